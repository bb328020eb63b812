"""Reading costs off scratch frontiers: the log-linear chord between fully decayed runs, a fitted power law, and the
envelope of several models' frontiers (the best single model at a loss). Used by ``analyze_saving`` (the merge) and
``report`` (tables and plots)."""

from __future__ import annotations

import json
import math


def frontier_cost(points, loss):
  """Cost at which the scratch frontier [(cost, final_loss), ...] reaches ``loss`` (log-linear), else None."""
  pts = sorted(points)
  for (c0, l0), (c1, l1) in zip(pts, pts[1:]):
    lo, hi = min(l0, l1), max(l0, l1)
    if lo <= loss <= hi and l0 != l1:
      w = (l0 - loss) / (l0 - l1)
      return math.exp(math.log(c0) + w * (math.log(c1) - math.log(c0)))
  return None


def fit_frontier(points):
  """Fits L(F) = E + A F^-a to ``[(cost, loss), ...]`` (least squares in log(L - E) for each E on a fine grid below
  the lowest loss; the best E wins). Returns ``{'E', 'A', 'a', 'rms'}``; needs at least four points."""
  import numpy as np
  pts = sorted(points)
  if len(pts) < 4:
    raise ValueError(f"Fitting E + A F^-a needs at least four scratch budgets, got {len(pts)}.")
  f = np.log(np.array([c for c, _ in pts], np.float64))
  loss = np.array([l for _, l in pts], np.float64)
  best = None
  for e in np.linspace(0.0, loss.min() - 1e-4, 4000):
    y = np.log(loss - e)
    slope, icpt = np.polyfit(f, y, 1)
    if slope >= 0:
      continue
    pred = e + np.exp(icpt + slope * f)
    rms = float(np.sqrt(np.mean((pred - loss) ** 2)))
    if best is None or rms < best["rms"]:
      best = {"E": float(e), "A": float(np.exp(icpt)), "a": float(-slope), "rms": rms}
  if best is None:
    raise ValueError("The scratch losses do not fall with cost; no frontier to fit.")
  return best


def fitted_cost(fit, loss, points, extrapolate: float = 2.0):
  """Cost at which the fitted frontier reaches ``loss``; None below its asymptote or farther than ``extrapolate``
  times outside the measured costs."""
  if loss <= fit["E"]:
    return None
  c = (fit["A"] / (loss - fit["E"])) ** (1.0 / fit["a"])
  lo, hi = min(p[0] for p in points), max(p[0] for p in points)
  return c if lo / extrapolate <= c <= hi * extrapolate else None


def scratch_point(b: dict) -> dict:
  """A budget entry's scratch run as a frontier point: steps, FLOPs, seconds and final loss."""
  point = {"steps": b["steps"], **{k: b["scratch"][k] for k in ("total_flops", "train_seconds", "final_eval_loss")}}
  if "file" in b:  # A swept frontier's point: which run it is.
    point.update(file=b["file"], lr=b.get("best_of") and next(
        (o["overrides"].get("train.lr") for o in b["best_of"] if o["file"] == b["file"]), None))
  return point


def frontier_points(d: dict) -> list:
  """The scratch points a merge read its savings against: those of ``--frontier`` files, else its own budgets'."""
  return d["frontier_from"]["points"] if d.get("frontier_from") else [scratch_point(b) for b in d["budgets"]]


def envelope_models(entries) -> dict:
  """{name: [(FLOPs, loss), ...]} of smaller models trained alone (``benchmarks.bound`` level-run files; 'a+b' pools
  one model's files), each its best run per budget, named by its cycle settings."""
  from benchmarks.bound import chain_name
  from multilevel.cycles.planner import candidate_from_runs
  out = {}
  for entry in entries:
    parts = []
    for p in entry.split("+"):
      with open(p) as f:
        parts.append(json.load(f))
    name = chain_name(parts[0])
    if name in out:  # Two entries of one model (e.g. one file per learning rate): the later would hide the former.
      raise ValueError(f"--envelope gives {name} twice ({entry}); pool one model's files with '+' "
                       f"(a.json+b.json) so that its best run per budget is kept.")
    out[name] = list(candidate_from_runs(name, [r for d in parts for r in d["runs"]]).frontier.points)
  return out


def envelope_cost(models: dict, target_points, loss: float) -> tuple[float | None, str | None, bool]:
  """(FLOPs, model, at_most) of the cheapest single model at ``loss``: the target's frontier and each of ``models``
  (log-linear chords). A model whose shortest run already ends below the loss costs at most that run (at_most)."""
  best = (None, None, False)
  for name, pts in [("target", list(target_points))] + list(models.items()):
    cost, at_most = frontier_cost(pts, loss), False
    if cost is None and loss > max(l for _, l in pts):
      cost, at_most = min(pts)[0], True  # Its shortest run is already below the loss.
    if cost is not None and (best[0] is None or cost < best[0]):
      best = (cost, name, at_most)
  return best
