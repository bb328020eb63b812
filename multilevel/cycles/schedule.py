"""The V-cycle schedule as data: levels, the maps between them, and the list of training stages.

``build_plan`` turns the ``cycle`` and ``train`` sections of a config into a ``Plan``. With ``levels = 1`` the plan is
one stage of plain training from scratch (the baseline); with ``K`` levels it is

  down:   train level 0 (the target) for down_fracs[0]*T steps, coalesce; ... down to level K-1,
  bottom: train level K-1 for small_frac*T steps,
  up:     grow + interpolate into level K-2, train up_fracs[K-2]*T; ... ; finally level 0 for up_fracs[0]*T.

Every per-level list (down_fracs, up_fracs, lr_scales) is indexed by level, the target model first, so one list
serves any number of levels (it is cut to the levels used).

The default proportions are the reference GPT-2 example's (method.md 7.2), scaled to the budget T: 5% warm-up-only
steps on the big model, 50% on the small one at 4x the learning rate, 50% on the big one, fresh AdamW each stage.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

from multilevel.models import ModelConfig
from multilevel.operators import LevelMap, make_mapping
from multilevel.train.optim import LrSchedule

ENTER = ("init", "coalesce", "grow")
OPT_POLICIES = ("reset", "carry")
FINAL_SCHEDULES = ("restart", "baseline_tail")


@dataclasses.dataclass(frozen=True)
class Stage:
  index: int
  level: int  # 0 is the target (largest) model.
  kind: str  # 'scratch' | 'down' | 'bottom' | 'up'
  enter: str  # How the parameters arrive: 'init' | 'coalesce' (from level-1) | 'grow' (from level+1).
  steps: int
  lr: LrSchedule

  @property
  def name(self) -> str:
    return f"{self.index}:{self.kind}@L{self.level}"


@dataclasses.dataclass(frozen=True)
class Plan:
  levels: tuple[ModelConfig, ...]  # levels[k] is the model of level k.
  maps: tuple[LevelMap, ...]  # maps[k]: levels[k] -> levels[k + 1].
  stages: tuple[Stage, ...]
  w_pre: float
  optimizer_policy: str
  restart_control: bool
  split_noise: float = 0.0  # Function-preserving symmetry breaking after growth (operators.split_noise); 0 = off.

  @property
  def total_steps(self) -> int:
    return sum(s.steps for s in self.stages)

  def snapshots_before(self, stage_index: int) -> tuple[int, ...]:
    """Levels whose pre-coalescing snapshot is held when ``stage_index`` starts (after its transition)."""
    held = set()
    for s in self.stages[: stage_index + 1]:
      if s.enter == "coalesce":
        held.add(s.level - 1)
      elif s.enter == "grow":
        held.discard(s.level)
    return tuple(sorted(held))

  def describe(self) -> str:
    lines = [f"{len(self.levels)}-level plan, {self.total_steps} steps:"]
    for s in self.stages:
      c = self.levels[s.level]
      lines.append(f"  stage {s.name}: enter by {s.enter}, L{c.num_layers}/d{c.width}/h{c.num_heads}, {s.steps} steps, "
                   f"lr peak {s.lr.peak:g} warmup {s.lr.warmup} decay {s.lr.decay}")
    return "\n".join(lines)


def _groups(value: Any) -> Optional[list]:
  """Schemes come from configs as JSON strings ('' = default) or as lists."""
  if value is None or value == "":
    return None
  return json.loads(value) if isinstance(value, str) else list(value)


def _tuple(v, n: int, name: str) -> tuple:
  v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
  if len(v) < n:
    raise ValueError(f"cycle.{name} needs at least {n} entries for this number of levels, got {list(v)}.")
  return v[:n]


def build_plan(model: ModelConfig, cycle, train) -> Plan:
  """The plan for target ``model`` from the ``cycle`` and ``train`` config sections (attribute access)."""
  k = int(cycle.levels)
  if k < 1:
    raise ValueError(f"cycle.levels must be >= 1 (1 = plain training from scratch), got {k}.")
  total = int(train.steps)
  if total < 1:
    raise ValueError(f"train.steps (the budget T) must be positive, got {total}.")
  policy = cycle.optimizer_policy
  if policy not in OPT_POLICIES:
    raise ValueError(f"cycle.optimizer_policy must be one of {OPT_POLICIES}, got {policy!r}.")
  if cycle.final_schedule not in FINAL_SCHEDULES:
    raise ValueError(f"cycle.final_schedule must be one of {FINAL_SCHEDULES}, got {cycle.final_schedule!r}.")
  if not 0.0 <= float(cycle.w_pre) <= 1.0:
    raise ValueError(f"cycle.w_pre (weight of the pre-coalescing model) must be in [0, 1], got {cycle.w_pre}.")
  split = float(cycle.get("split_noise", 0.0))
  if not split >= 0.0:
    raise ValueError(f"cycle.split_noise (relative noise that breaks the copies' symmetry after growth) must be "
                     f">= 0, got {split}; 0 turns it off.")
  lr, decay = float(train.lr), train.decay

  if k == 1:
    warm = round(float(train.warmup_frac) * total)
    stage = Stage(0, 0, "scratch", "init", total, LrSchedule(lr, total, warm, decay))
    return Plan((model,), (), (stage,), float(cycle.w_pre), policy, False)

  widths = _groups(cycle.width_schemes) or [None] * (k - 1)
  depths = _groups(cycle.depth_schemes) or [None] * (k - 1)
  if len(widths) != k - 1 or len(depths) != k - 1:
    raise ValueError(f"cycle.width_schemes / depth_schemes need one scheme per level transition ({k - 1}), got "
                     f"{len(widths)} and {len(depths)}.")
  maps, cfg = [], model
  for i in range(k - 1):
    m = make_mapping(cfg, width=widths[i], depth=depths[i], width_factor=int(cycle.width_factor),
                     depth_factor=int(cycle.depth_factor), depth_mode=cycle.depth_mode,
                     embed_factor=float(cycle.embed_factor) or None, preln_exact=bool(cycle.preln_exact),
                     depth_growth=cycle.get("depth_growth", "copy"))
    maps.append(m)
    cfg = m.small
  levels = (model,) + tuple(m.small for m in maps)

  scales = _tuple(cycle.lr_scales, k, "lr_scales")
  down = _tuple(cycle.down_fracs, k - 1, "down_fracs")
  up = _tuple(cycle.up_fracs, k - 1, "up_fracs")
  tw = float(cycle.transition_warmup_frac)
  steps_of = lambda frac, name: _positive(round(float(frac) * total), name)

  stages = []
  for lvl in range(k - 1):
    n = steps_of(down[lvl], f"down_fracs[{lvl}]")
    # Reference stage 1: linear warm-up over the whole stage, stopping at the peak.
    stages.append(Stage(len(stages), lvl, "down", "init" if lvl == 0 else "coalesce", n,
                        LrSchedule(lr * float(scales[lvl]), n, n, "constant")))
  n = steps_of(cycle.small_frac, "small_frac")
  stages.append(Stage(len(stages), k - 1, "bottom", "coalesce", n,
                      LrSchedule(lr * float(scales[k - 1]), n, round(tw * n), decay)))
  for lvl in range(k - 2, -1, -1):
    n = steps_of(up[lvl], f"up_fracs[{lvl}]")
    peak = lr * float(scales[lvl])
    if lvl == 0 and cycle.final_schedule == "baseline_tail":
      # Continue where the baseline's linear decay would be with n steps left, instead of restarting at the peak.
      warm_base = round(float(train.warmup_frac) * total)
      peak = lr * min(1.0, n / max(total - warm_base, 1))
    stages.append(Stage(len(stages), lvl, "up", "grow", n, LrSchedule(peak, n, round(tw * n), decay)))
  return Plan(levels, tuple(maps), tuple(stages), float(cycle.w_pre), policy, bool(cycle.restart_control), split)


def _positive(n: int, name: str) -> int:
  if n < 1:
    raise ValueError(f"cycle.{name} gives {n} steps at this budget; raise the fraction or train.steps.")
  return n
