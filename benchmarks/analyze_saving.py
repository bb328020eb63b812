"""Merges saving-benchmark results, adds the scratch-frontier view, and plots them.

  python -m benchmarks.analyze_saving benchmarks/results/saving_gpt_*.json --workroot=/tmp/mlb-gpt \
      --out=benchmarks/results/saving_gpt_summary.json --plot=benchmarks/results/saving_gpt.png

Two views of the saving, both against scratch runs of the same model, data and seed:
- read off the curve (the issue's definition): FLOPs and seconds the V-cycle needed to reach scratch's final loss at
  the same budget T; "not reached" when its level-0 curve never gets there.
- the scratch frontier: scratch runs at several budgets (each with its own full warm-up and decay) give final loss
  against cost; a V-cycle run ending at loss L with cost C saves 1 - C / C_scratch(L), where C_scratch(L) is read
  on that frontier (linear in log cost between budgets; None outside the measured range).
- the fitted frontier (``--fit``): L(F) = E + A F^-a fitted to the fully decayed scratch points (at least four), and
  the saving read off the fit, also a little outside the measured range. A chord between measured points lies above
  the convex frontier and inflates every saving read off it; the fit does not.
- ``--frontier=FILES``: the frontier (measured or fitted) is made of those files' scratch runs instead of the merged
  files' own, e.g. WSD scratch runs for methods measured against linear-decay scratch (the stronger baseline a user
  may have); the savings read off the curve stay against each file's own scratch run.
"""

from __future__ import annotations

import json

from absl import flags

from benchmarks import cli, saving
from benchmarks.frontiers import scratch_point, envelope_cost, envelope_models, fit_frontier, fitted_cost, frontier_cost
from benchmarks.report import COLUMNS, methods_table, plot


def define_flags(fv: flags.FlagValues) -> None:
  """Declares this script's flags on ``fv``; the results files are its arguments."""
  flags.DEFINE_string("out", "", "Merged JSON with frontier savings.", flag_values=fv)
  flags.DEFINE_string("plot", "", "PNG: saving against budget, eval loss against FLOPs and seconds.", flag_values=fv)
  flags.DEFINE_list("workroot", [], "Where the runs' workdirs are (one or more, comma-separated), to plot their eval "
                    "curves.", flag_values=fv)
  flags.DEFINE_string("markdown", "", "Write the methods-by-budget table (Markdown) here.", flag_values=fv)
  flags.DEFINE_bool("replace", False, "Later files win: a variant run again (and a scratch run again, within "
                    "--scratch_tol) replaces the earlier file's run at that budget.", flag_values=fv)
  flags.DEFINE_float("scratch_tol", SCRATCH_TOL, "Nats two scratch runs of one budget from different files may "
                     "differ by and still merge.", flag_values=fv)
  flags.DEFINE_bool("fit", False, "Read savings off a fitted frontier E + A F^-a (>= 4 scratch budgets).",
                    flag_values=fv)
  flags.DEFINE_integer("fit_min_steps", 0, "Fit only the scratch points of at least this many steps (the shortest "
                       "runs, dominated by warm-up, can leave the power law; the fit's rms says how well it holds).",
                       flag_values=fv)
  flags.DEFINE_list("frontier", [], "Results files whose scratch runs make the frontier instead of the merged "
                    "files' own (e.g. WSD scratch runs, to read linear-decay runs against the stronger baseline); "
                    "the savings read off the curve stay against each file's own scratch.", flag_values=fv)
  flags.DEFINE_list("envelope", [], "Level-run files of benchmarks.bound (smaller models trained alone; 'a.json+b.json' "
                    "pools one model's files): each variant's saving is also read against the envelope of those "
                    "models' frontiers and the target's, the best single model at its final loss.", flag_values=fv)
  flags.DEFINE_bool("frontier_best", False, "The --frontier files are a learning-rate sweep of scratch: at each "
                    "budget the run with the lowest loss is the frontier's point (the tuned baseline), instead of "
                    "requiring the files' runs to agree.", flag_values=fv)


