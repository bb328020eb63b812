"""The ``cycle`` section of a run config: which method, the V-cycle's knobs, and one sub-section per other method.

Each method's file defines its own options (``stack.GStackConfig``, ``mslt.MsltConfig``, ...); this file only
gathers them into the one typed section the driver reads, so the methods never import it (no import circle: the
driver types the config, then calls ``Method.build_plan`` with typed sections). ``build_plan`` is the public entry:
it types ``cycle`` and ``train`` (ConfigDicts or mappings are fine) and asks the chosen method for its plan.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from multilevel.cycles.core import CoreConfig
from multilevel.cycles.ligo import LigoConfig
from multilevel.cycles.msg import MsgConfig
from multilevel.cycles.mslt import MsltConfig
from multilevel.cycles.plan import METHODS, Plan, method_of
from multilevel.cycles.stack import GStackConfig, StackBertConfig
from multilevel.models import ModelConfig
from multilevel.operators.groups import DEPTH_MODES
from multilevel.operators.mapping import DEPTH_GROWTH
from multilevel.train.config import TrainConfig
from multilevel.typed_config import ConfigError, as_mapping, check_fields, fields_from, section_from


class MissingOptions(ConfigError, AttributeError):
  """``cycle.<name>`` read for a name that is neither a field of CycleConfig nor a registered method's options."""


def plugin_options(name: str) -> type | None:
  """The options dataclass of the registered method ``name`` when it declares one outside ``CycleConfig``."""
  if name not in METHODS or name in _FIELDS:
    return None
  return METHODS[name].options


OPT_POLICIES = ("reset", "carry")
FINAL_SCHEDULES = ("restart", "baseline_tail")
LR_RULES = ("fixed", "mup")
SMALL_STOPS = ("fixed", "frontier")
SMALL_INITS = ("coalesce", "fresh")
NEW_LAYERS = ("copy", "fresh")


