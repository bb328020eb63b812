"""The V-cycle plan: stage lengths from measured curves, aimed at the hand-over bound (``multilevel.cycles.frontier``).

``plan_vcycle`` turns the bound's hand-over into the V-cycle's stage lengths for a budget of ``steps`` target steps:
the small model trains (fully decayed) for as many steps as its frontier needs to reach the switch loss, the target
then trains for the steps its frontier still needs from there, the coalescing stage is a single step, and growth
does not interpolate with that step's snapshot (``w_pre = 0``). Its
prediction is the bound's, so a measured run of the plan says how close a real hand-over comes to a lossless one
(``benchmarks/bound.py`` measures both). The frontiers come from pilot runs (``experiments/plan.py`` runs and caches
them; ``multilevel.cycles.pilots`` reads them); their FLOPs are a cost of the plan and are reported beside its saving, not hidden in it.

Under one warm-up-stable-decay schedule (``train.decay='wsd'``) the smaller stages hand over at their peak rate, not
decayed: give ``plan_vcycle`` a ``Wsd`` (the target's stable curve, each candidate's in ``Candidate.stable``, and
the growth rates measured from runs) and it prices every hand-over on the stable curves instead
(``multilevel.cycles.growth.wsd_cost``): a calibrated estimate rather than a bound.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Sequence

from multilevel.cycles.frontier import Frontier, bound_at, ideal_cost  # noqa: F401  (the planner's public names)
from multilevel.cycles.growth import handover_jumps, mean_jump, predict_margins  # noqa: F401
from multilevel.cycles.pilots import (Candidate, candidate_from_bound, candidate_from_runs,  # noqa: F401
                                      target_from_saving, target_stable_from_saving)
from multilevel.cycles.plan_report import describe  # noqa: F401  (the plan as text)


# ------------------------------------------------------------------------------------------------ the V-cycle plan


def model_overrides(target, level) -> dict:
  """``model.*`` config keys that turn the target's ``ModelConfig`` into ``level``'s (the fields that differ)."""
  return {f"model.{f.name}": getattr(level, f.name) for f in dataclasses.fields(level)
          if getattr(level, f.name) != getattr(target, f.name)}


GROWTHS = ("depth", "width", "both")


@dataclasses.dataclass(frozen=True)
class Wsd:
  """Plan for one WSD schedule spanning every level: ``target`` is the target's stable curve (the un-decayed part of
  a scratch run at the planned ``train.lr``), ``cooldown_frac`` the schedule's cool-down (``train.cooldown_frac``),
  ``rates`` how fast a model learns after growing in each of ``GROWTHS`` (missing: 1, the bound's assumption;
  ``growth.rate_from_records`` measures one), ``transition_warmup_frac`` the warm-up at the start of each grown
  stage (``cycle.transition_warmup_frac``: the target's stage holds it and the whole cool-down), ``pilot_warmup_frac``
  the pilots' ``train.warmup_frac``: the planned small stage warms up over as many steps as the pilot whose stable
  curve it was priced on (``cycle.small_warmup_steps``), so that it follows that curve."""

  target: Frontier
  cooldown_frac: float = 0.2
  rates: dict = dataclasses.field(default_factory=dict)
  transition_warmup_frac: float = 0.05
  pilot_warmup_frac: float = 0.05

  def __post_init__(self):
    bad = {k: v for k, v in self.rates.items() if k not in GROWTHS or not (math.isfinite(v) and v > 0)}
    if bad:
      raise ValueError(f"Growth rates {bad}: name one of {GROWTHS}, each a finite positive fraction of scratch's "
                       f"pace (1 = as fast as scratch).")
    if not 0 < self.cooldown_frac < 1:
      raise ValueError(f"cooldown_frac must be in (0, 1), got {self.cooldown_frac}.")

  def rate(self, growth: str) -> float:
    return float(self.rates.get(growth, 1.0))


# Split noise of a planned V-cycle (relative, zero-sum over each group of copies): GPT's measured value
# (benchmarks/RESULTS.md, depth_zero_split: 0.1 and 0.5 gave the same loss).
SPLIT_NOISE = 0.1
# How a planned V-cycle starts and grows. The smallest model starts from its own initialisation, as its pilots did
# (cycle.small_init='fresh'), so its stage follows the pilot curve the plan was priced on: started by coalescing the
# target's initialisation instead, the same 2-layer GPT trained 0.08-0.13 nats behind its pilot at the hand-over
# (gcide, T=1400 / 2800; README, "Planning a schedule"). With no snapshot there is nothing to interpolate (w_pre = 0:
# the plan assumes a lossless hand-over), and split noise breaks the grown width copies' symmetry without changing
# the function (without it they stay copies for ever). The pricing still counts one coalescing step of each grown
# model, which no longer runs: a margin of one step.
START = {"cycle.small_init": "fresh", "cycle.w_pre": 0.0, "cycle.split_noise": SPLIT_NOISE}


def _one_axis(c: Candidate) -> bool:
  """Whether the candidate halves one axis only (its cycle settings keep a width or depth factor of 1)."""
  return any(int(c.cycle.get(k, 2)) == 1 for k in ("cycle.width_factor", "cycle.depth_factor"))


def chain_overrides(mid: Candidate, layers: int, heads: int) -> dict:
  """The ``cycle`` schemes of a 3-level V-cycle whose middle level is ``mid`` (one axis halved) and whose bottom
  halves the other axis too: an identity scheme on the axis a transition keeps (the target has ``layers`` layers
  and ``heads`` heads), the default halving on the other."""
  ident = lambda n: [[i] for i in range(n)]
  if int(mid.cycle.get("cycle.width_factor", 2)) == 1:  # Depth first, then width.
    widths, depths = [ident(heads), None], [None, ident(layers // 2)]
  else:  # Width first, then depth.
    widths, depths = [None, ident(heads // 2)], [ident(layers), None]
  return {"cycle.width_schemes": json.dumps(widths), "cycle.depth_schemes": json.dumps(depths)}


def _chain_row(small: Candidate, mid: Candidate, target: Frontier, target_step_flops: float, steps: int,
               target_loss: float, min_big_frac: float, jump: float) -> dict:
  """A 3-level chain small -> mid -> target priced like a 2-level candidate: each model trains from the loss it
  takes over at to the loss it hands over at, as its frontier says; one coalescing step at each larger level."""
  row = {"candidate": f"{small.name} > {mid.name}", "chain": (small.name, mid.name)}
  b = bound_at([small.frontier, mid.frontier, target], target_loss, jump=jump)
  row["bound"] = b
  if b is None or None in b["switch_losses"]:
    return row  # A chain that skips a model is one of the 2-level rows.
  s2, s1 = b["switch_losses"]
  n2 = max(1, round(small.frontier.cost(s2) / small.step_flops))
  n1 = max(1, round((mid.frontier.cost(s1) - mid.frontier.cost(s2 + jump)) / mid.step_flops))
  n0 = max(round(min_big_frac * steps), round(steps - target.cost(s1 + jump) / target_step_flops), 1)
  flops = target_step_flops * (1 + n0) + mid.step_flops * (1 + n1) + small.step_flops * n2
  return dict(row, switch_loss=s1, switch_losses=[s2, s1], small_steps=n2, mid_steps=n1, big_steps=n0, flops=flops,
              saving=1 - flops / (steps * target_step_flops))


def _wsd_rows(wsd: Wsd, candidates: Sequence[Candidate], target_step_flops: float, steps: int, min_big: int,
              jump: float, chains: bool) -> list[tuple]:
  """(candidate or (small, mid), row) for every 2-level candidate and, with ``chains``, every 3-level chain, priced
  under one WSD schedule (``growth.wsd_cost``)."""
  from multilevel.cycles.growth import wsd_cost
  missing = [c.name for c in candidates if c.stable is None]
  if missing:
    raise ValueError(f"Planning under train.decay='wsd' reads each candidate's stable curve (its loss before the "
                     f"cool-down), and {missing} have none: give level runs with curves (benchmarks.bound writes "
                     f"them) or pilots that evaluate often.")
  out = []
  price = lambda lower, rates, growth: wsd_cost([c.stable for c in lower], [c.step_flops for c in lower], rates,
                                                wsd.target, target_step_flops, steps, wsd.cooldown_frac,
                                                wsd.rate(growth), jump, min_big)
  for c in candidates:
    r = price([c], [1.0], c.growth)
    row = {"candidate": c.name, "pricing": "wsd", "growth_rate": wsd.rate(c.growth)}
    if r is not None:
      row.update(switch_loss=r["switch_losses"][0], small_steps=r["steps"][0], big_steps=r["big_steps"],
                 flops=r["flops"], saving=r["saving"], curve_end=_curve_end(r, [c], wsd, jump))
    out.append((c, row))
  for small in [c for c in candidates if not _one_axis(c)] if chains else []:
    for mid in [c for c in candidates if _one_axis(c)]:
      into_mid = "width" if mid.growth == "depth" else "depth"  # The axis the small model halves beyond the mid's.
      r = price([small, mid], [1.0, wsd.rate(into_mid)], mid.growth)
      row = {"candidate": f"{small.name} > {mid.name}", "chain": (small.name, mid.name), "pricing": "wsd",
             "growth_rates": [wsd.rate(into_mid), wsd.rate(mid.growth)]}
      if r is not None and None not in r["switch_losses"]:
        row.update(switch_loss=r["switch_losses"][1], switch_losses=r["switch_losses"], small_steps=r["steps"][0],
                   mid_steps=r["steps"][1], big_steps=r["big_steps"], flops=r["flops"], saving=r["saving"],
                   curve_end=_curve_end(r, [small, mid], wsd, jump))
      out.append(((small, mid), row))
  return out


def _curve_end(r: dict, lower: Sequence[Candidate], wsd: Wsd, jump: float) -> list[str]:
  """The measured curves a WSD hand-over stopped at the end of (a longer pilot of that model may find a later and
  better hand-over): the target's stable curve where the last growth lands, a smaller model's where it hands over."""
  out, last = [], [s for s in r["switch_losses"] if s is not None][-1]
  if wsd.target.at_lowest(last + jump):
    out.append("the target's")
  for c, s in zip(lower, r["switch_losses"]):
    if s is not None and c.stable.at_lowest(s):
      out.append(f"{c.name}'s")
  return out


def plan_vcycle(target: Frontier, target_step_flops: float, steps: int, candidates: Sequence[Candidate],
                target_pilot_flops: float = 0.0, min_big_frac: float = 0.05, jump: float = 0.0,
                shape: tuple[int, int] | None = None, wsd: Wsd | None = None,
                margins: tuple[float, float] = (0.02, 0.75)) -> dict:
  """The 2-level V-cycle that aims at the bound for a budget of ``steps`` target steps (the scratch run it is
  measured against), from the best of ``candidates``; scratch (``cycle.levels = 1``) when none saves anything. The
  target trains at least ``min_big_frac`` of the steps after growing, even where the bound would hand over at the
  budget's loss itself (a smaller model that reaches it alone, for which the plan also reports that option).

  Returns ``overrides`` (config keys the driver runs as they are), the predicted loss and FLOPs, the predicted
  saving, the pilots' FLOPs and the saving net of them, one row per candidate, and ``smaller_model_alone``: the best
  candidate trained alone to the budget's loss, when one gets there for less (you would end with that model, not the
  target: the envelope a user who only wants the loss would also consider).

  ``jump``: the loss the target starts above the small model at the hand-over (nats; ``handover_jumps`` measures it
  from a run). 0 assumes a lossless hand-over, the bound; a measured jump makes the plan hand over where the loss it
  costs is repaid, and its prediction an estimate rather than a bound.

  ``shape``: the target's (layers, heads). With it, the plan also prices 3-level chains: the halved candidate (both
  axes) at the bottom, a one-axis candidate (depth or width only) in the middle (``chain_overrides``), each model
  trained between the losses the chain's bound hands over at; the number of levels is then the planner's choice
  (1 = scratch, 2 or 3).

  ``wsd``: the run uses one WSD schedule across its levels (``Wsd``): every hand-over is priced on the stable curves
  with the measured growth rates (``growth.wsd_cost``), the target's stage holds its warm-up and the whole
  cool-down, and the prediction is that the run ends at scratch's loss for the predicted FLOPs. A 2-level WSD plan
  also reports ``margins`` (``growth.predict_margins``): its saving if the target lands ``margins[0]`` nats higher,
  learns at ``margins[1]`` times the priced rate, and both."""
  if steps < 4:
    raise ValueError(f"A V-cycle plan needs a budget of at least 4 target steps, got {steps}.")
  budget = steps * target_step_flops
  lo, hi = target.points[0][0], target.points[-1][0]
  if budget < lo:
    raise ValueError(f"The target's frontier starts at {lo:.3g} FLOPs; a budget of {steps} steps is only "
                     f"{budget:.3g}. Measure the target's scratch frontier at shorter budgets (its pilots).")
  # Scratch at the budget costs exactly ``budget``; its loss is needed only as the lowest loss worth handing over
  # at. Past the target's pilots, the search stays inside what they measured (the hand-over happens well above the
  # budget's loss, where the small model is still cheaper), and the plan says so.
  beyond = budget > hi
  target_loss = target.loss_range[0] if beyond else target.loss_at(budget)
  pilots = target_pilot_flops + sum(c.pilot_flops for c in candidates)
  if wsd is not None:
    cool = max(1, round(wsd.cooldown_frac * steps))
    min_big = max(round(min_big_frac * steps), math.ceil(cool / (1 - wsd.transition_warmup_frac)), 1)
    priced = _wsd_rows(wsd, candidates, target_step_flops, steps, min_big, jump, shape is not None)
  else:
    priced = _bound_rows(target, target_step_flops, steps, candidates, target_loss, min_big_frac, jump, shape)
  rows, best = [], None
  for c, row in priced:  # The first of equal savings wins.
    rows.append(row)
    if "saving" in row and (best is None or row["saving"] > best[1]["saving"]):
      best = (c, row)
  # A smaller model alone is priced against scratch at the budget; past the target's pilots target_loss is only
  # their lowest loss, and reaching it says nothing about scratch's loss at the budget.
  smaller = None if beyond else _smaller_model_alone(candidates, target_loss, budget)
  base = {"train.steps": steps}
  scope = {"handover_jump": jump, "budget_beyond_pilots": beyond,
           "pricing": "lossless bound on decayed frontiers" if wsd is None else
           f"WSD: stable curves, cool-down {wsd.cooldown_frac:g}, growth rates "
           f"{ {g: wsd.rate(g) for g in GROWTHS} }", "target_loss_is": "the target pilots' lowest (the budget is past them)"
           if beyond else "scratch's at the budget, on the target's frontier"}
  if best is None or best[1]["saving"] <= 0:
    # A candidate whose every measured loss lies below the lowest the search reaches never overlaps the target's
    # frontier: no hand-over can be priced, which says nothing about whether one pays. Say what to measure.
    below, why = (_wsd_no_overlap(candidates, wsd, steps, target_step_flops, jump) if wsd is not None else
                  _bound_no_overlap(candidates, target_loss, steps))
    return {"method": "scratch", "overrides": {**base, "cycle.levels": 1}, "target_loss": target_loss, **scope,
            "predicted_flops": budget, "predicted_saving": 0.0, "pilot_flops": pilots,
            "net_saving": -pilots / budget, "candidates": rows, "smaller_model_alone": smaller, "why": why,
            "no_overlap": below}
  c, row = best
  warm = _small_warmup(c[0] if isinstance(c, tuple) else c, wsd, row["small_steps"])
  if isinstance(c, tuple):
    return _chain_plan(c, row, shape, {**base, **warm}, steps, budget, scope, pilots, rows, smaller, target_loss)
  overrides = {**base, **START, **warm, **c.cycle, "cycle.method": "vcycle", "cycle.levels": 2,
               "cycle.small_frac": row["small_steps"] / steps, "cycle.up_fracs": (row["big_steps"] / steps,),
               "cycle.lr_scales": (1.0, c.lr_scale)}
  out = {"method": f"vcycle from {c.name}", "overrides": overrides, "target_loss": target_loss, **scope,
         "predicted_flops": row["flops"], "predicted_saving": row["saving"], "pilot_flops": pilots,
         "net_saving": 1 - (row["flops"] + pilots) / budget, "switch_loss": row["switch_loss"],
         "small_steps": row["small_steps"], "big_steps": row["big_steps"], "candidates": rows,
         "smaller_model_alone": smaller}
  if wsd is not None:
    out["margins"] = predict_margins(c.stable, c.step_flops, row["small_steps"], wsd.target, target, target_step_flops,
                                     row["big_steps"], steps, wsd.cooldown_frac, jump, wsd.rate(c.growth),
                                     *margins)
  if wsd is not None and c.seed_stables:
    out["seed_predictions"] = seed_predictions(c, row["small_steps"], row["big_steps"], wsd, target,
                                               target_step_flops, steps, jump)
  return out


def _bound_rows(target: Frontier, target_step_flops: float, steps: int, candidates: Sequence[Candidate],
                target_loss: float, min_big_frac: float, jump: float, shape: tuple[int, int] | None):
  """(candidate, row) for each 2-level hand-over at the lossless bound on the decayed frontiers, then, given the
  target's ``shape``, each 3-level chain of a halved candidate through a one-axis one (rows with no ``saving`` price
  nothing)."""
  budget = steps * target_step_flops
  for c in candidates:
    b = bound_at([c.frontier, target], target_loss, jump=jump)
    row = {"candidate": c.name, "bound": b}
    if b is not None and b["switch_losses"][0] is not None:
      switch = b["switch_losses"][0]
      small = max(1, round(c.frontier.cost(switch) / c.step_flops))
      big = max(round(min_big_frac * steps), round(steps - target.cost(switch + jump) / target_step_flops), 1)
      flops = target_step_flops * (1 + big) + c.step_flops * small  # One coalescing step, the small, the big.
      row.update(switch_loss=switch, small_steps=small, big_steps=big, flops=flops, saving=1 - flops / budget)
    yield c, row
  if shape is not None:
    for small in [c for c in candidates if not _one_axis(c)]:
      for mid in [c for c in candidates if _one_axis(c)]:
        yield (small, mid), _chain_row(small, mid, target, target_step_flops, steps, target_loss, min_big_frac, jump)


def _bound_no_overlap(candidates: Sequence[Candidate], target_loss: float, steps: int) -> tuple[list[str], str]:
  """Why no hand-over at the bound could be priced: the candidates whose frontier lies wholly below the lowest loss
  the search reaches, and the reason in words."""
  below = [c.name for c in candidates if c.frontier.loss_range[1] <= target_loss]
  if not below:
    return below, "no candidate's frontier is cheaper than the target's anywhere a hand-over could use it"
  return below, (f"the frontier of {', '.join(below)} lies wholly below the losses the target's frontier reaches "
                 f"(down to {target_loss:.4f}), so no hand-over could be priced: measure the target to lower losses "
                 f"(longer --target_pilots, up to the budget of {steps} steps) or the candidates to higher ones "
                 f"(shorter --small_pilots)")


def _wsd_no_overlap(candidates: Sequence[Candidate], wsd: Wsd, steps: int, target_step_flops: float,
                    jump: float) -> tuple[list[str], str]:
  """Why no WSD hand-over could be priced: the candidates whose stable curve starts (its first evaluation) below the
  loss that lands the target where scratch's cool-down starts, and the reason in words. A hand-over is priced only at
  a loss both curves measure and that lands before that point, so such a candidate, however cheap, has no loss left
  to hand over at: its pilot must be evaluated earlier."""
  cool = max(1, round(wsd.cooldown_frac * steps))
  edge = wsd.target.loss_at((steps - cool) * target_step_flops)
  late = [] if edge is None else [c for c in candidates if c.stable.loss_range[1] < edge - jump]
  if not late:
    return [], ("under WSD no candidate hands over for less: either no candidate's stable curve is cheaper than the "
                "target's at a loss the target's stable curve measures before scratch's cool-down, or the growth rates "
                "take back what it saves")
  starts = ", ".join(f"{c.name}'s at {c.stable.loss_range[1]:.4f} (after {c.stable.points[0][0]:.3g} FLOPs)"
                     for c in late)
  return [c.name for c in late], (
      f"the stable curve of {', '.join(c.name for c in late)} starts below {edge - jump:.4f}, the loss a hand-over "
      f"must be made at for the target to land before scratch's cool-down starts (step {steps - cool} of {steps}): "
      f"{starts}. So no loss is left that both curves measure; evaluate those pilots earlier (more evaluations, e.g. "
      f"benchmarks.bound --evals=40, or a shorter pilot) and plan again")


def seed_predictions(c: Candidate, small_steps: int, big_steps: int, wsd: Wsd, target: Frontier,
                     target_step_flops: float, steps: int, jump: float = 0.0) -> list[dict]:
  """The planned WSD schedule (``small_steps`` of ``c``, then ``big_steps`` of the target) priced on each pilot
  seed's own stable curve (``growth.predict_wsd``), where the plan itself is priced on their mean: the hand-over loss
  and saving a run of the plan may see, seed by seed. Only the small model's seeds vary here (the target's curves
  are one seed's), so the measured spread can be wider. Where a seed's run would get further than the target's
  longest scratch run, its final loss is below what the frontier measures: ``saving`` is then what it saves at
  least (against that run, ``at_least``); None where the seed's curve does not reach the hand-over."""
  from multilevel.cycles.growth import predict_wsd
  out = []
  for seed, curve in c.seed_stables:
    p = predict_wsd(curve, c.step_flops, small_steps, wsd.target, target, target_step_flops, big_steps, steps,
                    wsd.cooldown_frac, jump, wsd.rate(c.growth))
    out.append(seed_row(seed, curve.loss_at(small_steps * c.step_flops), p))
  return out


