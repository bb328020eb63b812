"""What a growth costs, read from runs, and the price of a V-cycle under one warm-up-stable-decay (WSD) schedule.

Two things a hand-over can lose, each measured from a run:

- the *jump* (``handover_jumps``): the eval loss right after growing minus the one right before;
- the *growth rate* (``growth_rate``): how fast the grown model then learns, as a fraction of its own scratch run's
  pace at the same loss. On the target's stable curve U (the un-decayed part of a WSD scratch run: the loss it has
  after F FLOPs at its peak learning rate), a model at loss l sits at U^-1(l); the rate is how far that position moves
  per FLOP the grown model trains. 1 is the bound's assumption; width growth by duplication measured well below it on
  GPT (benchmarks/results/growth_rates_gcide_gpt.json).

Under one WSD schedule spanning every level (``train.decay='wsd'``) only the target's last stage cools down, over the
last ``cooldown_frac`` of the budget's T steps as scratch does; every smaller stage hands over at its *peak* rate, at
an un-decayed loss, so its cost is read off its stable curve, not its (decayed) frontier. The target, grown at loss
L and landing at L + jump, sits at U_T^-1(L + jump); it reaches scratch's position at the start of scratch's
cool-down, (1 - cooldown_frac) T steps, after (that distance) / rate FLOPs, then cools down as scratch does and ends
at scratch's final loss. ``wsd_cost`` finds the hand-over losses that make that cheapest (``frontier.best_table`` for
the smaller levels), ``predict_wsd`` prices a given schedule. On GPT (gcide, 2800 steps) this predicted a depth-only
V-cycle's final loss at 2.712 against a measured 2.713, where the decayed frontiers had predicted 2.664.
"""

from __future__ import annotations

import math
from typing import Sequence

from multilevel.cycles.frontier import Frontier, backtrack, best_table, check_rates
from multilevel.cycles.growth_curves import Curve, Stage

# The fewest evals of a grown model at its peak rate (after its growth, before any cool-down) that a growth rate is
# read from. With one or two, eval noise decides the rate: DeiT's planned target at 44 tokens/param (47 steps, one
# eval on 1,024 images) read -0.13x on one seed and 9.1x on another; BERT's stacked target (one eval) 0.07x.
MIN_EVALS = 3


def enough_evals(r: dict | None) -> bool:
  """Whether a measured rate (``growth_rate``'s, or ``stack_planner.stack_rates``' per doubling) rests on at least
  ``MIN_EVALS`` evals: the one rule every reader of rates applies."""
  return r is not None and r.get("rate") is not None and r["evals"] >= MIN_EVALS


# --------------------------------------------------------------------------------------------- stable curves


def stable_curve(name: str, points: Sequence[Sequence[float]]) -> Frontier:
  """A stable curve from ``(FLOPs, eval loss, learning rate)`` evaluations of one WSD run (of one model): those up to
  the last one at the run's peak rate (warm-up included, cool-down left out)."""
  pts = [tuple(float(x) for x in p[:3]) for p in points]
  if not pts:
    raise ValueError(f"Stable curve {name!r}: no evaluations.")
  peak = max(p[2] for p in pts)
  last = max(i for i, p in enumerate(pts) if p[2] >= peak * (1 - 1e-6))
  kept = [(f, l) for f, l, _ in pts[:last + 1] if f > 0]
  if len(kept) < 2:
    raise ValueError(f"Stable curve {name!r}: {len(kept)} evaluation(s) before the cool-down; evaluate more often "
                     f"(the planner reads the un-decayed loss between them).")
  return Frontier(name, tuple(kept))


def eval_curve(records: Sequence[dict], level: int | None = None) -> list[list[float]]:
  """``[FLOPs, eval loss, learning rate]`` at each evaluation in a run's metrics records (of ``level`` only, if
  given); an eval logged at a step without a learning rate takes the last one logged before it."""
  out, lr = [], None
  for r in sorted((r for r in records if "step" in r and "event" not in r), key=lambda r: r["step"]):
    if level is not None and r.get("level") != level:
      continue
    lr = r.get("lr", lr)
    if "eval_loss" in r and "flops" in r and lr is not None:
      out.append([r["flops"], r["eval_loss"], lr])
  return out


def stable_from_records(name: str, records: Sequence[dict], level: int = 0) -> Frontier:
  """``stable_curve`` of a run's metrics records (``multilevel.metrics.read_metrics``) at ``level``."""
  return stable_curve(name, eval_curve(records, level))