@dataclasses.dataclass(frozen=True)
class CycleConfig:
  """The ``cycle`` section: which method, the V-cycle's knobs, and a sub-section of options for each other method
  (``cycle.gstack``, ``cycle.stackbert``, ``cycle.mslt``, ...). Each default lives here and nowhere else.

  The defaults are what won in ``benchmarks/`` for the pre-LN families (README, "Does it save compute?"); the family
  config files override them (BERT keeps the reference growth), and ``,reference`` after the size restores the
  paper's protocol.
  """

  method: str = "vcycle"  # A registered method (multilevel.cycles.METHODS).
  levels: int = 2  # 1 = plain training from scratch (the baseline).
  width_factor: int = 2
  depth_factor: int = 2
  depth_mode: str = "adjacent"  # adjacent (paper) | stride (reference L6-H6.json)
  width_schemes: Any = ""  # JSON (or a list): one width scheme per transition, e.g. "[[[0,2],[1,3]]]"; '' = halve.
  depth_schemes: Any = ""
  embed_factor: float = 0.0  # 0 = the group size (the reference's 2 for pairs).
  preln_exact: bool = False  # Function-preserving width growth for pre-LN GPT (method.md 5.2).
  allow_unequal_width_groups: bool = False  # Width schemes whose groups differ in size (they change the function).
  depth_growth: str = "zero"  # copy (reference) | scaled | zero (function-preserving depth growth for pre-LN)
  # The layers depth growth adds: 'copy' (their weights copied from the small layer) or 'fresh' (drawn from a random
  # initialisation, their residual outputs kept at zero: still identities, with new features; needs
  # depth_growth='zero'; operators.fresh_layers).
  new_layers: str = "copy"
  # Per level, target model first; cut to the number of levels used.
  down_fracs: tuple[float, ...] = (0.05, 0.05, 0.05)  # Steps at each level before coalescing (fractions of T).
  small_frac: float = 0.5  # Steps at the smallest level (may exceed 1: its steps are cheaper).
  # Where the smallest level's weights come from: 'coalesce' (the paper: train the target down_fracs[0] of T, then
  # coalesce level by level) or 'fresh' (the smallest model's own random initialisation, as G_stack's small model and
  # the planner's pilots start: no down stages, no snapshots, so it needs w_pre = 0).
  small_init: str = "coalesce"
  # Warm-up steps of the smallest level's stage; 0 = transition_warmup_frac of the stage. A fresh small model trains
  # as its scratch pilot did only with the pilot's warm-up: at GPT's 8e-3, 18 warm-up steps instead of the pilot's 200
  # left it 0.6 nats behind the pilot after 300 steps.
  small_warmup_steps: int = 0
  up_fracs: tuple[float, ...] = (0.5, 0.25, 0.25)  # Steps at each level after growing back (level 0 = the end).
  lr_scales: tuple[float, ...] = (1.0, 4.0, 4.0)  # Peak learning rate of each level, relative to train.lr.
  # fixed: lr_scales only | mup: also muP's per-parameter rates at narrower levels (hidden matrices x fan-in ratio);
  # meant with lr_scales = (1, 1, 1), since muP already raises the small model's rates where the width asks it.
  lr_rule: str = "fixed"
  w_pre: float = 0.5  # Interpolation weight of the pre-coalescing model.
  split_noise: float = 0.0  # >0: zero-sum noise on the grown copies' read side (keeps the function).
  # Width growth with w_pre = 0 and nothing else that breaks the copies' symmetry (split noise, shrink-and-perturb's
  # perturbation, dropout, the restart control) leaves copies that get equal gradients and stay copies: the grown
  # model trains as the small one. Refused unless this is set (to run that as a control).
  allow_tied_copies: bool = False
  optimizer_policy: str = "reset"  # reset (paper) | carry (map Adam's moments through the same operators)
  transition_warmup_frac: float = 0.05  # Linear warm-up after each transition, as a fraction of the stage.
  final_schedule: str = "restart"  # restart (reference) | baseline_tail (continue scratch's decay)
  restart_control: bool = False  # Control: random weights at each transition instead of transferred ones.
  # How long the smallest level trains: 'fixed' (small_frac of the budget) or 'frontier' (adaptive, cycles/switch.py:
  # at most small_frac; it ends when its loss costs as many FLOPs per nat as the target's would on target_frontier,
  # the (FLOPs, eval loss) points of the target's fully decayed scratch runs; what it leaves goes to the target).
  small_stop: str = "fixed"
  target_frontier: tuple[tuple[float, ...], ...] = ()
  stop_window: int = 4  # Evaluations the small model's slope is fitted over (small_stop='frontier').
  # Shrink and perturb at growth (Ash & Adams 2020): params <- shrink * params + perturb * a fresh initialisation,
  # after interpolating. (1, 0) = off; it trades the function-preserving hand-over for plasticity.
  shrink_perturb: tuple[float, float] = (1.0, 0.0)
  # The other methods' options (each method's file defines its section).
  gstack: GStackConfig = GStackConfig()
  stackbert: StackBertConfig = StackBertConfig()
  mslt: MsltConfig = MsltConfig()
  ligo: LigoConfig = LigoConfig()
  msg: MsgConfig = MsgConfig()
  core: CoreConfig = CoreConfig()

  @classmethod
  def __section_from__(cls, c, section: str) -> "CycleConfig":
    """``section_from``'s hook: the fields, and the options section of a method registered with ``options``."""
    values = as_mapping(c, cls.__name__)
    extra = {k: values.pop(k) for k in list(values) if k not in _FIELDS and plugin_options(k) is not None}
    plugins = tuple(sorted(k for k in METHODS if plugin_options(k) is not None))
    out = fields_from(cls, values, section, more_keys=plugins)
    object.__setattr__(out, "_plugin_options", {
        k: section_from(plugin_options(k), v, f"{section}.{k}") for k, v in extra.items()})
    return out

  def __getattr__(self, name: str):
    """``cycle.<name>`` of a method registered with ``options`` (not a field here): as the config set it, else its
    defaults."""
    if name.startswith("__") or name == "_plugin_options":
      raise AttributeError(name)
    given = self.__dict__.get("_plugin_options", {})
    if name in given:
      return given[name]
    options = plugin_options(name)
    if options is not None:
      return options()
    raise MissingOptions(f"cycle has no section {name!r}: a method defined outside this package declares its options "
                         f"with register_method(Method(..., options=ItsOptionsDataclass)), and reads them as "
                         f"cycle.{name}; registered methods: {', '.join(METHODS)}.")

  def as_dict(self) -> dict:
    """The section as JSON-able data: its fields, and the options of the chosen method when they are not a field."""
    d = dataclasses.asdict(self)
    if plugin_options(self.method) is not None:
      d[self.method] = dataclasses.asdict(getattr(self, self.method))
    return d

  def __post_init__(self):
    check_fields(self, "cycle")
    if self.levels < 1:
      raise ConfigError(f"cycle.levels must be >= 1 (1 = plain training from scratch), got {self.levels}.")
    choices = (("optimizer_policy", OPT_POLICIES), ("final_schedule", FINAL_SCHEDULES), ("lr_rule", LR_RULES),
               ("small_stop", SMALL_STOPS), ("small_init", SMALL_INITS), ("depth_mode", DEPTH_MODES),
               ("depth_growth", DEPTH_GROWTH), ("new_layers", NEW_LAYERS))
    for name, allowed in choices:
      if getattr(self, name) not in allowed:
        raise ConfigError(f"cycle.{name} must be one of {allowed}, got {getattr(self, name)!r}.")
    if not 0.0 <= self.w_pre <= 1.0:
      raise ConfigError(f"cycle.w_pre (weight of the pre-coalescing model) must be in [0, 1], got {self.w_pre}.")
    if not self.split_noise >= 0.0:
      raise ConfigError(f"cycle.split_noise (relative noise that breaks the copies' symmetry after growth) must be "
                        f">= 0, got {self.split_noise}; 0 turns it off.")
    sp = tuple(self.shrink_perturb) if isinstance(self.shrink_perturb, (list, tuple)) else ()
    if len(sp) != 2 or not 0.0 < float(sp[0]) <= 1.0 or not float(sp[1]) >= 0.0:
      raise ConfigError(f"cycle.shrink_perturb must be (shrink, perturb) with 0 < shrink <= 1 and perturb >= 0, got "
                        f"{self.shrink_perturb!r}; (1, 0) turns it off.")
    if self.small_stop == "frontier":
      pts = self.target_frontier
      if len(pts) < 2 or any(len(p) != 2 for p in pts):
        raise ConfigError(f"cycle.small_stop='frontier' ends the small stage against the target's frontier: set "
                          f"cycle.target_frontier to two or more (FLOPs, eval loss) pairs of fully decayed scratch runs "
                          f"of the target (e.g. from experiments.plan's pilots), got {pts!r}.")
      if self.method != "vcycle" or self.levels < 2:
        raise ConfigError(f"cycle.small_stop='frontier' is a V-cycle option (cycle.method='vcycle', cycle.levels >= "
                          f"2); got method {self.method!r} with {self.levels} level(s). Use small_stop='fixed'.")
      if self.stop_window < 2:
        raise ConfigError(f"cycle.stop_window={self.stop_window}: the small model's slope needs at least 2 "
                          f"evaluations.")
    if self.small_init == "fresh" and self.w_pre > 0 and self.method == "vcycle" and self.levels > 1:
      raise ConfigError(f"cycle.small_init='fresh' starts the smallest model from its own initialisation, so no "
                        f"pre-coalescing snapshot exists to interpolate with; set cycle.w_pre=0 (with "
                        f"cycle.split_noise > 0 where the width grows), or cycle.small_init='coalesce'. Got w_pre "
                        f"{self.w_pre}.")
    if self.new_layers == "fresh" and self.depth_growth != "zero":
      raise ConfigError(f"cycle.new_layers='fresh' draws the added layers' weights and keeps their residual outputs "
                        f"at zero, as cycle.depth_growth='zero' grows them; got depth_growth {self.depth_growth!r}. "
                        f"Set cycle.depth_growth='zero' or cycle.new_layers='copy'.")
    if self.small_warmup_steps < 0:
      raise ConfigError(f"cycle.small_warmup_steps must be >= 0 (0 = transition_warmup_frac of the stage), got "
                        f"{self.small_warmup_steps}.")
    if not 0.0 <= self.transition_warmup_frac <= 1.0:
      raise ConfigError(f"cycle.transition_warmup_frac must be in [0, 1], got {self.transition_warmup_frac}.")
    for name in ("down_fracs", "up_fracs"):  # Shares of train.steps (1.5 trained 150% of it).
      values = getattr(self, name)
      for v in values if isinstance(values, (list, tuple)) else (values,):
        if not 0.0 <= float(v) <= 1.0:
          raise ConfigError(f"cycle.{name} are shares of train.steps and must lie in [0, 1], got {values!r}.")
    # The smallest model's steps cost a fraction of the target's, so its stage may run more than train.steps of them
    # (the planner's plans do): vcycle.build_plan refuses only a stage that costs more than the whole budget.
    if not 0.0 <= float(self.small_frac) < float("inf"):
      raise ConfigError(f"cycle.small_frac (the smallest stage's steps over train.steps) must be >= 0 and finite, "
                        f"got {self.small_frac!r}.")
    if any(not float(v) > 0 for v in self.lr_scales):
      raise ConfigError(f"cycle.lr_scales (each level's peak learning rate over train.lr) must be positive, got "
                        f"{tuple(self.lr_scales)!r}.")
    for name, options in METHOD_OPTIONS.items():  # Another method's options are not read: say so, not ignore them.
      if name != self.method:
        changed = _changed(getattr(self, name), options())
        if changed:
          raise ConfigError(f"cycle.{name}.{changed[0]} is an option of method {name!r}, but this run's "
                            f"cycle.method is {self.method!r}, which does not read it. Leave cycle.{name}.* out, or "
                            f"set cycle.method={name!r}.")


