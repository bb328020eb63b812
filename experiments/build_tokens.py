"""Builds (or finds) the token file of a run's text data and says what one epoch holds.

  python -m experiments.build_tokens --config=experiments/configs/gpt.py:tiny --config.data.name=docs \
      --config.data.vocab_size=1024 --steps=1400,2800 --out=.cache/corpus/docs-bpe-1024

The token file is built exactly as the run would build it (same corpus, tokenizer and settings, under the config's
``data.cache_dir``); a later run finds it there. ``--out`` also copies its folder (tokens, index, tokenizer, meta)
to a folder of your choice, for example inside the working tree to travel to another machine, where
``--config.data.token_file=<that folder>`` trains on it without the corpus' packages.
"""

import os
import shutil
import sys
import time

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "A text config (experiments/configs/gpt.py:<size>, bert.py).",
                                          lock_config=True)
_OUT = flags.DEFINE_string("out", "", "Also copy the token file's folder here (it must not exist yet).")
_STEPS = flags.DEFINE_list("steps", [], "Training steps to express in epochs of the training split.")
flags.mark_flags_as_required(["config"])


_DEBUG = flags.DEFINE_bool("debug", False, "Show the Python traceback of an error instead of one line.")


def _steps(values) -> list[int]:
  """``--steps`` as whole step counts (``1400``, ``1e3`` and ``1_000`` are all fine)."""
  out = []
  for v in values:
    try:
      n = float(v.replace("_", ""))
    except ValueError:
      raise app.UsageError(f"--steps takes step counts separated by commas (e.g. 1400,2800); got {v!r}.") from None
    if not n.is_integer() or n < 1:
      raise app.UsageError(f"--steps takes positive whole step counts; got {v!r}.")
    out.append(int(n))
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from multilevel import models as M
  from multilevel.data import make_data
  from multilevel.data import tokenfile
  cfg = _CONFIG.value
  if not M.family_of(cfg.model.family).is_text:
    raise app.UsageError(f"{cfg.model.family} is an image family: a token file holds text. Give a text config "
                         f"(gpt.py, bert.py or llama.py).")
  steps = _steps(_STEPS.value)
  out = os.path.abspath(os.path.expanduser(_OUT.value)) if _OUT.value else ""
  if out and os.path.exists(out):  # Checked before the build, which can take a while.
    raise app.UsageError(f"--out={out} already exists; name a folder that does not exist yet (the token file's "
                         f"folder is copied there).")
  seq_len, batch = int(cfg.model.max_len), int(cfg.train.batch_size)
  start = time.time()
  train, _, info = make_data(cfg.data, kind="text", batch_size=batch, seq_len=seq_len, model_family=cfg.model.family,
                             process_index=0, process_count=1)
  train.close()
  seconds = time.time() - start
  tf = tokenfile.open_token_file(info.token_file)
  train_tokens = info.num_train_examples * seq_len
  print(f"{info.description}\n"
        f"token file {tf.path}: {tf.num_tokens:,} tokens ({tf.tokens.dtype}), {tf.num_documents:,} documents, "
        f"{tf.nbytes / 2**20:.1f} MiB; ready in {seconds:.1f} s\n"
        f"one epoch: {train_tokens:,} training tokens ({info.num_train_examples:,} sequences of {seq_len}), "
        f"{info.num_eval_examples * seq_len:,} held out")
  for n in steps:
    tokens = n * batch * seq_len
    print(f"  {n:,} steps of {batch}x{seq_len}: {tokens:,} tokens = {tokens / train_tokens:.2f} epochs")
  if out:
    shutil.copytree(tf.path, out)
    print(f"copied to {out}: train on it with --config.data.token_file={out}")


if __name__ == "__main__":
  from experiments.errors import one_line
  app.run(one_line(main, (app.UsageError, ValueError, KeyError, OSError), lambda: _DEBUG.value))
