"""Export a finished run's target model as a Hugging Face checkpoint (config.json + model.safetensors).

  python -m experiments.export --workdir=runs/gpt-tiny --out=runs/gpt-tiny/hf

Needs the ``hf`` extra's safetensors. The model is the one the run ended with (checked against its summary.json);
``transformers.AutoModelFor...from_pretrained(OUT)`` loads it. An expected error prints one line starting with
"error:" and exits with status 1.
"""

import json
import os

from absl import app, flags

from experiments.errors import fail

_WORKDIR = flags.DEFINE_string("workdir", None, "The --workdir of a finished experiments.train run.")
_OUT = flags.DEFINE_string("out", None, "Folder to write config.json and model.safetensors to.")
flags.mark_flags_as_required(["workdir", "out"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from multilevel import interop
  from multilevel.checkpoint import CheckpointError, load_run, quiet_orbax_logs
  quiet_orbax_logs()
  out = _OUT.value
  if os.path.exists(out) and not os.path.isdir(out):
    fail(f"--out={out} is a file: pass a folder (it is created if missing) for config.json and model.safetensors.")
  try:
    cfg, params = load_run(_WORKDIR.value)
    with open(os.path.join(os.path.expanduser(_WORKDIR.value), "summary.json"), encoding="utf-8") as f:
      summary = json.load(f)
    tok = summary.get("tokenizer") or {}
    ids = {k: tok[i] for k, i in (("eos_token_id", "eos_id"), ("bos_token_id", "eos_id"), ("pad_token_id", "pad_id"))
           if isinstance(tok.get(i), int) and 0 <= tok[i] < cfg.vocab_size}  # Documents start after an <eos>.
    interop.check_inputs(summary)  # Before any file is written.
    out = interop.save_hf(cfg, params, out, labels=summary.get("class_names"), token_ids=ids)
    written = interop.save_inputs(str(out), cfg, summary)
  except (CheckpointError, ValueError, ImportError) as e:
    fail(str(e))
  except OSError as e:
    fail(f"Cannot write the model to --out={out}: {e.strerror or e} ({e.filename or out}).")
  print(f"{cfg.family} model ({cfg.num_layers} layers, width {cfg.width}) written to {out}"
        + (f", with {' and '.join(written)}" if written else ""))


if __name__ == "__main__":
  app.run(main)
