"""The V-cycle schedule as data: stages, steps, learning rates and the validation of bad settings."""

import pytest

from multilevel.cycles import build_plan
from tests.engine_util import tiny_config


def plan_of(family="gpt", levels=2, deep=True, **kw):
  c = tiny_config(family, levels=levels, deep=deep, **kw)
  from multilevel.cycles.run_config import model_config
  return build_plan(model_config(c, None), c.cycle, c.train)


def test_one_level_is_plain_training_with_warmup_and_decay():
  p = plan_of(levels=1, **{"train.steps": 200})
  (s,) = p.stages
  assert (s.kind, s.enter, s.steps, s.lr.warmup, s.lr.decay) == ("scratch", "init", 200, 10, "linear")
  assert p.maps == ()


def test_two_levels_follow_the_reference_proportions():
  p = plan_of(levels=2, **{"train.steps": 1000, "train.lr": 1e-4, "cycle.transition_warmup_frac": 0.0})
  kinds = [(s.kind, s.level, s.enter, s.steps) for s in p.stages]
  assert kinds == [("down", 0, "init", 50), ("bottom", 1, "coalesce", 500), ("up", 0, "grow", 500)]
  down, bottom, up = p.stages
  assert down.lr.warmup == down.steps and down.lr.decay == "constant"  # Warm-up only, stopping at the peak.
  assert bottom.lr.peak == pytest.approx(4e-4) and bottom.lr.warmup == 0  # 4x the large model's rate.
  assert up.lr.peak == pytest.approx(1e-4)
  assert p.levels[1].num_layers == 2 and p.levels[1].num_heads == 2 and p.levels[1].head_dim == 8
  assert p.snapshots_before(1) == (0,) and p.snapshots_before(2) == ()


def test_three_levels_chain_down_and_up():
  p = plan_of(levels=3, **{"train.steps": 400})
  assert [(s.kind, s.level) for s in p.stages] == [("down", 0), ("down", 1), ("bottom", 2), ("up", 1), ("up", 0)]
  assert [c.num_layers for c in p.levels] == [4, 2, 1] and [c.num_heads for c in p.levels] == [4, 2, 1]
  assert p.snapshots_before(2) == (0, 1) and p.snapshots_before(3) == (0,) and p.snapshots_before(4) == ()
  assert p.stages[4].steps == 200 and p.stages[3].steps == 100


def test_knobs_reach_the_stages():
  p = plan_of(levels=2, **{"train.steps": 1000, "cycle.transition_warmup_frac": 0.1,
                          "cycle.final_schedule": "baseline_tail"})
  assert p.stages[1].lr.warmup == 50 and p.stages[2].lr.warmup == 50
  # The baseline decays linearly from its peak over 950 steps; with 500 left it is at 500/950 of the peak.
  assert p.stages[2].lr.peak == pytest.approx(3e-3 * 500 / 950)


def test_width_copies_that_nothing_tells_apart_are_refused_with_what_breaks_them():
  """w_pre = 0 and no split noise: refused for width growth (the copies would stay tied), with the fix named; fine
  for depth-only growth, with split noise, interpolation or dropout, and when asked for as a control."""
  from multilevel.typed_config import ConfigError
  base = {"cycle.w_pre": 0.0}
  with pytest.raises(ConfigError, match=r"stay copies for ever.*cycle\.split_noise=0\.1.*allow_tied_copies=True"):
    plan_of(**base)
  for ok in ({"cycle.width_factor": 1}, {"cycle.split_noise": 0.1}, {"cycle.w_pre": 0.25}, {"model.dropout": 0.1},
             {"cycle.shrink_perturb": (0.9, 0.1)}, {"cycle.allow_tied_copies": True}):
    assert len(plan_of(**{**base, **ok}).levels) == 2

def test_the_smallest_stage_may_run_more_steps_than_the_budget():
  # A planned V-cycle gives its small model more steps than train.steps when they cost less (DeiT's plan at T=700:
  # 780 small steps, small_frac 1.11); refusing every share above 1 made the planner's own configs fail.
  p = plan_of(levels=2, **{"train.steps": 100, "cycle.small_frac": 1.5})
  assert [s.steps for s in p.stages if s.kind == "bottom"] == [150]
  # The largest share the refusal names fits (it is rounded down).
  assert [s.steps for s in plan_of(levels=2, **{"cycle.small_frac": 7.01}).stages if s.kind == "bottom"]
  # A small model from its own init has no down stages: cycle.down_fracs is neither read nor checked.
  fresh = {"cycle.small_init": "fresh", "cycle.w_pre": 0.0, "cycle.split_noise": 0.1}
  assert plan_of(levels=2, **fresh, **{"cycle.down_fracs": ()}).stages[0].kind == "bottom"


