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
from multilevel.cycles.frontier import in_handover
from multilevel.cycles.stack_planner import (GROWTH, ORDER, handover_reach, plan_stack, predict_stack,
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


def _predict(s: SeedPricing, steps: int, lower: Sequence[int], big: int, landing: float = 0.0,
             factor: float = 1.0) -> dict | None:
  return predict_stack(s.target, s.wsd, s.levels, s.target_step_flops, steps, s.rates, lower, big, landing, factor,
                       s.delays, s.rate_curves)


def _own(plan: dict, levels: Sequence[Candidate]) -> tuple[int, ...] | None:
  """A ``plan_stack`` plan's shallower stages: steps per shallower model, 0 where skipped (None for scratch)."""
  if plan["method"] == "scratch":
    return None
  by_name = dict(zip(plan["levels"], plan["stage_steps"]))
  return tuple(by_name.get(c.name, 0) for c in levels)


def plan_stack_seeds(seeds: Sequence[SeedPricing], steps: int, min_big_frac: float = 0.05,
                     min_stage_frac: float = 0.05, rates_span: float = 0.0, growth: str = GROWTH,
                     order: str = ORDER, margins: tuple[float, float] = (0.02, 0.75)) -> dict:
  """The stacking schedule for a budget of ``steps`` target steps whose predicted saving, priced on each of
  ``seeds`` (``SeedPricing``) with its own curves and rates, is highest on average (see the module's text). Every
  stage keeps ``plan_stack``'s floors (``min_stage_frac``, ``min_big_frac``, the cool-down inside the target's
  stage), and with ``rates_span`` each seed's hand-overs stay within that factor of where its own rates were
  measured; a schedule some seed cannot price is not a candidate. The search moves the shallower stages; the
  target's stage is then the fewest steps at which the seeds' mean predicted final loss reaches their mean scratch
  loss at the budget (a plan ``plan_stack`` makes for one seed reaches that seed's), so that the saving is one at
  this budget, not at a smaller one that a shorter run would reach.

  Returns the plan as ``plan_stack`` does, its ``predicted_saving`` (and ``predicted_flops``) the seeds' mean, with
  ``seed_predictions`` (per seed, the schedule priced on its own files), ``own_plans`` (per seed, the schedule its
  own files price best and its saving there, and ``mean_saving``: its shallower stages' mean saving over the seeds,
  the target's stage set as above),
  ``spread`` (the lowest and highest seed's saving), ``at_least`` (some seed's run ends past its longest scratch
  run, so its saving and the mean are what they save at least) and ``margins`` as the seeds' mean; or scratch when
  no schedule saves anything on average."""
  _check(seeds)
  if steps < 4:
    raise ValueError(f"A stacking plan needs a budget of at least 4 target steps, got {steps}.")
  first = seeds[0]
  n = len(first.levels)
  cool = max(1, round(first.wsd.cooldown_frac * steps))
  min_big = max(round(min_big_frac * steps), cool, 1)
  min_stage = max(1, round(min_stage_frac * steps))
  reach = [handover_reach(s.levels, s.rates_at, s.rate_curves or [None] * n, rates_span) for s in seeds]
  budget = steps * first.target_step_flops
  own_plans = [plan_stack(s.target, s.wsd, s.levels, s.target_step_flops, steps, s.rates, s.delays,
                          min_big_frac=min_big_frac, min_stage_frac=min_stage_frac, warmup_steps=s.warmup_steps,
                          growth=growth, order=order, margins=margins, rates_at=s.rates_at, rates_span=rates_span,
                          rate_curves=s.rate_curves) for s in seeds]

  # Every schedule is held to the seeds' scratch loss at the budget, on average: a shorter target stage ends higher
  # and would read as a larger saving at a smaller budget (the saving fades with the budget), not at this one.
  goals = [s.target.loss_at(steps * s.target_step_flops) for s in seeds]
  if any(g is None for g in goals):
    raise ValueError(f"The scratch frontier of seed(s) {[s.seed for s, g in zip(seeds, goals) if g is None]} does "
                     f"not reach a budget of {steps} steps: give scratch runs up to it.")
  goal = statistics.mean(goals)
  cache: dict = {}

  def priced(lower: tuple[int, ...]) -> tuple[int, list[dict]] | None:
    """For the shallower models' steps ``lower``: the fewest target steps at which the seeds' mean predicted final
    loss reaches their mean scratch loss, and each seed's prediction there; None where a floor is broken, some seed
    cannot price it, or a hand-over lies outside that seed's reach."""
    if lower in cache:
      return cache[lower]
    used = [i for i, k in enumerate(lower) if k]
    ok = bool(used) and all(lower[i] >= min_stage for i in used) and used == list(range(used[0], n))
    at = lambda big: [_predict(s, steps, lower, big) for s in seeds]
    # Past its frontier's end a seed's final loss is below the frontier's lowest: counted at that (it reaches at least).
    final = lambda p, s: p["final_loss"] if p["final_loss"] is not None else min(l for _, l in s.target.points)
    reached = lambda ps: statistics.mean(final(p, s) for p, s in zip(ps, seeds)) <= goal + 1e-12
    out = None
    if ok:
      hi = 4 * steps
      ps = at(hi)
      if all(ps) and all(in_handover(r[i], h) for p, r in zip(ps, reach) for i, h in enumerate(p["handover_losses"])
                         if h is not None) and reached(ps):
        lo = min_big
        while lo < hi:  # The fewest target steps that reach the goal (the final loss falls as the stage grows).
          mid = (lo + hi) // 2
          got = at(mid)
          if all(got) and reached(got):
            hi = mid
          else:
            lo = mid + 1
        out = (hi, at(hi))
    cache[lower] = out
    return out

  mean_saving = lambda lower: None if priced(lower) is None else statistics.mean(p["saving"] for p in priced(lower)[1])
  schedules = [_own(p, first.levels) for p in own_plans]
  starts = [x for x in schedules if x is not None]
  if len(starts) > 1 and len({tuple(k > 0 for k in x) for x in starts}) == 1:
    starts.append(tuple(round(statistics.mean(c)) for c in zip(*starts)))
  best = None
  for x in starts:
    x = _climb(x, mean_saving, max(1, steps // 16))
    v = mean_saving(x)
    if v is not None and (best is None or v > best[1] + 1e-12):
      best = (x, v)
  own = [{"seed": s.seed, "stage_steps": p["stage_steps"], "levels": p["levels"], "own_saving": p["predicted_saving"],
          "mean_saving": None if x is None else mean_saving(x)} for s, p, x in zip(seeds, own_plans, schedules)]
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
  big, preds = priced(x)
  lower = list(x)
  used = [i for i, k in enumerate(lower) if k]
  stage_steps = [lower[i] for i in used] + [big]
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
          "at_least": any(p["at_least"] for p in preds),
          "seed_predictions": [{**seed_row(s.seed, h[-1], p), "handover_losses": h}
                               for s, h, p in zip(seeds, handed, preds)],
          "margins": margin_rows(*margins, margin)}


def _climb(x: tuple[int, ...], value, step: int) -> tuple[int, ...]:
  """A pattern search from the shallower stages' lengths ``x``: move one by ``step`` (then half of it, down to one
  step) while ``value`` (None: not a schedule) rises; the stages a schedule leaves out stay out."""
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
