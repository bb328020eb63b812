"""The stacking plan: StackBERT's depth doublings (``cycle.method='stackbert'``) with stage lengths priced from pilots.

``plan_stack`` prices a chain of depth doublings under one warm-up-stable-decay schedule, as ``planner.plan_vcycle``
prices a V-cycle's hand-overs (``growth.wsd_cost``), with what stacking does differently:

- every stage trains at the target's peak learning rate on one continuous schedule (StackBERT's), so each shallower
  model's cost is read off the stable curve of its pilot *at that rate* (``lr_scale`` 1), and the pilots' warm-up is
  the planned run's;
- a model grows only from the one half as deep (``wsd_cost(adjacent=True)``): the plan may start the chain at any
  depth (``cycle.stackbert.stages``) but never skips a doubling;
- the copies do not keep the function: the loss jumps at each doubling and recovers within a few dozen steps. So
  each doubling is priced from the loss *before* it, with no jump, as a *delay* (the steps the stacked model spends
  getting back to that loss) and a *rate* after it; ``stack_rates`` fits both to a run's evals
  (``benchmarks/stack_rates.py`` reads them off finished runs, ``experiments.plan --stack_rates_from`` off run
  directories). On GPT (gcide) the model stacked from one layer into two learned faster than its own scratch run from
  the same loss (1.49x, after 44 steps), the four-layer target at 0.93x after 26 steps; on Shakespeare 0.96x after
  12 and 1.26x after 62: they depend on the data, so measure them on it.

The plan's stage lengths become ``cycle.stackbert.fracs`` of a run of ``train.steps`` = their sum, with the
cool-down and warm-up set in steps (``train.cooldown_frac``, ``train.warmup_frac``) to scratch's and the pilots'.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from multilevel.cycles.growth import growth_rate, margin_rows, predict_chain_wsd, wsd_cost
from multilevel.cycles.growth_curves import Curve, RateCurve, span_losses
from multilevel.cycles.pilots import Candidate
from multilevel.cycles.planner import seed_row

# How each doubling lays out and starts its copies. Measured on GPT at 21 tokens/param (benchmarks/SAVINGS.md,
# "Stacking with longer shallow stages and halved copies"): halved copies added 2-4 points on every seed.
GROWTH = "scaled"
ORDER = "stride"
# How far (as a factor on the shallower model's position on its own scratch curve) a planned hand-over may sit from
# the one its doubling's rate was measured at before the plan says so: LLaMA's 2-layer model learned at 3.03x after a
# 320-step 1-layer stage and at 1.0-1.2x after an 80-step one (benchmarks/SAVINGS.md, "A floor on every stage").
RATES_SPAN = 2.0


def stack_rates(curve: Sequence[Sequence[float]], stables: Sequence, step_flops: Sequence[float],
                knee: float) -> list[dict | None]:
  """How fast each stacked model of a run learned, from the run's eval ``curve`` (rows of FLOPs, seconds, eval loss,
  level; ``benchmarks.saving`` writes them) and the stable curves and step FLOPs of its models (``stables[level]``,
  ``step_flops[level]``; level 0 is the target; a stable curve None where unknown): per growth (shallowest first),
  from the last eval before the growth to the model's last eval before ``knee`` (the FLOPs where the run's cool-down
  starts), the model's position on its stable curve against the steps it trained, fitted as ``rate * (steps -
  delay)``: it recovers from the growth for ``delay`` steps, then learns at ``rate`` times its scratch run's pace from
  the loss it took over. ``trajectory``: per eval fitted, [steps since the growth, eval loss, position in the model's
  scratch steps since the loss it took over]. ``overall`` is the plain ratio (``growth.growth_rate``), ``evals`` the
  number of evals fitted (fewer than ``growth.MIN_EVALS`` is not a measurement to price with). None for a growth with
  no such evals or no curve."""
  out = []
  for i in range(1, len(curve)):
    if curve[i][3] == curve[i - 1][3]:
      continue
    level = int(curve[i][3])
    stable = stables[level] if level < len(stables) else None
    f0, l0 = curve[i - 1][0], curve[i - 1][2]
    after = [(p[0], p[2]) for p in curve[i:] if int(p[3]) == level and p[0] <= knee * (1 + 1e-9)]
    r = growth_rate([(f0, l0)] + after, stable) if stable and after else None
    pts = [] if r is None else [((f - f0) / step_flops[level], (stable.cost(l) - stable.cost(l0)) / step_flops[level])
                                for f, l in after if stable.cost(l) is not None]
    fit = _fit_delay(pts) if pts else None
    losses = [l for f, l in after if stable is not None and stable.cost(l) is not None]
    out.append(None if r is None or fit is None else
               dict(r, overall=r["rate"], rate=fit[0], delay=fit[1], level=level, handover_loss=l0, evals=len(pts),
                    trajectory=[[t, l, p] for (t, p), l in zip(pts, losses)]))
  return out


def _fit_delay(pts: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
  """``(rate, delay)`` of position = rate * (steps - delay), least squares over (steps, position) points; with one
  point, or a fit that would start before the growth, no delay. None where the model did not move forward."""
  n = len(pts)
  through_origin = lambda: sum(t * p for t, p in pts) / sum(t * t for t, _ in pts)
  if n >= 2:
    mt, mp = sum(t for t, _ in pts) / n, sum(p for _, p in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    slope = sum((t - mt) * (p - mp) for t, p in pts) / var if var > 0 else 0.0
    delay = mt - mp / slope if slope > 0 else -1.0
    if slope > 0 and 0 <= delay < max(t for t, _ in pts):
      return slope, delay
  r = through_origin()
  return (r, 0.0) if r > 0 else None


def by_level(target_stable, target_step_flops: float, levels: Sequence[Candidate]) -> tuple[list, list[float]]:
  """The stable curves and step FLOPs of a stacking run's models indexed by level, as ``stack_rates`` reads them
  (level 0 the target, then ``levels`` from the deepest: ``levels`` is shallowest first)."""
  return ([target_stable] + [c.stable for c in reversed(levels)],
          [target_step_flops] + [c.step_flops for c in reversed(levels)])


def rates_from_records(records: Sequence[dict], stables: Sequence, step_flops: Sequence[float]) -> list[dict | None]:
  """``stack_rates`` of a stacking run from its metrics records: its evals with their level, the points of the curve
  ``benchmarks.saving`` keeps (the eval at a stage's end included: it is the loss the model hands over at; the evals
  right after a growth have no FLOPs of their own and are not), the cool-down taken to start after the last eval at
  the run's peak learning rate."""
  evals = sorted((r for r in records if "eval_loss" in r and "flops" in r and "level" in r),
                 key=lambda r: (r["step"], r["flops"]))
  lrs = [r["lr"] for r in records if "lr" in r]
  if not evals or not lrs:
    return []
  peak = max(lrs)
  at_peak = [r["flops"] for r in records if "flops" in r and "eval_loss" in r and r.get("lr", 0) >= peak * (1 - 1e-6)]
  knee = max(at_peak) if at_peak else 0.0
  return stack_rates([[r["flops"], 0.0, r["eval_loss"], r["level"]] for r in evals], stables, step_flops, knee)


