"""The multi-level V-cycle (Zou, Zhang & Deng, ICLR 2024) as a method: its options, plan and transitions.

``build_plan`` turns the ``cycle`` and ``train`` sections of a config into a ``Plan``. With ``levels = 1`` the plan is
one stage of plain training from scratch (the baseline); with ``K`` levels it is

  down:   train level 0 (the target) for down_fracs[0]*T steps, coalesce; ... down to level K-1,
  bottom: train level K-1 for small_frac*T steps,
  up:     grow + interpolate into level K-2, train up_fracs[K-2]*T; ... ; finally level 0 for up_fracs[0]*T.

Every per-level list (down_fracs, up_fracs, lr_scales) is indexed by level, the target model first, so one list
serves any number of levels (it is cut to the levels used). With ``small_init='fresh'`` there are no down stages: the
bottom model starts from its own random initialisation (as G_stack's small model and the planner's pilots do) and
the way up grows without interpolating. The default proportions are the reference GPT-2
example's (method.md 7.2), scaled to the budget T: 5% warm-up-only steps on the big model, 50% on the small one at 4x
the learning rate, 50% on the big one, fresh AdamW each stage.

Its options are the top-level fields of the ``cycle`` section (``cycles/config.py``). The two transitions are pure
functions of the plan: ``coalesce`` (keep this level's parameters as the snapshot the way back up interpolates with,
then coalesce) and ``grow`` (de-coalesce, optional split noise and freshly drawn added layers, interpolate with the
held snapshot of the same level: never another run's model, the reference's bug B1).
"""

from __future__ import annotations

import json
import math
from typing import Any

import jax

from multilevel import models as M
from multilevel import operators as O
from multilevel.cycles.plan import Method, Plan, Stage, Transition, mup_multipliers, optim_for, register_method
from multilevel.models import ModelConfig
from multilevel.train.optim import LrSchedule, carry_moments, schedule_for
from multilevel.typed_config import ConfigError

def _schemes(value: Any, name: str, n: int) -> list:
  """One scheme (or None) per transition from a JSON string ('' = all default) or a list."""
  if value is None or value == "" or value == ():
    return [None] * n
  if isinstance(value, str):
    try:
      value = json.loads(value)
    except json.JSONDecodeError as e:
      raise ConfigError(f"cycle.{name} is not valid JSON ({e.msg} at character {e.pos}): {value!r}. Give one scheme "
                        f"per level transition, e.g. '[[[0, 2], [1, 3]]]' for one transition.") from None
  if not isinstance(value, (list, tuple)) or len(value) != n:
    got = len(value) if isinstance(value, (list, tuple)) else type(value).__name__
    raise ConfigError(f"cycle.{name} needs one scheme per level transition ({n} for {n + 1} levels), got {got}: "
                      f"{value!r}. Use null for a transition that keeps the default halving.")
  return list(value)


def _tuple(v, n: int, name: str) -> tuple:
  v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
  if len(v) < n:
    raise ConfigError(f"cycle.{name} needs at least {n} entries for this number of levels, got {list(v)}.")
  return v[:n]


def _positive(n: int, name: str) -> int:
  if n < 1:
    raise ConfigError(f"cycle.{name} gives {n} steps at this budget; raise the fraction or train.steps.")
  return n