def seed_row(seed, handover_loss: float | None, p: dict | None) -> dict:
  """One seed's entry of a plan's ``seed_predictions``: its hand-over loss and what the prediction ``p`` on its own
  curves says (None where they do not reach)."""
  return {"seed": seed, "handover_loss": handover_loss, "final_loss": p and p["final_loss"],
          "saving": p and p["saving"], "at_least": bool(p and p["at_least"])}


def _small_warmup(c: Candidate, wsd: Wsd | None, small_steps: int) -> dict:
  """Under WSD the small stage is priced on its pilot's stable curve, which it follows only with the pilot's
  warm-up (``train.warmup_frac`` of the pilot's steps; at most the stage's steps less one)."""
  if wsd is None or not c.stable_steps:
    return {}
  return {"cycle.small_warmup_steps": max(1, min(round(wsd.pilot_warmup_frac * c.stable_steps), small_steps - 1))}


def _chain_plan(chain, row, shape, base, steps, budget, scope, pilots, rows, smaller, target_loss) -> dict:
  """The 3-level plan of a winning chain row (see ``plan_vcycle``)."""
  small, mid = chain
  overrides = {**base, **START, **chain_overrides(mid, *shape), "cycle.method": "vcycle", "cycle.levels": 3,
               "cycle.small_frac": row["small_steps"] / steps,
               "cycle.up_fracs": (row["big_steps"] / steps, row["mid_steps"] / steps),
               "cycle.lr_scales": (1.0, mid.lr_scale, small.lr_scale)}
  return {"method": f"3-level vcycle from {small.name} through {mid.name}", "overrides": overrides, **scope,
          "target_loss": target_loss, "predicted_flops": row["flops"],
          "predicted_saving": row["saving"], "pilot_flops": pilots,
          "net_saving": 1 - (row["flops"] + pilots) / budget,
          "switch_loss": row["switch_loss"], "switch_losses": row["switch_losses"], "small_steps": row["small_steps"],
          "mid_steps": row["mid_steps"], "big_steps": row["big_steps"], "candidates": rows,
          "smaller_model_alone": smaller}