def stable_from_scratch_curve(name: str, curve: Sequence[Sequence[float]], total_flops: float,
                              cooldown_frac: float) -> Frontier:
  """``stable_curve`` of a ``benchmarks.saving`` scratch curve (``[FLOPs, seconds, eval loss]`` rows of a WSD run
  whose cool-down is its last ``cooldown_frac`` of ``total_flops``)."""
  knee = (1 - cooldown_frac) * total_flops * (1 + 1e-9)
  pts = [(f, l) for f, _, l, *_ in curve if f <= knee]
  if len(pts) < 2:
    raise ValueError(f"Stable curve {name!r}: {len(pts)} evaluation(s) before the cool-down.")
  return Frontier(name, tuple(pts))


# --------------------------------------------------------------------------------------------- growth, measured


def handover_jumps(records: Sequence[dict]) -> list[dict]:
  """The loss each growth cost in a run's metrics records (``multilevel.metrics.read_metrics``): for every stage
  entered at a larger model (a lower level), the eval loss at the end of the stage before and the last eval logged
  at the new stage's first step (after growing, and after any interpolation). Returns ``[{'step', 'before',
  'after', 'jump'}]`` in step order; empty when the run never grew or did not evaluate around its transitions."""
  ends = {r["stage"]: r for r in records if r.get("event") == "end_of_stage" and "eval_loss" in r}
  after: dict[int, dict] = {}
  for r in records:
    if str(r.get("event", "")).startswith("after_") and "eval_loss" in r:
      after[r["stage"]] = r  # The last one logged for the stage: the model it trains from.
  out = []
  for stage, a in sorted(after.items()):
    b = ends.get(stage - 1)
    if b is not None and a["level"] < b["level"]:
      out.append({"step": a["step"], "stage": stage, "before": b["eval_loss"], "after": a["eval_loss"],
                  "jump": a["eval_loss"] - b["eval_loss"], "flops": b.get("flops")})
  return out


def mean_jump(jumps: Sequence[dict]) -> float:
  """The mean ``jump`` of ``handover_jumps`` entries (of one run or several)."""
  if not jumps:
    raise ValueError("no growth with an eval on both sides of it: is it a V-cycle run?")
  return sum(j["jump"] for j in jumps) / len(jumps)


def growth_rate(points: Sequence[tuple[float, float]], target: Frontier) -> dict | None:
  """How fast a grown model learned, from ``points`` = (FLOPs, eval loss) of it at its peak rate, the hand-over first
  (its landing loss) and the last before any cool-down: the distance it moved on ``target`` (the grown model's
  stable curve) over the FLOPs it spent; ``evals``: the points after the first (fewer than ``MIN_EVALS`` is not a
  measurement to price with). None where the curve does not reach a loss or too few points."""
  pts = sorted(points)
  if len(pts) < 2:
    return None
  (f0, l0), (f1, l1) = pts[0], pts[-1]
  p0, p1 = target.cost(l0), target.cost(l1)
  if p0 is None or p1 is None or f1 <= f0:
    return None
  return {"rate": (p1 - p0) / (f1 - f0), "landing_loss": l0, "last_loss": l1, "flops": f1 - f0,
          "scratch_flops": p1 - p0, "evals": len(pts) - 1}


def rate_from_records(records: Sequence[dict], target: Frontier) -> dict | None:
  """``growth_rate`` of the target in a V-cycle run's metrics records: from its last growth (``handover_jumps``) to
  its last eval at the peak rate. None when the run never grew or its target never trained at its peak."""
  jumps = handover_jumps(records)
  if not jumps:
    return None
  g = jumps[-1]
  mine = [r for r in records if r.get("stage", -1) >= g["stage"] and r.get("level") == 0]
  lr_at = {r["step"]: r["lr"] for r in mine if "lr" in r}
  if not lr_at:
    return None
  peak = max(lr_at.values())
  evals = [(r["flops"], r["eval_loss"]) for r in mine if "eval_loss" in r and "flops" in r and "event" not in r
           and lr_at.get(r["step"], 0) >= peak * (1 - 1e-6)]
  start = g["flops"] if g.get("flops") is not None else (min(f for f, _ in evals) if evals else None)
  if start is None or not evals:
    return None
  return growth_rate([(start, g["after"])] + evals, target)


# --------------------------------------------------------------------------------------------- pricing under WSD


