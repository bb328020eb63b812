"""Savings of other seeds read on one seed's fitted frontier, shifted by how far each seed's own scratch run ends.

  python -m benchmarks.seeds_shifted --summary=benchmarks/results/gcide_gpt_tuned_wsd_fresh_summary.json \
      --budget=1400 --variant=planned \
      --seed=1:benchmarks/results/gcide_gpt_wsd_lr4e-3_planned_wsd_fresh_s1.json+benchmarks/results/gcide_gpt_wsd_lr8e-3_s1.json \
      --seed=2:...

A fitted frontier (``analyze_saving --fit``) costs five or more fully decayed scratch budgets per seed and learning
rate; a seed check of one method at one budget would cost several times the method's runs. So each further seed runs
scratch at that budget only (at each learning rate of the sweep, keeping its best) and the method, and is read on the
reference seed's fit moved by ``shift = best scratch loss of this seed - the reference seed's frontier loss at that
budget``: a method run ending at loss L with F FLOPs saves ``1 - F / F_fit(L - shift)``. This assumes another seed
moves the whole frontier by about as much as it moves the budget's point; the reference seed's own row is read on
its unshifted fit, as ``analyze_saving`` reads it, unless the reference seed is given as a ``--seed`` too (e.g. its
variant with a scratch run under another setting, ``ref.json+other.json``): then that row takes its place, shifted
like any other where its best scratch run ends lower than the frontier's point.

One scratch run's offset is noisy: on GPT at 42 tokens/param a seed's offset moved by 0.037 nats between 2800 and
3400 steps, about 10 points of saving. ``--shift_from=SEED:FILE[+FILE...]`` gives a seed's scratch runs at other
budgets where the reference frontier has points; its shift is then the mean of its offsets at all of them and at
--budget (each budget's best run against the frontier's point there), and the row lists them (``shift_budgets``).

``--read=measured`` reads on the reference seed's measured frontier instead (log-linear between its fully decayed
points, as the planner prices), for a family whose points follow no power law (BERT's masked-LM plateau, then a drop);
a chord between points far apart lies above a convex stretch and inflates what is read there. Either way, a run that
ends below what the frontier reaches gets no saving but a floor (``saving_at_least``).

Where a seed has a frontier of its own (its fully decayed scratch runs at several budgets, merged with its variant run
by ``analyze_saving``), ``--own=SEED:SUMMARY`` reads it there, unshifted: no assumption about how seeds move the
frontier, which matters where the seeds' frontiers differ in shape (LLaMA at β2 0.95: 0.11-0.20 nats between the
same two budgets), at the cost of a frontier per seed.

Besides the mean and the seeds' range, the output gives the half-width of the mean's 95% interval (``ci95``, Student's
t over the seeds read): a bar inside that interval is not cleared or missed by the mean, whatever side it lies on.
"""

from __future__ import annotations

import math
import statistics

import scipy.stats
from absl import app, flags

from benchmarks import cli
from benchmarks.frontiers import fitted_cost, frontier_cost
from multilevel.metrics import wall_seconds


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("summary", "", "analyze_saving output with a fitted frontier (--fit) of the reference seed, "
                      "holding the variant at --budget.", flag_values=fv)
  flags.DEFINE_integer("budget", 0, "The budget (train.steps) to read.", flag_values=fv)
  flags.DEFINE_string("variant", "planned", "The variant's name in the results files.", flag_values=fv)
  flags.DEFINE_multi_string("seed", [], "SEED:FILE[+FILE...]: benchmarks.saving results of that seed at --budget "
                            "(scratch at one or more learning rates, the variant in one of them).", flag_values=fv)
  flags.DEFINE_multi_string("own", [], "SEED:SUMMARY: an analyze_saving output whose frontier is that seed's own "
                            "scratch runs, holding its variant run at --budget: read there, unshifted.",
                            flag_values=fv)
  flags.DEFINE_multi_string("shift_from", [], "SEED:FILE[+FILE...]: that seed's scratch runs at other budgets "
                            "(benchmarks.saving results). Its shift becomes the mean, over --budget and each budget of "
                            "these files, of its best scratch loss there minus the reference frontier's point there: "
                            "one scratch run's noise at one budget moves its reading less.", flag_values=fv)
  flags.DEFINE_enum("read", "fit", ["fit", "measured"], "Where each saving is read: on the reference seed's fitted "
                    "frontier, or on its measured one (log-linear between the fully decayed points, as the planner "
                    "prices; None outside them) where the points are not a power law (BERT's masked-LM plateau).",
                    flag_values=fv)
  flags.DEFINE_string("out", "", "JSON to write the rows to.", flag_values=fv)


def standard_error(xs) -> float | None:
  """The standard error of the mean of ``xs``, None for fewer than two values."""
  xs = list(xs)
  return statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None


def interval95(xs) -> float | None:
  """The half-width of the 95% interval of the mean of ``xs`` (Student's t over len(xs) - 1 degrees of freedom: what
  that many seeds can tell apart; with three it is 4.3 standard errors either way), None for fewer than two."""
  xs = list(xs)
  se = standard_error(xs)
  return None if se is None else float(scipy.stats.t.ppf(0.975, len(xs) - 1)) * se


