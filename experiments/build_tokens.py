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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from multilevel.data import make_data
  from multilevel.data import tokenfile
  cfg = _CONFIG.value
  seq_len, batch = int(cfg.model.max_len), int(cfg.train.batch_size)
  start = time.time()
  try:
    train, _, info = make_data(cfg.data, kind="text", batch_size=batch, seq_len=seq_len, model_family=cfg.model.family,
                               process_index=0, process_count=1)
  except (ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  train.close()
  seconds = time.time() - start
  tf = tokenfile.open_token_file(info.token_file)
  train_tokens = info.num_train_examples * seq_len
  print(f"{info.description}\n"
        f"token file {tf.path}: {tf.num_tokens:,} tokens ({tf.tokens.dtype}), {tf.num_documents:,} documents, "
        f"{tf.nbytes / 2**20:.1f} MiB; ready in {seconds:.1f} s\n"
        f"one epoch: {train_tokens:,} training tokens ({info.num_train_examples:,} sequences of {seq_len}), "
        f"{info.num_eval_examples * seq_len:,} held out")
  for steps in _STEPS.value:
    tokens = int(steps) * batch * seq_len
    print(f"  {int(steps):,} steps of {batch}x{seq_len}: {tokens:,} tokens = {tokens / train_tokens:.2f} epochs")
  if _OUT.value:
    out = os.path.abspath(os.path.expanduser(_OUT.value))
    shutil.copytree(tf.path, out)
    print(f"copied to {out}: train on it with --config.data.token_file={out}")


if __name__ == "__main__":
  app.run(main)