@pytest.mark.parametrize("override, message", [
    ({"cycle.levels": 0}, "levels must be >= 1"),
    ({"cycle.optimizer_policy": "keep"}, "optimizer_policy"),
    ({"cycle.final_schedule": "x"}, "final_schedule"),
    ({"cycle.w_pre": 1.5}, "w_pre"),
    ({"cycle.split_noise": -0.1}, "split_noise .* must be >= 0"),
    ({"cycle.small_frac": 0.0}, "small_frac gives 0 steps"),
    ({"cycle.levels": 4}, "Cannot shrink"),
    ({"cycle.width_schemes": "[[[0, 1], [1, 2]]]", "cycle.levels": 2}, "twice"),
    # Shares above 1 trained past the budget (a 300% first stage), and lr_scales were named only as a peak rate. The
    # smallest stage may run more steps than the budget's (they are cheaper), but not cost more than all of it.
    ({"cycle.small_frac": 9.0}, r"cycle.small_frac=9.0 gives the smallest model \(2 layers, width 16\) 1.28x the "
                                r"FLOPs of the whole budget .* costs 0.143 of a target step, whatever train.steps\). "
                                r"Set cycle.small_frac to at most 7.01 here.$"),
    ({"cycle.small_frac": float("nan")}, r"cycle.small_frac .* must be >= 0 and finite"),
    ({"cycle.down_fracs": (3.0, 0.05)}, r"cycle.down_fracs are shares"),
    ({"cycle.lr_scales": (1.0, -4.0)}, r"cycle.lr_scales .* must be positive"),
    # Another method's options are not read by this one: refused, not ignored (and then recorded).
    ({"cycle.msg.ramp_frac": 0.2}, r"cycle.msg.ramp_frac is an option of method 'msg', but this run's cycle.method "
                                   r"is 'vcycle'"),
])
def test_bad_schedules_raise_clear_errors(override, message):
  with pytest.raises(ValueError, match=message):
    plan_of(**override)


# ------------------------------------------------------------------------------------------- warm-up, stable, decay


def _values(schedule, n):
  import numpy as np
  f = schedule.build()
  return np.array([float(f(i)) for i in range(n)])


def test_wsd_warms_up_holds_the_peak_and_cools_down_linearly():
  from multilevel.train.optim import LrSchedule
  v = _values(LrSchedule(1.0, 100, 10, "wsd", cooldown=20), 101)
  assert v[5] == pytest.approx(0.5) and v[10] == pytest.approx(1.0)
  assert (v[10:80] == 1.0).all()  # Stable: exactly the peak.
  assert v[90] == pytest.approx(0.5) and v[100] == pytest.approx(0.0, abs=1e-7)
  with pytest.raises(ValueError, match="needs 1 to 90 cool-down steps"):
    LrSchedule(1.0, 100, 10, "wsd", cooldown=95)
  with pytest.raises(ValueError, match="read only by decay='wsd'"):
    LrSchedule(1.0, 100, 10, "linear", cooldown=5)


def test_wsd_scratch_and_a_vcycle_share_one_schedule_with_a_single_final_cooldown():
  s = plan_of(levels=1, **{"train.steps": 200, "train.decay": "wsd", "train.cooldown_frac": 0.25}).stages[0]
  assert (s.lr.decay, s.lr.warmup, s.lr.cooldown) == ("wsd", 10, 50)
  p = plan_of(levels=2, **{"train.steps": 400, "train.decay": "wsd", "train.cooldown_frac": 0.2})
  down, bottom, up = p.stages
  assert bottom.lr.decay == "constant" and down.lr.decay == "constant"  # The small model hands over un-annealed.
  assert up.lr.decay == "wsd" and up.lr.cooldown == 80  # Scratch's cool-down length (0.2 T), at the very end.
  with pytest.raises(Exception, match="baseline_tail"):
    plan_of(levels=2, **{"train.decay": "wsd", "cycle.final_schedule": "baseline_tail"})