# Two scratch runs at the same budget from different results files must agree this closely (nats) to be merged: the
# same config on another machine's rounding moves the last digits, a different config moves more. Other code that
# only rounds differently can move more too (GPT T=300 before and after the attention-kernel change: 4.7021 and
# 4.7046, the curves equal to 1e-5 at step 30 and drifting apart after): --scratch_tol widens it for such merges.
SCRATCH_TOL = 1e-3


def _merge_budget(into: dict, b: dict, path: str, replace: bool = False, tol: float = SCRATCH_TOL) -> None:
  """Adds budget entry ``b`` (same steps as ``into``) to ``into``: its variants join; its scratch must agree. With
  ``replace`` the later file wins: its scratch (the same loss, within ``tol``, but its own seconds) and its runs
  of variants ``into`` already has replace those (listed in ``replaced``)."""
  la, lb = into["scratch"]["final_eval_loss"], b["scratch"]["final_eval_loss"]
  if abs(la - lb) > tol:
    raise ValueError(f"{path}: scratch at T={b['steps']} ends at {lb:.5f}, another file's at {la:.5f} (more than "
                     f"{tol} apart): these runs are not the same config (or ran on code that rounds differently: "
                     f"then a wider --scratch_tol); analyse them separately.")
  both = sorted(set(into["variants"]) & set(b["variants"]))
  if both and not replace:
    raise ValueError(f"{path}: variant(s) {both} at T={b['steps']} are also in another file; pass each run once "
                     "(or --replace, to let the later file's runs replace the earlier ones).")
  into.setdefault("merged_scratch_losses", [la]).append(lb)
  if replace:
    into["scratch"], into["scratch_curve"] = b["scratch"], b.get("scratch_curve", into.get("scratch_curve"))
    into.setdefault("replaced", []).extend(f"{n} (by {path})" for n in both)
  into["variants"].update(b["variants"])


def seed_of(results: dict) -> int:
  """The seed a results file ran with (``--set train.seed=S``; the config's default otherwise)."""
  seed = results.get("model_overrides", {}).get("train.seed")
  if seed is None:
    from multilevel.train.config import TrainConfig
    return TrainConfig().seed
  return int(seed)


def merge(paths, fit: bool = False, replace: bool = False, tol: float = SCRATCH_TOL, frontier=(),
          fit_min_steps: int = 0, frontier_best: bool = False, envelope=()):
  """Merges results files into one: budgets sorted by steps; a budget found in several files (e.g. more variants run
  later against the same scratch) becomes one entry whose scratch is the first file's (checked against the others);
  with ``replace`` later files win instead (a variant, or scratch, run again replaces the earlier run).

  Files of several seeds (``--set train.seed=S``) are merged per seed, each seed's variants read on its own scratch
  frontier; the result then holds the mean over seeds of every number at the budgets and variants all seeds ran
  (``per_seed`` keeps each seed's values of the savings and losses, ``seeds`` the seeds) and ``by_seed`` the merge of
  each seed alone.

  ``frontier`` (results files) replaces the frontier: each seed's variants are read against the scratch runs of the
  ``frontier`` files of the same seed (merged like the others) instead of their own files' scratch runs. With
  ``fit``, ``fit_min_steps`` leaves the scratch points of fewer steps out of the fit. ``frontier_best``: the
  ``frontier`` files are a sweep (of the learning rate, say) and each budget's point is its lowest-loss run."""
  groups, family = _group_by_seed(paths)
  if not groups:
    raise ValueError("No results files to merge.")
  fronts = {}
  if frontier:
    fgroups, ffamily = _group_by_seed(frontier)
    if ffamily != family:
      raise ValueError(f"The frontier files are {ffamily} results; the others are {family}: use one family.")
    for seed in groups:
      if seed not in fgroups:
        raise ValueError(f"No frontier file ran seed {seed} (they ran {sorted(fgroups)}): pass scratch runs of "
                         "every seed the variants ran.")
      fronts[seed] = {"files": [p for p, _ in fgroups[seed]],
                      "budgets": (_best_budgets if frontier_best else
                                  lambda f: _merge_budgets(f, replace, tol))(fgroups[seed])}
  models = envelope_models(envelope)
  by_seed = {seed: _merge_seed(files, fit, replace, tol, fronts.get(seed), fit_min_steps, models)
             for seed, files in sorted(groups.items())}
  if len(by_seed) == 1:
    (seed, out), = by_seed.items()
    return dict(out, seed=seed)
  return _across_seeds(by_seed)


