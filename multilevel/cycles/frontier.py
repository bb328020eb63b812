"""Frontiers and the lossless hand-over bound.

A model's *frontier* is the final eval loss of fully decayed scratch runs against their training FLOPs, one point per
budget (``Frontier``; log-linear between budgets). With F_m(L) the FLOPs model m needs to reach loss L on its
frontier, an ideal chain small -> ... -> target that hands over with no loss at all and then learns exactly as the
next model's scratch run does from that loss costs, for two levels,

  F_target(L_T) - max over L >= L_T of [F_target(L) - F_small(L)]

(``ideal_cost`` solves any number of levels by the same recursion on a grid of losses). What that maximum is of
F_target(L_T) is the *bound*: what a hand-over method saves if its grown model then learns only as fast as scratch.
A method above it has a grown model that learns faster than scratch after the hand-over; at or below it, the fade of
the saving with the budget is the physics of growth at that scale.

The same ``Frontier`` holds any curve of loss falling with FLOPs: ``multilevel.cycles.growth`` builds one from the
stable (un-decayed) part of a warm-up-stable-decay run, which is where a V-cycle under one WSD schedule hands over.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class Frontier:
  """A model's fully decayed scratch runs: ``points`` are (FLOPs, final eval loss), one per budget, kept as their
  lower envelope (a longer run that ends higher than a shorter one is not on the frontier)."""

  name: str
  points: tuple[tuple[float, float], ...]

  def __post_init__(self):
    pts = tuple(sorted((float(f), float(l)) for f, l in self.points))
    if len(pts) < 2:
      raise ValueError(f"Frontier {self.name!r} needs at least two budgets (fully decayed scratch runs), got "
                       f"{len(pts)}.")
    if not all(math.isfinite(f) and f > 0 and math.isfinite(l) for f, l in pts):
      raise ValueError(f"Frontier {self.name!r} has a non-finite or non-positive point: {pts}.")
    env, best = [], math.inf
    for f, l in pts:
      if l < best:
        env.append((f, l))
        best = l
    object.__setattr__(self, "points", tuple(env))

  @property
  def loss_range(self) -> tuple[float, float]:
    """(lowest, highest) loss the frontier measures."""
    return self.points[-1][1], self.points[0][1]

  def at_lowest(self, loss: float) -> bool:
    """Whether ``loss`` is at the lowest loss the curve measures (to 0.1% of its range) or below: a hand-over there
    sits at the end of what was measured, and a longer run may find a later one."""
    lo, hi = self.loss_range
    return loss <= lo + 1e-3 * (hi - lo)

  def cost(self, loss: float) -> float | None:
    """FLOPs at which the frontier reaches ``loss`` (log-linear between budgets); None outside its range."""
    lo, hi = self.loss_range
    if not lo <= loss <= hi:
      return None
    if len(self.points) == 1:
      return self.points[0][0]
    for (f0, l0), (f1, l1) in zip(self.points, self.points[1:]):
      if l1 <= loss <= l0:
        w = (l0 - loss) / (l0 - l1)
        return math.exp(math.log(f0) + w * (math.log(f1) - math.log(f0)))
    return None

  def loss_at(self, flops: float) -> float | None:
    """The frontier's loss at ``flops`` (linear in log FLOPs between budgets); None outside its range."""
    (f_lo, _), (f_hi, _) = self.points[0], self.points[-1]
    if not f_lo <= flops <= f_hi:
      return None
    if len(self.points) == 1:
      return self.points[0][1]
    for (f0, l0), (f1, l1) in zip(self.points, self.points[1:]):
      if f0 <= flops <= f1:
        w = (math.log(flops) - math.log(f0)) / (math.log(f1) - math.log(f0))
        return l0 + w * (l1 - l0)
    return None


