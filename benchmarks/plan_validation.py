"""How close the planner's predictions came: every measured plan's predicted saving beside its seeds' savings.

  python -m benchmarks.plan_validation --checks=benchmarks/results/plan_validation_checks.txt \
      --out=benchmarks/results/plan_validation.json

--checks lists one measured plan per line, ``FAMILY CORPUS TOKENS_PER_PARAM PLAN SEEDS`` (paths relative to the
file; ``#`` starts a comment): PLAN is the ``plan.json`` that ``experiments.plan`` wrote (its
``plan.predicted_saving``), SEEDS the ``benchmarks.seeds_shifted`` rows of its runs (each seed's saving on the fitted
frontier the plan was priced from, shifted by that seed's own scratch run). Per plan: the seeds' mean, range and
standard error, the error (measured mean minus predicted, in points of the saving), and whether it lies within 5
points (the long-budget issue's bar) and whether the prediction lies inside the 95% interval of the seeds' mean
(Student's t over the seeds: what they can tell apart; with three seeds it is 4.3 standard errors wide either way). A
seed whose run ended past the frontier's reach has no saving to read (``unread``) and is left out of the mean; where
it ended below that reach, what it saved at least is shown (``unread_at_least``). Then, per
family, per method and over all plans: the mean absolute error and the mean error (its sign: + the plans saved more
than predicted); and for the stacking plans that checked where they hand over against where their rates were
measured (``plan.rates_near``), the plans whose every hand-over lay within ``stack_planner.RATES_SPAN`` of it
(``near``) apart from those with one or more further off (``far``).

``--excess=FAMILY:CORPUS:STEPS:KIND=NATS`` asks what a prediction would have been had the plan's target gained NATS
more in its cool-down than scratch does from the same loss (``benchmarks.stack_rates`` reads this *cool-down excess*
off finished runs; KIND is the plan's method, ``vcycle`` or ``stackbert``): the plan ends NATS lower, read on the
seeds' fitted frontier (saving' = 1 - (1 - saving) F(L_T) / F(L_T - NATS), L_T the fit's loss at the budget), beside
the errors without it, over the plans it covers (seeds read on the measured frontier carry their summary's fit too,
which this uses; for BERT's long-budget points that fit is poor, 0.048 nats rms).
"""

from __future__ import annotations

import os
import statistics

from absl import app, flags

from benchmarks import cli
from benchmarks.seeds_shifted import interval95, standard_error
from multilevel.cycles.plan_report import method_kind

BAR = 0.05  # The long-budget issue's bar: predicted within 5 points of the measured saving.


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("checks", "", "Text file: FAMILY CORPUS TOKENS_PER_PARAM PLAN SEEDS per line.", flag_values=fv)
  flags.DEFINE_multi_string("excess", [], "FAMILY:CORPUS:STEPS:KIND=NATS: a cool-down excess to re-read those "
                            "plans' predictions with.", flag_values=fv)
  flags.DEFINE_string("out", "", "JSON to write the table to.", flag_values=fv)


def read_checks(path: str) -> list[dict]:
  """The lines of a checks file as dicts (paths made absolute against the file's folder)."""
  if not os.path.exists(path):
    raise app.UsageError(f"--checks={path}: no such file.")
  base, out = os.path.dirname(os.path.abspath(path)), []
  with open(path) as f:
    for n, line in enumerate(f, 1):
      words = line.split("#", 1)[0].split()
      if not words:
        continue
      if len(words) != 5:
        raise app.UsageError(f"{path}:{n}: expected FAMILY CORPUS TOKENS_PER_PARAM PLAN SEEDS, got {line.strip()!r}.")
      family, corpus, tpp, plan, seeds = words
      try:
        tpp = float(tpp)
      except ValueError:
        raise app.UsageError(f"{path}:{n}: tokens per parameter {tpp!r} is not a number.") from None
      out.append({"family": family, "corpus": corpus, "tokens_per_param": tpp,
                  "plan": os.path.join(base, plan), "seeds": os.path.join(base, seeds)})
  if not out:
    raise app.UsageError(f"--checks={path}: no plan listed.")
  return out