def _check(levels: Sequence[Candidate], rates: Sequence[float], delays: Sequence[float] | None) -> list[float]:
  """The per-doubling delays (0 each when None), after refusing what cannot be priced."""
  if not levels:
    raise ValueError("A stacking plan needs at least one shallower model (the target's depth / 2).")
  missing = [c.name for c in levels if c.stable is None]
  if missing:
    raise ValueError(f"A stacking plan reads each shallower model's stable curve, and {missing} have none: give "
                     f"pilots of them under train.decay='wsd' that evaluate often.")
  off = [f"{c.name} (x{c.lr_scale:g})" for c in levels if abs(c.lr_scale - 1.0) > 1e-9]
  if off:
    raise ValueError(f"Stacking trains every stage at the target's train.lr, and the pilots of {off} were best at "
                     f"another rate: give pilots at --lr_scales=1 only.")
  if len(rates) != len(levels) or not all(math.isfinite(r) and r > 0 for r in rates):
    raise ValueError(f"Give one finite positive growth rate per doubling ({len(levels)}: into each deeper model, the "
                     f"target last), got {list(rates)}.")
  delays = [0.0] * len(levels) if delays is None else [float(d) for d in delays]
  if len(delays) != len(levels) or not all(math.isfinite(d) and d >= 0 for d in delays):
    raise ValueError(f"Give one delay per doubling ({len(levels)}, steps >= 0, the target's last), got {delays}.")
  return delays


