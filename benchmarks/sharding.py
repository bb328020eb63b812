"""FSDP by the axis-role table: memory per device from abstract shardings, and the cost of sharding on CPU.

    python -m benchmarks.sharding [--rounds 5] [--steps 5] [--out benchmarks/results/sharding.json]

Part 1, nothing allocated: bytes per device of the parameters and the AdamW state (fp32 moments mu and nu; counts
are scalars) of GPT-2 124M, BERT-Large and a 1.3B GPT shape (24 layers, width 2048, 16 heads of 128, FFN 8192,
vocabulary 50257, 2048 positions) at fsdp = 1, 2, 4, 8, from ``NamedSharding.shard_shape`` of the shardings the
driver uses (``multilevel.train.sharding.param_specs`` on an ``AbstractMesh``).

Part 2, two fake CPU devices (``--xla_force_host_platform_device_count=2``, set by this script): the saving
benchmark's GPT (4 layers, width 64, vocabulary 1024, batch 32 x 128) trained with ``train.mesh=data:2`` (parameters
replicated) and ``fsdp:2`` (parameters and moments split), and the coalescing operator of its first transition on
the same two meshes, in one run: ``--rounds`` interleaved rounds of ``--steps`` steps each (waiting for every step,
as the driver does on a multi-device CPU mesh), reported as the median per-round ratio fsdp / replicated. On CPU the
devices share the same two cores and memory, so this measures the overhead of the gathers and scatters, not a gain.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")  # Before JAX starts.

import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import flags  # noqa: E402
from jax.sharding import AbstractMesh, NamedSharding  # noqa: E402

from benchmarks import cli  # noqa: E402
from multilevel import models as M  # noqa: E402
from multilevel import operators as O  # noqa: E402
from multilevel.train import (LrSchedule, ObjectiveConfig, OptimConfig, StepConfig, build_steps, init_params,  # noqa: E402
                              make_mesh, param_shardings, put_batch)
from multilevel.train.sharding import param_specs  # noqa: E402
from multilevel.tree import flatten  # noqa: E402

MODELS = {
    "gpt2-124M": M.preset("gpt2"),
    "bert-large": M.preset("bert-large"),
    "gpt-1.3B": M.ModelConfig("gpt", 24, 16, 128, vocab_size=50257, max_len=2048),
}
BENCH_GPT = M.ModelConfig("gpt", 4, 2, 32, vocab_size=1024, max_len=128)


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_integer("rounds", 5, "Interleaved timing rounds of part 2.", flag_values=fv)
  flags.DEFINE_integer("steps", 5, "Timed train steps per mesh per round.", flag_values=fv)
  flags.DEFINE_integer("batch", 32, "Rows per step in part 2.", flag_values=fv)
  flags.DEFINE_bool("skip_timing", False, "Only part 1 (no devices needed).", flag_values=fv)
  flags.DEFINE_string("out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "sharding.json"),
                      "JSON results ('' = do not write).", flag_values=fv)


def bytes_per_device(cfg: M.ModelConfig, fsdp: int) -> dict:
  """Parameters and AdamW moments (two fp32 copies of the parameters) per device, from the shardings alone."""
  mesh = AbstractMesh((1, fsdp), ("data", "fsdp"))
  specs = param_specs(cfg, mesh)
  total = per_device = 0
  for name, x in flatten(M.abstract_params(cfg)).items():
    shard = NamedSharding(mesh, specs[name]).shard_shape(x.shape)
    total += int(np.prod(x.shape)) * x.dtype.itemsize
    per_device += int(np.prod(shard)) * x.dtype.itemsize
  return {"params_bytes": total, "params_per_device": per_device, "state_per_device": 3 * per_device,
          "state_total": 3 * total}


def memory_table() -> list[dict]:
  rows = []
  for name, cfg in MODELS.items():
    for fsdp in (1, 2, 4, 8):
      b = bytes_per_device(cfg, fsdp)
      rows.append({"model": name, "params": M.num_params(M.abstract_params(cfg)), "fsdp": fsdp, **b})
  return rows


def _time_steps(compiled, state, batch, start: int, n: int):
  times = []
  for i in range(n):
    t0 = time.perf_counter()
    state, metrics = compiled(state, batch, jnp.int32(start + i))
    float(metrics["loss"])  # Wait for the step (the CPU all-reduce can deadlock otherwise).
    times.append(time.perf_counter() - t0)
  return state, times


def timing(a) -> dict:
  if jax.device_count() < 2:
    raise SystemExit("Part 2 needs two devices: run without XLA_FLAGS set (this script sets it) or with "
                     "--xla_force_host_platform_device_count=2.")
  cfg = BENCH_GPT
  sc = StepConfig(cfg, ObjectiveConfig())
  oc = OptimConfig(LrSchedule(1e-3, 10**6, 0, "constant"))
  rows = np.random.default_rng(0).integers(0, cfg.vocab_size, (a.batch, cfg.max_len), dtype=np.int32)
  setups = {}
  for name, spec in (("replicated", "data:2"), ("fsdp", "fsdp:2")):
    mesh = make_mesh(spec, 2)
    steps = build_steps(sc, oc, mesh)
    state = steps.init_state(init_params(cfg, 0, mesh))
    batch = put_batch({"tokens": rows}, mesh)
    compiled = steps.compile_train(state, batch, jnp.int32(0))
    state, _ = _time_steps(compiled, state, batch, 0, 2)  # Warm-up.
    m = O.make_mapping(cfg, preln_exact=True, depth_growth="zero")
    coalesce = jax.jit(lambda t: O.coalesce(t, m, check_finite=False),
                       out_shardings=param_shardings(m.small, mesh)).lower(state.params).compile()
    jax.block_until_ready(coalesce(state.params))
    setups[name] = {"compiled": compiled, "state": state, "batch": batch, "coalesce": coalesce, "g": 2}
  ratios, op_ratios, per = [], [], {k: [] for k in setups}
  for r in range(a.rounds):
    order = list(setups) if r % 2 == 0 else list(reversed(setups))
    step_s, op_s = {}, {}
    for name in order:
      s = setups[name]
      s["state"], times = _time_steps(s["compiled"], s["state"], s["batch"], s["g"], a.steps)
      s["g"] += a.steps
      step_s[name] = statistics.median(times)
      t0 = time.perf_counter()
      for _ in range(a.steps):
        jax.block_until_ready(s["coalesce"](s["state"].params))
      op_s[name] = (time.perf_counter() - t0) / a.steps
      per[name].append({"step_s": step_s[name], "coalesce_s": op_s[name]})
    ratios.append(step_s["fsdp"] / step_s["replicated"])
    op_ratios.append(op_s["fsdp"] / op_s["replicated"])
  return {"model": f"GPT L{cfg.num_layers}/d{cfg.width}, vocab {cfg.vocab_size}, batch {a.batch} x {cfg.max_len}",
          "step_ratio_fsdp_over_replicated": statistics.median(ratios), "step_ratios": ratios,
          "coalesce_ratio_fsdp_over_replicated": statistics.median(op_ratios), "coalesce_ratios": op_ratios,
          "per_round": per}


def main(argv):
  del argv
  a = cli.parse(define_flags)
  res = {"command": cli.command("benchmarks.sharding"), "date": datetime.datetime.now().isoformat(timespec="seconds"),
         "jax": jax.__version__, "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
         "memory": memory_table()}
  print("| model | params | fsdp | params / device | params + AdamW / device |")
  print("|---|---:|---:|---:|---:|")
  for r in res["memory"]:
    print(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['fsdp']} | {r['params_per_device'] / 2**20:,.0f} MiB | "
          f"{r['state_per_device'] / 2**30:.2f} GiB |")
  if not a.skip_timing:
    res["timing"] = timing(a)
    t = res["timing"]
    print(f"\n{t['model']} on 2 CPU devices: step time fsdp:2 / data:2 = {t['step_ratio_fsdp_over_replicated']:.2f} "
          f"(rounds {[round(x, 2) for x in t['step_ratios']]}), coalesce = "
          f"{t['coalesce_ratio_fsdp_over_replicated']:.2f} (rounds {[round(x, 2) for x in t['coalesce_ratios']]})")
  if a.out:
    with open(a.out, "w") as f:
      json.dump(res, f, indent=1)
    print(f"Wrote {a.out}")


if __name__ == "__main__":
  cli.run(main, define_flags)
