"""Schedules from measured frontiers: the lossless hand-over bound, and the V-cycle plan that aims at it.

A model's *frontier* is the final eval loss of fully decayed scratch runs against their training FLOPs, one point per
budget (``Frontier``; log-linear between budgets). With F_m(L) the FLOPs model m needs to reach loss L on its
frontier, an ideal chain small -> ... -> target that hands over with no loss at all and then learns exactly as the
next model's scratch run does from that loss costs, for two levels,

  F_target(L_T) - max over L >= L_T of [F_target(L) - F_small(L)]

(``ideal_cost`` solves any number of levels by the same recursion on a grid of losses). What that maximum is of
F_target(L_T) is the *bound*: what a hand-over method saves if its grown model then learns only as fast as scratch.
A method above it has a grown model that learns faster than scratch after the hand-over; at or below it, the fade of
the saving with the budget is the physics of growth at that scale.

``plan_vcycle`` turns the bound's hand-over into the V-cycle's stage lengths for a budget of ``steps`` target steps:
the small model trains (fully decayed) for as many steps as its frontier needs to reach the switch loss, the target
then trains for the steps its frontier still needs from there, the coalescing stage is a single step, and growth
does not interpolate with that step's snapshot (``w_pre = 0``). Its
prediction is the bound's, so a measured run of the plan says how close a real hand-over comes to a lossless one
(``benchmarks/bound.py`` measures both). The frontiers come from pilot runs (``experiments/plan.py`` runs and caches
them); their FLOPs are a cost of the plan and are reported beside its saving, not hidden in it.
"""

from __future__ import annotations

import dataclasses
import json
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


def ideal_cost(chain: Sequence[Frontier], target_loss: float, grid: int = 400, jump: float = 0.0) -> dict | None:
  """The cheapest lossless hand-over chain ``chain[0] -> ... -> chain[-1]`` (smallest first, the target last) to
  ``target_loss``; any model of the chain may be skipped. Returns ``{'flops', 'switch_losses'}`` (the loss at which
  each model hands over, None for one skipped) or None when the target's frontier does not reach the loss.

  On a grid of losses L from the highest any frontier measures down to ``target_loss``: best[k](L) is the cheapest
  way to have model k at loss L, min(F_k(L), min over L' >= L and j < k of best[j](L') + F_k(L) - F_k(L' + jump)).

  ``jump`` (nats, >= 0): the loss the grown model starts above the one it grew from (0 for a function-preserving
  hand-over; measure it with ``handover_jumps``). A hand-over whose landing loss L' + jump lies above the bigger
  model's measured range is not used."""
  if not (jump >= 0 and math.isfinite(jump)):
    raise ValueError(f"The hand-over jump must be a finite loss difference >= 0 (nats), got {jump}.")
  if chain[-1].cost(target_loss) is None:
    return None
  top = max(f.loss_range[1] for f in chain)
  losses = [top - (top - target_loss) * i / (grid - 1) for i in range(grid)]  # Descending, ends at target_loss.
  inf = math.inf
  costs = [[f.cost(l) for l in losses] for f in chain]
  # Where a model lands when it takes over at grid loss L' (its own cost to reach L' + jump).
  lands = costs if jump == 0 else [[f.cost(l + jump) for l in losses] for f in chain]
  best = [[inf] * grid for _ in chain]
  back: list[list[tuple | None]] = [[None] * grid for _ in chain]
  for k in range(len(chain)):
    run_min, arg = [inf] * len(chain), [None] * len(chain)  # min over L' >= L of best[j](L') - F_k(L'), per j.
    for i in range(grid):
      ck, lk = costs[k][i], lands[k][i]
      for j in range(k):
        if best[j][i] < inf and lk is not None and best[j][i] - lk < run_min[j]:
          run_min[j], arg[j] = best[j][i] - lk, i
      if ck is None:
        continue
      best[k][i], back[k][i] = ck, None  # Model k from scratch to this loss.
      for j in range(k):
        if run_min[j] < inf and run_min[j] + ck < best[k][i]:
          best[k][i], back[k][i] = run_min[j] + ck, (j, arg[j])
  k, i = len(chain) - 1, grid - 1
  flops = best[k][i]
  switches: list[float | None] = [None] * (len(chain) - 1)
  while back[k][i] is not None:
    j, i = back[k][i]
    switches[j] = losses[i]
    k = j
  return {"flops": flops, "switch_losses": switches}


