"""Step time of the coalesced small model over the big one's, next to their FLOPs ratio, for each family.

    python -m benchmarks.step_ratio [--families gpt,bert,deit] [--rounds 5 --steps 3]
        [--out benchmarks/results/step_ratio.json]

The V-cycle's wall-clock saving is its FLOPs saving only if a small-model step costs what its FLOPs say. This times
the engine's jitted train step (``build_steps``, one device, AdamW, blocked every step) of the saving benchmark's
models (``benchmarks/variants.py`` MODELS: 4 layers, 2 heads x 32, seq 128, vocabulary 1024, batch 32; DeiT on 28x28
images, batch 128) and of their coalesced small models (``make_mapping(cfg).small``: half the layers and heads), in
interleaved rounds (the order alternates), and reports the median per-round step-time ratio small / big against the
analytic train-FLOPs ratio. Compilation and two warm-up steps are excluded.
"""

from __future__ import annotations

import statistics
import time
import types

import numpy as np
from absl import flags

from benchmarks import cli


def define_flags(fv: flags.FlagValues) -> None:
  """Declares this script's flags on ``fv``."""
  flags.DEFINE_string("families", "gpt,bert,deit", "Comma-separated families.", flag_values=fv)
  flags.DEFINE_integer("rounds", 5, "Timed rounds.", flag_values=fv)
  flags.DEFINE_integer("steps", 3, "Timed steps per model per round.", flag_values=fv)
  flags.DEFINE_integer("warmup", 2, "Untimed steps per model after compilation.", flag_values=fv)
  cli.define_timing_output(fv, "step_ratio.json")


def parse_args(argv: list[str] | None = None) -> types.SimpleNamespace:
  """The flags as a namespace: of ``argv`` if given, else of the command line."""
  return cli.parse(define_flags, argv)


def big_config(family: str):
  """The saving benchmark's model of ``family`` and its batch size."""
  from multilevel import models as M
  if family == "deit":
    return M.ModelConfig("deit", 4, 2, 32, image_size=28, patch_size=4, num_channels=1, num_classes=10), 128
  return M.ModelConfig(family, 4, 2, 32, vocab_size=1024, max_len=128), 32


class Timed:
  """A compiled train step of one model on a fixed batch."""

  def __init__(self, cfg, batch_size: int):
    import jax
    import jax.numpy as jnp

    from multilevel.train import (LrSchedule, ObjectiveConfig, OptimConfig, StepConfig, build_steps, init_params,
                                  make_mesh, put_batch)
    self.jax, self.jnp = jax, jnp
    mesh = make_mesh("", 1)
    self.objective = ObjectiveConfig(mask_id=4, pad_id=-1)
    sc = StepConfig(cfg, self.objective, grad_accum=1, seed=0)
    oc = OptimConfig(LrSchedule(peak=1e-4, steps=10**7, warmup=0, decay="constant"), weight_decay=0.01,
                     grad_clip=1.0)
    steps = build_steps(sc, oc, mesh)
    self.state = steps.init_state(init_params(cfg, 0, mesh))
    rng = np.random.default_rng(0)
    if cfg.family == "deit":
      rows = {"image": rng.standard_normal((batch_size, cfg.image_size, cfg.image_size, cfg.num_channels),
                                           dtype=np.float32),
              "label": rng.integers(0, cfg.num_classes, (batch_size,), dtype=np.int32)}
    else:
      rows = {"tokens": rng.integers(5, cfg.vocab_size, (batch_size, cfg.max_len), dtype=np.int32)}
    self.batch = put_batch(rows, mesh)
    self.train = steps.compile_train(self.state, self.batch, jnp.int32(0))
    self.g = 0

  def run(self, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
      self.state, m = self.train(self.state, self.batch, self.jnp.int32(self.g))
      self.jax.block_until_ready((self.state, m))
      self.g += 1
    return (time.perf_counter() - t0) / max(n, 1)


def measure(family: str, a) -> dict:
  from multilevel import operators as O
  from multilevel.train import train_flops_per_step
  big, batch = big_config(family)
  small = O.make_mapping(big).small
  sides = {"big": Timed(big, batch), "small": Timed(small, batch)}
  for side in sides.values():
    side.run(a.warmup)
  rounds = []
  for r in range(a.rounds):
    order = ("big", "small") if r % 2 == 0 else ("small", "big")
    t = {name: sides[name].run(a.steps) for name in order}
    rounds.append({"big_step_s": t["big"], "small_step_s": t["small"], "ratio": t["small"] / t["big"]})
  obj = sides["big"].objective
  flops = {k: train_flops_per_step(c, batch, obj) for k, c in (("big", big), ("small", small))}
  ratios = [x["ratio"] for x in rounds]
  out = {
      "family": family, "batch": batch,
      "big": f"L{big.num_layers}/d{big.width}/h{big.num_heads}", "small": f"L{small.num_layers}/d{small.width}/"
      f"h{small.num_heads}",
      "big_step_s": statistics.median(x["big_step_s"] for x in rounds),
      "small_step_s": statistics.median(x["small_step_s"] for x in rounds),
      "step_time_ratio": statistics.median(ratios), "step_time_ratio_min": min(ratios),
      "step_time_ratio_max": max(ratios), "flops_ratio": flops["small"] / flops["big"],
      "big_train_flops_per_step": flops["big"], "small_train_flops_per_step": flops["small"], "rounds": rounds,
  }
  print(f"{family}: small/big step time {out['step_time_ratio']:.3f} [{min(ratios):.3f}, {max(ratios):.3f}] "
        f"(big {1e3 * out['big_step_s']:.1f} ms, small {1e3 * out['small_step_s']:.1f} ms), FLOPs ratio "
        f"{out['flops_ratio']:.3f}", flush=True)
  return out


def main(argv):
  del argv
  a = parse_args()
  if a.rounds < 1 or a.steps < 1 or a.warmup < 0:
    from absl import app
    raise app.UsageError(f"--rounds and --steps must be 1 or more and --warmup 0 or more, got {a.rounds}, {a.steps} "
                         f"and {a.warmup}.")
  cli.time_each("benchmarks.step_ratio", a, measure, cli.families(a))


if __name__ == "__main__":
  cli.run(main, define_flags)
