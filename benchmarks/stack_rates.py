"""How fast each stacked model learns, from finished stacking runs: the rates and delays the stacking plan prices with.

  python -m benchmarks.stack_rates \
      --target=benchmarks/results/gcide_gpt_wsd_lr4e-3.json,benchmarks/results/gcide_gpt_wsd_lr4e-3_frontier.json \
      --levels=benchmarks/results/bound_gcide_gpt_depth_L2_lr1_curve.json,benchmarks/results/bound_gcide_gpt_depth_L1_lr1_curve.json+benchmarks/results/bound_gcide_gpt_depth_L1.json \
      --runs=benchmarks/results/gcide_gpt_wsd_lr4e-3_stackbert_long_scaled.json \
      --out=benchmarks/results/stack_rates_gcide_gpt.json

For each stacking variant in --runs (``benchmarks.saving`` results under ``train.decay='wsd'``): per doubling, the
stacked model's position on its own stable curve (the target's longest WSD scratch run of --target; the shallower
models' level runs of --levels, shallowest first, at the target's rate) against the steps it trained, from the last
eval before the growth to its last eval before the cool-down, fitted as rate x (steps - delay)
(``multilevel.cycles.stack_planner.stack_rates``; a doubling with fewer than ``growth.MIN_EVALS`` such evals is shown
and left out). Their means are what ``experiments.plan --stack_rates
--stack_delays`` take, with the mean loss before each doubling (``--stack_rates_at``: the plan says where it hands
over far from it).

Per run it also reads the cool-down (``cooldowns``): the target's last eval before it (the knee), its final loss, and
the loss the target's decayed frontier gives for the knee's place on the stable curve plus the FLOPs the run spent
after the knee, which is what the plan prices a cool-down at. ``excess`` (nats) is how much lower the run ended than
that: a stacked model that gains more in its cool-down than scratch does from the same loss shows a positive one.
"""

from __future__ import annotations

import json
import os
import statistics

from absl import app, flags

from benchmarks import cli


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_list("target", [], "benchmarks.saving results with the target's WSD scratch runs.", flag_values=fv)
  flags.DEFINE_list("levels", [], "benchmarks.bound level runs of the shallower models at the target's rate, "
                    "shallowest first ('a.json+b.json' pools one model's files).", flag_values=fv)
  flags.DEFINE_list("runs", [], "benchmarks.saving results with stacking variants run under WSD.", flag_values=fv)
  flags.DEFINE_list("variants", [], "Only these variants of --runs (default every one with a curve).", flag_values=fv)
  flags.DEFINE_float("cooldown_frac", 0.2, "train.cooldown_frac of the scratch runs the budgets are of.",
                     flag_values=fv)
  flags.DEFINE_string("out", "", "JSON to write the rates to.", flag_values=fv)


def measure(a) -> dict:
  from multilevel.cycles import growth, planner, stack_planner
  if not a.target or not a.levels or not a.runs:
    raise app.UsageError("Give --target (WSD scratch results), --levels (the shallower models' level runs) and --runs.")
  target, step, _ = planner.target_from_saving(a.target)
  stable = planner.target_stable_from_saving(a.target, a.cooldown_frac)
  try:
    levels = [planner.candidate_from_bound(p, None, True, lr_scale=1.0) for p in a.levels]
  except (ValueError, OSError) as e:
    raise app.UsageError(f"--levels: {e}") from None
  stables, steps_of = stack_planner.by_level(stable, step, levels)
  rows, by_level, cooldowns = [], {}, []
  for path in a.runs:
    with open(path) as f:
      d = json.load(f)
    for b in d["budgets"]:
      for name, v in b.get("variants", {}).items():
        if not v.get("curve") or (a.variants and name not in a.variants):
          continue
        # A planned run's cool-down is the budget's (its train.steps may differ): it starts that far from the end.
        knee = v["total_flops"] - a.cooldown_frac * b["steps"] * step
        for r in stack_planner.stack_rates(v["curve"], stables, steps_of, knee):
          if r is None:
            continue
          used = growth.enough_evals(r)  # Fewer evals cannot tell the delay from the rate.
          rows.append({"run": os.path.basename(path), "T": b["steps"], "variant": name, "level": r["level"],
                       "handover_loss": r["handover_loss"], "rate": r["rate"], "delay": r["delay"],
                       "overall": r["overall"], "steps_measured": round(r["flops"] / steps_of[r["level"]]),
                       "evals": r["evals"], "used": used,
                       "trajectory": [[round(t, 1), round(l, 4), round(q, 1)] for t, l, q in r["trajectory"]]})
          if used:
            by_level.setdefault(r["level"], []).append(r)
        c = cooldown(v["curve"], v["total_flops"], knee, stable, target)
        if c is not None:
          cooldowns.append({"run": os.path.basename(path), "T": b["steps"], "variant": name, **c})
  n = len(levels)
  mean = lambda k, lv: statistics.mean(r[k] for r in by_level[lv]) if by_level.get(lv) else None
  out = {"command": cli.command("benchmarks.stack_rates"), "rows": rows,
         "rates": [mean("rate", lv) for lv in range(n - 1, -1, -1)],  # Shallowest growth first, the target's last.
         "delays": [mean("delay", lv) for lv in range(n - 1, -1, -1)],
         "at": [mean("handover_loss", lv) for lv in range(n - 1, -1, -1)], "cooldowns": cooldowns}
  return out


