"""A training method as data: the ``Plan`` (models and stages) and the named ``Transition`` between two stages.

A method is a plan builder plus its transitions (``Method``). The plan lists the models (``levels``) and the
training stages in order; each stage trains one of those models for some steps with its own optimizer config. Between
two stages the driver runs the method's transition into the next stage: a pure function, built from the operators
and jitted once, that maps the current parameters, optimizer state and held snapshots to the next stage's, and
returns the intermediate trees worth evaluating (after coalescing, after de-coalescing, ...). The driver owns the
loop, timing, evaluation, logging and checkpoints; the method stays out of them.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable, Mapping

from multilevel.models import ModelConfig
from multilevel.registry import Registry
from multilevel.train.optim import LrSchedule, OptimConfig, schedule_for
from multilevel.train.views import FULL, View


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stretch of training: ``steps`` steps of model ``level`` with optimizer ``optim``.

  ``kind`` is a label for logs and summaries (the V-cycle's 'scratch' | 'down' | 'bottom' | 'up'); ``enter`` names
  how the parameters arrive ('init' for the first stage, else the method's transition into this stage); ``held``
  lists the levels whose snapshot trees are kept while this stage trains (the checkpoint stores them); ``view`` says
  what the stage holds and trains of its model (``train.views``: the whole model unless the method says otherwise);
  ``stop`` is an optional rule that may end the stage before ``steps`` (``switch.FrontierSwitch``: its ``decide``
  reads the stage's evaluations); the driver then asks the method for the plan with that cut
  (``build_plan(..., cuts=((stage, steps_done, extra_final_steps),))``).
  """

  index: int
  level: int  # Index into ``Plan.levels``; 0 is the target model.
  kind: str
  enter: str
  steps: int
  optim: OptimConfig
  held: tuple[int, ...] = ()
  view: View = FULL
  stop: Any = None

  @property
  def lr(self) -> LrSchedule:
    return self.optim.schedule

  @property
  def name(self) -> str:
    return f"{self.index}:{self.kind}@L{self.level}"


@dataclasses.dataclass(frozen=True)
class Plan:
  """The whole schedule of a run: which models, which stages, and the method's options for its transitions."""

  method: str
  levels: tuple[ModelConfig, ...]  # levels[k] is the model of level k; levels[0] the target.
  stages: tuple[Stage, ...]
  options: Any = None  # The method's typed options, read by its transitions.
  maps: tuple = ()  # Level maps between consecutive levels, for methods that use the operators' LevelMap.
  seed: int = 0  # The run's seed: transitions that draw random numbers fold it in.

  def __post_init__(self):
    """A plan's bookkeeping mistakes are refused here, naming the stage, rather than surfacing as shape errors in
    a compiled step or an optimizer update."""
    where = f"The {self.method!r} plan"
    if not self.levels or not self.stages:
      raise ValueError(f"{where} needs at least one level and one stage; got {len(self.levels)} and "
                       f"{len(self.stages)}.")
    for i, s in enumerate(self.stages):
      if not isinstance(s, Stage):
        raise TypeError(f"{where}: stage {i} is a {type(s).__name__}, not a Stage.")
      if s.index != i:
        raise ValueError(f"{where}: stage {i} has index {s.index}; a stage's index is its position in the plan (build "
                         f"stages with keywords, Stage(index=..., level=..., ...), to keep index and level apart).")
      for lvl in (s.level,) + tuple(s.held):
        if not 0 <= lvl < len(self.levels):
          raise ValueError(f"{where}: stage {s.name} names level {lvl}, but the plan has levels "
                           f"0..{len(self.levels) - 1} (levels[0] is the target).")
      if isinstance(s.steps, bool) or not isinstance(s.steps, numbers.Integral) or s.steps < 0:
        raise ValueError(f"{where}: stage {s.name} has {s.steps!r} steps; a stage takes a whole number >= 0.")
    if self.stages[0].enter != "init":
      raise ValueError(f"{where}: the first stage enters by {self.stages[0].enter!r}; it must enter by 'init' (the "
                       f"model's initialisation, or a checkpoint it starts from).")

  @property
  def total_steps(self) -> int:
    return sum(s.steps for s in self.stages)

  def snapshots_before(self, stage_index: int) -> tuple[int, ...]:
    """Levels whose snapshot is held when ``stage_index`` starts (after its transition): the one record of them."""
    return self.stages[stage_index].held

  def describe(self) -> str:
    lines = [f"{self.method}: {len(self.levels)}-level plan, {self.total_steps} steps:"]
    for s in self.stages:
      c = self.levels[s.level]
      lines.append(f"  stage {s.name}: enter by {s.enter}, L{c.num_layers}/d{c.width}/h{c.num_heads}/f{c.ffn_dim}, "
                   f"{s.steps} steps, lr peak {s.lr.peak:g} warmup {s.lr.warmup} decay {s.lr.decay}"
                   + ("" if s.view is FULL else f", trains {s.view.name}"))
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Transition:
  """A named, pure move from one stage's state to the next stage's, as an ordered tuple of named parts.

  The state flows through the parts as a dict ``carry``: ``params``, ``opt_state``, ``taken`` (the snapshots this
  transition consumes, ``takes``: levels), ``put`` (the snapshots it creates, ``puts``) and the intermediate trees
  worth evaluating, under their event names (``probe_levels``: event -> level of the model that evaluates it). A part
  is ``(name, fn)`` with ``fn(carry) -> updates``; each part is jitted as one program, so an operator rounds exactly
  as it does when called alone (XLA would round a fused composition differently). The resulting parameters are
  evaluated last, logged as ``final_event``.

  ``t(params, opt_state, taken) -> (params, opt_state, put, probes)`` runs it (each part jitted); the driver runs
  the same parts compiled ahead of time (``run(carry, compile)``) to keep compilation out of the timed region.
  """

  name: str
  parts: tuple[tuple[str, Callable[[dict], dict]], ...]
  final_event: str
  takes: tuple[int, ...] = ()
  puts: tuple[int, ...] = ()
  probe_levels: Mapping[str, int] = dataclasses.field(default_factory=dict)

  def run(self, carry: dict, compile_part: Callable[[Callable, dict], Callable]) -> dict:
    """Runs the parts in order; ``compile_part(fn, carry)`` returns the executable of each (e.g. ``jax.jit``)."""
    carry = dict(carry, put={}, **{"taken": carry.get("taken", {})})
    for _, fn in self.parts:
      carry.update(compile_part(fn, carry)(carry))
    return carry

  def __call__(self, params, opt_state, taken):
    import jax  # Deferred: keeps this module importable without initialising JAX.
    out = self.run({"params": params, "opt_state": opt_state, "taken": taken},
                   lambda fn, carry: jax.jit(fn))
    return out["params"], out["opt_state"], out["put"], {k: out[k] for k in self.probe_levels}


