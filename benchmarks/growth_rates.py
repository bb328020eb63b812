"""How fast a grown model learns, from the curves of finished WSD runs: the growth rates the planner prices with.

  python -m benchmarks.growth_rates \
      --target=benchmarks/results/gcide_gpt_wsd_lr4e-3.json,benchmarks/results/gcide_gpt_wsd_lr4e-3_frontier.json \
      --runs=benchmarks/results/gcide_gpt_wsd_lr4e-3_vcycles.json,benchmarks/results/gcide_gpt_wsd_lr4e-3_vcycles2.json \
      --kind=depth_only_w0=depth,width_only_split=width,depth_zero=both \
      --out=benchmarks/results/growth_rates_gcide_gpt.json

For each variant of each budget in --runs (``benchmarks.saving`` results of V-cycles under ``train.decay='wsd'``):
the target's last growth (the last eval of a smaller level, then the eval right after growing), its evals before
the cool-down (the last ``cooldown_frac`` of the budget's steps), and where each of those losses sits on the target's
stable curve (the longest scratch run of --target before its cool-down). The rate is the distance moved on that
curve over the FLOPs spent (``multilevel.cycles.growth.growth_rate``): 1 = as fast as scratch from the same loss.
Rates are grouped by the growth each variant makes (--kind) into the mean and the range; give the means to
``experiments.plan --growth_rates``. A run whose target has fewer than ``growth.MIN_EVALS`` evals between its growth
and its cool-down (a short target stage) is shown and left out of the means: over so few steps eval noise decides
the rate.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from benchmarks import cli


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_list("target", [], "benchmarks.saving results with the target's WSD scratch runs (the longest one's "
                    "curve is the stable curve).", flag_values=fv)
  flags.DEFINE_list("runs", [], "benchmarks.saving results with V-cycle variants run under WSD.", flag_values=fv)
  flags.DEFINE_list("kind", [], "VARIANT=GROWTH (depth, width or both): the growth each variant's last transition "
                    "makes; variants not named are reported without a group.", flag_values=fv)
  flags.DEFINE_float("cooldown_frac", 0.2, "train.cooldown_frac of the runs.", flag_values=fv)
  flags.DEFINE_string("out", "", "JSON to write the rates to.", flag_values=fv)


def variant_rate(v: dict, steps: int, target_step: float, stable, cooldown_frac: float) -> dict | None:
  """The growth rate of one variant's run (its ``curve`` rows: FLOPs, seconds, eval loss, level)."""
  from multilevel.cycles.growth import growth_rate
  curve = v.get("curve") or []
  smaller = [i for i, p in enumerate(curve) if p[3] != 0]
  if not smaller or smaller[-1] == len(curve) - 1:
    return None
  hand = curve[smaller[-1]]
  jumps = v.get("handover_jumps") or []  # Rounded jumps in nats, one per growth (benchmarks.saving).
  landing = hand[2] + (jumps[-1] if jumps else 0.0)
  knee = v["total_flops"] - cooldown_frac * steps * target_step
  after = [(p[0], p[2]) for p in curve[smaller[-1] + 1:] if p[0] <= knee * (1 + 1e-9)]
  r = growth_rate([(hand[0], landing)] + after, stable)
  if r is None:
    return None
  return dict(r, handover_loss=hand[2], target_steps_measured=round(r["flops"] / target_step))


def measure(a) -> dict:
  from multilevel.cycles import growth
  from multilevel.cycles.planner import target_from_saving, target_stable_from_saving
  if not a.target or not a.runs:
    raise app.UsageError("Give --target (the target's WSD scratch results) and --runs (V-cycle results).")
  _, target_step, _ = target_from_saving(a.target)
  stable = target_stable_from_saving(a.target, a.cooldown_frac)
  kinds = {}
  for kv in a.kind:
    name, eq, kind = kv.partition("=")
    if not eq or kind not in ("depth", "width", "both"):
      raise app.UsageError(f"--kind takes VARIANT=GROWTH with GROWTH depth, width or both; got {kv!r}.")
    kinds[name] = kind
  rows = []
  for path in a.runs:
    with open(path) as f:
      d = json.load(f)
    for b in d["budgets"]:
      for name, v in b.get("variants", {}).items():
        r = variant_rate(v, b["steps"], target_step, stable, a.cooldown_frac)
        rows.append({"file": os.path.basename(path), "steps": b["steps"], "variant": name,
                     "growth": kinds.get(name), **(r or {"rate": None})})
  groups = {}
  for r in rows:
    r["used"] = growth.enough_evals(r)
    if r["growth"] and r["used"]:
      groups.setdefault(r["growth"], []).append(r["rate"])
  summary = {k: {"mean": sum(v) / len(v), "min": min(v), "max": max(v), "n": len(v)} for k, v in groups.items()}
  # Per budget too: a rate measured at the plan's own budget can differ from the mean over budgets (DeiT, both: 1.32
  # at T=1400 against 2.24 over all; re-planned with it, the prediction there held within 5 points).
  by_budget = {}
  for r in rows:
    if r["growth"] and r["used"]:
      by_budget.setdefault(r["growth"], {}).setdefault(str(r["steps"]), []).append(r["rate"])
  by_budget = {k: {t: sum(v) / len(v) for t, v in sorted(ts.items(), key=lambda kv: int(kv[0]))}
               for k, ts in by_budget.items()}
  return {"command": cli.command("benchmarks.growth_rates"), "cooldown_frac": a.cooldown_frac,
          "target_stable": stable.points, "rows": rows, "rates": summary, "by_budget": by_budget}


def table(d: dict) -> str:
  lines = ["| run | T | variant | growth | hand-over loss | landing | last loss before the cool-down | target steps | "
           "evals | rate |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in d["rows"]:
    if r["rate"] is None:
      lines.append(f"| {r['file']} | {r['steps']} | {r['variant']} | {r['growth'] or '-'} | | | | | | n/a |")
      continue
    evals = f"{r['evals']}" + ("" if r.get("used", True) else " (too few: not in the means)")
    lines.append(f"| {r['file']} | {r['steps']} | {r['variant']} | {r['growth'] or '-'} | {r['handover_loss']:.3f} | "
                 f"{r['landing_loss']:.3f} | {r['last_loss']:.3f} | {r['target_steps_measured']} | {evals} | "
                 f"{r['rate']:.2f} |")
  for k, s in sorted(d["rates"].items()):
    lines.append(f"\n{k}: mean rate {s['mean']:.2f} (min {s['min']:.2f}, max {s['max']:.2f}, {s['n']} runs)")
    per = (d.get("by_budget") or {}).get(k) or {}
    if len(per) > 1:
      lines.append("  by budget: " + ", ".join(f"T={t} {m:.2f}" for t, m in per.items()))
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run_report(define_flags, measure, table)