def check(c: dict, plan: dict, seeds: dict) -> dict:
  """One plan's prediction against its seeds (``plan`` and ``seeds``: the files ``c`` names, read)."""
  predicted = (plan.get("plan") or {}).get("predicted_saving")
  if not isinstance(predicted, (int, float)):
    raise app.UsageError(f"plan {c['plan']}: no plan.predicted_saving (is it a plan.json of experiments.plan?).")
  rows = seeds.get("rows")
  if not isinstance(rows, list) or not rows:
    raise app.UsageError(f"seeds {c['seeds']}: no rows (is it the output of benchmarks.seeds_shifted?).")
  if seeds.get("budget") is not None and plan.get("steps") is not None and seeds["budget"] != plan["steps"]:
    raise app.UsageError(f"{c['seeds']} reads budget {seeds['budget']}, but {c['plan']} plans {plan['steps']} steps.")
  read = [(r["seed"], r["saving"]) for r in rows if r.get("saving") is not None]
  if not read:
    raise app.UsageError(f"seeds {c['seeds']}: no seed has a saving to read (every run ended past the fit).")
  s = [x for _, x in read]
  mean = statistics.mean(s)
  se = standard_error(s)
  half = interval95(s)  # The 95% interval's half-width.
  err = mean - predicted
  try:
    near = rates_near(plan["plan"])
  except ValueError as e:
    raise app.UsageError(f"plan {c['plan']}: {e}; re-make it with experiments.plan, or drop its rates_near.") from None
  return {"family": c["family"], "corpus": c["corpus"], "tokens_per_param": c["tokens_per_param"],
          "plan": os.path.basename(c["plan"]), "seeds_file": os.path.basename(c["seeds"]),
          "method": plan["plan"].get("method"), "rates_near": near, "steps": plan.get("steps"),
          "predicted": predicted,
          "seeds": [{"seed": k, "saving": x} for k, x in read], "unread": [r["seed"] for r in rows
                                                                           if r.get("saving") is None],
          "unread_at_least": [r.get("saving_at_least") for r in rows if r.get("saving") is None],
          "n": len(s), "mean": mean, "min": min(s), "max": max(s), "se": se, "ci95": half, "error": err,
          "within_bar": abs(err) <= BAR, "within_ci": None if half is None else abs(err) <= half}


def rates_near(plan: dict) -> str | None:
  """'near' where every hand-over of a stacking plan lies within its span of where its doubling's rate was measured
  (``stack_planner.rates_near``), 'far' where one does not, None where the plan did not check (a V-cycle, or stacking
  planned without the losses its rates were measured from)."""
  near = plan.get("rates_near")
  if not near:
    return None
  if not isinstance(near, list) or not all(isinstance(r, dict) and isinstance(r.get("far"), bool) for r in near):
    raise ValueError("plan.rates_near is not a list of hand-overs each with a true/false 'far' (as "
                     "experiments.plan writes it)")
  return "far" if any(r["far"] for r in near) else "near"


def summarize(rows: list[dict]) -> dict:
  """Mean absolute and mean signed error, the counts within the bar and inside the seeds' 95% interval."""
  errs = [r["error"] for r in rows]
  noisy = [r for r in rows if r["within_ci"] is not None]
  return {"plans": len(rows), "mean_abs_error": statistics.mean(abs(e) for e in errs),
          "mean_error": statistics.mean(errs), "within_bar": sum(r["within_bar"] for r in rows),
          "within_ci": sum(bool(r["within_ci"]) for r in noisy), "with_ci": len(noisy)}


def parse_excess(items) -> dict:
  """``--excess`` as {(family, corpus, steps, kind): nats}."""
  out = {}
  for item in items or ():
    key, eq, value = item.rpartition("=")
    parts = key.split(":")
    try:
      if not eq or len(parts) != 4 or parts[3] not in ("vcycle", "stackbert"):
        raise ValueError
      out[(parts[0], parts[1], int(parts[2]), parts[3])] = float(value)
    except ValueError:
      raise app.UsageError(f"--excess takes FAMILY:CORPUS:STEPS:KIND=NATS with KIND vcycle or stackbert, got "
                           f"{item!r}.") from None
  return out


def with_excess(r: dict, plan: dict, fit: dict, nats: float) -> float:
  """The plan's predicted saving had its target ended ``nats`` lower than priced, read on the seeds' fit
  L(F) = E + A F^-a."""
  e, amp, a = fit["E"], fit["A"], fit["a"]
  budget = plan["predicted_flops"] / (1 - r["predicted"])
  cost = lambda loss: (amp / (loss - e)) ** (1 / a)
  goal = e + amp * budget ** -a
  if goal - nats <= e:
    raise app.UsageError(f"--excess={nats:g} for {r['plan']} puts its final loss under the fit's floor E={e:.3f}.")
  return 1 - (1 - r["predicted"]) * cost(goal) / cost(goal - nats)


