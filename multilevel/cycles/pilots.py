"""What pilot runs measured, as the planner reads it: a ``Candidate`` (a smaller model the target can grow from: its
frontier, its stable curve under WSD, its step cost, its best rate) and the target's frontier and stable curve.

``candidate_from_runs`` builds a candidate from run records (``experiments.plan``'s pilots), ``candidate_from_bound``
from ``benchmarks.bound`` level-run files, ``target_from_saving`` and ``target_stable_from_saving`` read the
target's scratch runs in ``benchmarks.saving`` results. Runs of one model at several seeds pool as their mean, and
each seed's stable curve is kept, so a plan can be priced on the mean and on each seed (``planner.plan_vcycle``).
The planner (``multilevel.cycles.planner``) re-exports these names.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from multilevel.cycles.frontier import Frontier


@dataclasses.dataclass(frozen=True)
class Candidate:
  """A smaller model the target can grow from: its frontier, the FLOPs of one of its steps, the peak learning rate
  its pilots found best (a multiple of the target's), and the ``cycle`` overrides that make the V-cycle's small level
  this model (e.g. ``{"cycle.width_factor": 1}`` for depth-only halving)."""

  name: str
  frontier: Frontier
  step_flops: float
  lr_scale: float
  cycle: dict = dataclasses.field(default_factory=dict)
  pilot_flops: float = 0.0
  model: dict = dataclasses.field(default_factory=dict)  # ``model.*`` overrides that make the target this model.
  stable: Frontier | None = None  # Its stable curve at ``lr_scale`` (a WSD pilot before its cool-down), for ``Wsd``.
  stable_steps: int = 0  # train.steps of the pilot whose curve ``stable`` is (its warm-up is a share of them).
  # With pilots at several seeds, ``stable`` is their mean and these are (seed, that seed's stable curve): the plan
  # prices its schedule on each as well, the spread a run of it may land in (``plan_vcycle``'s ``seed_predictions``).
  seed_stables: tuple = ()
  pilot_warmup_frac: float | None = None  # The pilots' train.warmup_frac where their files record it.

  @property
  def growth(self) -> str:
    """The axes the target grows in from this model: 'depth' (it halves depth only), 'width' or 'both'."""
    if int(self.cycle.get("cycle.width_factor", 2)) == 1:
      return "depth"
    return "width" if int(self.cycle.get("cycle.depth_factor", 2)) == 1 else "both"


def candidate_from_runs(name: str, runs: Sequence[dict], cycle: dict | None = None,
                        model: dict | None = None, stable: bool = False) -> Candidate:
  """A candidate from its fully decayed runs (``steps``, ``lr_scale``, ``total_flops``, ``final_eval_loss`` each):
  the best learning rate at each budget is its frontier, the one that won at the longest budget its rate (the small
  stage is about that long or shorter), and every run counts as pilot cost. With ``stable``, runs with a ``curve``
  (``[FLOPs, eval loss, learning rate]`` rows of a WSD run) give the stable curve: the longest one's at that rate.

  Runs may name their ``seed``: a budget and rate run at several seeds counts as the mean of its seeds (of one seed's
  repeats, the lowest), and so does the stable curve (the seeds' longest curves at the rate, averaged evaluation by
  evaluation), so a plan prices the small model's mean behaviour rather than one seed's luck."""
  seed_of = lambda r: None if r.get("seed") is None else int(r["seed"])  # (A --set value is a string: "1" is 1.)
  by_seed: dict[tuple, tuple] = {}
  for r in runs:
    key = (r["steps"], r["lr_scale"], seed_of(r))
    if key not in by_seed or r["final_eval_loss"] < by_seed[key][1]:
      by_seed[key] = (r["total_flops"], r["final_eval_loss"])
  pooled: dict[tuple, list] = {}
  for (steps, scale, _), v in by_seed.items():
    pooled.setdefault((steps, scale), []).append(v)
  best: dict[int, tuple] = {}
  for (steps, scale), vs in pooled.items():
    f, l = sum(v[0] for v in vs) / len(vs), sum(v[1] for v in vs) / len(vs)
    if steps not in best or l < best[steps][1]:
      best[steps] = (f, l, scale)
  if len(best) < 2:
    raise ValueError(f"Candidate {name!r} needs fully decayed runs at two budgets or more, got {sorted(best)}.")
  n, rate = min(best), best[max(best)][2]
  curved = [r for r in runs if r.get("curve") and r["lr_scale"] == rate] if stable else []
  stable, stable_steps, seed_stables = None, 0, ()
  if curved:
    from multilevel.cycles.growth import stable_curve
    stable_steps = int(max(r["steps"] for r in curved))
    seeds: dict = {}
    for r in curved:
      if r["steps"] == stable_steps:
        seeds.setdefault(seed_of(r), r["curve"])
    curves = list(seeds.values())
    grid = [p[0] for p in curves[0]]
    if any([p[0] for p in c] != grid for c in curves[1:]):
      raise ValueError(f"Candidate {name!r}: the {len(curves)} seeds' {stable_steps}-step curves were evaluated at "
                       f"different FLOPs; pool runs with the same steps and --evals.")
    mean = [[grid[i], sum(c[i][1] for c in curves) / len(curves), curves[0][i][2]] for i in range(len(grid))]
    stable = stable_curve(f"{name} (stable" + (f", {len(curves)} seeds)" if len(curves) > 1 else ")"), mean)
    if len(curves) > 1:
      seed_stables = tuple((k, stable_curve(f"{name} (stable, seed {k})", c)) for k, c in seeds.items())
  return Candidate(name, Frontier(name, tuple((f, l) for f, l, _ in best.values())), best[n][0] / n, rate,
                   dict(cycle or {}), sum(r["total_flops"] for r in runs), dict(model or {}), stable, stable_steps,
                   seed_stables)


def _saving_file(path: str, family: str | None) -> dict:
  """A ``benchmarks.saving`` results file, refused when it is not one or is of another family than ``family``."""
  try:
    with open(path) as f:
      d = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not JSON ({e}).") from None
  if not isinstance(d, dict) or not isinstance(d.get("budgets"), list) or not all(
      isinstance(b, dict) and "scratch" in b and "steps" in b for b in d["budgets"]):
    raise ValueError(f"{path} is not a benchmarks.saving result (no 'budgets' with a 'scratch' run each).")
  if family and d.get("family") and d["family"] != family:
    raise ValueError(f"{path} holds {d['family']} runs, and the config is a {family} model: its frontier is another "
                     f"model's.")
  return d


def target_from_saving(paths: Sequence[str], family: str | None = None) -> tuple[Frontier, float, float]:
  """The target's frontier, the FLOPs of one of its steps and the frontier's total cost, from the scratch runs in
  ``benchmarks.saving`` results files (of ``family`` where given)."""
  budgets = []
  for p in paths:
    budgets += _saving_file(p, family)["budgets"]
  if not budgets:
    raise ValueError(f"no budgets in {list(paths)}")
  pts = tuple((b["scratch"]["total_flops"], b["scratch"]["final_eval_loss"]) for b in budgets)
  return Frontier("target", pts), budgets[0]["scratch"]["total_flops"] / budgets[0]["steps"], sum(f for f, _ in pts)


def target_stable_from_saving(paths: Sequence[str], cooldown_frac: float) -> Frontier:
  """The target's stable curve from the longest WSD scratch run in ``benchmarks.saving`` results files (its curve
  before the cool-down, the last ``cooldown_frac`` of it)."""
  from multilevel.cycles.growth import stable_from_scratch_curve
  budgets = []
  for p in paths:
    with open(p) as f:
      budgets += [b for b in json.load(f)["budgets"] if b.get("scratch_curve")]
  if not budgets:
    raise ValueError(f"no scratch curve in {list(paths)}: run benchmarks.saving (it writes one per budget).")
  b = max(budgets, key=lambda b: b["steps"])
  return stable_from_scratch_curve("target (stable)", b["scratch_curve"], b["scratch"]["total_flops"], cooldown_frac)


def candidate_from_bound(path: str, base_lr: float | None = None, stable: bool = False,
                         lr_scale: float | None = None) -> Candidate:
  """A candidate from a ``benchmarks.bound`` level-run file (its runs at each budget and learning rate; its
  ``cycle.*`` settings name it and make the V-cycle's small level this model). ``'a.json+b.json'`` pools one model's
  files (e.g. run with different base rates). Each run's ``lr_scale`` is relative to its file's ``base_lr``; the
  candidate's is made relative to ``base_lr`` (the planned run's ``train.lr``; default the first file's). With
  ``lr_scale``, only the runs at that rate count (stacking trains every stage at ``train.lr``: 1)."""
  files = []
  for p in path.split("+"):
    with open(p) as f:
      files.append(json.load(f))
  d = files[0]
  if any(f.get("model") != d.get("model") for f in files):
    raise ValueError(f"{path}: the files ran different models; pool one model's level runs only.")
  base = float(base_lr or d.get("base_lr") or 1.0)
  # A file's train.seed (its --set) names the seed of its runs: several seeds of one model pool as their mean.
  runs = [dict(r, lr_scale=r["lr_scale"] * float(f.get("base_lr") or base) / base,
               seed=r.get("seed", f.get("set", {}).get("train.seed"))) for f in files for r in f["runs"]]
  if lr_scale is not None:
    runs = [r for r in runs if abs(r["lr_scale"] - lr_scale) < 1e-9]
  cycle = {k: v for k, v in d.get("set", {}).items() if k.startswith("cycle.")}
  name = f"L{d['level']}" + "".join(f" {k.split('.', 1)[1]}={v}" for k, v in cycle.items())
  warm = d.get("set", {}).get("train.warmup_frac")
  try:
    c = candidate_from_runs(name, runs, cycle, d.get("model", {}), stable)
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None
  return c if warm is None else dataclasses.replace(c, pilot_warmup_frac=float(warm))