def test_a_continuous_wsd_curve_cut_into_stages_is_scratchs_curve():
  import numpy as np

  from multilevel.cycles.plan import scratch_schedules
  from multilevel.train.config import TrainConfig
  from multilevel.train.optim import schedule_for
  train = TrainConfig(steps=300, lr=2e-3, decay="wsd", cooldown_frac=0.3, warmup_frac=0.05)
  whole = _values(schedule_for(train, 2e-3, 300, 15), 300)
  for cut in [(100, 100, 100), (40, 180, 80), (250, 50), (15, 285)]:
    pieces = np.concatenate([_values(s, n) for s, n in zip(scratch_schedules(train, cut), cut)])
    np.testing.assert_allclose(pieces, whole, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("override, message", [
    ({"train.cooldown_frac": 0.0}, "cooldown_frac"),
    ({"train.decay": "wsd", "train.warmup_frac": 0.5, "train.cooldown_frac": 0.6}, "overlap"),
])
def test_bad_wsd_settings_are_refused(override, message):
  with pytest.raises(Exception, match=message):
    plan_of(levels=1, **override)


# ------------------------------------------------------------------------------------------------ muP's rates


def test_mup_doubles_the_rate_of_hidden_matrices_at_half_width_and_nothing_else():
  from multilevel import models as M
  from multilevel.cycles.plan import mup_multipliers
  big = M.preset("gpt-test").replace(vocab_size=64)
  half = big.replace(num_heads=big.num_heads // 2)
  m = dict(mup_multipliers(big, half))
  assert m == {f"layers/{k}/kernel": 2.0 for k in ("attn/query", "attn/key", "attn/value", "attn/out", "mlp/fc1",
                                                    "mlp/fc2")}
  assert mup_multipliers(big, big.replace(num_layers=1)) == ()  # Depth only: every fan-in is the target's.


def test_lr_multipliers_scale_exactly_the_named_updates():
  import jax
  import jax.numpy as jnp

  from multilevel.train.optim import LrSchedule, OptimConfig
  params = {"a": {"kernel": jnp.ones((3, 2))}, "b": {"bias": jnp.ones((2,))}}
  grads = jax.tree.map(lambda x: 0.1 * jnp.arange(x.size, dtype=jnp.float32).reshape(x.shape) + 0.01, params)
  plain = OptimConfig(LrSchedule(1e-2, 10, 0, "constant"))
  scaled = OptimConfig(LrSchedule(1e-2, 10, 0, "constant"), lr_multipliers=(("a/kernel", 2.0),))
  up = lambda oc: oc.build().update(grads, oc.build().init(params), params)[0]
  u0, u1 = up(plain), up(scaled)
  assert (u1["a"]["kernel"] == 2.0 * u0["a"]["kernel"]).all() and (u1["b"]["bias"] == u0["b"]["bias"]).all()


def test_a_mup_vcycle_gives_only_its_narrower_levels_multipliers():
  p = plan_of(levels=2, **{"cycle.lr_rule": "mup", "cycle.lr_scales": (1.0, 1.0)})
  down, bottom, up = p.stages
  assert down.optim.lr_multipliers == () and up.optim.lr_multipliers == ()
  assert dict(bottom.optim.lr_multipliers)["layers/mlp/fc1/kernel"] == 2.0
  assert plan_of(levels=2).stages[1].optim.lr_multipliers == ()  # The default rule: lr_scales only.
  with pytest.raises(Exception, match="lr_rule"):
    plan_of(levels=2, **{"cycle.lr_rule": "sqrt"})


def test_shrink_and_perturb_mixes_the_grown_model_with_a_fresh_initialisation():
  import jax
  import numpy as np

  from multilevel import models as M
  from multilevel.cycles import method_of
  p = plan_of(levels=2, deep=False, **{"cycle.shrink_perturb": (0.5, 0.1)})
  _, bottom, up = p.stages
  t = method_of("vcycle").transition(p, bottom, up)
  assert [name for name, _ in t.parts] == ["grow", "interpolate", "shrink_perturb", "optimizer"]
  assert t.final_event == "after_shrink_perturb" and t.probe_levels["after_interpolate"] == 0
  small = M.init_params(p.levels[1], 3)
  held = M.init_params(p.levels[0], 4)
  opt = up.optim.build().init(held)
  params, _, _, probes = t(small, opt, {0: held})
  fresh = M.init_params(p.levels[0], p.seed + 2000 + up.index)
  want = jax.tree.map(lambda a, r: 0.5 * a + 0.1 * r, probes["after_interpolate"], fresh)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  with pytest.raises(Exception, match="shrink_perturb"):
    plan_of(levels=2, **{"cycle.shrink_perturb": (0.0, 0.1)})


def test_fresh_added_layers_are_drawn_at_growth_and_refused_where_they_cannot_be():
  import jax
  import numpy as np

  from multilevel import models as M
  from multilevel import operators as O
  from multilevel.cycles import method_of
  p = plan_of(levels=2, **{"cycle.new_layers": "fresh", "cycle.width_factor": 1, "cycle.w_pre": 0.0,
                           "cycle.small_init": "fresh"})
  bottom, up = p.stages
  t = method_of("vcycle").transition(p, bottom, up)
  assert [name for name, _ in t.parts] == ["grow", "optimizer"]
  small = M.init_params(p.levels[1], 3)
  params, _, _, _ = t(small, up.optim.build().init(M.init_params(p.levels[0], 4)), {})
  m = p.maps[0]
  want = O.fresh_layers(O.decoalesce(small, m), M.init_params(p.levels[0], p.seed + 3000 + up.index), m)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(Exception, match="depth_growth='zero'"):
    plan_of(levels=2, **{"cycle.new_layers": "fresh", "cycle.depth_growth": "copy"})
  with pytest.raises(Exception, match="no level of this plan changes the depth"):
    plan_of(levels=2, **{"cycle.new_layers": "fresh", "cycle.depth_factor": 1})
  with pytest.raises(Exception, match="new_layers"):
    plan_of(levels=2, **{"cycle.new_layers": "random"})


def test_the_plan_names_each_stages_model_with_its_ffn_width():
  p = plan_of(levels=2, **{"train.steps": 1000, "model.ffn_size": 96})
  lines = p.describe().splitlines()
  assert "L4/d32/h4/f96, 50 steps" in lines[1] and "L2/d16/h2/f48, 500 steps" in lines[2], lines