def _budget(d: dict, steps: int):
  return next((b for b in d["budgets"] if b["steps"] == steps), None)


def measure(a) -> dict:
  own_specs = getattr(a, "own", None) or []
  if not (a.summary and a.budget and (a.seed or own_specs)):
    raise app.UsageError("Give --summary, --budget and at least one --seed or --own.")
  ref, fit, points, ref_loss, b = _frontier(a, a.summary)
  shift_from = _shift_from(getattr(a, "shift_from", None) or [], ref, a.budget, {s.partition(":")[0] for s in a.seed})
  on = None if a.read == "measured" else fit  # The fit stays in the output either way (plan_validation --excess).
  rows = [{"seed": ref.get("seed"), "scratch": ref_loss, "shift": 0.0,
           **_read(on, points, b["variants"][a.variant], 0.0)}]
  for spec in a.seed:
    seed, _, files = spec.partition(":")
    scratch, run, beside = [], None, None
    for path in files.split("+"):
      d = cli.read_report(path, "--seed: ")
      e = _budget(d, a.budget)
      if e is None:
        raise app.UsageError(f"{path} has no budget of {a.budget} steps.")
      scratch.append(e["scratch"]["final_eval_loss"])
      if a.variant in e["variants"]:
        run, beside = e["variants"][a.variant], _beside(e, d)
    if run is None:
      raise app.UsageError(f"--seed={spec}: no {a.variant!r} run in these files.")
    shift = min(scratch) - ref_loss
    extra = {}
    if seed in shift_from:
      by_budget = {a.budget: shift, **shift_from[seed]}
      shift = sum(by_budget.values()) / len(by_budget)
      extra = {"shift_budgets": {str(k): v for k, v in sorted(by_budget.items())}}
    row = {"scratch": min(scratch), "shift": shift, **extra, **_read(on, points, run, shift)}
    # The reference seed with more scratch runs: read with them instead.
    _place(rows, seed, {**row, **_seconds(row, run, beside)}, ref)
  for spec in own_specs:
    seed, _, path = spec.partition(":")
    if not (seed and path):
      raise app.UsageError(f"--own={spec}: expected SEED:SUMMARY (e.g. 1:results/seed1_summary.json).")
    own, own_fit, own_points, own_loss, e = _frontier(a, path, flag="--own: ")
    run = e["variants"][a.variant]
    row = {"scratch": own_loss, "shift": 0.0, "frontier": path,
           **_read(None if a.read == "measured" else own_fit, own_points, run, 0.0)}
    _place(rows, seed, {**row, **_seconds(row, run, _beside(e, own))}, ref)
  savings = [r["saving"] for r in rows if r["saving"] is not None]
  return {"command": cli.command("benchmarks.seeds_shifted"), "budget": a.budget, "variant": a.variant, "fit": fit,
          "read": a.read,
          "rows": rows, "mean": sum(savings) / len(savings) if savings else None,
          "min": min(savings, default=None), "max": max(savings, default=None), "n": len(savings),
          "ci95": interval95(savings)}


def _shift_from(specs: list[str], ref: dict, budget: int, seeds: set[str]) -> dict:
  """--shift_from: per seed, {steps: its best scratch loss there - the reference frontier's point there} for every
  budget of its files but --budget (whose offset the --seed files give)."""
  points = {p["steps"]: p["final_eval_loss"] for p in (ref.get("frontier_from") or {}).get("points", [])}
  out = {}
  for spec in specs:
    seed, _, files = spec.partition(":")
    if not (seed and files):
      raise app.UsageError(f"--shift_from={spec}: expected SEED:FILE[+FILE...].")
    if seed not in seeds:
      raise app.UsageError(f"--shift_from={spec}: seed {seed} has no --seed; give its runs at --budget there.")
    best = {}
    for path in files.split("+"):
      for e in cli.read_report(path, "--shift_from: ").get("budgets", []):
        if e["steps"] != budget and "scratch" in e:
          best[e["steps"]] = min(best.get(e["steps"], math.inf), e["scratch"]["final_eval_loss"])
    if not best:
      raise app.UsageError(f"--shift_from={spec}: no scratch run at a budget other than {budget} steps.")
    missing = sorted(set(best) - set(points))
    if missing:
      raise app.UsageError(f"--shift_from={spec}: the reference frontier has no point at {missing} steps to measure "
                           f"the seed's offset against; its points are at {sorted(points)}.")
    out[seed] = {steps: loss - points[steps] for steps, loss in best.items()}
  return out


