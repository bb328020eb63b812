"""One stacking schedule for several seeds, each priced on its own runs.

How fast a stacked model learns after a doubling belongs to the seed and holds from plan to plan (LLaMA on gcide:
seed 42's growths priced seeds 1 and 2 at 11-13 points of mean error, each seed's own at 4-6;
benchmarks/SAVINGS.md, "Each seed priced on its own runs"). A plan priced on one seed's files is a plan for that
seed, and a user who will run a seed not yet seen wants the schedule that saves most on average over the seeds
measured. ``plan_stack_seeds`` takes each seed's pricing inputs (``SeedPricing``: its target frontier and stable
curve, its shallower models' stable curves, the rates or rate curves its own runs measured), prices every schedule
on each seed, and picks the one whose *mean* predicted saving is highest: a pattern search over the stage lengths
that starts from each seed's own best schedule (``stack_planner.plan_stack``) and from their mean. The plan says
what it predicts on each seed (``seed_predictions``) and what each seed's own best would have predicted for it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Sequence

from multilevel.cycles.growth import margin_rows
from multilevel.cycles.growth_curves import Curve
from multilevel.cycles.pilots import Candidate
from multilevel.cycles.planner import Frontier, seed_row
from multilevel.cycles.stack_planner import (GROWTH, ORDER, plan_stack, predict_stack, reach_losses,
                                             schedule_overrides)


@dataclasses.dataclass(frozen=True)
class SeedPricing:
  """One seed's inputs to a stacking plan (as ``plan_stack`` takes them), all from that seed's own runs: ``target``
  its decayed frontier, ``wsd`` its ``planner.Wsd`` (stable curve, cool-down), ``levels`` its shallower models
  (shallowest first), ``rates`` and ``delays`` per doubling (or ``rate_curves`` over those models' curves),
  ``rates_at`` the losses the rates were measured from, ``warmup_steps`` the pilots' warm-up."""

  seed: int
  target: Frontier
  wsd: object
  levels: Sequence[Candidate]
  target_step_flops: float
  rates: Sequence[float]
  delays: Sequence[float] | None = None
  rate_curves: Sequence[Curve | None] | None = None
  rates_at: Sequence[float | None] | None = None
  warmup_steps: int | Sequence[int] = 0


def _check(seeds: Sequence[SeedPricing]) -> None:
  if len(seeds) < 2:
    raise ValueError(f"Pricing a plan on several seeds needs two seeds or more, got {len(seeds)}.")
  ids = [s.seed for s in seeds]
  if len(set(ids)) != len(ids):
    raise ValueError(f"Each seed's files price it once: seeds {ids} repeat one.")
  first = seeds[0]
  for s in seeds[1:]:
    names = [c.name for c in s.levels]
    if names != [c.name for c in first.levels]:
      raise ValueError(f"Seed {s.seed}'s shallower models are {names}, seed {first.seed}'s "
                       f"{[c.name for c in first.levels]}: give every seed the same chain of models.")
    same = lambda a, b: math.isclose(a, b, rel_tol=1e-6)
    if not same(s.target_step_flops, first.target_step_flops) or not all(
        same(a.step_flops, b.step_flops) for a, b in zip(s.levels, first.levels)):
      raise ValueError(f"Seed {s.seed}'s models cost other FLOPs per step than seed {first.seed}'s: the seeds' files "
                       f"must be runs of the same models and batch.")
    if not same(s.wsd.cooldown_frac, first.wsd.cooldown_frac):
      raise ValueError(f"Seed {s.seed} is priced with cool-down {s.wsd.cooldown_frac:g}, seed {first.seed} with "
                       f"{first.wsd.cooldown_frac:g}: one config, one schedule.")


def _reach(s: SeedPricing, span: float) -> list:
  """Per doubling of seed ``s``, the losses it may hand over at (as ``plan_stack`` keeps them; None: anywhere)."""
  curves = list(s.rate_curves) if s.rate_curves is not None else [None] * len(s.levels)
  at = list(s.rates_at) if s.rates_at is not None else [None] * len(s.levels)
  return [(cv.reach(span) if cv is not None else reach_losses(c, a, span))
          if span and (a is not None or cv is not None) else None for c, a, cv in zip(s.levels, at, curves)]


def _within(reach, loss: float) -> bool:
  if reach is None:
    return True
  intervals = [reach] if isinstance(reach, tuple) else reach
  return any(lo - 1e-9 <= loss <= hi + 1e-9 for lo, hi in intervals)


def _predict(s: SeedPricing, steps: int, lower: Sequence[int], big: int, landing: float = 0.0,
             factor: float = 1.0) -> dict | None:
  return predict_stack(s.target, s.wsd, s.levels, s.target_step_flops, steps, s.rates, lower, big, landing, factor,
                       s.delays, s.rate_curves)


def _own(plan: dict, levels: Sequence[Candidate]) -> tuple[tuple[int, ...], int] | None:
  """A ``plan_stack`` plan's schedule as (steps per shallower model, 0 where skipped; the target's steps)."""
  if plan["method"] == "scratch":
    return None
  by_name = dict(zip(plan["levels"], plan["stage_steps"]))
  return tuple(by_name.get(c.name, 0) for c in levels), plan["stage_steps"][-1]


def plan_stack_seeds(seeds: Sequence[SeedPricing], steps: int, min_big_frac: float = 0.05,
                     min_stage_frac: float = 0.05, rates_span: float = 0.0, growth: str = GROWTH,
                     order: str = ORDER, margins: tuple[float, float] = (0.02, 0.75)) -> dict:
  """The stacking schedule for a budget of ``steps`` target steps whose predicted saving, priced on each of
  ``seeds`` (``SeedPricing``) with its own curves and rates, is highest on average (see the module's text). Every
  stage keeps ``plan_stack``'s floors (``min_stage_frac``, ``min_big_frac``, the cool-down inside the target's
  stage), and with ``rates_span`` each seed's hand-overs stay within that factor of where its own rates were
  measured; a schedule some seed cannot price is not a candidate.

  Returns the plan as ``plan_stack`` does, its ``predicted_saving`` (and ``predicted_flops``) the seeds' mean, with
  ``seed_predictions`` (per seed, the schedule priced on its own files), ``own_plans`` (per seed, the schedule its
  own files price best and its saving there, and what that schedule would save on the others on average),
  ``spread`` (the lowest and highest seed's saving) and ``margins`` as the seeds' mean; or scratch when no schedule
  saves anything on average."""
  _check(seeds)
  if steps < 4:
    raise ValueError(f"A stacking plan needs a budget of at least 4 target steps, got {steps}.")
  first = seeds[0]
  n = len(first.levels)
  cool = max(1, round(first.wsd.cooldown_frac * steps))
  min_big = max(round(min_big_frac * steps), cool, 1)
  min_stage = max(1, round(min_stage_frac * steps))
  reach = [_reach(s, rates_span) for s in seeds]
  budget = steps * first.target_step_flops
  own_plans = [plan_stack(s.target, s.wsd, s.levels, s.target_step_flops, steps, s.rates, s.delays,
                          min_big_frac=min_big_frac, min_stage_frac=min_stage_frac, warmup_steps=s.warmup_steps,
                          growth=growth, order=order, margins=margins, rates_at=s.rates_at, rates_span=rates_span,
                          rate_curves=s.rate_curves) for s in seeds]

  cache: dict = {}

  def priced(x: tuple[int, ...]) -> list[dict] | None:
    """Each seed's prediction for schedule ``x`` (the shallower models' steps, then the target's), or None where it
    breaks a floor or some seed cannot price it (or hands over outside its reach)."""
    if x in cache:
      return cache[x]
    lower, big = x[:-1], x[-1]
    ok = big >= min_big and any(lower) and all(k == 0 or k >= min_stage for k in lower)
    used = [i for i, k in enumerate(lower) if k]
    ok = ok and used == list(range(used[0], n))  # A chain of doublings: the shallowest may be left out, none between.
    out = []
    for s, r in zip(seeds, reach) if ok else ():
      p = _predict(s, steps, lower, big)
      if p is None or not all(h is None or _within(r[i], h) for i, h in enumerate(p["handover_losses"][:n])):
        out = None
        break
      out.append(p)
    cache[x] = out if ok else None
    return cache[x]

  mean_saving = lambda x: None if priced(x) is None else statistics.mean(p["saving"] for p in priced(x))
  starts = [(*lo, big) for lo, big in filter(None, (_own(p, first.levels) for p in own_plans))]
  if len(starts) > 1 and len({tuple(k > 0 for k in x[:-1]) for x in starts}) == 1:
    starts.append(tuple(round(statistics.mean(c)) for c in zip(*starts)))
  best = None
  for x in starts:
    x = _climb(x, mean_saving, max(1, steps // 16))
    v = mean_saving(x)
    if v is not None and (best is None or v > best[1] + 1e-12):
      best = (x, v)
  own = [{"seed": s.seed, "stage_steps": p["stage_steps"], "levels": p["levels"], "own_saving": p["predicted_saving"],
          "mean_saving": None if _own(p, first.levels) is None else mean_saving((*_own(p, first.levels)[0],
                                                                                 _own(p, first.levels)[1]))}
         for s, p in zip(seeds, own_plans)]
  scope = {"pricing": f"stacking under WSD, the mean over seeds {[s.seed for s in seeds]}, each priced on its own "
                      f"runs: stable curves at train.lr, cool-down {first.wsd.cooldown_frac:g}, its own growths"
                      + (f"; each hand-over within {rates_span:g}x of where that seed's rate was measured"
                         if rates_span else ""),
           "seeds": [s.seed for s in seeds], "min_big_steps": min_big, "own_plans": own,
           **({"rates_span": rates_span} if rates_span else {})}
  if best is None or best[1] <= 0:
    return {"method": "scratch", "overrides": {"train.steps": steps, "cycle.levels": 1}, **scope,
            "predicted_flops": budget, "predicted_saving": 0.0, "stage_steps": [], "switch_losses": [], "levels": [],
            "why": "no chain of doublings saves anything on the seeds' mean at this budget"}
  x, saving = best
  lower, big = list(x[:-1]), x[-1]
  used = [i for i, k in enumerate(lower) if k]
  stage_steps = [lower[i] for i in used] + [big]
  preds = priced(x)
  warm = first.warmup_steps if isinstance(first.warmup_steps, int) else first.warmup_steps[used[0]]
  handed = [[h for h in p["handover_losses"] if h is not None] for p in preds]
  mean_of = lambda rows: None if any(r is None for r in rows) else statistics.mean(rows)

  def margin(landing, factor):
    ps = [_predict(s, steps, lower, big, landing, factor) for s in seeds]
    if any(p is None for p in ps):
      return None
    return {"final_loss": mean_of([p["final_loss"] for p in ps]), "saving": statistics.mean(p["saving"] for p in ps),
            "at_least": any(p["at_least"] for p in ps)}

  return {"method": f"stackbert from {first.levels[used[0]].name}, {len(stage_steps)} stages",
          "overrides": schedule_overrides(stage_steps, cool, warm, growth, order), **scope,
          "predicted_flops": statistics.mean(p["flops"] for p in preds), "predicted_saving": saving,
          "stage_steps": stage_steps, "levels": [first.levels[i].name for i in used],
          "switch_losses": [statistics.mean(h[j] for h in handed) for j in range(len(used))],
          "spread": [min(p["saving"] for p in preds), max(p["saving"] for p in preds)],
          "seed_predictions": [{**seed_row(s.seed, h[-1], p), "handover_losses": h}
                               for s, h, p in zip(seeds, handed, preds)],
          "margins": margin_rows(*margins, margin)}


def _climb(x: tuple[int, ...], value, step: int) -> tuple[int, ...]:
  """A pattern search from schedule ``x``: move one stage length by ``step`` (then half of it, down to one step)
  while ``value`` (None: not a schedule) rises; the stages a schedule leaves out stay out."""
  best = value(x)
  if best is None:
    return x
  while step >= 1:
    moved = True
    while moved:
      moved = False
      for i in [i for i, k in enumerate(x) if k]:
        for d in (step, -step):
          y = x[:i] + (x[i] + d,) + x[i + 1:]
          v = value(y) if y[i] > 0 else None
          if v is not None and v > best + 1e-12:
            x, best, moved = y, v, True
    step //= 2
  return x