def plan_stack(target, wsd, levels: Sequence[Candidate], target_step_flops: float, steps: int, rates: Sequence[float],
               delays: Sequence[float] | None = None, min_big_frac: float = 0.05, min_stage_frac: float = 0.05,
               warmup_steps: int | Sequence[int] = 0, growth: str = GROWTH, order: str = ORDER,
               margins: tuple[float, float] = (0.02, 0.75), rates_at: Sequence[float] | None = None,
               rates_span: float = 0.0, rate_curves: Sequence[Curve | None] | None = None) -> dict:
  """The StackBERT schedule that the pilots price cheapest for a budget of ``steps`` target steps.

  ``target``: the target's decayed frontier; ``wsd``: ``planner.Wsd`` (its stable curve and cool-down);
  ``levels``: the shallower models, shallowest first, each half as deep as the next (the last half the target's
  depth), their pilots at the target's learning rate. Per doubling, the model grown from ``levels[k]`` (the
  target's last): ``rates[k]``, how fast it learns, and ``delays[k]``, the steps it first spends recovering from the
  growth (``stack_rates`` measures both; no delay by default). ``warmup_steps``: the pilots' warm-up (one per level,
  or one for all), which the planned run keeps: that of the level its first stage trains.

  ``min_big_frac``: the fewest steps the target trains, as a share of ``steps`` (its cool-down is always inside
  them). ``min_stage_frac``: the shortest stage a plan may have, as a share of ``steps``. The cheapest chain with no
  such floor often passes through a model for a step or two (a doubling skipped in all but name), which is not what
  the rates were measured on, so only chains whose every stage is at least that long are priced; the shallowest
  models may be left out (``dropped`` names those the floor left out of a chain that would otherwise use them).

  ``rates_at``: the loss each doubling's rate was measured from (the shallower model's loss before it, one per
  doubling, None where unknown; ``benchmarks.stack_rates`` prints them): the plan's ``rates_near`` compares them
  with its own hand-overs. ``rates_span`` > 1 (with ``rates_at``): only chains whose every hand-over lies within
  that factor of the measured one, as positions on the shallower model's own stable curve, are priced (0: any).

  ``rate_curves``: per doubling, a ``growth_curves.Curve`` (``RateCurve`` or ``TrajectoryCurve``, over the shallower
  model's stable curve) or None: where given, how far the grown model gets is read off it at the loss the plan hands
  over at, in place of ``rates[k]`` and ``delays[k]``, and ``rates_span`` keeps the hand-over within that factor of
  one of the curve's measured positions (``Curve.reach``: no hand-over in a gap between two points wider than that).

  Returns the plan as ``plan_vcycle`` does (``method``, ``overrides``, ``predicted_flops``, ``predicted_saving``)
  with ``stage_steps`` and ``switch_losses``, ``margins``: the saving if every stacked model lands ``margins[0]``
  nats higher, learns at ``margins[1]`` times its rate, and both, and ``rates_near`` (see ``rates_near``; None when
  ``rates_at`` is not given); or scratch (``cycle.levels`` 1) when no chain saves anything."""
  delays = _check(levels, rates, delays)
  curves = _check_curves(levels, rate_curves)
  if rates_span and not (rates_span > 1 and (rates_at is not None or any(curves))):
    raise ValueError(f"A span of {rates_span:g} keeps each hand-over within that factor of where its doubling's rate "
                     f"was measured: give a factor above 1 and the losses the rates were measured from.")
  if rates_at is not None and (len(rates_at) != len(levels)
                               or not all(x is None or math.isfinite(float(x)) for x in rates_at)):
    raise ValueError(f"Give one finite loss (or None: unknown) per doubling ({len(levels)}: the loss before each "
                     f"doubling that its rate was measured from, the target's last), got {list(rates_at)}.")
  if steps < 4:
    raise ValueError(f"A stacking plan needs a budget of at least 4 target steps, got {steps}.")
  budget = steps * target_step_flops
  cool = max(1, round(wsd.cooldown_frac * steps))
  min_big = max(round(min_big_frac * steps), cool, 1)
  min_stage = max(1, round(min_stage_frac * steps))
  reach = handover_reach(levels, rates_at, curves, rates_span)
  price = lambda floor: wsd_cost(
      [c.stable for c in levels], [c.step_flops for c in levels], [1.0] + [float(x) for x in rates[:-1]], wsd.target,
      target_step_flops, steps, wsd.cooldown_frac, float(rates[-1]), 0.0, min_big, adjacent=True,
      delays=[0.0] + delays[:-1], target_delay=delays[-1], min_steps=floor, handover=reach, curves=[None] + curves)
  r, free = price(min_stage), price(0)
  # The models the floor left out: those the chain priced without it uses and this one skips.
  dropped = [] if r is None or free is None else [c.name for c, a, b in zip(levels, free["steps"], r["steps"])
                                                  if a and not b]
  if any(curves):
    shown = [f"curve over {len(cv.points)} points" if cv is not None else f"{float(x):.3g} after {d:.0f} steps"
             for x, d, cv in zip(rates, delays, curves)]
  else:  # As plans priced at one rate per doubling have always said it.
    shown = f"{[round(float(x), 3) for x in rates]} after delays {[round(d) for d in delays]} steps"
  scope = {"pricing": f"stacking under WSD: stable curves at train.lr, cool-down {wsd.cooldown_frac:g}, rates "
                      f"{shown}, from the loss before each doubling; the target at least {min_big} steps"
                      + (f"; each hand-over within {rates_span:g}x of where its rate was measured" if rates_span
                         else ""),
           "stack_rates": list(rates), "stack_delays": delays, "min_big_steps": min_big,
           **({"rate_curves": [None if cv is None else cv.describe(c.step_flops) for c, cv in zip(levels, curves)]}
              if any(curves) else {}),
           **({"rates_span": rates_span, "reach": reach} if rates_span else {})}
  if r is None or r["saving"] <= 0:
    return {"method": "scratch", "overrides": {"train.steps": steps, "cycle.levels": 1}, **scope,
            "predicted_flops": budget, "predicted_saving": 0.0, "stage_steps": [], "switch_losses": [], "levels": [],
            "why": "no chain of doublings from these pilots is cheaper than scratch at this budget"
                   + (f" with every hand-over within {rates_span:g}x of where its rate was measured" if rates_span
                      else "")}
  used = [k for k, n in enumerate(r["steps"]) if n]
  stage_steps = [r["steps"][k] for k in used] + [r["big_steps"]]
  overrides = schedule_overrides(stage_steps, cool, warmup_steps if isinstance(warmup_steps, int) else
                                 warmup_steps[used[0]], growth, order)
  out = {"method": f"stackbert from {levels[used[0]].name}, {len(stage_steps)} stages", "overrides": overrides,
         **scope, "predicted_flops": r["flops"], "predicted_saving": r["saving"], "stage_steps": stage_steps,
         "switch_losses": [r["switch_losses"][k] for k in used], "levels": [levels[k].name for k in used],
         "dropped": dropped, "curve_end": _curve_end(r, levels, wsd),
         "rates_near": None if rates_at is None and not any(curves) else
         rates_near(levels, r["steps"], r["switch_losses"], rates_at or [None] * len(levels), curves=curves)}
  if any(curves):
    grown = [*r["steps"][1:], r["big_steps"]]  # Per doubling, the steps of the model it grows into.
    out["rates_at_plan"] = [None if s is None else _read_at(cv, s, x, d, n)
                            for s, x, d, cv, n in zip(r["switch_losses"], rates, delays, curves, grown)]
  out["margins"] = margin_rows(*margins, lambda dl, f: predict_stack(
      target, wsd, levels, target_step_flops, steps, rates, r["steps"], r["big_steps"], dl, f, delays, curves))
  seeds = seed_predictions(target, wsd, levels, target_step_flops, steps, rates, r["steps"], r["big_steps"], delays,
                           curves)
  if seeds:
    out["seed_predictions"] = seeds
  return out


