"""Entry point: train one run (a V-cycle, or plain training with --config.cycle.levels=1).

  python -m experiments.train --config=experiments/configs/gpt.py:tiny --workdir=runs/gpt-tiny \
      --config.cycle.levels=2 --config.train.steps=600

Writes DIR/metrics.jsonl, DIR/tensorboard/, DIR/summary.json and DIR/checkpoints/; the same command resumes.
"""

import os

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "A config file (experiments/configs/<family>.py:<size>).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the summary.")
_COMPILE_CACHE = flags.DEFINE_string("compilation_cache", "~/.cache/multilevel/jax",
                                     "Persistent XLA compilation cache ('' to disable).")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() (multi-host runs).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import jax

  if _DISTRIBUTED.value:
    jax.distributed.initialize()
  if _COMPILE_CACHE.value:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(_COMPILE_CACHE.value))
  from multilevel.cycles.driver import train_and_evaluate

  logging.info("JAX %s on %s (%d devices, %d processes)", jax.__version__, jax.default_backend(), jax.device_count(),
               jax.process_count())
  summary = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  print(f"final eval loss {summary['final_eval_loss']:.4f} | {summary['total_flops']:.3g} FLOPs | "
        f"{summary['train_seconds']:.1f} s training | {os.path.join(_WORKDIR.value, 'summary.json')}")


if __name__ == "__main__":
  app.run(main)