def build_plan(model: ModelConfig, cycle, train, cuts: tuple = ()) -> Plan:
  """The V-cycle plan for target ``model`` from the typed ``cycle`` (``cycles.config.CycleConfig``) and ``train``
  sections; ``cycles.build_plan`` types ConfigDicts first.

  ``cuts``: ``((stage, steps, extra),)`` when an adaptive bottom stage (``cycle.small_stop='frontier'``) ended after
  ``steps``: the plan it ran then, with ``extra`` more steps for the target's last stage (the driver converts the
  unused small steps' FLOPs into target steps). The cut stage keeps the optimizer it trained with."""
  k, total = cycle.levels, train.steps
  lr, decay = train.lr, train.decay
  opt = lambda schedule: optim_for(schedule, train)

  if k == 1:
    warm = round(train.warmup_frac * total)
    stage = Stage(0, 0, "scratch", "init", total, opt(schedule_for(train, lr, total, warm)))
    return Plan("vcycle", (model,), (stage,), cycle, (), train.seed)
  wsd = decay == "wsd"
  if wsd and cycle.final_schedule == "baseline_tail":
    raise ConfigError("cycle.final_schedule='baseline_tail' continues scratch's linear decay; with train.decay='wsd' "
                      "every stage but the last already holds the peak and the last cools down as scratch does. Use "
                      "cycle.final_schedule='restart' (the default) with WSD.")

  def trained(peak, n, warm, final):
    """One WSD schedule spans all levels: each stage holds its peak and only the last one cools down, over as many
    steps as scratch's cool-down (train.cooldown_frac of T, at most what the stage leaves after its warm-up)."""
    if not wsd:
      return LrSchedule(peak, n, warm, decay)
    if not final:
      return LrSchedule(peak, n, warm, "constant")
    cool = min(max(1, round(train.cooldown_frac * total)), n - warm)
    if cool < 1:
      raise ConfigError(f"The last stage ({n} steps, {warm} of warm-up) leaves no step for the WSD cool-down; lower "
                        f"cycle.transition_warmup_frac or raise up_fracs[0].")
    return LrSchedule(peak, n, warm, "wsd", cooldown=cool)

  widths = _schemes(cycle.width_schemes, "width_schemes", k - 1)
  depths = _schemes(cycle.depth_schemes, "depth_schemes", k - 1)
  try:
    maps = O.make_chain(model, k, widths=widths, depths=depths, width_factor=cycle.width_factor,
                        depth_factor=cycle.depth_factor, depth_mode=cycle.depth_mode,
                        embed_factor=cycle.embed_factor or None, preln_exact=cycle.preln_exact,
                        depth_growth=cycle.depth_growth, allow_unequal_width_groups=cycle.allow_unequal_width_groups)
  except O.ChainError as e:
    i, lvl = e.transition, e.level
    if widths[i] is not None or depths[i] is not None:
      raise e.reason from None  # The scheme given for that transition is what is wrong; its own message says how.
    raise ConfigError(f"cycle.levels={k}: level {i} ({lvl.num_layers} layers, {lvl.num_heads} heads) cannot be "
                      f"coalesced again ({e.reason}) Use fewer cycle.levels, a larger model, or cycle.width_factor=1 "
                      f"/ cycle.depth_factor=1 to keep that axis.") from None
  levels = (model,) + tuple(m.small for m in maps)
  _check_symmetry_broken(cycle, levels)
  _check_small_stage_cost(cycle, levels)
  if cycle.new_layers == "fresh" and not any(m.changes_depth for m in maps):
    raise ConfigError("cycle.new_layers='fresh' draws the layers that depth growth adds, but no level of this plan "
                      "changes the depth (cycle.depth_factor=1 or depth schemes that keep every layer). Set "
                      "cycle.new_layers='copy', or grow the depth.")

  scales = _tuple(cycle.lr_scales, k, "lr_scales")
  down = () if cycle.small_init == "fresh" else _tuple(cycle.down_fracs, k - 1, "down_fracs")  # (No down stages.)
  up = _tuple(cycle.up_fracs, k - 1, "up_fracs")
  tw = cycle.transition_warmup_frac
  steps_of = lambda frac, name: _positive(round(float(frac) * total), name)
  # cycle.lr_rule='mup': per-parameter rates at each narrower level (plan.mup_multipliers); the target's are all 1.
  mup = {lvl: mup_multipliers(model, levels[lvl]) if cycle.lr_rule == "mup" and lvl else () for lvl in range(k)}
  opt_at = lambda lvl, schedule: optim_for(schedule, train, mup[lvl])

  stages, held = [], []
  fresh = cycle.small_init == "fresh"  # The bottom model starts from its own init: no down stages, no snapshots.
  for lvl in range(0 if fresh else k - 1):
    n = steps_of(down[lvl], f"down_fracs[{lvl}]")
    # Reference stage 1: linear warm-up over the whole stage, stopping at the peak.
    stages.append(Stage(len(stages), lvl, "down", "init" if lvl == 0 else "coalesce", n,
                        opt_at(lvl, LrSchedule(lr * float(scales[lvl]), n, n, "constant")), tuple(held)))
    held.append(lvl)  # Coalescing this level keeps it as the interpolation partner of the way back up.
  n = steps_of(cycle.small_frac, "small_frac")
  # The bottom stage's warm-up: cycle.small_warmup_steps (the planner sets its pilot's, so the stage follows the pilot
  # curve it was priced on), else transition_warmup_frac of the stage.
  small_warm = cycle.small_warmup_steps or round(tw * n)
  if cycle.small_warmup_steps and small_warm >= n:
    raise ConfigError(f"cycle.small_warmup_steps={cycle.small_warmup_steps} leaves no step of the {n}-step bottom "
                      f"stage at its peak learning rate; lower it or raise cycle.small_frac.")
  cut = {int(c[0]): (int(c[1]), int(c[2])) for c in cuts}
  bottom = len(stages)
  if set(cut) - {bottom}:
    raise ValueError(f"Cuts {sorted(cut)} name stages other than the bottom stage {bottom}: only it is adaptive.")
  stop = None
  if cycle.small_stop == "frontier":
    from multilevel.cycles.switch import FrontierSwitch
    stop = FrontierSwitch(tuple((float(f), float(l)) for f, l in cycle.target_frontier), cycle.stop_window,
                          small_warm)
  stages.append(Stage(bottom, k - 1, "bottom", "init" if fresh else "coalesce", cut.get(bottom, (n,))[0],
                      opt_at(k - 1, trained(lr * float(scales[k - 1]), n, small_warm, False)), tuple(held),
                      stop=None if bottom in cut else stop))
  for lvl in range(k - 2, -1, -1):
    n = steps_of(up[lvl], f"up_fracs[{lvl}]")
    if lvl == 0 and bottom in cut:
      n += cut[bottom][1]
    peak = lr * float(scales[lvl])
    if lvl == 0 and cycle.final_schedule == "baseline_tail":
      # Continue where the baseline's linear decay would be with n steps left, instead of restarting at the peak.
      warm_base = round(train.warmup_frac * total)
      peak = lr * min(1.0, n / max(total - warm_base, 1))
    if lvl in held:
      held.remove(lvl)  # Growing into this level consumes its snapshot.
    stages.append(Stage(len(stages), lvl, "up", "grow", n, opt_at(lvl, trained(peak, n, round(tw * n), lvl == 0)),
                        tuple(sorted(held))))
  return Plan("vcycle", levels, tuple(stages), cycle, tuple(maps), train.seed)


