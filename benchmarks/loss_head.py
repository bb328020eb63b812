"""The vocabulary loss alone (logits, cross-entropy, hits, and their gradients), the engine's against plain autodiff.

    python -m benchmarks.loss_head [--shapes 32x127x32x1024,32x127x64x1024,8x128x256x8192]
        [--max_logits 0,262144,524288,1048576,-1] [--rounds 9] [--out benchmarks/results/loss_head.json]

For each shape (batch x positions x width x vocabulary) it jits the value and gradient (features and embedding) of
the plain loss (optax's integer-label cross-entropy differentiated by JAX, the hits by argmax: what the engine ran
below ``train.max_logits`` before) and of ``losses.cross_entropy_sums`` at each ``--max_logits`` (0 = one chunk,
-1 = auto), and times them in interleaved rounds (the order alternates). It reports each one's median time per call
and its time over the plain loss's within each round, median [min, max]: ratios, because this machine's speed drifts.
The first two shapes are the GPT benchmark's coalesced small model and its target (width 32 and 64, 127 predicted
positions of 32 rows, vocabulary 1024), the third the throughput benchmark's GPT-2 shape.
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
  flags.DEFINE_list("shapes", ["32x127x32x1024", "32x127x64x1024", "8x128x256x8192"],
                    "Shapes BxTxDxV to time.", flag_values=fv)
  flags.DEFINE_list("max_logits", ["0", "262144", "524288", "1048576", "-1"],
                    "The engine's loss at each of these max_logits (0 = one chunk, -1 = auto).", flag_values=fv)
  flags.DEFINE_integer("rounds", 9, "Timed rounds.", flag_values=fv)
  flags.DEFINE_integer("calls", 3, "Timed calls per loss per round.", flag_values=fv)
  cli.define_timing_output(fv, "loss_head.json")


def parse_args(argv: list[str] | None = None) -> types.SimpleNamespace:
  """The flags as a namespace: of ``argv`` if given, else of the command line."""
  return cli.parse(define_flags, argv)


def losses(max_logits: list[int]) -> dict:
  """``{name: loss(h, emb, labels) -> (loss_sum, correct)}``: the plain autodiff loss and the engine's at each
  ``max_logits``."""
  import jax.numpy as jnp
  import optax

  from multilevel.train.losses import cross_entropy_sums

  def plain(h, emb, labels):
    logits = jnp.einsum("btd,vd->btv", h, emb)
    return (jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, labels)),
            jnp.sum((jnp.argmax(logits, -1) == labels).astype(jnp.float32)))

  def engine(m):
    def f(h, emb, labels):
      s = cross_entropy_sums(h, emb, None, labels, jnp.ones(labels.shape), max_logits=m)
      return s["loss_sum"], s["correct"]
    return f

  return {"plain autodiff": plain, **{f"engine max_logits={m}": engine(m) for m in max_logits}}


def parse_shape(shape: str) -> tuple[int, int, int, int]:
  """``"BxTxDxV"`` as four positive integers; anything else is a usage error that names the shape."""
  from absl import app
  parts = shape.split("x")
  if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise app.UsageError(f"--shapes takes batch x positions x width x vocabulary as four positive integers, e.g. "
                         f"32x127x32x1024; got {shape!r}.")
  return tuple(int(p) for p in parts)


def measure(shape: str, a) -> dict:
  import jax
  import jax.numpy as jnp

  from multilevel.train.losses import num_chunks
  b, t, d, v = parse_shape(shape)
  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
  emb = jnp.asarray(0.1 * rng.standard_normal((v, d)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
  sides = {name: jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))
           for name, f in losses([int(m) for m in a.max_logits]).items()}
  first = {}
  for name, fn in sides.items():  # Compile, and one untimed call.
    (loss, correct), _ = jax.block_until_ready(fn(h, emb, labels))
    first[name] = (float(loss), float(correct))
  times = {name: [] for name in sides}
  names = list(sides)
  for r in range(a.rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      t0 = time.perf_counter()
      for _ in range(a.calls):
        jax.block_until_ready(sides[name](h, emb, labels))
      times[name].append((time.perf_counter() - t0) / a.calls)
  rows = []
  for name in names:
    ratio = [x / p for x, p in zip(times[name], times["plain autodiff"])]
    m = name.split("=")[1] if "=" in name else None
    rows.append({"loss": name, "chunks": None if m is None else num_chunks(b * t, v, int(m)),
                 "median_ms": 1e3 * statistics.median(times[name]), "min_ms": 1e3 * min(times[name]),
                 "over_plain": statistics.median(ratio), "over_plain_min": min(ratio), "over_plain_max": max(ratio),
                 "loss_sum": first[name][0], "correct": first[name][1]})
    print(f"{shape} {name:28s} chunks {rows[-1]['chunks'] or '-':>3} {rows[-1]['median_ms']:8.2f} ms  "
          f"x{rows[-1]['over_plain']:.3f} [{min(ratio):.3f}, {max(ratio):.3f}] of plain  "
          f"loss {first[name][0]:.4f} hits {first[name][1]:.0f}", flush=True)
  return {"shape": shape, "matmul_gflop": 6 * b * t * d * v / 1e9, "rows": rows}


def main(argv):
  del argv
  a = parse_args()
  for shape in a.shapes:  # Refused before anything is timed.
    parse_shape(shape)
  if not all(m.lstrip("-").isdigit() and int(m) >= -1 for m in a.max_logits):
    from absl import app
    raise app.UsageError(f"--max_logits takes integers: -1 (auto), 0 (one chunk) or logits per chunk; got "
                         f"{a.max_logits}.")
  cli.time_each("benchmarks.loss_head", a, measure, a.shapes)


if __name__ == "__main__":
  cli.run(main, define_flags)