@dataclasses.dataclass(frozen=True)
class Method:
  """A growth method: ``build_plan(model, cycle, train) -> Plan`` and ``transition(plan, src, dst) -> Transition``.

  ``options``: the frozen dataclass of the method's own options, read as ``cycle.<name>`` (its defaults where a
  config does not set them; ``--config.cycle.<name>.<key>=`` on the command line once the method is registered),
  for a method defined outside this package. The methods of this package declare theirs as fields of
  ``cycles.config.CycleConfig`` instead.
  """

  name: str
  build_plan: Callable[..., Plan]
  transition: Callable[[Plan, Stage, Stage], Transition]
  description: str = ""
  options: type | None = None


METHODS: Registry[Method] = Registry("method", "cycle.method")
register_method = METHODS.register
method_of = METHODS.get


def optim_for(schedule: LrSchedule, train, lr_multipliers: tuple = ()) -> OptimConfig:
  """The stage optimizer: AdamW with the run's hyperparameters (``train``: a TrainConfig) and ``schedule``."""
  return OptimConfig(schedule, float(train.weight_decay), float(train.b1), float(train.b2), float(train.eps),
                     float(train.grad_clip), tuple(lr_multipliers))


def mup_multipliers(target: ModelConfig, level: ModelConfig) -> tuple[tuple[str, float], ...]:
  """muP's learning rates for Adam at a narrower level: a parameter whose fan-in shrinks with the width (its axes of
  an input role, ``hidden:in``, ``heads:in``, ``ffn:in``, in the family's axis table) gets the ratio of the target's
  fan-in to the level's as its multiplier, so the hidden matrices of a model at half the width train at twice the
  rate; vector-like parameters (biases, norms, embedding tables, inputs of fixed size) keep 1. Only parameters whose
  factor is not 1 are listed."""
  from multilevel import models as M
  from multilevel.models import axes as A
  from multilevel.tree import flatten
  table = M.family_of(level).axes
  big, small = flatten(M.abstract_params(target)), flatten(M.abstract_params(level))
  fan_in = (A.HIDDEN_IN, A.HEADS_IN, A.FFN_IN)
  out = []
  for path, leaf in sorted(small.items()):
    roles = table.get(path, ())
    factor = 1.0
    for axis, role in enumerate(roles):
      if role in fan_in:
        factor *= big[path].shape[axis] / leaf.shape[axis]
    if factor != 1.0:
      out.append((path, factor))
  return tuple(out)


