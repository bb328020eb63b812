"""Depth stacking: G_stack (Du et al., NeurIPS 2024) and StackBERT (Gong et al., ICML 2019) as methods.

Both train a shallower model at the target width and grow it in depth by copying its blocks in stacking order
(block i of the grown model is block i mod L_small of the small one: the whole model repeated, ``M o M o ... o M``);
embeddings, final norm and head are kept. The copy is the operators' de-coalescing with a stride depth map
(``depth_mode='stride'``, plain copies, width kept), so the stacked model's blocks equal the small model's exactly.

- **G_stack** (``cycle.method='gstack'``): one hop. The small model (``num_layers / factor`` layers, ``factor`` 4 by
  default) trains for ``growth_frac`` of the budget with a warm-up and a constant learning rate (the paper stacks a
  checkpoint taken early in a long schedule, never annealed), then the stacked model trains for the rest with a
  fresh AdamW and a fresh warm-up and decay. The paper's base share is about 9% of the tokens (10B tokens for
  targets of 0.4-7B parameters, at most ~11% of the budget); we default to 10%.
- **StackBERT** (``cycle.method='stackbert'``): progressive doubling, 3 -> 6 -> 12 layers for BERT-Base
  (``num_layers / 4 -> / 2 -> x1``), with the published step shares 50k / 70k / 280k of 400k (12.5% / 17.5% / 70%),
  a fresh optimizer at each stage (the released scripts reset it) and one learning-rate curve continuous across
  stages (the released runs are piecewise linear); ``lr_schedule='restart'`` instead gives each stage its own
  warm-up and decay. Beyond the paper: ``order='adjacent'`` repeats each block in place, and ``growth='scaled'``
  halves both copies' residual-branch outputs (``'zero'`` zeroes the later one's: function-preserving for pre-LN).

The reference code of both trains every parameter after growth; so do we. Depth copies do not keep the function
(a block applied twice is not a block applied once); both papers accept the loss jump after stacking.
"""

from __future__ import annotations

import dataclasses

from multilevel import operators as O
from multilevel.cycles.plan import (Method, Plan, Stage, Transition, fresh_optimizer, optim_for, register_method,
                                    split_steps, stage_schedules)
from multilevel.train.optim import LrSchedule, schedule_for
from multilevel.typed_config import ConfigError, check_fields

LR_SCHEDULES = ("continuous", "restart")


@dataclasses.dataclass(frozen=True)
class GStackConfig:
  """``cycle.gstack``: G_stack's options."""

  factor: int = 4  # g: the small model has num_layers / g layers (the paper: g = 4; 2-4 work, 1 layer does not).
  growth_frac: float = 0.1  # Share of train.steps on the small model before stacking.
  small_lr_scale: float = 1.0  # Peak learning rate of the small model, relative to train.lr.

  def __post_init__(self):
    check_fields(self, "cycle.gstack")
    if self.factor < 2:
      raise ConfigError(f"cycle.gstack.factor must be >= 2 (the stack's depth multiple), got {self.factor}.")
    if not 0 < self.growth_frac < 1:
      raise ConfigError(f"cycle.gstack.growth_frac (the small model's share of the steps) must be in (0, 1), got "
                        f"{self.growth_frac}.")
    if not self.small_lr_scale > 0:
      raise ConfigError(f"cycle.gstack.small_lr_scale must be positive, got {self.small_lr_scale}.")


@dataclasses.dataclass(frozen=True)
class StackBertConfig:
  """``cycle.stackbert``: StackBERT's options."""

  stages: int = 3  # Depths num_layers / 2^(stages-1), ..., / 2, x1 (3: 3 -> 6 -> 12 for BERT-Base).
  fracs: tuple[float, ...] = (0.125, 0.175, 0.7)  # Share of the steps of each stage, shallowest first.
  lr_schedule: str = "continuous"  # continuous (one scratch-like curve across stages) | restart (each its own)
  # How each doubling lays out and starts the copies (the papers: 'stride', 'copy'). order: 'stride' repeats the whole
  # model (block i -> i and i + L), 'adjacent' repeats each block in place (i -> 2i and 2i + 1). growth: the copies'
  # residual-branch outputs, as the operators' depth_growth: 'copy' (both whole), 'scaled' (each halved: the pair
  # adds about one block's update), 'zero' (the later copy zeroed: a pre-LN model's function is kept).
  order: str = "stride"
  growth: str = "copy"

  def __post_init__(self):
    check_fields(self, "cycle.stackbert")
    if self.order not in O.DEPTH_MODES:
      raise ConfigError(f"cycle.stackbert.order must be one of {O.DEPTH_MODES}, got {self.order!r}.")
    if self.growth not in O.DEPTH_GROWTH:
      raise ConfigError(f"cycle.stackbert.growth must be one of {O.DEPTH_GROWTH}, got {self.growth!r}.")
    if self.stages < 2:
      raise ConfigError(f"cycle.stackbert.stages must be >= 2, got {self.stages}.")
    if len(self.fracs) != self.stages or any(not f > 0 for f in self.fracs):
      raise ConfigError(f"cycle.stackbert.fracs needs one positive share per stage ({self.stages}), got "
                        f"{list(self.fracs)}.")
    if abs(sum(self.fracs) - 1.0) > 1e-6:  # Shares of train.steps: (0.1, 0.2, 0.3) was silently stretched to all.
      raise ConfigError(f"cycle.stackbert.fracs are the stages' shares of train.steps and must add up to 1, got "
                        f"{list(self.fracs)} (sum {sum(self.fracs):g}); to train fewer steps, lower train.steps.")
    if self.lr_schedule not in LR_SCHEDULES:
      raise ConfigError(f"cycle.stackbert.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}.")