def bound_at(chain: Sequence[Frontier], target_loss: float, grid: int = 400, jump: float = 0.0) -> dict | None:
  """The bound's saving at ``target_loss``, where it hands over (loss and the handing model's FLOPs), and the
  envelope: the best *single* model of the chain at that loss (a smaller model trained longer). With ``jump`` > 0
  the hand-over loses that much loss (see ``ideal_cost``): no longer a bound, a calibrated estimate."""
  full = chain[-1].cost(target_loss)
  ideal = ideal_cost(chain, target_loss, grid, jump)
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


# ------------------------------------------------------------------------------------------------ the V-cycle plan


def model_overrides(target, level) -> dict:
  """``model.*`` config keys that turn the target's ``ModelConfig`` into ``level``'s (the fields that differ)."""
  return {f"model.{f.name}": getattr(level, f.name) for f in dataclasses.fields(level)
          if getattr(level, f.name) != getattr(target, f.name)}


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


def candidate_from_runs(name: str, runs: Sequence[dict], cycle: dict | None = None,
                        model: dict | None = None) -> Candidate:
  """A candidate from its fully decayed runs (``steps``, ``lr_scale``, ``total_flops``, ``final_eval_loss`` each):
  the best learning rate at each budget is its frontier, the one that won at the longest budget its rate (the small
  stage is about that long or shorter), and every run counts as pilot cost."""
  best: dict[int, tuple] = {}
  for r in runs:
    if r["steps"] not in best or r["final_eval_loss"] < best[r["steps"]][1]:
      best[r["steps"]] = (r["total_flops"], r["final_eval_loss"], r["lr_scale"])
  if len(best) < 2:
    raise ValueError(f"Candidate {name!r} needs fully decayed runs at two budgets or more, got {sorted(best)}.")
  n = min(best)
  return Candidate(name, Frontier(name, tuple((f, l) for f, l, _ in best.values())), best[n][0] / n,
                   best[max(best)][2], dict(cycle or {}), sum(r["total_flops"] for r in runs), dict(model or {}))


def target_from_saving(paths: Sequence[str]) -> tuple[Frontier, float, float]:
  """The target's frontier, the FLOPs of one of its steps and the frontier's total cost, from the scratch runs in
  ``benchmarks.saving`` results files."""
  budgets = []
  for p in paths:
    with open(p) as f:
      budgets += json.load(f)["budgets"]
  if not budgets:
    raise ValueError(f"no budgets in {list(paths)}")
  pts = tuple((b["scratch"]["total_flops"], b["scratch"]["final_eval_loss"]) for b in budgets)
  return Frontier("target", pts), budgets[0]["scratch"]["total_flops"] / budgets[0]["steps"], sum(f for f, _ in pts)


def candidate_from_bound(path: str, base_lr: float | None = None) -> Candidate:
  """A candidate from a ``benchmarks.bound`` level-run file (its runs at each budget and learning rate; its
  ``cycle.*`` settings name it and make the V-cycle's small level this model). ``'a.json+b.json'`` pools one model's
  files (e.g. run with different base rates). Each run's ``lr_scale`` is relative to its file's ``base_lr``; the
  candidate's is made relative to ``base_lr`` (the planned run's ``train.lr``; default the first file's)."""
  files = []
  for p in path.split("+"):
    with open(p) as f:
      files.append(json.load(f))
  d = files[0]
  if any(f.get("model") != d.get("model") for f in files):
    raise ValueError(f"{path}: the files ran different models; pool one model's level runs only.")
  base = float(base_lr or d.get("base_lr") or 1.0)
  runs = [dict(r, lr_scale=r["lr_scale"] * float(f.get("base_lr") or base) / base) for f in files for r in f["runs"]]
  cycle = {k: v for k, v in d.get("set", {}).items() if k.startswith("cycle.")}
  name = f"L{d['level']}" + "".join(f" {k.split('.', 1)[1]}={v}" for k, v in cycle.items())
  try:
    return candidate_from_runs(name, runs, cycle, d.get("model", {}))
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None