def _frontier(a, path: str, flag: str = ""):
  """An analyze_saving summary's frontier and its variant at --budget: (summary, flops fit or None, [(FLOPs, loss)]
  points, the point's loss at --budget, the budget's entry). ``flag`` names the option the path came from."""
  d = cli.read_report(path, flag)
  fit = (d.get("frontier_fit") or {}).get("flops")
  if a.read == "fit" and not fit:
    raise app.UsageError(f"{flag}{path} has no fitted frontier: merge with analyze_saving --fit, or read on the "
                         "measured one (--read=measured).")
  pts = (d.get("frontier_from") or {}).get("points", [])
  point = next((p for p in pts if p["steps"] == a.budget), None)
  b = _budget(d, a.budget)
  if point is None or b is None or a.variant not in b["variants"]:
    raise app.UsageError(f"{flag}{path} has no frontier point or no {a.variant!r} run at {a.budget} steps.")
  return d, fit, [(p["total_flops"], p["final_eval_loss"]) for p in pts], point["final_eval_loss"], b


def _beside(entry: dict, results: dict) -> dict | None:
  """The budget entry's scratch run where it trained by the same command as its variant, so their seconds compare
  (not read from another file, nor reused from the workroot: files written before scratch_reused was recorded say so
  only in their command); None otherwise."""
  reused = entry.get("scratch_from") or entry.get("scratch_reused") or "--reuse_scratch" in results.get("command", "")
  return None if reused else entry["scratch"]


def _place(rows: list, seed: str, row: dict, ref: dict) -> None:
  """Adds a seed's row; the reference seed's replaces the first row (read on the summary's own runs)."""
  row = {"seed": int(seed) if seed.lstrip("-").isdigit() else seed, **row}
  if str(seed) == str(ref.get("seed")):
    rows[0] = row
  else:
    rows.append(row)


def _read(fit, points, run: dict, shift: float) -> dict:
  """The run's saving on the fit (None for the measured frontier) at its loss moved by ``shift``. A run that ends
  below what the frontier reaches (under its lowest point; past twice its longest run on the fit) has no saving read,
  but at least ``saving_at_least``: scratch would need more than that reach's FLOPs."""
  loss = run["final_eval_loss"] - shift
  cost = frontier_cost(points, loss) if fit is None else fitted_cost(fit, loss, points)
  out = {"final_eval_loss": run["final_eval_loss"], "total_flops": run["total_flops"],
         "saving": None if cost is None else 1 - run["total_flops"] / cost}
  if cost is None:
    if fit is None:
      reach, lowest = min(points, key=lambda p: p[1])
      below = loss < lowest
    else:
      reach = 2.0 * max(c for c, _ in points)
      far = fitted_cost(fit, loss, points, extrapolate=math.inf)  # None under the fit's asymptote: never reached.
      below = far is None or far > reach
    if below:
      out["saving_at_least"] = 1 - run["total_flops"] / reach
  return out


def _seconds(row: dict, run: dict, scratch: dict | None) -> dict:
  """Seconds saved where the seed's scratch run trained in the same session as the method (a machine's speed drifts
  between sessions): scratch's seconds at the FLOPs the shifted fit says it needs for the method's loss (its seconds
  scaled by FLOPs: a scratch step costs the same throughout), against the method's own."""
  if scratch is None or row["saving"] is None or "train_seconds" not in scratch or "train_seconds" not in run:
    return {}
  needed = run["total_flops"] / (1 - row["saving"])  # The fit's FLOPs for the method's (shifted) loss.
  scratch_s = scratch["train_seconds"] * needed / scratch["total_flops"]
  return {"seconds": wall_seconds(run), "scratch_seconds": scratch["train_seconds"],
          "seconds_saving": 1 - wall_seconds(run) / scratch_s}


def table(d: dict) -> str:
  pct = lambda x: "n/a" if x is None else f"{100 * x:+.0f}%"
  on = "measured frontier" if d.get("read") == "measured" else "fit"
  own = any("frontier" in r for r in d["rows"])
  lines = [f"{d['variant']} at T={d['budget']}, read on the reference seed's {on} shifted per seed"
           + (f" ('own': on the seed's own {on})" if own else "") + ":",
           "| seed | best scratch | shift | final loss | FLOPs saved | seconds saved (same session) |",
           "|---|---|---|---|---|---|"]
  for r in d["rows"]:
    secs = (f"{pct(r['seconds_saving'])} ({r['seconds']:.1f} s; scratch {r['scratch_seconds']:.1f} s)"
            if "seconds_saving" in r else "-")
    saved = f"at least {pct(r['saving_at_least'])}" if "saving_at_least" in r else pct(r["saving"])
    shift = "own" if "frontier" in r else f"{r['shift']:+.4f}"
    lines.append(f"| {r['seed']} | {r['scratch']:.4f} | {shift} | {r['final_eval_loss']:.4f} | "
                 f"{saved} | {secs} |")
  line = f"mean {pct(d['mean'])} [{pct(d['min'])}, {pct(d['max'])}]"
  if d.get("ci95") is not None:
    line += (f"; the mean's 95% interval {pct(d['mean'] - d['ci95'])} to {pct(d['mean'] + d['ci95'])} "
             f"(Student's t, {d['n']} seeds)")
  lines.append(line)
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run_report(define_flags, measure, table)