def cooldown(curve, total_flops: float, knee: float, stable, target) -> dict | None:
  """The cool-down of a run whose ``curve`` (rows of FLOPs, seconds, eval loss, level) ends in the target (level
  0): its last target eval at or before ``knee`` FLOPs, its final eval, and the target's decayed frontier read at
  the knee's place on ``stable`` plus the FLOPs after the knee. None where a curve does not reach."""
  at_knee = [p for p in curve if int(p[3]) == 0 and p[0] <= knee * (1 + 1e-9)]
  if not at_knee or int(curve[-1][3]) != 0:
    return None
  k, final = at_knee[-1], curve[-1][2]
  pos = stable.cost(k[2])
  priced = None if pos is None else target.loss_at(pos + total_flops - k[0])
  return {"knee_loss": k[2], "final_loss": final, "priced_final": priced,
          "excess": None if priced is None else priced - final}


def table(d: dict) -> str:
  lines = ["| run | T | variant | into level | hand-over loss | rate | delay (steps) | overall | steps measured | "
           "evals |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in d["rows"]:
    evals = f"{r['evals']}" + ("" if r.get("used", True) else " (too few: not in the means)")
    lines.append(f"| {r['run']} | {r['T']} | {r['variant']} | {r['level']} | {r['handover_loss']:.3f} | "
                 f"{r['rate']:.2f} | {r['delay']:.0f} | {r['overall']:.2f} | {r['steps_measured']} | {evals} |")
  if any(r.get("trajectory") for r in d["rows"]):
    lines += ["", "Each stacked model's way along its own scratch curve, as (steps since its growth: scratch steps "
              "moved from the loss it took over); a constant rate is a straight line through them:", "",
              "| run | T | into level | trajectory |", "|---|---|---|---|"]
    for r in d["rows"]:
      way = ", ".join(f"{t:.0f}: {q:.0f}" for t, _, q in r.get("trajectory") or [])
      lines.append(f"| {r['run']} | {r['T']} | {r['level']} | {way} |")
  fmt = lambda xs: ",".join("?" if x is None else f"{x:.3g}" for x in xs)
  lines.append(f"\n--stack_rates={fmt(d['rates'])} --stack_delays={fmt(d['delays'])}"
               + (f" --stack_rates_at={fmt(d['at'])}" if d.get("at") else ""))
  cools = d.get("cooldowns") or []
  if cools:
    lines += ["", "| run | T | variant | loss at the cool-down's start | final loss | priced from there | excess (nats) |",
              "|---|---|---|---|---|---|---|"]
    num = lambda x: "n/a" if x is None else f"{x:.3f}"
    for c in cools:
      lines.append(f"| {c['run']} | {c['T']} | {c['variant']} | {c['knee_loss']:.3f} | {c['final_loss']:.3f} | "
                   f"{num(c['priced_final'])} | {num(c['excess'])} |")
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run_report(define_flags, measure, table)