def stack_map(small_layers: int, big, factor: int, order: str = "stride", growth: str = "copy"):
  """The level map whose de-coalescing stacks a ``small_layers``-layer model ``factor`` times into ``big`` (``order``
  and ``growth``: ``StackBertConfig``'s)."""
  if big.num_layers != small_layers * factor:
    raise ConfigError(f"Stacking {small_layers} layers {factor} times gives {small_layers * factor}, not the "
                      f"{big.num_layers} layers of the model to grow into.")
  return O.make_mapping(big, width_factor=1, depth_factor=factor, depth_mode=order, depth_growth=growth)


def _depth_divisible(model, factor: int, what: str) -> None:
  if model.num_layers % factor or model.num_layers // factor < 1:
    raise ConfigError(f"{what} needs the target's num_layers ({model.num_layers}) to be a multiple of {factor}; "
                      f"change model.num_layers or the method's factor/stage count.")


def gstack_plan(model, cycle, train) -> Plan:
  opts: GStackConfig = cycle.gstack
  _depth_divisible(model, opts.factor, f"cycle.gstack.factor={opts.factor}")
  small = model.replace(num_layers=model.num_layers // opts.factor)
  n_small, n_big = split_steps(train.steps, (opts.growth_frac, 1 - opts.growth_frac),
                               ("cycle.gstack.growth_frac", "1 - cycle.gstack.growth_frac"))
  warm = lambda n: round(train.warmup_frac * n)
  s0 = Stage(0, 1, "small", "init", n_small,
             optim_for(LrSchedule(train.lr * opts.small_lr_scale, n_small, warm(n_small), "constant"), train))
  s1 = Stage(1, 0, "stacked", "stack", n_big, optim_for(schedule_for(train, train.lr, n_big, warm(n_big)), train))
  maps = (stack_map(small.num_layers, model, opts.factor),)
  return Plan("gstack", (model, small), (s0, s1), opts, maps, train.seed)


def stackbert_plan(model, cycle, train) -> Plan:
  opts: StackBertConfig = cycle.stackbert
  k = opts.stages
  _depth_divisible(model, 2 ** (k - 1), f"cycle.stackbert.stages={k} (doubling {k - 1} times)")
  # Level j has num_layers / 2^j layers; stages go from the shallowest (level k-1) up to the target (level 0).
  levels = tuple(model.replace(num_layers=model.num_layers // 2 ** j) for j in range(k))
  total = sum(float(f) for f in opts.fracs)
  steps = split_steps(train.steps, [float(f) / total for f in opts.fracs],
                      [f"cycle.stackbert.fracs[{i}]" for i in range(k)])
  schedules = stage_schedules(train, steps, opts.lr_schedule, "cycle.stackbert.lr_schedule")
  stages = tuple(Stage(i, k - 1 - i, "small" if i == 0 else "stacked", "init" if i == 0 else "stack", steps[i],
                       optim_for(schedules[i], train)) for i in range(k))
  # maps[j]: from level j (deeper) to level j + 1 (half as deep), as the operators define a level map.
  maps = tuple(stack_map(levels[j + 1].num_layers, levels[j], 2, opts.order, opts.growth) for j in range(k - 1))
  return Plan("stackbert", levels, stages, opts, maps, train.seed)


def stack_transition(plan: Plan, src: Stage, dst: Stage) -> Transition:
  """Stacks the trained shallower model into ``dst``'s depth; a fresh optimizer."""
  if dst.enter != "stack" or dst.level != src.level - 1:
    raise ValueError(f"Stage {dst.name} cannot be entered by {dst.enter!r} from {src.name}.")
  m = plan.maps[dst.level]
  grow = lambda c: {"params": O.decoalesce(c["params"], m, check_finite=False)}
  return Transition("stack", (("stack", grow), fresh_optimizer(dst)), "after_stack")


GSTACK = register_method(Method("gstack", gstack_plan, stack_transition,
                                "G_stack: a num_layers/g model for a short share, stacked g times, fresh schedule."))
STACKBERT = register_method(Method("stackbert", stackbert_plan, stack_transition,
                                   "StackBERT: progressive doubling in depth, optimizer reset at each stage."))