def schedule_overrides(stage_steps: Sequence[int], cool: int, warm: int, growth: str = GROWTH,
                       order: str = ORDER) -> dict:
  """The driver's overrides for a stacking schedule of ``stage_steps`` (the shallowest stage first, the target's
  last) whose last ``cool`` steps cool down and whose first ``warm`` steps warm up (at most the first stage's less
  one; 0: none set)."""
  total = sum(stage_steps)
  overrides = {"train.steps": total, "cycle.method": "stackbert", "cycle.stackbert.stages": len(stage_steps),
               "cycle.stackbert.fracs": tuple(n / total for n in stage_steps),
               "cycle.stackbert.growth": growth, "cycle.stackbert.order": order,
               "train.cooldown_frac": cool / total}
  if warm:
    overrides["train.warmup_frac"] = min(warm, stage_steps[0] - 1) / total
  return overrides


def seed_predictions(target, wsd, levels: Sequence[Candidate], target_step_flops: float, steps: int,
                     rates: Sequence[float], lower_steps: Sequence[int], big_steps: int,
                     delays: Sequence[float] | None = None,
                     rate_curves: Sequence[Curve | None] | None = None) -> list[dict]:
  """A stacking schedule (as ``predict_stack`` takes it) priced on each pilot seed's own stable curves of the
  shallower models it trains, where the plan is priced on their mean (``Candidate.seed_stables``: pilots at several
  seeds): the hand-over into the target and the saving a run may see, seed by seed, as ``planner.seed_predictions``
  gives them for a V-cycle. Only seeds that every model the schedule trains was piloted at; none when a model has
  one seed. Only the smaller models' seeds vary: the target's curves are one seed's, and a target whose own seeds
  part (LLaMA's scratch runs at 1600 steps: 0.14 nats apart) spreads the runs further."""
  used = [c for c, n in zip(levels, lower_steps) if n]
  if not used or any(len(c.seed_stables) < 2 for c in used):
    return []
  common = [k for k, _ in used[0].seed_stables if all(k in dict(c.seed_stables) for c in used[1:])]
  out = []
  for seed in common:
    at = [dataclasses.replace(c, stable=dict(c.seed_stables)[seed]) if n else c for c, n in zip(levels, lower_steps)]
    p = predict_stack(target, wsd, at, target_step_flops, steps, rates, lower_steps, big_steps, delays=delays,
                      rate_curves=rate_curves)
    handed = None if p is None else [x for x in p["handover_losses"] if x is not None]
    out.append({**seed_row(seed, handed[-1] if handed else None, p), "handover_losses": handed})
  return out


