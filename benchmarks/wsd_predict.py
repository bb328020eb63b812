"""Predicted against measured: finished 2-level V-cycles under one WSD schedule, priced after the fact from curves.

  python -m benchmarks.wsd_predict \
      --target=benchmarks/results/gcide_gpt_wsd_lr4e-3.json,benchmarks/results/gcide_gpt_wsd_lr4e-3_frontier.json \
      --small=benchmarks/results/bound_gcide_gpt_depth_L1.json+benchmarks/results/bound_gcide_gpt_depth_L1_curve.json \
      --runs=benchmarks/results/gcide_gpt_wsd_lr4e-3_planned_depth.json:planned --rate=0.92

For each budget of each --runs file (``benchmarks.saving`` results; ``FILE:VARIANT``), the schedule the variant ran
(its small steps and target steps, read off its curve: the evals at the smaller level, then at the target) is priced
by ``multilevel.cycles.growth.predict_wsd`` from the small model's stable curve (--small: a ``benchmarks.bound``
level-run file with eval curves), the target's stable curve and frontier (--target) and the target's growth rate
(--rate): the predicted final loss beside the measured one, and what the old pricing on decayed frontiers
(``planner.predict_vcycle``, lossless, rate 1) predicted. The small model's stable curve comes from separate pilots,
so this checks the pricing on runs it did not see.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from benchmarks import cli


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_list("target", [], "benchmarks.saving results with the target's WSD scratch runs.", flag_values=fv)
  flags.DEFINE_string("small", "", "benchmarks.bound level-run file(s) of the small model ('a.json+b.json' pools), "
                      "with eval curves.", flag_values=fv)
  flags.DEFINE_list("runs", [], "FILE:VARIANT of 2-level V-cycle runs under WSD.", flag_values=fv)
  flags.DEFINE_float("rate", 1.0, "The target's growth rate after the growth.", flag_values=fv)
  flags.DEFINE_float("cooldown_frac", 0.2, "train.cooldown_frac of the runs.", flag_values=fv)
  flags.DEFINE_string("out", "", "JSON to write the predictions to.", flag_values=fv)


def measure(a) -> dict:
  from multilevel.cycles import growth, planner
  if not (a.target and a.small and a.runs):
    raise app.UsageError("Give --target, --small and --runs.")
  target, target_step, _ = planner.target_from_saving(a.target)
  stable = planner.target_stable_from_saving(a.target, a.cooldown_frac)
  small = planner.candidate_from_bound(a.small, stable=True)
  if small.stable is None:
    raise app.UsageError(f"--small={a.small}: no run with an eval curve at its best rate; rerun benchmarks.bound.")
  rows = []
  for spec in a.runs:
    path, _, variant = spec.rpartition(":")
    if not path:
      raise app.UsageError(f"--runs takes FILE:VARIANT, got {spec!r}.")
    with open(path) as f:
      d = json.load(f)
    for b in d["budgets"]:
      v = b.get("variants", {}).get(variant)
      if v is None:
        continue
      curve = v["curve"]
      last_small = max(i for i, p in enumerate(curve) if p[3] != 0)
      # Less the target's steps before coalescing (a V-cycle whose small model starts fresh has none).
      first_small = min(i for i, p in enumerate(curve) if p[3] != 0)
      f_small = curve[last_small][0] - (curve[first_small - 1][0] if first_small else 0.0)
      n_small = round(f_small / small.step_flops)
      n_big = round((v["total_flops"] - curve[last_small][0]) / target_step)
      jumps = v.get("handover_jumps") or [0.0]
      new = growth.predict_wsd(small.stable, small.step_flops, n_small, stable, target, target_step, n_big,
                               b["steps"], a.cooldown_frac, jump=jumps[-1], rate=a.rate)
      old = planner.predict_vcycle(target, target_step, small.frontier, small.step_flops, n_small, n_big)
      rows.append({"file": os.path.basename(path), "variant": variant, "steps": b["steps"], "small_steps": n_small,
                   "big_steps": n_big, "handover_loss": curve[last_small][2],
                   "predicted_handover_loss": None if new is None else new["small_loss"],
                   "measured_final": v["final_eval_loss"], "scratch_final": b["scratch"]["final_eval_loss"],
                   "predicted_final_wsd": None if new is None else new["final_loss"],
                   "predicted_past_frontier": bool(new and new["at_least"]),
                   "predicted_final_frontiers": None if old is None else old["final_loss"]})
  return {"command": cli.command("benchmarks.wsd_predict"), "rate": a.rate, "rows": rows}


def table(d: dict) -> str:
  f = lambda x: "n/a" if x is None else f"{x:.4f}"
  lines = ["| run | T | small / target steps | hand-over loss, measured (predicted) | final loss measured | "
           "predicted (WSD curves) | predicted (decayed frontiers) | scratch |", "|---|---|---|---|---|---|---|---|"]
  for r in d["rows"]:
    lines.append(f"| {r['file']}:{r['variant']} | {r['steps']} | {r['small_steps']} / {r['big_steps']} | "
                 f"{r['handover_loss']:.4f} ({f(r['predicted_handover_loss'])}) | {r['measured_final']:.4f} | "
                 f"{'below the frontier' if r.get('predicted_past_frontier') else f(r['predicted_final_wsd'])} | "
                 f"{f(r['predicted_final_frontiers'])} | {r['scratch_final']:.4f} |")
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run_report(define_flags, measure, table)