def _excess_rows(rows: list[dict], checks: list[dict], docs: list[tuple[dict, dict]], excess: dict) -> dict | None:
  """Adds ``excess`` / ``predicted_excess`` / ``error_excess`` to the rows ``excess`` covers; the errors over them."""
  if not excess:
    return None
  covered = []
  for r, c, (plan, seeds) in zip(rows, checks, docs):
    nats = excess.get((r["family"], r["corpus"], r["steps"], method_kind(r["method"])))
    if nats is None:
      continue
    if not seeds.get("fit"):
      raise app.UsageError(f"seeds {c['seeds']}: no fit to read an excess on.")
    r["excess"], r["predicted_excess"] = nats, with_excess(r, plan["plan"], seeds["fit"], nats)
    r["error_excess"] = r["mean"] - r["predicted_excess"]
    covered.append(r)
  unused = set(excess) - {(r["family"], r["corpus"], r["steps"], method_kind(r["method"])) for r in covered}
  if unused:
    raise app.UsageError(f"--excess names no listed plan: {sorted(unused)}.")
  mae = lambda k: statistics.mean(abs(r[k]) for r in covered)
  return {"plans": len(covered), "mean_abs_error": mae("error"), "mean_abs_error_excess": mae("error_excess"),
          "within_bar": sum(abs(r["error"]) <= BAR for r in covered),
          "within_bar_excess": sum(abs(r["error_excess"]) <= BAR for r in covered)}


def measure(a) -> dict:
  if not a.checks:
    raise app.UsageError("Give --checks (a file of FAMILY CORPUS TOKENS_PER_PARAM PLAN SEEDS lines).")
  excess = parse_excess(getattr(a, "excess", None))
  checks = read_checks(a.checks)
  # Each file read once.
  docs = [(cli.read_report(c["plan"], "plan "), cli.read_report(c["seeds"], "seeds ")) for c in checks]
  rows = [check(c, *d) for c, d in zip(checks, docs)]
  whatif = _excess_rows(rows, checks, docs, excess)
  families = sorted({r["family"] for r in rows})
  kinds = sorted({method_kind(r["method"]) for r in rows})
  return {"command": cli.command("benchmarks.plan_validation"), "bar": BAR, "rows": rows,
          "by_family": {f: summarize([r for r in rows if r["family"] == f]) for f in families},
          "by_method": {k: summarize([r for r in rows if method_kind(r["method"]) == k]) for k in kinds},
          "by_rates_near": {k: summarize([r for r in rows if r["rates_near"] == k]) for k in ("near", "far")
                            if any(r["rates_near"] == k for r in rows)},
          "all": summarize(rows), **({"excess": whatif} if whatif else {})}


def table(d: dict) -> str:
  pct = lambda x: f"{100 * x:+.1f}"
  lines = ["| family | corpus | tokens/param | plan | method | predicted | measured mean [min, max] (seeds) | "
           "error (points) | 95% interval (points, either way) | within 5 | inside the interval |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in d["rows"]:
    bounds = [x for x in r.get("unread_at_least", ()) if x is not None]
    seeds = f"{r['n']}" + (f", {len(r['unread'])} past the frontier" if r["unread"] else "") + (
        f": at least {', '.join(pct(x) for x in bounds)}" if bounds else "")
    ci = "" if r["ci95"] is None else f"{100 * r['ci95']:.1f}"
    yes = lambda b: "" if b is None else ("yes" if b else "**no**")
    lines.append(f"| {r['family']} | {r['corpus']} | {r['tokens_per_param']:g} | {r['plan']} | {r['method']} | "
                 f"{pct(r['predicted'])}% | {pct(r['mean'])}% [{pct(r['min'])}, {pct(r['max'])}] ({seeds}) | "
                 f"{100 * r['error']:+.1f} | {ci} | {yes(r['within_bar'])} | {yes(r['within_ci'])} |")
  lines += ["", "| | plans | mean absolute error (points) | mean error | within 5 points | inside the 95% interval |",
            "|---|---|---|---|---|---|"]
  groups = (list(d["by_family"].items()) + list(d["by_method"].items())
            + [(f"stacking, hand-overs {k} where the rates were measured", v)
               for k, v in d.get("by_rates_near", {}).items()] + [("all", d["all"])])
  for name, s in groups:
    lines.append(f"| {name} | {s['plans']} | {100 * s['mean_abs_error']:.1f} | {100 * s['mean_error']:+.1f} | "
                 f"{s['within_bar']} of {s['plans']} | {s['within_ci']} of {s['with_ci']} |")
  w = d.get("excess")
  if w:
    lines += ["", "| plan | cool-down excess (nats) | predicted | with the excess | measured | error | with the excess |",
              "|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
      if "excess" in r:
        lines.append(f"| {r['plan']} | {r['excess']:+.3f} | {pct(r['predicted'])}% | {pct(r['predicted_excess'])}% | "
                     f"{pct(r['mean'])}% | {100 * r['error']:+.1f} | {100 * r['error_excess']:+.1f} |")
    lines.append(f"\nOver these {w['plans']} plans: mean absolute error {100 * w['mean_abs_error']:.1f} points, "
                 f"{100 * w['mean_abs_error_excess']:.1f} with the excess; within 5 points {w['within_bar']}, "
                 f"{w['within_bar_excess']} with it.")
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run_report(define_flags, measure, table)