def _read_at(curve: Curve | None, loss: float, rate: float, delay: float, steps: int) -> dict:
  """What a doubling is priced at where the plan hands over at ``loss`` and the grown model trains ``steps``: a rate
  curve's (rate, delay) there; a trajectory curve's distance over those steps (in its scratch curve's steps) and the
  mean rate that is; the constant ``rate`` and ``delay`` without a curve."""
  if curve is None or isinstance(curve, RateCurve):
    r, d = curve.at(loss) if curve is not None else (float(rate), float(delay))
    return {"rate": r, "delay": d}
  moved = curve.stage(loss).progress(steps)
  return {"moved": moved, "steps": steps, "overall": moved / steps if steps else None}


def _check_curves(levels: Sequence[Candidate], rate_curves) -> list:
  """One ``Curve`` or None per doubling (None each when ``rate_curves`` is None), each over the stable curve of
  the model it grows from."""
  if rate_curves is None:
    return [None] * len(levels)
  curves = list(rate_curves)
  if len(curves) != len(levels) or not all(c is None or isinstance(c, Curve) for c in curves):
    raise ValueError(f"Give one rate curve (or None) per doubling ({len(levels)}, the target's last), got {curves!r}.")
  wrong = [c.name for c, cv in zip(levels, curves) if cv is not None and cv.stable != c.stable]
  if wrong:
    raise ValueError(f"The rate curves of the doublings from {wrong} are not placed on those models' stable curves: "
                     f"build each from the pilot of the model it grows from.")
  return curves


def handover_reach(levels: Sequence[Candidate], rates_at: Sequence[float | None] | None,
                   curves: Sequence[Curve | None], span: float) -> list:
  """Per doubling (from ``levels[k]``), the losses it may hand over at to stay within ``span`` of where its rate was
  measured (``rates_at[k]``) or of one of its rate curve's points (``curves[k]``): as ``wsd_cost``'s ``handover``
  takes them, None where nothing constrains it (no span, or neither given)."""
  return [(curve.reach(span) if curve is not None else reach_losses(c, at, span))
          if span and (at is not None or curve is not None) else None
          for c, at, curve in zip(levels, rates_at or [None] * len(levels), curves)]


