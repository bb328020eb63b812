"""A stacking plan priced seed by seed, against the mean of its seeds: the per-seed re-pricings of
``benchmarks.rate_curve_check`` (one file per seed, each priced on that seed's own scratch runs, pilots and the
growths its own runs measured, ``--seed`` that seed) combined plan by plan.

  python -m benchmarks.seed_pricing --checks=rate_curve_check_X_own_s42.json,..._own_s1.json,..._own_s2.json \
      --out=benchmarks/results/seed_pricing_X.json

Per plan: the mean over the seeds of each seed's price (with that plan's own runs left out of its curves, and in
sample), beside the mean of the seeds' measured savings and the plan's recorded prediction (priced on one seed), in
points of the saving; a plan that some seed's curves cannot price has no mean. Then over the plans: the mean absolute
error, the mean error and how many lie within 5 points (the long-budget issue's bar).
"""

from __future__ import annotations

import statistics

from absl import app, flags

from benchmarks import cli
from benchmarks.rate_curve_check import error_summary


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_list("checks", [], "benchmarks.rate_curve_check outputs, one per seed, each run with --seed=that seed "
                    "on that seed's own files.", flag_values=fv)
  flags.DEFINE_string("out", "", "JSON to write the combination to.", flag_values=fv)


def _load(path: str) -> dict:
  d = cli.read_report(path)
  if not isinstance(d, dict) or not all("measured_seed" in r for r in d.get("rows", [])) or not d.get("rows"):
    raise app.UsageError(f"{path}: not a benchmarks.rate_curve_check output run with --seed (no rows with "
                         f"'measured_seed').")
  return d


def combine(checks: list[dict]) -> dict:
  """The plans every check priced, each with the seeds' mean price and measured saving (see the module's text)."""
  if len(checks) < 2:
    raise app.UsageError("Give one check per seed, two seeds or more.")
  by_seed = [{r["plan"]: r for r in c["rows"]} for c in checks]
  plans = [p for p in by_seed[0] if all(p in s for s in by_seed[1:])]
  if not plans:
    raise app.UsageError("The checks share no plan: give checks of the same plans at different seeds.")
  mean = lambda xs: None if any(x is None for x in xs) else statistics.mean(xs)
  rows = []
  for p in plans:
    rs = [s[p] for s in by_seed]
    measured = statistics.mean(r["measured_seed"] for r in rs)
    row = {"plan": p, "steps": rs[0]["steps"], "stages": rs[0]["stages"], "measured": measured,
           "measured_seeds": [r["measured_seed"] for r in rs], "recorded": rs[0]["predicted"],
           "left_out": mean([r["curve_left_out"] for r in rs]), "in_sample": mean([r["curve_in_sample"] for r in rs])}
    for k in ("recorded", "left_out", "in_sample"):
      row[f"error_{k}"] = None if row[k] is None else 100 * (measured - row[k])
    rows.append(row)
  summary = {}
  for k in ("recorded", "left_out", "in_sample"):
    summary[k] = error_summary([r[f"error_{k}"] for r in rows if r[f"error_{k}"] is not None])
  return {"seeds": len(checks), "rows": rows, "summary": summary}


def measure(a) -> dict:
  if not a.checks:
    raise app.UsageError("Give --checks: benchmarks.rate_curve_check outputs, one per seed.")
  return {"command": cli.command("benchmarks.seed_pricing"), "checks": list(a.checks),
          **combine([_load(p) for p in a.checks])}


def table(d: dict) -> str:
  pct = lambda x: "n/a" if x is None else f"{100 * x:+.1f}%"
  pts = lambda x: "n/a" if x is None else f"{x:+.1f}"
  lines = [f"| plan | T | stages | measured (mean of {d['seeds']} seeds) | recorded prediction | seeds' mean price, "
           "own runs left out | in sample | errors (measured - each) |", "|---|---|---|---|---|---|---|---|"]
  for r in d["rows"]:
    lines.append(f"| {r['plan']} | {r['steps']} | {' / '.join(str(n) for n in r['stages'])} | {pct(r['measured'])} "
                 f"| {pct(r['recorded'])} | {pct(r['left_out'])} | {pct(r['in_sample'])} | "
                 f"{pts(r['error_recorded'])} / {pts(r['error_left_out'])} / {pts(r['error_in_sample'])} |")
  for k, s in d["summary"].items():
    lines.append(f"\n{k}: mean absolute error {pts(s['mean_abs'])} points, mean {pts(s['mean'])}, "
                 f"{s['within_5']} of {s['n']} within 5")
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run_report(define_flags, measure, table)