_FIELDS = frozenset(f.name for f in dataclasses.fields(CycleConfig))
# The built-in methods' option sections: the fields whose value is a dataclass of options.
METHOD_OPTIONS = {f.name: type(f.default) for f in dataclasses.fields(CycleConfig)
                  if dataclasses.is_dataclass(f.default)}


# The V-cycle's own options (the section's top-level fields): the other built-in methods read only cycle.method and
# their own section (experiments.train refuses these keys on their command line; config files set them for the
# V-cycle, so they may stand there unread).
VCYCLE_KEYS = _FIELDS - {"method"} - set(METHOD_OPTIONS)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(CycleConfig)}


def unread_keys(cycle) -> dict[str, str]:
  """The V-cycle's own keys (``VCYCLE_KEYS``) that the run described by ``cycle`` (a typed section, a ConfigDict or
  the dict a run records) does not read, each with the reason: all of them under another method; under the V-cycle,
  those its shape leaves out (scratch, a small model from its own init, a fixed small stage). Family config files set
  these keys for every run, so they may stand there unread; a command line that sets one is refused
  (experiments.train) and a resume does not compare them (cycles.resume)."""
  get = ((lambda k: cycle.get(k, _DEFAULTS[k])) if hasattr(cycle, "get") else
         (lambda k: getattr(cycle, k, _DEFAULTS[k])))
  method = get("method")
  if method not in METHOD_OPTIONS and method != "vcycle":
    return {}  # A method registered from outside (a plugin) may read any of them.
  if method != "vcycle":
    return {k: f"an option of the V-cycle (cycle.method='vcycle'); method {method!r} reads only cycle.{method}.*"
            for k in VCYCLE_KEYS}
  if int(get("levels")) == 1:
    return {k: "cycle.levels=1 trains the target alone, from scratch" for k in VCYCLE_KEYS - {"levels"}}
  out = {}
  if get("small_init") == "fresh":
    out["down_fracs"] = ("cycle.small_init='fresh' starts the smallest model from its own initialisation, so there "
                         "are no down stages")
  if get("small_stop") == "fixed":
    for k in ("target_frontier", "stop_window"):
      out[k] = "cycle.small_stop='fixed' ends the smallest stage after cycle.small_frac of the steps"
  return out


def _changed(options, defaults) -> list[str]:
  """The fields of an options dataclass that differ from its defaults."""
  return [f.name for f in dataclasses.fields(options) if getattr(options, f.name) != getattr(defaults, f.name)]


def build_plan(model: ModelConfig, cycle, train) -> Plan:
  """The plan of ``cycle.method`` for target ``model``; ``cycle`` and ``train`` may be typed or ConfigDicts."""
  cycle = section_from(CycleConfig, cycle, "cycle")
  train = section_from(TrainConfig, train, "train")
  return method_of(cycle.method).build_plan(model, cycle, train)
