"""What the checkpoint checksums (``checkpoint.verify``) cost: a save and a restore of a train state with them and
without, side by side.

    python -m benchmarks.checkpoint_cost [--model gpt2] [--rounds 3] [--out benchmarks/results/checkpoint_cost.json]

The state is the preset's parameters and AdamW's two moments (what a run's checkpoint holds between level changes).
Each round saves it synchronously to a fresh folder and restores it, once with ``verify=False`` and once with
``verify=True`` (the order alternating between rounds), and times the checksums alone (``tree_checksums``). Reports
the medians and the ratios with / without, per round: this machine's speed drifts.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
import types

from absl import flags

from benchmarks import cli


def define_flags(fv: flags.FlagValues) -> None:
  """Declares this script's flags on ``fv``."""
  flags.DEFINE_string("model", "gpt2", "A preset (multilevel.models.PRESETS).", flag_values=fv)
  flags.DEFINE_integer("rounds", 3, "Rounds, each one save and restore per setting.", flag_values=fv)
  cli.define_timing_output(fv, "checkpoint_cost.json")


def parse_args(argv: list[str] | None = None) -> types.SimpleNamespace:
  """The flags as a namespace: of ``argv`` if given, else of the command line."""
  return cli.parse(define_flags, argv)


def _save_restore(state, verify: bool) -> tuple[float, float]:
  from multilevel.checkpoint import Checkpointer
  d = tempfile.mkdtemp()
  try:
    ckpt = Checkpointer(d, async_save=False, verify=verify)
    t0 = time.perf_counter()
    ckpt.save(0, state, {})
    ckpt.wait()
    t1 = time.perf_counter()
    ckpt.restore_state(0, state)
    t2 = time.perf_counter()
    ckpt.close()
    return t1 - t0, t2 - t1
  finally:
    shutil.rmtree(d, ignore_errors=True)


def measure(model: str, a) -> dict:
  import jax
  import optax

  from multilevel import models as M
  from multilevel.checkpoint import tree_checksums
  params = M.init_params(M.preset(model), 0)
  state = {"params": params, "opt_state": optax.adamw(1e-4).init(params)}
  size = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))
  rows = []
  for r in range(a.rounds):
    t = time.perf_counter()
    tree_checksums(state)
    row = {"checksums_s": time.perf_counter() - t}
    for verify in ((False, True) if r % 2 == 0 else (True, False)):
      row[f"save_s_verify_{verify}"], row[f"restore_s_verify_{verify}"] = _save_restore(state, verify)
    rows.append(row)
  med = lambda k: statistics.median(row[k] for row in rows)
  ratio = lambda op: statistics.median(row[f"{op}_s_verify_True"] / row[f"{op}_s_verify_False"] for row in rows)
  out = {"model": model, "state_gib": size / 2**30, "rounds": rows, "checksums_s": med("checksums_s"),
         **{f"{op}_s_{v}": med(f"{op}_s_verify_{flag}") for op in ("save", "restore")
            for v, flag in (("plain", False), ("verified", True))},
         "save_ratio": ratio("save"), "restore_ratio": ratio("restore")}
  print(f"{model}: state {out['state_gib']:.2f} GiB; checksums {out['checksums_s']:.2f} s; save "
        f"{out['save_s_plain']:.2f} -> {out['save_s_verified']:.2f} s ({out['save_ratio']:.2f}x), restore "
        f"{out['restore_s_plain']:.2f} -> {out['restore_s_verified']:.2f} s ({out['restore_ratio']:.2f}x)", flush=True)
  return out


def main(argv):
  del argv
  a = parse_args()
  if a.rounds < 1:
    from absl import app
    raise app.UsageError(f"--rounds must be 1 or more, got {a.rounds}.")
  cli.time_each("benchmarks.checkpoint_cost", a, measure, [a.model])


if __name__ == "__main__":
  cli.run(main, define_flags)
