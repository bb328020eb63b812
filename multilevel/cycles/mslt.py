"""MSLT, multi-stage layerwise training (Yang et al. 2020, "Progressively Stacking 2.0", arXiv 2011.13635).

Start with a few layers; at each stage add new top layers and train only those, the lower layers frozen: they run
forward only (``train.views.FrozenBottom``: no gradient, no optimizer state, no weight decay, no backward pass
through them, since the trainable layers receive their output under ``stop_gradient``); a final stage trains the
whole model. The FLOPs of a frozen stage are the forward pass through everything plus the backward pass through
the trained layers and the head (``FrozenBottom.train_flops_per_step``).

The paper's text is not public beyond its abstract and there is no official code, so the details are documented
choices (README, "Methods"):

- ``stages`` growth stages of ``num_layers / stages`` layers each (4: 3 -> 6 -> 9 -> 12 for BERT-Base), the first
  trained whole from scratch; the new layers of each stage start as copies of the current top ones (as in the
  ``tongxuluo/prts`` re-implementation; the operators' de-coalescing with a depth map that copies the top block
  group), then ``final_frac`` of the budget trains the whole model (the abstract's "final" stage).
- In a frozen stage the token/patch embeddings (and so a tied output embedding) stay frozen; the head's own
  parameters (GPT's final LayerNorm, BERT's MLM transform and output bias, DeiT's classifier) train with the new
  layers (prts trains the head and final norm in every stage). Training a tied embedding would need a backward pass
  through every layer and undo the saving.
- The growth stages share the budget left by the final stage equally; each stage gets a fresh AdamW (its trainable
  set changes) and one learning-rate curve runs continuously across stages, scratch's warm-up and decay cut into
  pieces (``lr_schedule='restart'`` gives each stage its own warm-up and decay).
"""

from __future__ import annotations

import dataclasses

from multilevel import operators as O
from multilevel.cycles.plan import (Method, Plan, Stage, Transition, fresh_optimizer, optim_for, register_method,
                                    split_steps, stage_schedules)
from multilevel.train.views import FULL, FrozenBottom
from multilevel.typed_config import ConfigError, check_fields

LR_SCHEDULES = ("continuous", "restart")


@dataclasses.dataclass(frozen=True)
class MsltConfig:
  """``cycle.mslt``: MSLT's options."""

  stages: int = 4  # Growth stages; each adds num_layers / stages layers (the first trains them from scratch).
  final_frac: float = 0.25  # Share of the steps for the final stage that trains every parameter (0: none).
  lr_schedule: str = "continuous"  # continuous (scratch's curve cut into stages) | restart (each stage its own)

  def __post_init__(self):
    check_fields(self, "cycle.mslt")
    if self.stages < 2:
      raise ConfigError(f"cycle.mslt.stages must be >= 2 (one stage is training from scratch), got {self.stages}.")
    if not 0 <= self.final_frac < 1:
      raise ConfigError(f"cycle.mslt.final_frac must be in [0, 1), got {self.final_frac}.")
    if self.lr_schedule not in LR_SCHEDULES:
      raise ConfigError(f"cycle.mslt.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}.")


def top_copy_map(big, new_layers: int):
  """The level map whose de-coalescing appends copies of the top ``new_layers`` blocks of a model with
  ``big.num_layers - new_layers`` layers (block ``n + i`` copies block ``n - new_layers + i``)."""
  n = big.num_layers - new_layers
  if not 0 < new_layers <= n:
    raise ConfigError(f"Cannot add {new_layers} layers copied from the top of a {n}-layer model.")
  groups = [[j] for j in range(n - new_layers)] + [[j, j + new_layers] for j in range(n - new_layers, n)]
  return O.make_mapping(big, width_factor=1, depth=groups, depth_growth="copy")


def mslt_plan(model, cycle, train) -> Plan:
  opts: MsltConfig = cycle.mslt
  k = opts.stages
  if model.num_layers % k:
    raise ConfigError(f"cycle.mslt.stages={k} adds num_layers / stages layers per stage, so it must divide the "
                      f"target's {model.num_layers} layers; choose a divisor of {model.num_layers}.")
  step = model.num_layers // k
  # Level j has num_layers - j * step layers; growth stage i trains level k-1-i; the final stage level 0 again.
  levels = tuple(model.replace(num_layers=model.num_layers - j * step) for j in range(k))
  has_final = opts.final_frac > 0
  growth = (1.0 - opts.final_frac) / k
  fracs = [growth] * k + ([opts.final_frac] if has_final else [])
  names = [f"stage {i} (1 - cycle.mslt.final_frac) / stages" for i in range(k)] + ["cycle.mslt.final_frac"]
  steps = split_steps(train.steps, fracs, names)
  schedules = stage_schedules(train, steps, opts.lr_schedule, "cycle.mslt.lr_schedule")
  stages = [Stage(0, k - 1, "bottom", "init", steps[0], optim_for(schedules[0], train))]
  for i in range(1, k):
    stages.append(Stage(i, k - 1 - i, "frozen", "add_top", steps[i], optim_for(schedules[i], train),
                        view=FrozenBottom(i * step)))
  if has_final:
    stages.append(Stage(k, 0, "full", "unfreeze", steps[k], optim_for(schedules[k], train)))
  # maps[j]: from level j to level j + 1 (step fewer layers), as the operators define a level map.
  maps = tuple(top_copy_map(levels[j], step) for j in range(k - 1))
  return Plan("mslt", levels, tuple(stages), opts, maps, train.seed)


def mslt_transition(plan: Plan, src: Stage, dst: Stage) -> Transition:
  """Into a frozen stage: new top blocks copied from the top ones, the rest frozen; into the final stage: every
  parameter trains again. A fresh optimizer over what trains."""
  src_cfg, dst_cfg = plan.levels[src.level], plan.levels[dst.level]
  if dst.enter == "add_top":
    m = plan.maps[dst.level]

    def add_top(c):
      grown = O.decoalesce(src.view.to_model(src_cfg, c["params"]), m, check_finite=False)
      return {"params": dst.view.from_model(dst_cfg, grown)}

    return Transition("add_top", (("add_top", add_top), fresh_optimizer(dst)), "after_add_top")
  if dst.enter == "unfreeze" and dst.view is FULL and dst.level == src.level:
    unfreeze = lambda c: {"params": src.view.to_model(src_cfg, c["params"])}
    return Transition("unfreeze", (("unfreeze", unfreeze), fresh_optimizer(dst)), "after_unfreeze")
  raise ValueError(f"Stage {dst.name} cannot be entered by {dst.enter!r} from {src.name}.")


MSLT = register_method(Method("mslt", mslt_plan, mslt_transition,
                              "MSLT: add top layers stage by stage, train only them (the rest forward only), then all."))