def ideal_cost(chain: Sequence[Frontier], target_loss: float, grid: int = 400, jump: float = 0.0,
               rates: Sequence[float] | None = None) -> dict | None:
  """The cheapest lossless hand-over chain ``chain[0] -> ... -> chain[-1]`` (smallest first, the target last) to
  ``target_loss``; any model of the chain may be skipped. Returns ``{'flops', 'switch_losses'}`` (the loss at which
  each model hands over, None for one skipped) or None when the target's frontier does not reach the loss.

  On a grid of losses L from the highest any frontier measures down to ``target_loss``: best[k](L) is the cheapest
  way to have model k at loss L, min(F_k(L), min over L' >= L and j < k of best[j](L') + F_k(L) - F_k(L' + jump)).

  ``jump`` (nats, >= 0): the loss the grown model starts above the one it grew from (0 for a function-preserving
  hand-over; measure it with ``handover_jumps``). A hand-over whose landing loss L' + jump lies above the bigger
  model's measured range is not used.

  ``rates``: per model, how fast it learns after growing into it, as a fraction of its scratch run's pace (1 each by
  default: the bound). Model k grown at loss L' then needs (F_k(L) - F_k(L' + jump)) / rates[k] FLOPs to reach L
  (``growth.growth_rate`` measures it from a run); ``rates[0]`` is not read."""
  if not (jump >= 0 and math.isfinite(jump)):
    raise ValueError(f"The hand-over jump must be a finite loss difference >= 0 (nats), got {jump}.")
  rates = check_rates(rates, len(chain))
  if chain[-1].cost(target_loss) is None:
    return None
  top = max(f.loss_range[1] for f in chain)
  losses = [top - (top - target_loss) * i / (grid - 1) for i in range(grid)]  # Descending, ends at target_loss.
  best, back = best_table(chain, losses, jump, rates)
  k, i = len(chain) - 1, grid - 1
  return {"flops": best[k][i], "switch_losses": backtrack(back, losses, k, i, len(chain) - 1)}


def check_rates(rates: Sequence[float] | None, n: int) -> tuple[float, ...]:
  """``rates`` as a tuple of ``n`` finite positive rates (above 1: a grown model that learns faster than its scratch
  run); ``None`` gives 1 each (the bound)."""
  if rates is None:
    return (1.0,) * n
  rates = tuple(float(r) for r in rates)
  if len(rates) != n or not all(math.isfinite(r) and r > 0 for r in rates):
    raise ValueError(f"Growth rates must be {n} finite positive numbers (one per model of the chain; 1 = learns as "
                     f"fast as its scratch run after growing), got {rates}.")
  return rates


def best_table(chain: Sequence[Frontier], losses: Sequence[float], jump: float, rates: Sequence[float],
               adjacent: bool = False, delays: Sequence[float] | None = None,
               min_flops: Sequence[float] | None = None,
               handover: Sequence[tuple[float, float] | None] | None = None,
               curves: Sequence | None = None) -> tuple[list[list[float]], list[list[tuple | None]]]:
  """The dynamic programme of ``ideal_cost`` on the descending grid ``losses``: ``best[k][i]``, the fewest FLOPs
  that put model k at ``losses[i]`` (from scratch, or grown from a smaller model j < k at a grid loss above), and
  ``back[k][i]``, ``(j, i')`` for the hand-over used (None: from scratch). With ``adjacent`` model k grows only from
  model k - 1 (a chain of doublings, as stacking grows: a model may start the chain, none may be jumped over).
  ``delays[k]``: FLOPs model k spends after growing before it moves on (a recovery from the growth), added to every
  hand-over into it. ``min_flops[k]``: the fewest FLOPs a stage of model k may spend (its delay included); shorter
  stages, a model passed through for a step or two among them, are not priced (none by default). ``handover[k]``:
  the (lowest, highest) loss at which model k may hand over to a larger model, or a list of such intervals (None:
  anywhere); ``best[k][i]`` is
  infinite outside it, so neither a later model nor the caller grows from model k there. ``curves[k]``: a function
  of the loss the smaller model handed over at giving, for that hand-over, the FLOPs model k trains to move a given
  distance (FLOPs of its own curve) in place of ``rates[k]`` and ``delays[k]`` (``growth_curves``: how far a grown
  model gets depends on where it grew); such a level is solved by trying every hand-over (quadratic in the grid)
  instead of a running minimum."""
  delays = [0.0] * len(chain) if delays is None else [float(d) for d in delays]
  floors = [0.0] * len(chain) if min_flops is None else [float(m) for m in min_flops]
  inf, grid = math.inf, len(losses)
  costs = [[f.cost(l) for l in losses] for f in chain]
  # Where a model lands when it takes over at grid loss L' (its own cost to reach L' + jump).
  lands = costs if jump == 0 else [[f.cost(l + jump) for l in losses] for f in chain]
  best = [[inf] * grid for _ in chain]
  back: list[list[tuple | None]] = [[None] * grid for _ in chain]
  sources = (lambda k: range(k - 1, k) if k else range(0)) if adjacent else range
  for k in range(len(chain)):
    if curves is not None and curves[k] is not None:
      _curved_level(k, losses, costs, lands, best, back, sources(k), curves[k], floors[k])
    else:
      _level(k, losses, costs, lands, best, back, sources(k), rates[k], delays[k], floors[k])
    if handover is not None and handover[k] is not None:
      best[k] = [b if in_handover(handover[k], l) else inf for b, l in zip(best[k], losses)]
  return best, back


