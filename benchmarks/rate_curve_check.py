"""Would a rate curve have predicted the stacking plans that missed? Re-prices finished plans' schedules with rates
read off a curve of measured rates (``growth.RateCurve``) instead of the one rate each plan was priced with.

  python -m benchmarks.rate_curve_check \
      --target=<the target's WSD scratch results> --levels=<1-layer level file>,<2-layer level file> \
      --plans=plan_a.json,plan_b.json --rates=stack_rates_a.json,stack_rates_b.json \
      --seeds=seeds_a_own_fit.json,seeds_b_own_fit.json --pool=stack_rates_recipe.json \
      --out=benchmarks/results/rate_curve_check_X.json

--plans are ``experiments.plan`` outputs of stacking plans; --rates the ``benchmarks.stack_rates`` readings of each
plan's own runs (a file may hold several plans' runs: a plan's rows are those at its budget); --seeds each plan's
``benchmarks.seeds_shifted`` reading (its seeds' mean saving). Each plan's schedule, held as it ran, is priced
(``stack_planner.predict_stack``) three ways: with the rates the plan was priced with (this reproduces its
prediction; the curves of the files it names where it was priced with --stack_rate_curves), with curves through
every measured doubling of --rates and --pool (in sample: its own runs included; --kind: which rate), and with
curves through all but its own runs (left out: what a planner with the other runs would have said). Each beside the
measured mean, in points of the saving.
"""

from __future__ import annotations

import os
import statistics

from absl import app, flags

from benchmarks import cli


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_list("target", [], "benchmarks.saving results with the target's WSD scratch runs (the plans' "
                    "--target_from).", flag_values=fv)
  flags.DEFINE_list("levels", [], "benchmarks.bound level runs of the shallower models at the target's rate, "
                    "shallowest first (the plans' --stack_from).", flag_values=fv)
  flags.DEFINE_list("plans", [], "plan.json files of stacking plans that were run.", flag_values=fv)
  flags.DEFINE_list("rates", [], "benchmarks.stack_rates results of each plan's runs, one per --plans entry.",
                    flag_values=fv)
  flags.DEFINE_list("seeds", [], "benchmarks.seeds_shifted readings of each plan's runs, one per --plans entry.",
                    flag_values=fv)
  flags.DEFINE_list("pool", [], "More benchmarks.stack_rates results whose rows join every curve (runs that are not "
                    "plans, e.g. a hand-set recipe).", flag_values=fv)
  flags.DEFINE_enum("kind", "fit", ["fit", "overall", "trajectory"], "What the curves go through: 'fit' (rate and "
                    "delay fitted to the grown model's evals: experiments.plan --stack_curve_kind=rate), 'overall' "
                    "(the plain ratio over its stage, no delay) or 'trajectory' (the way it went, eval by eval: "
                    "--stack_curve_kind=trajectory).", flag_values=fv)
  flags.DEFINE_integer("seed", None, "Also hold each price against this seed's saving alone (the seed whose scratch "
                       "runs are --target: what the pricing can be asked to match, without the other seeds' spread).",
                       flag_values=fv)
  flags.DEFINE_float("cooldown_frac", 0.2, "train.cooldown_frac of the scratch runs the budgets are of.",
                     flag_values=fv)
  flags.DEFINE_string("out", "", "JSON to write the check to.", flag_values=fv)


def priced_with(d: dict) -> list[dict]:
  """The measured doublings a plan was priced off (``experiments.plan --stack_rate_curves``: the files it names),
  or none: it was priced at its constant ``stack_rates``."""
  from experiments import plan_stacking
  files = (d.get("stack_rate_curves") or {}).get("files") or []
  return plan_stacking.curve_rows(files) if files else []


def error_summary(errs: list[float]) -> dict:
  """Errors in points of the saving (measured minus priced): their mean absolute value, their mean (None without
  any), how many lie within 5 points (the long-budget issue's bar) and how many there are."""
  return {"mean_abs": statistics.mean(abs(e) for e in errs) if errs else None,
          "mean": statistics.mean(errs) if errs else None, "within_5": sum(abs(e) <= 5 for e in errs), "n": len(errs)}


