"""How far a grown model gets after its growth, as a function of *where* the growth happened: what a stacking plan
prices each doubling with when one rate per doubling is not enough.

A grown model's stage is priced by how far it moves along its own scratch run's stable curve (in that run's steps)
in the steps it trains after growing (``Stage``): a constant rate after a delay is a straight line, a measured
trajectory a piecewise-linear one. Two curves give a stage for a hand-over at any loss of the smaller model, from
stages measured after hand-overs at several losses, interpolated in log position on the smaller model's stable curve
and held from the nearest measured point beyond them:

- ``RateCurve``: a (rate, delay) fitted per measured growth (``stack_planner.stack_rates``); on LLaMA (gcide) the
  model stacked from one layer into two learned at 0.86-0.96x its scratch pace after 70-80 steps of the one-layer
  model, 1.13-1.34x after 161 and 2.88-3.61x after 320 (benchmarks/SAVINGS.md), which one rate cannot price;
- ``TrajectoryCurve``: the measured trajectories themselves. A fitted rate is a straight line through a way that
  bends: after the recipe's 320-step hand-over LLaMA's stacked 2-layer model had moved 390-410 scratch steps after
  240 steps and 1430-1580 after 480, so a plan with a shorter stage there got about 1.8x where the fit said 3.3x.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from multilevel.cycles.frontier import Frontier


@dataclasses.dataclass(frozen=True)
class Stage:
  """How far a grown model has moved along its own scratch curve ``t`` steps after growing, in that curve's steps:
  piecewise linear through ``knots`` ((0, 0) first, steps ascending, the distance never falling), then on at
  ``slope`` per step past the last knot."""

  knots: tuple[tuple[float, float], ...]
  slope: float

  def __post_init__(self):
    k = tuple((float(t), float(q)) for t, q in self.knots)
    if not k or k[0] != (0.0, 0.0) or any(b[0] <= a[0] or b[1] < a[1] for a, b in zip(k, k[1:])) or not (
        math.isfinite(self.slope) and self.slope > 0):
      raise ValueError(f"A stage runs from (0, 0) through knots of ascending steps and a distance that never falls, "
                       f"then on at a positive slope; got {k} and {self.slope}.")
    object.__setattr__(self, "knots", k)

  @classmethod
  def linear(cls, rate: float, delay: float) -> "Stage":
    """``rate`` times the scratch pace after ``delay`` steps of none."""
    return cls(((0.0, 0.0),) + (((float(delay), 0.0),) if delay > 0 else ()), float(rate))

  def progress(self, t: float) -> float:
    """The distance moved after ``t`` steps."""
    if t <= 0:
      return 0.0
    for (t0, q0), (t1, q1) in zip(self.knots, self.knots[1:]):
      if t <= t1:
        return q0 + (q1 - q0) * (t - t0) / (t1 - t0)
    t0, q0 = self.knots[-1]
    return q0 + self.slope * (t - t0)

  def steps(self, q: float) -> float:
    """The steps it takes to move ``q`` (where the distance stands still, as in a recovery, the last such step)."""
    for (t0, q0), (t1, q1) in zip(self.knots, self.knots[1:]):
      if q1 > q:
        return t0 + max(0.0, q - q0) * (t1 - t0) / (q1 - q0)
    t0, q0 = self.knots[-1]
    return t0 + max(0.0, q - q0) / self.slope

  def scaled(self, factor: float) -> "Stage":
    """The same stage moving ``factor`` times as far."""
    return Stage(tuple((t, q * factor) for t, q in self.knots), self.slope * factor)


def _mean_stage(stages: Sequence[Stage], weights: Sequence[float]) -> Stage:
  """The weighted mean of ``stages``: their distances averaged at every knot of any, the slopes averaged."""
  ts = sorted({t for s in stages for t, _ in s.knots})
  knots = tuple((t, sum(w * s.progress(t) for s, w in zip(stages, weights))) for t in ts)
  return Stage(knots, sum(w * s.slope for s, w in zip(stages, weights)))


@dataclasses.dataclass(frozen=True)
class Curve:
  """Stages measured after hand-overs at several losses of the smaller model: ``points`` are (position, stage), the
  position the hand-over loss's place on ``stable`` (the smaller model's stable curve) in FLOPs, ascending;
  ``counts`` the growths measured at each point."""

  name: str
  stable: Frontier
  points: tuple[tuple[float, Stage], ...]
  counts: tuple[int, ...] = ()

  def __post_init__(self):
    if not self.points or any(not (math.isfinite(x) and x > 0) for x, _ in self.points):
      raise ValueError(f"Curve {self.name!r}: give points at positive positions, got {[x for x, _ in self.points]}.")
    if any(b[0] <= a[0] for a, b in zip(self.points, self.points[1:])):
      raise ValueError(f"Curve {self.name!r}: positions must ascend, got {[x for x, _ in self.points]}.")

  @property
  def positions(self) -> list[float]:
    return [x for x, _ in self.points]

  def stage(self, loss: float) -> Stage:
    """The stage after a hand-over at ``loss`` of the smaller model: between two measured points their stages'
    mean weighted linearly in log position; beyond the points, and for a loss off the smaller model's curve, the
    stage of the end it lies beyond."""
    k, w = self._between(loss)
    return self.points[k][1] if w is None else _mean_stage((self.points[k][1], self.points[k + 1][1]), (1 - w, w))

  def _between(self, loss: float) -> tuple[int, float | None]:
    """Where a hand-over at ``loss`` lies among the points: (k, w), between point k and k + 1 at weight w in log
    position; (k, None) at or beyond point k, an end (a loss off the smaller model's curve: the end it lies beyond)."""
    pos = self.stable.cost(loss)
    if pos is None:
      pos = self.points[0][0] if loss > self.stable.loss_range[1] else self.points[-1][0]
    xs = self.positions
    if pos <= xs[0]:
      return 0, None
    for k, (x0, x1) in enumerate(zip(xs, xs[1:])):
      if pos <= x1:
        return k, math.log(pos / x0) / math.log(x1 / x0)
    return len(xs) - 1, None

  def scaled(self, factor: float):
    """The same curve with every stage moving ``factor`` times as far (a plan's margins)."""
    return dataclasses.replace(self, points=tuple((x, s.scaled(factor)) for x, s in self.points))

  def reach(self, span: float) -> list[tuple[float, float]]:
    """The (lowest, highest) losses of the smaller model within ``span`` times (either way) of a measured position,
    one interval per point, overlapping ones merged (the curve's ends where the span runs past them): where a plan
    may hand over and still be priced near a measurement rather than across a gap."""
    out: list[tuple[float, float]] = []
    for x in self.positions:
      low, high = span_losses(self.stable, x, span)
      if out and high >= out[-1][0]:  # Positions ascend, so losses descend: this one overlaps the last.
        out[-1] = (min(low, out[-1][0]), out[-1][1])
      else:
        out.append((low, high))
    return out

  def describe(self, step_flops: float) -> list[dict]:
    """The points as the smaller model's steps (its position / ``step_flops``) and loss, what the stage moved at its
    last knot and over how many steps, and the count."""
    counts = self.counts or (1,) * len(self.points)
    return [{"steps": round(x / step_flops, 1), "loss": round(self.stable.loss_at(x), 4), **self._shown(s), "n": n}
            for (x, s), n in zip(self.points, counts)]

  def _shown(self, s: Stage) -> dict:
    t, q = s.knots[-1]
    return {"measured_steps": round(t, 1), "moved": round(q, 1), "then": round(s.slope, 4)}


def span_losses(stable: Frontier, pos: float, span: float) -> tuple[float, float]:
  """The (lowest, highest) loss on ``stable`` within ``span`` times (either way) of position ``pos`` (FLOPs), the
  curve's ends where the span runs past them."""
  lo, hi = stable.loss_range
  further, earlier = stable.loss_at(pos * span), stable.loss_at(pos / span)
  return (lo if further is None else further, hi if earlier is None else earlier)


def _placed(name: str, stable: Frontier, measured: Sequence[tuple], merge: float) -> list[list[tuple]]:
  """``measured`` rows (hand-over loss, *rest) placed on ``stable`` as (position, *rest), grouped where positions lie
  within ``merge`` times the first of a group (the seeds of one schedule hand over within a few percent of each
  other). A loss off the curve is an error: a longer pilot of the smaller model places it."""
  placed, off = [], []
  for loss, *rest in measured:
    pos = stable.cost(float(loss))
    if pos is None:
      off.append(float(loss))
    else:
      placed.append((pos, *rest))
  if off or not placed:
    lo, hi = stable.loss_range
    raise ValueError(f"Curve {name!r}: " + (f"hand-over losses {[round(o, 4) for o in off]} lie off the smaller "
                     f"model's stable curve ({lo:.4f} to {hi:.4f}); give a pilot that reaches them."
                     if off else "no measurements."))
  placed.sort(key=lambda p: p[0])
  groups: list[list[tuple]] = []
  for p in placed:
    if groups and p[0] <= groups[-1][0][0] * merge:
      groups[-1].append(p)
    else:
      groups.append([p])
  return groups


class RateCurve(Curve):
  """A ``Curve`` of straight-line stages: a (rate, delay) per measured growth, interpolated between points (the rate
  and the delay each linear in log position)."""

  @classmethod
  def from_measurements(cls, name: str, stable: Frontier, measured: Sequence[Sequence[float]],
                        merge: float = 1.1) -> "RateCurve":
    """The curve through ``measured`` (hand-over loss, rate, delay) rows, one per measured growth; the rows of one
    group of positions (``merge``) become one point, their mean."""
    groups = _placed(name, stable, measured, merge)
    mean = lambda g, i: sum(p[i] for p in g) / len(g)
    return cls.of(name, stable, [(mean(g, 0), mean(g, 1), mean(g, 2)) for g in groups], [len(g) for g in groups])

  @classmethod
  def of(cls, name: str, stable: Frontier, points: Sequence[Sequence[float]],
         counts: Sequence[int] = ()) -> "RateCurve":
    """A curve from (position, rate, delay) points."""
    pts = [tuple(float(x) for x in p) for p in points]
    if not all(len(p) == 3 and all(math.isfinite(x) for x in p) and p[1] > 0 and p[2] >= 0 for p in pts):
      raise ValueError(f"Rate curve {name!r}: give (position > 0, rate > 0, delay >= 0) points, got {pts}.")
    return cls(name, stable, tuple((x, Stage.linear(r, d)) for x, r, d in pts), tuple(counts))

  def at(self, loss: float) -> tuple[float, float]:
    """(rate, delay in steps) after a hand-over at ``loss`` of the smaller model, interpolated as ``stage`` is."""
    rd = [(s.slope, s.knots[-1][0]) for _, s in self.points]
    k, w = self._between(loss)
    if w is None:
      return rd[k]
    (r0, d0), (r1, d1) = rd[k], rd[k + 1]
    return r0 + w * (r1 - r0), d0 + w * (d1 - d0)

  def stage(self, loss: float) -> Stage:
    return Stage.linear(*self.at(loss))

  def _shown(self, s: Stage) -> dict:
    return {"rate": round(s.slope, 4), "delay": round(s.knots[-1][0], 2)}


class TrajectoryCurve(Curve):
  """A ``Curve`` of measured trajectories: each growth's distance moved at each eval (``stack_rates``' trajectory),
  from (0, 0) through the evals (the distance held where it fell: a recovery), then on at its mean pace over the
  last ``tail`` of its steps. The evals of one group of positions are averaged."""

  @classmethod
  def from_measurements(cls, name: str, stable: Frontier, measured: Sequence[tuple[float, Sequence]],
                        merge: float = 1.1, tail: float = 0.5) -> "TrajectoryCurve":
    """The curve through ``measured`` (hand-over loss, [(steps since the growth, distance moved), ...]) rows."""
    groups = _placed(name, stable, [(loss, _measured_stage(name, way, tail)) for loss, way in measured], merge)
    mean = lambda g: (sum(p[0] for p in g) / len(g), _mean_stage([p[1] for p in g], [1 / len(g)] * len(g)))
    return cls(name, stable, tuple(mean(g) for g in groups), tuple(len(g) for g in groups))


def _measured_stage(name: str, way: Sequence[Sequence[float]], tail: float) -> Stage:
  """A ``Stage`` through one measured trajectory (see ``TrajectoryCurve``)."""
  pts = sorted((float(t), float(q)) for t, q, *_ in way if float(t) > 0)
  if not pts:
    raise ValueError(f"Curve {name!r}: a growth with no eval after it.")
  knots, best = [(0.0, 0.0)], 0.0
  for t, q in pts:
    best = max(best, q)
    knots.append((t, best))
  end = knots[-1][0]
  start = Stage(tuple(knots), 1.0).progress(end * (1 - tail))
  slope = (knots[-1][1] - start) / (end * tail)
  if not slope > 0:
    slope = knots[-1][1] / end
  if not slope > 0:
    raise ValueError(f"Curve {name!r}: a growth that never moved forward ({pts}).")
  return Stage(tuple(knots), slope)