def wsd_cost(lower: Sequence[Frontier], step_flops: Sequence[float], rates: Sequence[float], target: Frontier,
             target_step_flops: float, steps: int, cooldown_frac: float, target_rate: float = 1.0,
             jump: float = 0.0, min_big: int = 1, grid: int = 400, adjacent: bool = False,
             delays: Sequence[float] | None = None, target_delay: float = 0.0, min_steps: int = 0,
             handover: Sequence[tuple[float, float] | None] | None = None,
             curves: Sequence[Curve | None] | None = None) -> dict | None:
  """The cheapest V-cycle under one WSD schedule from the smaller models ``lower`` (their *stable* curves, smallest
  first; any may be skipped) to the target (``target``: its stable curve) that ends at scratch's final loss after a
  budget of ``steps`` target steps.

  ``rates[k]``: how fast model k learns after growing into it (``rates[0]``, the bottom model's, is not read);
  ``target_rate``: the target's after its growth. ``min_big``: fewest target steps after the growth (the cool-down,
  ``cooldown_frac`` of ``steps``, is always inside them). ``adjacent``: each model grows only from the one before it
  and the target only from the last of ``lower`` (a chain of doublings, as stacking grows; the smallest models may
  still be skipped, none in between). ``delays[k]`` / ``target_delay``: steps a model grown into spends before it
  moves on from the loss it took over at (a recovery from the growth; ``delays[0]`` is not read), then at its rate.
  ``min_steps``: the fewest steps a smaller model's stage may train (a delay included); only chains whose every
  stage is at least that long are priced (a model passed through for a step or two is a growth in name only).
  ``handover[k]``: the (lowest, highest) loss at which smaller model k may hand over, or a list of such intervals
  (None: anywhere).
  ``curves``: one per model, the target's last (``len(lower) + 1``; None where the constant rate and delay hold):
  a ``growth_curves.Curve`` whose stage, read at the loss the model before handed over at, replaces that model's
  rate and delay (``curves[0]`` is not read).

  Returns ``{'flops', 'saving', 'switch_losses', 'steps', 'big_steps', 'landing_flops'}`` (``steps``: per smaller
  model, its training steps, 0 when skipped; ``flops`` also counts one coalescing step of each grown model) or None
  when no hand-over lands on the target's measured stable curve before scratch's cool-down starts."""
  rates = check_rates(rates, len(lower))
  if not (math.isfinite(target_rate) and target_rate > 0):
    raise ValueError(f"The target's growth rate must be a finite positive number, got {target_rate}.")
  if not 0 < cooldown_frac < 1:
    raise ValueError(f"cooldown_frac must be in (0, 1), got {cooldown_frac}.")
  budget = steps * target_step_flops
  cool = max(1, round(cooldown_frac * steps))
  knee = (steps - cool) * target_step_flops  # Where scratch's cool-down starts.
  top = max(f.loss_range[1] for f in lower)
  bottom = min(f.loss_range[0] for f in lower)
  losses = [top - (top - bottom) * i / (grid - 1) for i in range(grid)]
  # The loss that lands exactly where scratch's cool-down starts: where the hand-over usually ends up (a lower one
  # lands past it), so it is priced exactly rather than to the grid's resolution.
  edge = target.loss_at(knee)
  if edge is not None and bottom < edge - jump < top:
    losses = sorted(set(losses) | {edge - jump}, reverse=True)
  delays = [0.0] * len(lower) if delays is None else [float(d) for d in delays]
  if len(delays) != len(lower) or not all(math.isfinite(d) and d >= 0 for d in delays + [target_delay]):
    raise ValueError(f"Growth delays must be {len(lower)} finite numbers of steps >= 0 (and the target's), got "
                     f"{delays} and {target_delay}.")
  curves = _check_curves(curves, len(lower))
  curved = [None if c is None else _in_flops(c, f) for c, f in zip(curves, step_flops)]
  best, back = best_table(lower, losses, jump, rates, adjacent, [d * f for d, f in zip(delays, step_flops)],
                          [min_steps * f for f in step_flops], handover, curved)
  lands = [target.cost(l + jump) for l in losses]
  choice = None
  for k in range(len(lower) - 1, len(lower)) if adjacent else range(len(lower)):
    for i, land in enumerate(lands):
      if best[k][i] == math.inf or land is None or land > knee * (1 + 1e-9):
        continue
      st = curves[-1].stage(losses[i]) if curves[-1] is not None else Stage.linear(target_rate, target_delay)
      big = max(min_big, math.ceil(cool + st.steps(max(0.0, knee - land) / target_step_flops) - 1e-9))
      total = best[k][i] + target_step_flops * (1 + big)
      if choice is None or total < choice[0]:
        choice = (total, k, i, big, land)
  if choice is None:
    return None
  _, k, i, big, land = choice
  switches = backtrack(back, losses, k, i, len(lower))
  switches[k] = losses[i]
  n, prev, coalesce = [0] * len(lower), None, 0.0
  for m, s in enumerate(switches):
    if s is None:
      continue
    if prev is None:
      n[m] = max(1, round(lower[m].cost(s) / step_flops[m]))
    else:
      st = curves[m].stage(prev) if curves[m] is not None else Stage.linear(rates[m], delays[m])
      n[m] = max(1, round(st.steps((lower[m].cost(s) - lower[m].cost(prev + jump)) / step_flops[m])))
      coalesce += step_flops[m]
    prev = s
  flops = sum(a * b for a, b in zip(n, step_flops)) + coalesce + target_step_flops * (1 + big)
  return {"flops": flops, "saving": 1 - flops / budget, "switch_losses": switches, "steps": n, "big_steps": big,
          "landing_flops": land}