# Split noise of a planned V-cycle (relative, zero-sum over each group of copies): GPT's measured value
# (benchmarks/RESULTS.md, depth_zero_split: 0.1 and 0.5 gave the same loss).
SPLIT_NOISE = 0.1


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


def plan_vcycle(target: Frontier, target_step_flops: float, steps: int, candidates: Sequence[Candidate],
                target_pilot_flops: float = 0.0, min_big_frac: float = 0.05, jump: float = 0.0,
                shape: tuple[int, int] | None = None) -> dict:
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
  (1 = scratch, 2 or 3)."""
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
  rows, best = [], None
  for c in candidates:
    b = bound_at([c.frontier, target], target_loss, jump=jump)
    row = {"candidate": c.name, "bound": b}
    if b is not None and b["switch_losses"][0] is not None:
      switch = b["switch_losses"][0]
      small = max(1, round(c.frontier.cost(switch) / c.step_flops))
      big = max(round(min_big_frac * steps), round(steps - target.cost(switch + jump) / target_step_flops), 1)
      flops = target_step_flops * (1 + big) + c.step_flops * small  # One coalescing step, the small, the big.
      row.update(switch_loss=switch, small_steps=small, big_steps=big, flops=flops, saving=1 - flops / budget)
      if best is None or row["saving"] > best[1]["saving"]:
        best = (c, row)
    rows.append(row)
  if shape is not None:
    for small in [c for c in candidates if not _one_axis(c)]:
      for mid in [c for c in candidates if _one_axis(c)]:
        row = _chain_row(small, mid, target, target_step_flops, steps, target_loss, min_big_frac, jump)
        rows.append(row)
        if "saving" in row and (best is None or row["saving"] > best[1]["saving"]):
          best = ((small, mid), row)
  smaller = _smaller_model_alone(candidates, target_loss, budget)
  base = {"train.steps": steps}
  scope = {"handover_jump": jump, "budget_beyond_pilots": beyond, "target_loss_is": "the target pilots' lowest (the budget is past them)"
           if beyond else "scratch's at the budget, on the target's frontier"}
  if best is None or best[1]["saving"] <= 0:
    # A candidate whose every measured loss lies below the lowest the search reaches never overlaps the target's
    # frontier: no hand-over can be priced, which says nothing about whether one pays. Say what to measure.
    below = [c.name for c in candidates if c.frontier.loss_range[1] <= target_loss]
    why = ("no candidate's frontier is cheaper than the target's anywhere a hand-over could use it" if not below else
           f"the frontier of {', '.join(below)} lies wholly below the losses the target's frontier reaches (down to "
           f"{target_loss:.4f}), so no hand-over could be priced: measure the target to lower losses (longer "
           f"--target_pilots, up to the budget of {steps} steps) or the candidates to higher ones (shorter "
           f"--small_pilots)")
    return {"method": "scratch", "overrides": {**base, "cycle.levels": 1}, "target_loss": target_loss, **scope,
            "predicted_flops": budget, "predicted_saving": 0.0, "pilot_flops": pilots,
            "net_saving": -pilots / budget, "candidates": rows, "smaller_model_alone": smaller, "why": why,
            "no_overlap": below}
  c, row = best
  if isinstance(c, tuple):
    return _chain_plan(c, row, shape, base, steps, budget, scope, pilots, rows, smaller)
  # w_pre = 0: after a one-step coalescing stage the held snapshot is an untrained model, and interpolating with it
  # would throw away part of what the small model learned (the plan assumes a lossless hand-over). Split noise then
  # breaks the grown copies' symmetry without changing the function (without it they stay copies for ever).
  overrides = {**base, "cycle.split_noise": SPLIT_NOISE, **c.cycle, "cycle.method": "vcycle", "cycle.levels": 2,
               "cycle.down_fracs": (1 / steps,), "cycle.w_pre": 0.0,
               "cycle.small_frac": row["small_steps"] / steps, "cycle.up_fracs": (row["big_steps"] / steps,),
               "cycle.lr_scales": (1.0, c.lr_scale)}
  return {"method": f"vcycle from {c.name}", "overrides": overrides, "target_loss": target_loss, **scope,
          "predicted_flops": row["flops"], "predicted_saving": row["saving"], "pilot_flops": pilots,
          "net_saving": 1 - (row["flops"] + pilots) / budget, "switch_loss": row["switch_loss"],
          "small_steps": row["small_steps"], "big_steps": row["big_steps"], "candidates": rows,
          "smaller_model_alone": smaller}


def _chain_plan(chain, row, shape, base, steps, budget, scope, pilots, rows, smaller) -> dict:
  """The 3-level plan of a winning chain row (see ``plan_vcycle``)."""
  small, mid = chain
  overrides = {**base, "cycle.split_noise": SPLIT_NOISE, **chain_overrides(mid, *shape), "cycle.method": "vcycle",
               "cycle.levels": 3, "cycle.down_fracs": (1 / steps, 1 / steps), "cycle.w_pre": 0.0,
               "cycle.small_frac": row["small_steps"] / steps,
               "cycle.up_fracs": (row["big_steps"] / steps, row["mid_steps"] / steps),
               "cycle.lr_scales": (1.0, mid.lr_scale, small.lr_scale)}
  return {"method": f"3-level vcycle from {small.name} through {mid.name}", "overrides": overrides, **scope,
          "target_loss": row["bound"]["target_loss"], "predicted_flops": row["flops"],
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
      out.append({"step": a["step"], "before": b["eval_loss"], "after": a["eval_loss"],
                  "jump": a["eval_loss"] - b["eval_loss"]})
  return out


def mean_jump(jumps: Sequence[dict]) -> float:
  """The mean ``jump`` of ``handover_jumps`` entries (of one run or several)."""
  if not jumps:
    raise ValueError("no growth with an eval on both sides of it: is it a V-cycle run?")
  return sum(j["jump"] for j in jumps) / len(jumps)


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


def describe(plan: dict) -> str:
  """The plan as a few lines for a terminal."""
  where = ("the lowest loss the target's pilots reached (the budget is past them)" if plan["budget_beyond_pilots"]
           else "scratch's loss at this budget")
  lines = [f"plan: {plan['method']}  (hand-overs searched down to loss {plan['target_loss']:.4f}: {where})"]
  if plan.get("handover_jump"):
    lines.append(f"  each hand-over assumed to cost {plan['handover_jump']:.4f} nats (a measured jump), not lossless")
  for r in plan["candidates"]:
    if "mid_steps" in r:
      lines.append(f"  {r['candidate']}: {r['small_steps']} steps of {r['chain'][0]} to loss {r['switch_losses'][0]:.3f}, "
                   f"{r['mid_steps']} of {r['chain'][1]} to {r['switch_losses'][1]:.3f}, then {r['big_steps']} "
                   f"target steps: predicted saving {100 * r['saving']:+.1f}%")
    elif "chain" in r:
      lines.append(f"  {r['candidate']}: the chain's bound skips a model (a 2-level row covers it)")
    elif "saving" in r:
      lines.append(f"  {r['candidate']}: hand over at loss {r['switch_loss']:.3f} after {r['small_steps']} small "
                   f"steps, then {r['big_steps']} target steps: predicted saving {100 * r['saving']:+.1f}%")
    else:
      lines.append(f"  {r['candidate']}: no hand-over pays (its frontier is nowhere cheaper, or does not overlap)")
  lines.append(f"predicted FLOPs {plan['predicted_flops']:.3g} ({100 * plan['predicted_saving']:+.1f}% vs scratch); "
               f"pilots cost {plan['pilot_flops']:.3g} FLOPs, so {100 * plan['net_saving']:+.1f}% net for one run")
  if plan.get("no_overlap"):
    lines.append(f"why scratch: {plan['why']}")
  a = plan.get("smaller_model_alone")
  if a:
    lines.append(f"note: {a['candidate']} trained alone reaches the same loss in {'at most ' if a['at_most'] else ''}"
                 f"{a['steps']} steps ({100 * a['saving']:+.1f}% of the FLOPs saved); you would end with that "
                 f"smaller model, not the target")
  return "\n".join(lines)
