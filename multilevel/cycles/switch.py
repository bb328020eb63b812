"""The adaptive hand-over: end a small model's stage when its loss stops getting cheaper than the target's would.

The lossless hand-over bound (``planner.py``) switches from the small model to the target at the loss L where
F_target(L) - F_small(L) is largest, i.e. where the two frontiers' marginal costs meet: the small model then pays as
many FLOPs per nat as the target would. ``FrontierSwitch`` measures the small model's side online, from the stage's
own evaluations, so the stage needs no pilot of the small model and no fixed length:

  after the warm-up, at each evaluation of the stage, fit the last ``window`` (FLOPs, eval loss) points with a line;
  its slope gives the small model's cost per nat now, -dF/dL; the target's cost per nat at the current loss L comes
  from the target's frontier (fully decayed scratch runs, log-linear between budgets, as the bound reads them);
  stop as soon as the small model's cost is at least the target's (or its loss stopped falling).

The target's frontier is config data (``cycle.target_frontier``: (FLOPs, loss) pairs from pilot or benchmark runs of
the target), so a run's decisions depend only on its config and its own evaluations: a resumed run decides the same.
Above the frontier's highest loss (the small model has not reached the loss of the target's shortest run) and below
its lowest the target's cost is extrapolated from the nearest budgets' segment. The stage never runs past its
planned length (the maximum), and what it leaves unused goes to the target (the method's ``build_plan(cuts=...)``).

Caveats, on purpose visible: with WSD the small stage trains at a constant rate, so its curve lies above its fully
decayed frontier and flattens earlier, which makes the rule switch earlier than the offline bound (on GPT at 21
tokens/param it fired after 490-630 of the plan's 1101 small steps). Under one WSD schedule the grown target also
trains at its peak rate until the last cool-down, so the like-for-like comparison is the target's *stable* curve,
the un-decayed part of a WSD scratch run: any (FLOPs, loss) points will do here, and ``benchmarks.saving
--frontier_curve=stable`` passes those; evaluation noise (a few thousandths of a nat with the benchmarks' 8 eval
batches) is why the slope is a fit over ``window`` points.
"""

from __future__ import annotations

import dataclasses
import math

from multilevel.cycles.planner import Frontier


@dataclasses.dataclass(frozen=True)
class FrontierSwitch:
  """Stop rule of a stage: see the module docstring. ``points`` are the target's (FLOPs, eval loss) frontier."""

  points: tuple[tuple[float, float], ...]
  window: int = 4
  warmup: int = 0  # Steps of the stage's warm-up: evaluations before its end are not used.

  def __post_init__(self):
    if self.window < 2:
      raise ValueError(f"cycle.stop_window={self.window}: the slope needs at least two evaluations.")
    Frontier("cycle.target_frontier", self.points)  # Validates (two or more finite points).

  @property
  def frontier(self) -> Frontier:
    return Frontier("target", self.points)

  def target_cost_per_nat(self, loss: float) -> float:
    """-dF/dL of the target's frontier at ``loss``: its FLOPs per nat there (log-linear segments, the end segments
    extrapolated)."""
    pts = self.frontier.points  # FLOPs ascending, loss descending.
    if len(pts) < 2:
      raise ValueError("cycle.target_frontier needs two points with falling loss.")
    seg = next(((a, b) for a, b in zip(pts, pts[1:]) if b[1] <= loss <= a[1]), None)
    if seg is None:
      seg = (pts[0], pts[1]) if loss > pts[0][1] else (pts[-2], pts[-1])
    (f0, l0), (f1, l1) = seg
    rate = (math.log(f1) - math.log(f0)) / (l0 - l1)  # d ln F / d(-L)
    log_flops = math.log(f0) + (l0 - loss) * rate
    return math.exp(log_flops) * rate if log_flops < 700 else math.inf  # (Far outside the range: beyond any cost.)

  def decide(self, history: list[tuple[int, float, float]]) -> dict | None:
    """``history``: (stage step, stage FLOPs, eval loss) of the stage's evaluations so far. Returns None to go on,
    else why it stops: the loss, both costs per nat and the fitted slope."""
    pts = [(f, l) for step, f, l in history if step > self.warmup][-self.window:]
    if len(pts) < self.window:
      return None
    n = len(pts)
    mf, ml = sum(f for f, _ in pts) / n, sum(l for _, l in pts) / n
    var = sum((f - mf) ** 2 for f, _ in pts)
    slope = sum((f - mf) * (l - ml) for f, l in pts) / var if var > 0 else 0.0  # dL/dF
    loss = pts[-1][1]
    target = self.target_cost_per_nat(loss)
    if slope >= 0:
      return {"reason": "stalled", "loss": loss, "slope": slope, "small_cost": math.inf, "target_cost": target}
    small = -1.0 / slope
    if small >= target:
      return {"reason": "costlier", "loss": loss, "slope": slope, "small_cost": small, "target_cost": target}
    return None


def online_stop(overrides: dict, points) -> dict:
  """A planned V-cycle's ``overrides`` (``plan.json``'s) with its smallest stage ended by this rule against the
  target's ``points``: its planned length becomes the most it may run. For a plan priced under one WSD schedule pass
  the target's stable curve (the planner's ``wsd.target_stable``), else its decayed frontier. A plan of scratch has
  no small stage: returned unchanged."""
  if overrides.get("cycle.method", "vcycle") != "vcycle" or int(overrides.get("cycle.levels", 1)) < 2:
    return dict(overrides)
  pts = tuple((float(f), float(l)) for f, l in points)
  FrontierSwitch(pts)  # Two or more finite points, or a clear error.
  return {**overrides, "cycle.small_stop": "frontier", "cycle.target_frontier": pts}