def _check_small_stage_cost(cycle, levels: tuple[ModelConfig, ...]) -> None:
  """``small_frac`` above 1 gives the smallest model more steps than the budget's (its steps are cheaper: planned
  V-cycles do this); refused where that stage alone would cost more FLOPs than the whole budget of target steps."""
  if float(cycle.small_frac) <= 1:
    return
  from multilevel.train.flops import train_flops_per_step
  ratio = train_flops_per_step(levels[-1], 1) / train_flops_per_step(levels[0], 1)
  share = float(cycle.small_frac) * ratio
  if share > 1:
    most = math.floor(100 / ratio) / 100  # Rounded down, so that the share named fits.
    raise ConfigError(f"cycle.small_frac={cycle.small_frac} gives the smallest model ({levels[-1].num_layers} "
                      f"layers, width {levels[-1].width}) {share:.2f}x the FLOPs of the whole budget of "
                      f"train.steps target steps, before any other stage (a step of it costs {ratio:.3f} of a "
                      f"target step, whatever train.steps). Set cycle.small_frac to at most {most:.2f} here.")


def _check_symmetry_broken(cycle, levels: tuple[ModelConfig, ...]) -> None:
  """Refuses width growth whose copies nothing tells apart. De-coalescing gives each small unit (hidden dimension,
  FFN unit, head) identical copies; with no interpolation (w_pre = 0) and none of split noise, shrink-and-perturb's
  perturbation, dropout or the restart control, the copies get identical gradients and updates for ever, so the
  grown model has the small model's capacity in the big one's cost."""
  grows_width = any((a.width, a.ffn_dim, a.num_heads) != (b.width, b.ffn_dim, b.num_heads)
                    for a, b in zip(levels, levels[1:]))
  broken = (cycle.w_pre > 0 or cycle.split_noise > 0 or float(cycle.shrink_perturb[1]) > 0 or cycle.restart_control
            or levels[0].dropout > 0)
  if grows_width and not broken and not cycle.allow_tied_copies:
    raise ConfigError(
        "cycle.w_pre=0 with cycle.split_noise=0 grows the width by exact copies that nothing tells apart: they get "
        "equal gradients and stay copies for ever, so the grown model trains as the small one does (measured: after "
        "800 big-model steps half the hidden dimensions were still duplicates). Set cycle.split_noise=0.1 (keeps "
        "the function and breaks the symmetry), or cycle.w_pre > 0, or cycle.allow_tied_copies=True to run the tied "
        "model as a control.")