def _smaller_model_alone(candidates: Sequence[Candidate], target_loss: float, budget: float) -> dict | None:
  """The candidate that, trained alone, reaches ``target_loss`` for the fewest FLOPs below ``budget`` (None if none
  does): its steps, FLOPs, saving and the overrides that run it."""
  alone = []
  for c in candidates:
    cost = c.frontier.cost(target_loss)
    if cost is None and c.frontier.loss_range[1] < target_loss:
      cost = c.frontier.points[0][0]  # Its shortest run already ends lower: at most that much.
    if cost is not None and cost < budget:
      steps = max(1, round(cost / c.step_flops))
      alone.append({"candidate": c.name, "steps": steps, "flops": cost, "saving": 1 - cost / budget,
                    "at_most": c.frontier.cost(target_loss) is None,
                    "lr_scale": c.lr_scale,  # Of the target's train.lr.
                    "overrides": {**c.model, "cycle.levels": 1, "train.steps": steps}})
  return max(alone, key=lambda a: a["saving"]) if alone else None


def predict_vcycle(target: Frontier, target_step_flops: float, small: Frontier, small_step_flops: float,
                   small_steps: int, big_steps: int, jump: float = 0.0) -> dict | None:
  """What the frontiers predict for a given 2-level schedule: the small model trained ``small_steps`` (fully
  decayed: its frontier), the target landing ``jump`` above that loss, then ``big_steps`` more target steps as if
  continuing its own frontier from there (plus the one coalescing step). Returns the predicted final loss, FLOPs and
  saving against the target's scratch at that loss, or None where a frontier does not reach."""
  f_small = small_steps * small_step_flops
  l_small = small.loss_at(f_small)
  start = None if l_small is None else target.cost(l_small + jump)
  end = None if start is None else start + big_steps * target_step_flops
  if end is not None and target.points[-1][0] < end <= target.points[-1][0] + target_step_flops:
    end = target.points[-1][0]  # Past the frontier's end by less than a step (the stage lengths are rounded).
  loss = None if end is None else target.loss_at(end)
  if loss is None:
    return None
  flops = f_small + (1 + big_steps) * target_step_flops
  return {"small_loss": l_small, "landing_loss": l_small + jump, "final_loss": loss, "flops": flops,
          "saving": 1 - flops / target.cost(loss)}