def _group_by_seed(paths):
  """({seed: [(path, results), ...]}, family) of results files, refusing a mix of families."""
  groups: dict[int, list[tuple[str, dict]]] = {}
  family = None
  for p in paths:
    with open(p) as f:
      d = json.load(f)
    if family is not None and d["family"] != family:
      raise ValueError(f"{p} is a {d['family']} result; the others are {family}: merge one family at a time.")
    family = d["family"]
    groups.setdefault(seed_of(d), []).append((p, d))
  return groups, family


def _merge_budgets(files, replace: bool, tol: float) -> list:
  """The budget entries of ``files`` (one seed), merged by steps and sorted."""
  by_steps = {}
  for p, d in files:
    for b in d["budgets"]:
      if b["steps"] in by_steps:
        _merge_budget(by_steps[b["steps"]], b, p, replace, tol)
      else:
        by_steps[b["steps"]] = b
  return [by_steps[k] for k in sorted(by_steps)]


def _best_budgets(files) -> list:
  """At each budget of ``files`` (one seed) the scratch run with the lowest final loss, with the file and the
  overrides it ran with (``best_of``: every file's loss there), sorted by steps: the frontier of a sweep."""
  best = {}
  for p, d in files:
    for b in d["budgets"]:
      loss = b["scratch"]["final_eval_loss"]
      entry = best.setdefault(b["steps"], {"best_of": []})
      entry["best_of"].append({"file": p, "final_eval_loss": loss, "overrides": d.get("model_overrides", {})})
      if "scratch" not in entry or loss < entry["scratch"]["final_eval_loss"]:
        entry.update({k: v for k, v in b.items() if k != "variants"}, variants={}, file=p)
  return [best[k] for k in sorted(best)]


def _merge_seed(files, fit: bool, replace: bool, tol: float, frontier: dict | None = None,
                fit_min_steps: int = 0, models: dict | None = None) -> dict:
  """The merge of one seed's results files, with the frontier savings added (read against ``frontier['budgets']``'
  scratch runs when given, else against the files' own)."""
  meta = {"commands": [d["command"] for _, d in files], "family": files[0][1]["family"]}
  budgets = _merge_budgets(files, replace, tol)
  front = frontier["budgets"] if frontier else budgets
  flops_pts = [(b["scratch"]["total_flops"], b["scratch"]["final_eval_loss"]) for b in front]
  secs_pts = [(b["scratch"]["train_seconds"], b["scratch"]["final_eval_loss"]) for b in front]
  fits = None
  if fit:
    keep = [b["steps"] >= fit_min_steps for b in front]
    if fit_min_steps and sum(keep) < 4:
      raise ValueError(f"--fit_min_steps={fit_min_steps} keeps {sum(keep)} of the {len(front)} scratch budgets; the "
                       "fit needs at least four: lower it, or run scratch at more budgets above it.")
    fit_f = [p for p, k in zip(flops_pts, keep) if k]
    fit_s = [p for p, k in zip(secs_pts, keep) if k]
    fits = {"flops": fit_frontier(fit_f), "seconds": fit_frontier(fit_s), "min_steps": fit_min_steps}
  for b in budgets:
    for v in b["variants"].values():
      loss = v["final_eval_loss"]
      if fits:
        # Where the fit leaves out the shortest points, it is not extrapolated below them: a loss above the fitted
        # points' is read on the measured chord instead (``frontier_read`` says which).
        above = fit_min_steps > 0 and loss > max(l for _, l in fit_f)
        cf = frontier_cost(flops_pts, loss) if above else fitted_cost(fits["flops"], loss, fit_f)
        cs = frontier_cost(secs_pts, loss) if above else fitted_cost(fits["seconds"], loss, fit_s)
        v["frontier_read"] = "chord" if above else "fit"
      else:
        cf = frontier_cost(flops_pts, loss)
        cs = frontier_cost(secs_pts, loss)
      v["frontier_flops_saving"] = None if cf is None else 1 - v["total_flops"] / cf
      if models:  # The best single model at this loss: the target's (measured) frontier or a smaller model alone.
        ce, who, at_most = envelope_cost(models, flops_pts, loss)
        v["envelope_flops_saving"] = None if ce is None else 1 - v["total_flops"] / ce
        v["envelope_model"], v["envelope_at_most"] = who, at_most
      # "seconds" (steps + level-change operators) where recorded; older results have only train_seconds.
      v["frontier_seconds_saving"] = None if cs is None else 1 - v.get("seconds", v["train_seconds"]) / cs
  out = dict(meta, budgets=budgets)
  if frontier:
    out["frontier_from"] = {"files": frontier["files"],
                            "points": [scratch_point(b) for b in front]}
  if fits:
    out["frontier_fit"] = fits
  if models:
    out["envelope_models"] = models
  return out


