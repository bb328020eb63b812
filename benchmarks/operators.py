"""Wall time of coalesce, de-coalesce and interpolate on BERT-Base / BERT-Large parameter trees, next to a plain copy.

    python -m benchmarks.operators [--presets bert-base,bert-large] [--repeats 5] \
        [--out benchmarks/results/operators.json]

Each operator is jitted (the LevelMap is a static argument), called once to compile (reported separately as the
first call), then timed as the best of ``--repeats`` calls with ``block_until_ready``. The reference is
``jax.jit(lambda t: jax.tree.map(jnp.copy, t))`` on the large tree: every operator reads and writes about as much
memory as that copy or less (coalesce reads the large tree and writes a quarter-sized one at the default halving of
width and depth; de-coalesce the reverse; interpolate reads two large trees and writes one), so the ratio says how
far each is from a memory-bound copy. The operators' finite check (on by default for concrete trees, skipped under
jit) is timed on its own on the large tree: one reduction that reads it once. Parameter trees are random normal
leaves of the right shapes (``M.abstract_params``), not Flax init, which would be slower and changes nothing here.
"""

import datetime
import functools
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from benchmarks import cli
from multilevel import models as M
from multilevel import operators as O
from multilevel.operators.finite import require_finite


def define_flags(fv: flags.FlagValues) -> None:
  """Declares this script's flags on ``fv``."""
  flags.DEFINE_string("presets", "bert-base,bert-large", "Comma-separated model presets (M.preset).", flag_values=fv)
  flags.DEFINE_integer("repeats", 5, "Timed calls per operator after the first; the best is kept.", flag_values=fv)
  flags.DEFINE_integer("width_factor", 2, "Width factor of the mapping.", flag_values=fv)
  flags.DEFINE_integer("depth_factor", 2, "Depth factor of the mapping.", flag_values=fv)
  flags.DEFINE_enum("depth_mode", "adjacent", list(O.DEPTH_MODES), "How layers pair up when depth coalesces.",
                    flag_values=fv)
  flags.DEFINE_float("w_pre", 0.25, "Interpolation weight of the pre-coalescing tree.", flag_values=fv)
  flags.DEFINE_string("out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "operators.json"),
                      "JSON results ('' = do not write).", flag_values=fv)


def random_tree(cfg, seed, std=0.02):
  abstract = M.abstract_params(cfg)
  leaves, treedef = jax.tree.flatten(abstract)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  make = jax.jit(lambda ks: [std * jax.random.normal(k, a.shape, a.dtype) for k, a in zip(ks, leaves)])
  return jax.tree.unflatten(treedef, make(keys))


def tree_bytes(tree):
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def timed(fn, *args, repeats):
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  first = time.perf_counter() - start
  del out
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
    del out
  return first, min(times), statistics.median(times)


def bench_preset(name, args):
  cfg = M.preset(name)
  m = O.make_mapping(cfg, width_factor=args.width_factor, depth_factor=args.depth_factor,
                     depth_mode=args.depth_mode)
  large, pre = random_tree(cfg, 0), random_tree(cfg, 1)
  # Jitted: the finite check cannot read traced values, so it is switched off explicitly and timed on its own.
  coalesce = jax.jit(functools.partial(O.coalesce, check_finite=False), static_argnums=1)
  decoalesce = jax.jit(functools.partial(O.decoalesce, check_finite=False), static_argnums=1)
  interpolate = jax.jit(functools.partial(O.interpolate, w_pre=args.w_pre, check_finite=False))
  copy = jax.jit(lambda t: jax.tree.map(jnp.copy, t))
  # The first calls compile; they also make the inputs of the later cases, so their times are kept here.
  first_calls = {}
  start = time.perf_counter()
  small = jax.block_until_ready(coalesce(large, m))
  first_calls["coalesce"] = time.perf_counter() - start
  start = time.perf_counter()
  grown = jax.block_until_ready(decoalesce(small, m))
  first_calls["decoalesce"] = time.perf_counter() - start
  n_large, n_small = M.num_params(large), M.num_params(small)
  b_large, b_small = tree_bytes(large), tree_bytes(small)
  cases = [
      ("copy (large tree)", copy, (large,), b_large + b_large),
      ("coalesce", lambda t: coalesce(t, m), (large,), b_large + b_small),
      ("decoalesce", lambda t: decoalesce(t, m), (small,), b_small + b_large),
      (f"interpolate (w_pre={args.w_pre})", interpolate, (grown, pre), 3 * b_large),
      ("finite check (large tree)", lambda t: require_finite(t, "the large tree"), (large,), b_large),
      ("copy (small tree)", copy, (small,), b_small + b_small),
  ]
  rows = []
  for op, fn, fargs, moved in cases:
    first, best, median = timed(fn, *fargs, repeats=args.repeats)
    first = first_calls.get(op, first)
    rows.append({"model": name, "op": op, "first_call_s": round(first, 3), "best_ms": round(1e3 * best, 2),
                 "median_ms": round(1e3 * median, 2), "bytes_moved": moved,
                 "effective_GBps": round(moved / best / 1e9, 2)})
    print(json.dumps(rows[-1]), flush=True)
  copy_best = rows[0]["best_ms"]
  for row in rows:
    row["x_copy"] = round(row["best_ms"] / copy_best, 2)
  info = {"model": name, "mapping": m.describe().split(" (")[0], "params_large": n_large, "params_small": n_small,
          "depth_mode": args.depth_mode}
  return info, rows


def markdown(infos, rows):
  lines = ["| model (large -> small) | op | best ms | median ms | x copy | GB/s | first call s |",
           "|---|---|---:|---:|---:|---:|---:|"]
  names = {i["model"]: f"{i['model']} ({i['params_large'] / 1e6:.1f}M -> {i['params_small'] / 1e6:.1f}M)"
           for i in infos}
  for r in rows:
    lines.append(f"| {names[r['model']]} | {r['op']} | {r['best_ms']:.1f} | {r['median_ms']:.1f} | "
                 f"{r['x_copy']:.2f} | {r['effective_GBps']:.2f} | {r['first_call_s']:.2f} |")
  return "\n".join(lines)


def main(argv):
  del argv
  args = cli.parse(define_flags)
  load_before = os.getloadavg()
  start = time.perf_counter()
  infos, rows = [], []
  for name in args.presets.split(","):
    info, r = bench_preset(name.strip(), args)
    infos.append(info)
    rows.extend(r)
  table = markdown(infos, rows)
  print(table)
  result = {
      "command": cli.command("benchmarks.operators"),
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
      "jax_version": jax.__version__,
      "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()],
      "cpu_count": os.cpu_count(),
      "machine": platform.machine(),
      "python": platform.python_version(),
      "load_average_before": [round(x, 2) for x in load_before],
      "load_average_after": [round(x, 2) for x in os.getloadavg()],
      "total_s": round(time.perf_counter() - start, 1),
      "repeats": args.repeats,
      "models": infos,
      "results": rows,
      "markdown": table,
  }
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
  cli.run(main, define_flags)