def reach_losses(c: Candidate, at: float, span: float) -> tuple[float, float] | None:
  """The (lowest, highest) loss at which shallower model ``c`` may hand over to stay within ``span`` times (either
  way) its position on its stable curve at loss ``at`` (the curve's ends where the span runs past them); None (no
  constraint) where ``at`` is off that curve."""
  pos = c.stable.cost(at)
  return None if pos is None else span_losses(c.stable, pos, span)


def rates_near(levels: Sequence[Candidate], lower_steps: Sequence[int], switch_losses: Sequence[float | None],
               rates_at: Sequence[float | None], span: float = RATES_SPAN,
               curves: Sequence[Curve | None] | None = None) -> list[dict]:
  """Per doubling of a priced chain (``lower_steps`` per shallower model, 0 where the chain starts higher), how far
  its planned hand-over is from the one its rate was measured at (``rates_at``), as positions on the shallower
  model's own stable curve in its steps (for the first stage, the steps it trains). ``far`` where the ratio is
  outside [1/``span``, ``span``] or a loss is off that curve: a rate measured after a long shallow stage does not
  hold after a short one (``RATES_SPAN``). Where a doubling has a rate curve (``curves[k]``), the measured
  hand-over is the curve's point nearest the planned one (in log position): far only outside the span of every
  point."""
  out = []
  names = [c.name for c in levels] + ["the target"]
  curves = list(curves) if curves is not None else [None] * len(levels)
  for k, c in enumerate(levels):
    if not lower_steps[k] or switch_losses[k] is None or (rates_at[k] is None and curves[k] is None):
      continue
    at = lambda loss: None if c.stable.cost(loss) is None else c.stable.cost(loss) / c.step_flops
    planned = at(switch_losses[k])
    if curves[k] is not None:
      where = [x / c.step_flops for x in curves[k].positions]
      measured = min(where, key=lambda x: abs(math.log(x / planned))) if planned else where[0]
      measured_loss = c.stable.loss_at(measured * c.step_flops)
    else:
      measured, measured_loss = at(float(rates_at[k])), float(rates_at[k])
    ratio = planned / measured if measured and planned is not None else None
    out.append({"doubling": f"{c.name} -> {names[k + 1]}", "measured_at": measured_loss,
                "planned_at": switch_losses[k], "measured_steps": measured, "planned_steps": planned, "ratio": ratio,
                "far": ratio is None or not 1 / span <= ratio <= span, "curve": curves[k] is not None})
  return out


def _curve_end(r: dict, levels: Sequence[Candidate], wsd) -> list[str]:
  """The measured curves a priced hand-over sits at the end of (a longer pilot of that model may find a later and
  better one): a shallower model's where it hands over, the target's where the last doubling lands."""
  out = [f"{c.name}'s" for c, s in zip(levels, r["switch_losses"]) if s is not None and c.stable.at_lowest(s)]
  last = [s for s in r["switch_losses"] if s is not None]
  if last and wsd.target.at_lowest(last[-1]):
    out.append("the target's")
  return out


def predict_stack(target, wsd, levels: Sequence[Candidate], target_step_flops: float, steps: int,
                  rates: Sequence[float], lower_steps: Sequence[int], big_steps: int, landing: float = 0.0,
                  rate_factor: float = 1.0, delays: Sequence[float] | None = None,
                  rate_curves: Sequence[Curve | None] | None = None) -> dict | None:
  """What the pilots predict for a given stacking schedule (``lower_steps`` per shallower model, 0 where the chain
  starts higher, then ``big_steps`` of the target; ``target``: the target's decayed frontier): ``growth
  .predict_chain_wsd`` with every stacked model landing ``landing`` nats higher and, after its delay, learning at
  ``rate_factor`` times its rate (read off ``rate_curves`` where a doubling has one, as ``plan_stack`` does)."""
  delays = _check(levels, rates, delays)
  curves = [None if cv is None else cv.scaled(rate_factor) for cv in _check_curves(levels, rate_curves)]
  rs = [float(x) * rate_factor for x in rates]
  return predict_chain_wsd([c.stable for c in levels], [c.step_flops for c in levels], lower_steps, [1.0] + rs[:-1],
                           wsd.target, target, target_step_flops, big_steps, steps, wsd.cooldown_frac, rs[-1],
                           landing, [0.0] + delays[:-1], delays[-1], curves=[None] + curves)