def _check_curves(curves, n_lower: int) -> list:
  """``curves`` as a list of ``n_lower + 1`` entries (None each when not given), each a ``Curve`` or None."""
  if curves is None:
    return [None] * (n_lower + 1)
  curves = list(curves)
  if len(curves) != n_lower + 1 or not all(c is None or isinstance(c, Curve) for c in curves):
    raise ValueError(f"Give {n_lower + 1} rate curves (one per model, the target's last; None where its constant "
                     f"rate holds), got {curves!r}.")
  return curves


def _in_flops(curve: Curve, step_flops: float):
  """What ``best_table`` reads of ``curve`` for a model whose step costs ``step_flops``: per hand-over loss, the
  FLOPs the grown model trains to move a given distance (FLOPs of its scratch curve)."""
  def at(loss: float):
    stage = curve.stage(loss)
    return lambda distance: stage.steps(distance / step_flops) * step_flops
  return at


def predict_wsd(small: Frontier, small_step_flops: float, small_steps: int, target_stable: Frontier,
                target: Frontier, target_step_flops: float, big_steps: int, steps: int, cooldown_frac: float,
                jump: float = 0.0, rate: float = 1.0) -> dict | None:
  """What the curves predict for a given 2-level V-cycle under one WSD schedule: the small model at its peak rate for
  ``small_steps`` (its stable curve ``small``), the target landing ``jump`` above that loss on its stable curve, then
  ``big_steps`` target steps, the last ``cooldown_frac`` of ``steps`` of them cooling down; before the cool-down it
  moves along its stable curve at ``rate``, and the cool-down ends where scratch's does from that position (on the
  target's frontier ``target``). Returns the predicted final loss, FLOPs and saving; None where a curve does not
  reach. Where the run would end past the target's longest scratch run, its final loss lies below what the frontier
  measures: ``final_loss`` is then None and ``saving`` what it saves at least (against that run; ``at_least``)."""
  f_small = small_steps * small_step_flops
  l_small = small.loss_at(f_small)
  if l_small is None:
    return None
  return _wsd_target_stage(l_small, f_small, target_stable, target, target_step_flops, big_steps, steps,
                           cooldown_frac, jump, rate)


def _wsd_target_stage(l_small: float, f_small: float, target_stable: Frontier, target: Frontier,
                      target_step_flops: float, big_steps: int, steps: int, cooldown_frac: float, jump: float,
                      rate: float, delay: float = 0.0, stage: Stage | None = None) -> dict | None:
  """``predict_wsd``'s target stage, after smaller stages that spent ``f_small`` FLOPs and handed over at
  ``l_small``; the target's first ``delay`` steps after growing (before its cool-down) move it nowhere (``stage``:
  how far it moves, in place of ``rate`` and ``delay``)."""
  land = target_stable.cost(l_small + jump)
  if land is None:
    return None
  cool = min(max(1, round(cooldown_frac * steps)), big_steps)
  stage = stage or Stage.linear(rate, delay)
  end = land + stage.progress(big_steps - cool) * target_step_flops + cool * target_step_flops
  flops = f_small + (1 + big_steps) * target_step_flops
  loss = target.loss_at(end)
  out = {"small_loss": l_small, "landing_loss": l_small + jump, "landing_flops": land, "flops": flops}
  if loss is not None:
    return {**out, "final_loss": loss, "saving": 1 - flops / target.cost(loss), "at_least": False}
  if end < target.points[-1][0]:
    return None  # Before the frontier's first point: nothing to read.
  return {**out, "final_loss": None, "saving": 1 - flops / target.points[-1][0], "at_least": True}