# The values kept per seed (besides their mean) in a merge of several seeds.
PER_SEED = ("final_eval_loss", "frontier_flops_saving", "frontier_seconds_saving", "flops_saving", "seconds_saving",
            "equal_flops_loss_diff")


def _mean(values):
  """Mean of numbers (None if any is None); of dicts, key by key over the keys all have; otherwise the first value."""
  if any(v is None for v in values):
    return None
  if all(isinstance(v, dict) for v in values):
    keys = [k for k in values[0] if all(k in v for v in values)]
    return {k: _mean([v[k] for v in values]) for k in keys}
  if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
    return values[0] if all(v == values[0] for v in values) else sum(values) / len(values)  # Steps stay ints.
  return values[0]


def _across_seeds(by_seed: dict) -> dict:
  """One result from the merges of several seeds: the budgets (and variants) every seed ran, each number the mean
  over the seeds, with ``per_seed`` holding each seed's values of PER_SEED."""
  seeds = list(by_seed)
  steps_each = [{b["steps"]: b for b in m["budgets"]} for m in by_seed.values()]
  common = sorted(set.intersection(*[set(s) for s in steps_each]))
  if not common:
    raise ValueError(f"The seeds {seeds} share no budget: run every seed at the same budgets.")
  budgets = []
  for steps in common:
    entries = [s[steps] for s in steps_each]
    names = [n for n in entries[0]["variants"] if all(n in e["variants"] for e in entries)]
    b = {k: _mean([e[k] for e in entries]) for k in entries[0] if k != "variants" and all(k in e for e in entries)}
    b["scratch"]["per_seed"] = {"final_eval_loss": [e["scratch"]["final_eval_loss"] for e in entries]}
    b["variants"] = {}
    for n in names:
      runs = [e["variants"][n] for e in entries]
      v = _mean(runs)
      v["per_seed"] = {k: [r.get(k) for r in runs] for k in PER_SEED}
      b["variants"][n] = v
    budgets.append(b)
  first = next(iter(by_seed.values()))
  return {"commands": [c for m in by_seed.values() for c in m["commands"]], "family": first["family"],
          "seeds": seeds, "budgets": budgets, "by_seed": {str(k): m for k, m in by_seed.items()}}


def main(argv):
  a = cli.parse(define_flags)
  d = merge(argv[1:], fit=a.fit, replace=a.replace, tol=a.scratch_tol, frontier=a.frontier,
            fit_min_steps=a.fit_min_steps, frontier_best=a.frontier_best, envelope=a.envelope)
  print(saving.table(d, COLUMNS))
  if a.out:
    with open(a.out, "w") as f:
      json.dump(d, f, indent=1)
  if a.plot:
    plot(d, a.plot, a.workroot)
  if a.markdown:
    with open(a.markdown, "w") as f:
      f.write(methods_table(d) + "\n")


if __name__ == "__main__":
  cli.run(main, define_flags, positional=True)