def transition(plan: Plan, src: Stage, dst: Stage) -> Transition:
  """The V-cycle's move from ``src`` into ``dst``: coalesce one level down, or grow one level up."""
  cycle = plan.options
  if dst.enter == "coalesce":
    m = plan.maps[src.level]
    # This level, right now, is the interpolation partner of the way back up.
    coalesce = lambda c: {"params": O.coalesce(c["params"], m, check_finite=False), "put": {src.level: c["params"]}}
    return _complete(plan, dst, "coalesce", [("coalesce", coalesce)], "after_coalesce", (), (src.level,), {},
                     lambda t: O.coalesce(t, m, check=False, check_finite=False))
  if dst.enter == "grow":
    m = plan.maps[dst.level]
    noise, seed = cycle.split_noise, plan.seed + 1000 + dst.index
    # Drawn eagerly, as a model's initial parameters always are (under jit the same key gives other bits).
    new = M.init_params(plan.levels[dst.level], plan.seed + 3000 + dst.index) if (
        cycle.new_layers == "fresh" and m.changes_depth) else None

    def grow(c):
      grown = O.decoalesce(c["params"], m, check_finite=False)
      if noise:
        grown = O.split_noise(grown, m, scale=noise, seed=seed, check_finite=False)
      if new is not None:
        grown = O.fresh_layers(grown, new, m, check=False, check_finite=False)
      return {"after_decoalesce": grown}

    def interpolate(c):
      return {"params": O.interpolate(c["after_decoalesce"], c["taken"][dst.level], w_pre=cycle.w_pre,
                                      check_finite=False)}

    if dst.level in plan.stages[src.index].held:
      parts, event, probes = [("grow", grow), ("interpolate", interpolate)], "after_interpolate", {
          "after_decoalesce": dst.level}
      takes = (dst.level,)
    else:  # No snapshot of this level (cycle.small_init='fresh', which implies w_pre = 0): nothing to interpolate.
      parts, event, probes, takes = [("grow", lambda c: {"params": grow(c)["after_decoalesce"]})], \
          "after_decoalesce", {}, ()
    shrink, perturb = (float(x) for x in cycle.shrink_perturb)
    if (shrink, perturb) != (1.0, 0.0):
      # Drawn eagerly, as a model's initial parameters always are; the interpolated model becomes a probe.
      fresh = M.init_params(plan.levels[dst.level], plan.seed + 2000 + dst.index)

      before = event  # The model as grown (and interpolated) becomes a probe.

      def shrink_and_perturb(c):
        mixed = jax.tree.map(lambda p, r: shrink * p + perturb * r, c["params"], fresh)
        return {before: c["params"], "params": mixed}

      parts.append(("shrink_perturb", shrink_and_perturb))
      probes[before], event = dst.level, "after_shrink_perturb"
    return _complete(plan, dst, "grow", parts, event, takes, (), probes,
                     lambda t: O.decoalesce(t, m, check=False, check_finite=False))
  raise ValueError(f"Stage {dst.name} cannot be entered by {dst.enter!r} from {src.name}.")


def _complete(plan: Plan, dst: Stage, name, parts, event, takes, puts, probe_levels, opt_map) -> Transition:
  """The transition's own parts followed by the restart control (random weights instead of the transferred ones,
  which then become an intermediate probe: the control shows what the schedule alone is worth) and the next
  stage's optimizer state: fresh (the paper), or Adam's moments carried through ``opt_map``."""
  parts, probe_levels = list(parts), dict(probe_levels)
  final = event
  if plan.options.restart_control:
    # Drawn eagerly, as a model's initial parameters always are (under jit the same key gives other bits).
    random = M.init_params(plan.levels[dst.level], plan.seed + 1 + dst.index)
    parts.append(("restart_control", lambda c: {event: c["params"], "params": random}))
    probe_levels[event], final = dst.level, "after_restart_control"

  def optimizer(c):
    fresh = dst.optim.build().init(c["params"])
    if plan.options.optimizer_policy == "carry":
      return {"opt_state": carry_moments(c["opt_state"], fresh, opt_map)}
    return {"opt_state": fresh}

  parts.append(("optimizer", optimizer))
  return Transition(name, tuple(parts), final, takes, puts, probe_levels)


VCYCLE = register_method(Method("vcycle", build_plan, transition,
                                "The multi-level V-cycle: coalesce, train small, de-coalesce + interpolate."))