def predict_chain_wsd(lower: Sequence[Frontier], step_flops: Sequence[float], lower_steps: Sequence[int],
                      rates: Sequence[float], target_stable: Frontier, target: Frontier, target_step_flops: float,
                      big_steps: int, steps: int, cooldown_frac: float, target_rate: float = 1.0,
                      jump: float = 0.0, delays: Sequence[float] | None = None,
                      target_delay: float = 0.0, curves: Sequence[Curve | None] | None = None) -> dict | None:
  """``predict_wsd`` for a chain: the smaller models ``lower`` (stable curves, smallest first) train
  ``lower_steps[k]`` steps each in turn (0: skipped), each grown one landing ``jump`` above the loss it took over at
  on its own stable curve and, after ``delays[k]`` steps, moving along it at ``rates[k]`` (``rates[0]`` and
  ``delays[0]`` are not read), then the target as in ``predict_wsd`` at ``target_rate`` after ``target_delay``
  steps. ``curves`` (as ``wsd_cost`` takes them): a model's stage read at the loss it took over at.
  Returns the loss each model hands over at (None where skipped) beside ``predict_wsd``'s answer for the target's
  stage; None where a curve does not reach."""
  rates = check_rates(rates, len(lower))
  curves = _check_curves(curves, len(lower))
  delays = [0.0] * len(lower) if delays is None else list(delays)
  if len(lower_steps) != len(lower) or not any(lower_steps):
    raise ValueError(f"Give steps for each of the {len(lower)} smaller models, some of them positive: {lower_steps}.")
  loss, flops, handed = None, 0.0, []
  for k, (curve, f, n) in enumerate(zip(lower, step_flops, lower_steps)):
    if not n:
      handed.append(None)
      continue
    start = 0.0 if loss is None else curve.cost(loss + jump)
    if start is None:
      return None
    if loss is None:
      pos = start + n * f
    else:
      st = curves[k].stage(loss) if curves[k] is not None else Stage.linear(rates[k], delays[k])
      pos = start + st.progress(n) * f
    flops += n * f + (0.0 if loss is None else f)  # A grown model's first step, as the planner counts it.
    loss = curve.loss_at(pos)
    if loss is None:
      return None
    handed.append(loss)
  p = _wsd_target_stage(loss, flops, target_stable, target, target_step_flops, big_steps, steps, cooldown_frac,
                        jump, target_rate, target_delay, curves[-1] and curves[-1].stage(loss))
  return None if p is None else {**p, "handover_losses": handed}


def predict_margins(small: Frontier, small_step_flops: float, small_steps: int, target_stable: Frontier,
                    target: Frontier, target_step_flops: float, big_steps: int, steps: int, cooldown_frac: float,
                    jump: float = 0.0, rate: float = 1.0, landing: float = 0.02, slower: float = 0.75) -> list[dict]:
  """How much of a planned schedule's predicted saving survives the two errors its runs have shown: the target
  landing ``landing`` nats above the planned loss (a small model's seed, or a jump the plan did not price), and the
  grown target learning at ``slower`` times the priced ``rate``; each alone, then both. The schedule is held fixed
  (``predict_wsd``), so each row's ``saving`` is read off the target's frontier at the loss that run would end at.
  At short budgets the rows stay near the prediction (the target's stage is mostly its cool-down); where the target
  has real work to do they fall far below it, and so did the measured savings (benchmarks/SAVINGS.md, "How much of
  a plan's saving survives"). These are sensitivities, not a calibrated interval: on BERT's plateau the runs ended
  below even the last row."""
  return margin_rows(landing, slower, lambda dl, f: predict_wsd(
      small, small_step_flops, small_steps, target_stable, target, target_step_flops, big_steps, steps, cooldown_frac,
      jump + dl, rate * f))


def margin_rows(landing: float, slower: float, predict) -> list[dict]:
  """The three margin rows of a plan (``predict_margins``; the stacking plan's): the target landing ``landing`` nats
  higher, learning at ``slower`` times its rate, then both, each priced by ``predict(landing, rate_factor)`` (a
  ``predict_wsd``-like dict, or None where a curve does not reach)."""
  rows = []
  for dl, f in ((landing, 1.0), (0.0, slower), (landing, slower)):
    p = predict(dl, f)
    rows.append({"landing": dl, "rate_factor": f, "final_loss": p and p["final_loss"], "saving": p and p["saving"],
                 "at_least": bool(p and p["at_least"])})
  return rows