def scratch_schedules(train, steps: tuple[int, ...], peak: float | None = None) -> tuple[LrSchedule, ...]:
  """Scratch's learning-rate curve (linear warm-up over ``train.warmup_frac`` of the budget, then linear decay to
  zero at its end) cut into consecutive stages of ``steps`` steps: each stage's schedule starts where the previous
  one stopped, so the curve is continuous across stages although each stage has its own optimizer (StackBERT's
  piecewise-linear schedule; MSLT). The warm-up must end inside the first stage."""
  total, lr = sum(steps), float(train.lr if peak is None else peak)
  warm = round(train.warmup_frac * total)
  if train.decay not in ("linear", "constant", "wsd"):
    raise ValueError(f"A learning-rate curve continuous across stages is built from linear pieces; train.decay="
                     f"{train.decay!r} is not. Use train.decay='linear' (or 'constant' or 'wsd'), or the method's "
                     f"option that restarts the schedule at each stage.")
  if warm > steps[0]:
    raise ValueError(f"The warm-up ({warm} steps, train.warmup_frac={train.warmup_frac}) is longer than the first "
                     f"stage ({steps[0]} steps); lower train.warmup_frac or lengthen the first stage.")
  if train.decay == "constant":
    return tuple(LrSchedule(lr, n, warm if i == 0 else 0, "constant") for i, n in enumerate(steps))

  if train.decay == "wsd":
    return _wsd_pieces(train, steps, lr, warm)

  def at(t):  # The whole curve's value at step t.
    return lr * (t / warm if t < warm else (total - t) / max(total - warm, 1))

  out, start = [], 0
  for i, n in enumerate(steps):
    end = start + n
    if i == 0:
      out.append(LrSchedule(lr, n, warm, "linear", at(end) / lr))
    else:
      head = at(start)
      out.append(LrSchedule(head, n, 0, "linear", at(end) / head))
    start = end
  return tuple(out)


def _wsd_pieces(train, steps: tuple[int, ...], lr: float, warm: int) -> tuple[LrSchedule, ...]:
  """Scratch's warm-up-stable-decay curve (the cool-down over the last ``train.cooldown_frac`` of the budget) cut
  into the stages: stable stages hold the peak, the stage the cool-down starts in is itself a WSD piece, later ones
  decay linearly on from where the curve is."""
  total = sum(steps)
  cool = min(max(1, round(float(train.cooldown_frac) * total)), total - warm)
  knee = total - cool

  def at(t):
    return lr * (t / warm if t < warm else 1.0 if t <= knee else (total - t) / cool)

  out, start = [], 0
  for i, n in enumerate(steps):
    end, w = start + n, (warm if i == 0 else 0)
    if end <= knee:
      out.append(LrSchedule(lr, n, w, "constant"))
    elif start >= knee:
      out.append(LrSchedule(at(start), n, 0, "linear", at(end) / at(start)))
    else:
      out.append(LrSchedule(lr, n, w, "wsd", at(end) / lr, cooldown=end - knee))
    start = end
  return tuple(out)


def stage_schedules(train, steps: tuple[int, ...], mode: str, key: str) -> tuple[LrSchedule, ...]:
  """One schedule per stage: ``mode='continuous'`` cuts scratch's curve into the stages (``scratch_schedules``),
  ``'restart'`` gives each stage its own warm-up and decay; ``key`` names the option in errors."""
  if mode == "continuous":
    try:
      return scratch_schedules(train, steps)
    except ValueError as e:
      from multilevel.typed_config import ConfigError
      raise ConfigError(f"{key}='continuous': {e}") from None
  return tuple(schedule_for(train, train.lr, n, round(train.warmup_frac * n)) for n in steps)


def fresh_optimizer(dst: Stage) -> tuple[str, Callable[[dict], dict]]:
  """The transition part that gives ``dst`` a fresh optimizer state over its view's trainable parameters."""
  return ("optimizer", lambda c: {"opt_state": dst.optim.build().init(dst.view.split(c["params"])[0])})


def split_steps(total: int, fracs, names) -> tuple[int, ...]:
  """``round(frac * total)`` steps per stage, the last stage taking what is left; every stage at least one step."""
  steps = [round(float(f) * total) for f in fracs[:-1]]
  steps.append(total - sum(steps))
  if total < len(steps):
    raise ValueError(f"train.steps={total} is fewer than the plan's {len(steps)} stages, each of which needs a step; "
                     f"raise train.steps.")
  for i, (n, name) in enumerate(zip(steps, names)):
    if n < 1 and i == len(steps) - 1:  # The remainder: the shares before it took everything.
      raise ValueError(f"{name} is left {n} steps at train.steps={total}: the stages before it take "
                       f"{sum(steps[:-1])}; lower their shares or raise train.steps.")
    if n < 1:
      raise ValueError(f"{name} gives {n} steps at train.steps={total}; raise it or train.steps.")
  return tuple(steps)
