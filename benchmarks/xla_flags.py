"""XLA's CPU options against the engine's train step: each option in its own process, side by side, as ratios.

    python -m benchmarks.xla_flags [--models gpt] [--threads 1|0] [--passes 3] [--steps 4]
        [--options=,--xla_cpu_experimental_onednn_fusion_type=dot] [--out benchmarks/results/xla_flags.json]

XLA reads ``XLA_FLAGS`` once, when the backend starts, so one process cannot compare options: each (pass, option)
runs ``--child`` in a fresh process with ``XLA_FLAGS`` set to the option (plus, with ``--threads 1``, the flags that
keep XLA's CPU runtime on one thread), builds ``benchmarks.throughput``'s step for the same shapes and seed (the
engine's jitted ``build_steps`` train step, fp32, blocked on every step), runs ``--warmup`` steps and then times
``--steps`` steps. Passes alternate the order of the options, so a machine that speeds up or slows down during the
run does not favour one of them. The figure that survives a noisy machine is each option's step time over the
baseline's (the first option, '' = XLA's defaults) *within the same pass*; the report gives the median of those
ratios over passes with their range, and the median step time. Each child also reports the loss after its steps:
an option that changes the numerics shows there (fast math may, by rounding).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types

from absl import flags

from benchmarks import cli

ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
DEFAULT_OPTIONS = ["", "--xla_cpu_experimental_onednn_fusion_type=dot", "--xla_cpu_experimental_xnn_fusion_type=dot",
                   "--xla_cpu_enable_fast_math=true", "--xla_cpu_enable_concurrency_optimized_scheduler=true"]


def define_flags(fv: flags.FlagValues) -> None:
  """Declares this script's flags on ``fv``."""
  from benchmarks import throughput
  throughput.define_flags(fv)  # The shapes, seed, --warmup and --steps of the throughput benchmark.
  fv.set_default("models", "gpt")
  fv.set_default("steps", 4)
  fv.set_default("threads", 1)  # Here: XLA's threads (1, or 0 for XLA's default), not torch's.
  fv.set_default("out", "")
  flags.DEFINE_list("options", DEFAULT_OPTIONS, "XLA_FLAGS values to compare (each one process per pass); the first "
                    "is the baseline the ratios are taken against ('' = XLA's defaults).", flag_values=fv)
  flags.DEFINE_integer("passes", 3, "Passes over the options (alternating order).", flag_values=fv)
  flags.DEFINE_integer("timeout", 600, "Seconds one child may take.", flag_values=fv)
  flags.DEFINE_bool("child", False, "Internal: time one option in this process (XLA_FLAGS already set).",
                    flag_values=fv)


def parse_args(argv: list[str] | None = None) -> types.SimpleNamespace:
  """The flags as a namespace: of ``argv`` if given, else of the command line."""
  return cli.parse(define_flags, argv)


def time_steps(family: str, a) -> dict:
  """In this process: build the throughput benchmark's step for ``family``, warm up, time ``a.steps`` steps."""
  from benchmarks import throughput
  from multilevel import models as M
  cfg = throughput.model_config(family, a)
  ours = throughput.Ours(family, cfg, M.init_params(cfg, a.seed), throughput.make_batches(family, cfg, a))
  ours.run(max(a.warmup, 1))
  times = []
  for _ in range(a.steps):
    t0 = time.perf_counter()
    ours.run(1)
    times.append(time.perf_counter() - t0)
  return {"step_s": statistics.median(times), "min_step_s": min(times), "compile_s": ours.compile_seconds,
          "loss": ours.losses[-1]}


def child_env(option: str, threads: int) -> dict:
  """The environment of a child that times ``option``."""
  xla = " ".join(x for x in (option, ONE_THREAD if threads == 1 else "") if x)
  return dict(os.environ, XLA_FLAGS=xla, JAX_PLATFORMS="cpu")


def run_child(option: str, family: str, argv: list[str], a) -> dict:
  """One (option, family) timed in a fresh process; its JSON line back."""
  cmd = [sys.executable, "-m", "benchmarks.xla_flags", "--child", f"--models={family}", *argv]
  r = subprocess.run(cmd, env=child_env(option, a.threads), capture_output=True, text=True, timeout=a.timeout,
                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
  if r.returncode != 0 or not lines:
    raise RuntimeError(f"XLA_FLAGS={option!r} ({family}) failed with exit code {r.returncode}:\n{r.stderr[-3000:]}")
  return json.loads(lines[-1][len("RESULT "):])


def summarise(options: list[str], passes: list[dict]) -> list[dict]:
  """Per option: the median (and range) over passes of its step time over the baseline's in the same pass."""
  base = options[0]
  rows = []
  for o in options:
    ratios = [p[o]["step_s"] / p[base]["step_s"] for p in passes]
    rows.append({"option": o, "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                 "step_s": statistics.median(p[o]["step_s"] for p in passes),
                 "losses": sorted({round(p[o]["loss"], 6) for p in passes})})
  return rows


def table(family: str, rows: list[dict]) -> str:
  lines = [f"| {family}: XLA_FLAGS option | step time / baseline's, median [min, max] over passes | median step (s) | "
           f"loss after the steps |", "|---|---|---|---|"]
  for r in rows:
    lines.append(f"| `{r['option'] or '(defaults)'}` | {r['ratio']:.3f} [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}] "
                 f"| {r['step_s']:.3f} | {', '.join(f'{x:.4f}' for x in r['losses'])} |")
  return "\n".join(lines)


def forwarded(argv: list[str]) -> list[str]:
  """The command line's flags a child needs (shapes, seed, steps), without the ones only the parent reads."""
  own = ("--options", "--passes", "--timeout", "--out", "--models", "--threads", "--child")
  return [x for x in argv[1:] if not x.startswith(own)]


def main(argv):
  a = parse_args()
  families = [m.strip() for m in a.models.split(",") if m.strip()]
  if a.child:
    print("RESULT " + json.dumps(time_steps(families[0], a)), flush=True)
    return
  if a.threads not in (0, 1) or a.passes < 1 or a.steps < 1 or not a.options:
    raise ValueError(f"--threads must be 1 or 0 (XLA's default), --passes and --steps at least 1 and --options not "
                     f"empty; got {a.threads}, {a.passes}, {a.steps}, {a.options}.")
  result = {"command": cli.command("benchmarks.xla_flags"), "machine": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "load_before": os.getloadavg(), "threads": a.threads or "XLA's default",
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "families": {}}
  for family in families:
    passes = []
    for k in range(a.passes):
      order = a.options if k % 2 == 0 else a.options[::-1]
      passes.append({o: run_child(o, family, forwarded(sys.argv), a) for o in order})
      print(f"{family} pass {k}: " + ", ".join(f"{o or '(defaults)'} {passes[-1][o]['step_s']:.3f} s" for o in order),
            flush=True)
    rows = summarise(a.options, passes)
    result["families"][family] = {"rows": rows, "passes": passes}
    print(table(family, rows), flush=True)
  result["load_after"] = os.getloadavg()
  if a.out:
    from multilevel.files import write_json_atomic  # Whole or not at all; it makes the folder.
    write_json_atomic(a.out, result)


if __name__ == "__main__":
  cli.run(main, define_flags)