def in_handover(allowed, loss: float) -> bool:
  """Whether a model may hand over at ``loss``: ``allowed`` is None (anywhere), a (lowest, highest) interval of
  losses or a list of such intervals (``best_table``'s ``handover[k]``)."""
  return allowed is None or any(lo <= loss <= hi for lo, hi in (allowed if isinstance(allowed, list) else [allowed]))


def _level(k, losses, costs, lands, best, back, sources, r, delay, floor) -> None:
  """``best_table``'s row of model k at a constant rate ``r`` and ``delay`` (FLOPs), by a running minimum."""
  inf, grid, n = math.inf, len(losses), len(best)
  # Model k's stage from a hand-over at L' to L trains (F_k(L) - land_k(L')) / r + delay FLOPs, at least its
  # floor: land_k(L') <= F_k(L) - need. The hand-overs allowed grow with i (the grid descends in loss, so F_k
  # ascends), so each source keeps a pointer ``upto`` and the min over L' up to it of best[j](L') - land_k(L')/r.
  need = r * (floor - delay)
  run_min, arg, upto = [inf] * n, [None] * n, [0] * n
  for i in range(grid):
    ck = costs[k][i]
    for j in sources:
      while upto[j] <= i:
        lk = lands[k][upto[j]]
        if lk is not None and ck is not None and lk > ck - need:
          break  # Later hand-overs land later still: the stage to here would be too short.
        if best[j][upto[j]] < inf and lk is not None and best[j][upto[j]] - lk / r < run_min[j]:
          run_min[j], arg[j] = best[j][upto[j]] - lk / r, upto[j]
        upto[j] += 1
    if ck is None:
      continue
    if ck >= floor:
      best[k][i], back[k][i] = ck, None  # Model k from scratch to this loss.
    for j in sources:
      if run_min[j] < inf and run_min[j] + ck / r + delay < best[k][i]:
        best[k][i], back[k][i] = run_min[j] + ck / r + delay, (j, arg[j])


def _curved_level(k, losses, costs, lands, best, back, sources, curve, floor) -> None:
  """``best_table``'s row of model k when how far it gets after growing depends on the hand-over loss (``curve``):
  every hand-over L' >= L of every source tried."""
  stage = [curve(l) for l in losses]  # Per hand-over loss of the smaller model: FLOPs for a distance.
  for i, ck in enumerate(costs[k]):
    if ck is None:
      continue
    if ck >= floor:
      best[k][i], back[k][i] = ck, None
    for j in sources:
      for s in range(i + 1):
        lk = lands[k][s]
        if best[j][s] == math.inf or lk is None:
          continue
        spent = stage[s](max(0.0, ck - lk))
        if spent >= floor and best[j][s] + spent < best[k][i]:
          best[k][i], back[k][i] = best[j][s] + spent, (j, s)


def backtrack(back, losses: Sequence[float], k: int, i: int, n: int) -> list[float | None]:
  """The loss at which each of the ``n`` smaller models hands over on the way to ``best[k][i]`` (None: skipped)."""
  switches: list[float | None] = [None] * n
  while back[k][i] is not None:
    j, i = back[k][i]
    switches[j] = losses[i]
    k = j
  return switches


def bound_at(chain: Sequence[Frontier], target_loss: float, grid: int = 400, jump: float = 0.0,
             rates: Sequence[float] | None = None) -> dict | None:
  """The bound's saving at ``target_loss``, where it hands over (loss and the handing model's FLOPs), and the
  envelope: the best *single* model of the chain at that loss (a smaller model trained longer). With ``jump`` > 0
  the hand-over loses that much loss, and with ``rates`` below 1 the grown models learn slower than scratch (see
  ``ideal_cost``): no longer a bound, a calibrated estimate."""
  full = chain[-1].cost(target_loss)
  ideal = ideal_cost(chain, target_loss, grid, jump, rates)
  if full is None or ideal is None:
    return None
  singles = [(f.cost(target_loss), f.name) for f in chain]
  best_single = min((c, n) for c, n in singles if c is not None)
  # A smaller model whose shortest measured run already ends below the loss reaches it for less than that run:
  # the envelope is at least this (and the bound above, which only hands over inside measured ranges, is too low).
  below = [(f.points[0][0], f.name) for f in chain[:-1] if f.loss_range[1] < target_loss]
  at_least = {n: 1 - c / full for c, n in below if c < full}
  return {"target_loss": target_loss, "target_flops": full, "ideal_flops": ideal["flops"],
          "envelope_at_least": at_least,
          "bound_saving": 1 - ideal["flops"] / full, "switch_losses": ideal["switch_losses"],
          "switch_flops": [None if l is None else f.cost(l) for f, l in zip(chain, ideal["switch_losses"])],
          "envelope_model": best_single[1], "envelope_saving": 1 - best_single[0] / full}