def check(a) -> dict:
  from experiments import plan_stacking
  from multilevel.cycles import planner, stack_planner
  if not a.target or not a.levels or not a.plans:
    raise app.UsageError("Give --target, --levels and --plans (with --rates and --seeds, one per plan).")
  if not len(a.plans) == len(a.rates) == len(a.seeds):
    raise app.UsageError(f"--plans, --rates and --seeds go one per plan: got {len(a.plans)}, {len(a.rates)} and "
                         f"{len(a.seeds)}.")
  target, step, _ = planner.target_from_saving(a.target)
  wsd = planner.Wsd(planner.target_stable_from_saving(a.target, a.cooldown_frac), a.cooldown_frac)
  levels = plan_stacking.levels_from_files(a.levels, None)
  names = [c.name for c in levels]
  pool = plan_stacking.curve_rows(a.pool) if a.pool else []
  own = []
  for p, r in zip(a.plans, a.rates):
    budget = cli.read_report(p)["steps"]
    own.append([row for row in plan_stacking.curve_rows([r]) if row["T"] == budget])
  if a.kind == "overall":
    pool = [{**r, "rate": r["overall"], "delay": 0.0} for r in pool]
    own = [[{**r, "rate": r["overall"], "delay": 0.0} for r in rows] for rows in own]
  everything = pool + [row for rows in own for row in rows]
  rows_out, left_off = [], set()
  for i, (p, s) in enumerate(zip(a.plans, a.seeds)):
    d, seeds = cli.read_report(p), cli.read_report(s)
    plan = d["plan"]
    if not str(plan.get("method", "")).startswith("stackbert"):
      raise app.UsageError(f"{p}: the plan is {plan.get('method')!r}, not a stacking plan.")
    steps = d["steps"]
    lower = [0] * len(levels)
    for name, n in zip(plan["levels"], plan["stage_steps"][:-1]):
      lower[names.index(name)] = n
    big = plan["stage_steps"][-1]
    rates, delays = plan["stack_rates"], plan["stack_delays"]

    def price(rows, kind=a.kind):
      curves = None
      if rows:
        curves, _, off = plan_stacking.rate_curves(rows, levels, "trajectory" if kind == "trajectory" else "rate")
        left_off.update((o["run"], o["doubling"]) for o in off)
      r = stack_planner.predict_stack(target, wsd, levels, step, steps, rates, lower, big, delays=delays,
                                      rate_curves=curves)
      return None if r is None or r.get("final_loss") is None else r["saving"]

    left_out = pool + [row for j, rows in enumerate(own) if j != i for row in rows]
    measured = seeds["mean"]
    got = {"plan": os.path.basename(p), "steps": steps, "stages": plan["stage_steps"],
           "predicted": plan["predicted_saving"],
           "as_priced": price(priced_with(d), (d.get("stack_rate_curves") or {}).get("kind")),
           "curve_in_sample": price(everything),
           "curve_left_out": price(left_out), "measured": measured, "measured_range": [seeds["min"], seeds["max"]],
           "own_runs": len(own[i])}
    one = [r["saving"] for r in seeds.get("rows", []) if a.seed is not None and r.get("seed") == a.seed]
    if a.seed is not None and not one:
      raise app.UsageError(f"{s}: no row of seed {a.seed}.")
    for k in ("predicted", "curve_in_sample", "curve_left_out"):
      got[f"error_{k}"] = None if got[k] is None else 100 * (measured - got[k])
      if one:
        got[f"seed_error_{k}"] = None if got[k] is None else 100 * (one[0] - got[k])
    if one:
      got["measured_seed"] = one[0]
    rows_out.append(got)
  summary = {}
  for against in ("", "seed_") if a.seed is not None else ("",):
    for k in ("predicted", "curve_in_sample", "curve_left_out"):
      errs = [r[f"{against}error_{k}"] for r in rows_out if r[f"{against}error_{k}"] is not None]
      summary[f"{k}{' against seed ' + str(a.seed) if against else ''}"] = error_summary(errs)
  return {"command": cli.command("benchmarks.rate_curve_check"), "kind": a.kind, "rows": rows_out,
          "summary": summary, "off_curve": sorted(list(x) for x in left_off)}


def table(d: dict) -> str:
  pct = lambda x: "n/a" if x is None else f"{100 * x:+.1f}%"
  pts = lambda x: "n/a" if x is None else f"{x:+.1f}"
  lines = ["| plan | T | stages | predicted (its rates) | curve, in sample | curve, its runs left out | "
           "measured (mean of seeds) | errors (measured - each) |", "|---|---|---|---|---|---|---|---|"]
  for r in d["rows"]:
    lines.append(f"| {r['plan']} | {r['steps']} | {' / '.join(str(n) for n in r['stages'])} | {pct(r['predicted'])} "
                 f"| {pct(r['curve_in_sample'])} | {pct(r['curve_left_out'])} | {pct(r['measured'])} | "
                 f"{pts(r['error_predicted'])} / {pts(r['error_curve_in_sample'])} / "
                 f"{pts(r['error_curve_left_out'])} |")
  for k, s in d["summary"].items():
    lines.append(f"\n{k}: mean absolute error {pts(s['mean_abs'])} points, mean {pts(s['mean'])}, "
                 f"{s['within_5']} of {s['n']} within 5")
  if d.get("off_curve"):
    lines.append(f"\nleft out of the curves (handed over where the smaller model's pilot does not reach): "
                 f"{', '.join(f'{run} ({what})' for run, what in d['off_curve'])}")
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run_report(define_flags, check, table)
