"""The growth methods beside the V-cycle (G_stack, StackBERT, MSLT, LiGO; CoRe's own tests are in test_core.py): each one's defining property, its plan and its
refusals, and end-to-end runs through the driver that evaluate around every transition and resume bit for bit."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multilevel import models as M
from multilevel import operators as O
from multilevel.cycles import CycleConfig, method_of
from multilevel.cycles.mslt import top_copy_map
from multilevel.cycles.stack import stack_map
from multilevel.train import LrSchedule, ObjectiveConfig, OptimConfig, StepConfig, TrainState, train_step_fn
from multilevel.train.config import TrainConfig
from multilevel.train.views import FULL, FrozenBottom, head_only_names
from multilevel.tree import flatten
from multilevel.typed_config import ConfigError, section_from
from tests.engine_util import Killed, read_jsonl, tiny_config, train_killed_at


def _noisy_params(cfg, seed=0):
  p = M.init_params(cfg, seed)
  rng = np.random.default_rng(seed + 1)
  return jax.tree.map(lambda x: x + jnp.asarray(0.05 * rng.standard_normal(x.shape), x.dtype), p)


# ---------------------------------------------------------------------------------------------- stacking

@pytest.mark.parametrize("family", ["gpt", "bert", "deit"])
def test_the_stacked_model_is_the_small_model_repeated(family):
  big = M.preset(f"{family}-test").replace(num_layers=4)
  small = big.replace(num_layers=1 if family == "gpt" else 2)
  factor = big.num_layers // small.num_layers
  sp = _noisy_params(small)
  grown = O.decoalesce(sp, stack_map(small.num_layers, big, factor))
  for name, x in flatten(grown).items():
    y = flatten(sp)[name]
    if name.startswith("layers/"):
      for i in range(big.num_layers):  # Block i is block i mod L_small: the whole model repeated.
        np.testing.assert_array_equal(np.asarray(x[i]), np.asarray(y[i % small.num_layers]), err_msg=name)
    else:
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)


def test_stackbert_order_and_growth_lay_out_and_start_the_copies():
  """'adjacent' repeats each block in place; 'scaled' halves both copies' residual outputs; 'zero' zeroes the later
  copy's, so the stacked pre-LN GPT computes the small model's logits."""
  big = M.preset("gpt-test").replace(num_layers=4)
  small = big.replace(num_layers=2)
  sp = _noisy_params(small)
  outs = ("attn/out/kernel", "attn/out/bias", "mlp/fc2/kernel", "mlp/fc2/bias")
  small_layers = flatten(sp["layers"])
  for order, idx in [("stride", [0, 1, 0, 1]), ("adjacent", [0, 0, 1, 1])]:
    for growth in ("copy", "scaled", "zero"):
      plan = _plan("stackbert", stages=2, fracs=(0.5, 0.5), order=order, growth=growth)
      grown = O.decoalesce(sp, plan.maps[0])
      for name, x in flatten(grown["layers"]).items():
        want = np.asarray(small_layers[name])[idx]
        if name in outs and growth == "scaled":
          want = want / 2
        if name in outs and growth == "zero":
          later = [i for i in range(4) if idx[i] in idx[:i]]  # The second copy of each small block.
          want = want.copy()
          want[later] = 0
        np.testing.assert_array_equal(np.asarray(x), want, err_msg=(order, growth, name))
      if growth == "zero":
        x = jnp.asarray(np.random.default_rng(0).integers(0, big.vocab_size, (2, 16)), jnp.int32)
        np.testing.assert_allclose(M.apply(big, grown, x), M.apply(small, sp, x), rtol=0, atol=2e-5)


def test_mslt_new_top_layers_copy_the_top_ones():
  big = M.preset("gpt-test").replace(num_layers=3)
  small = big.replace(num_layers=2)
  sp = _noisy_params(small)
  grown = O.decoalesce(sp, top_copy_map(big, 1))
  for name, x in flatten(grown["layers"]).items():
    y = np.asarray(flatten(sp["layers"])[name])
    np.testing.assert_array_equal(np.asarray(x), y[[0, 1, 1]], err_msg=name)


def _plan(method, steps=100, **opts):
  """The plan of ``method`` for a 4-layer GPT, its options given as the config's ``cycle.<method>`` dict."""
  model = M.preset("gpt-test").replace(num_layers=4)
  cycle = section_from(CycleConfig, {"method": method, **({method: opts} if opts else {})}, "cycle")
  return method_of(method).build_plan(model, cycle, TrainConfig(steps=steps))


@pytest.mark.parametrize("method", ["stackbert", "mslt"])
def test_the_learning_rate_runs_on_scratch_curve_across_stages(method):
  train = TrainConfig(steps=100)
  plan = _plan(method)
  scratch = LrSchedule(train.lr, 100, round(train.warmup_frac * 100), "linear").build()
  g = 0
  for s in plan.stages:
    fn = s.lr.build()
    for t in range(s.steps):
      assert float(fn(t)) == pytest.approx(float(scratch(g + t)), rel=1e-6, abs=1e-6 * train.lr), (s.name, t)
    g += s.steps
  assert g == 100


def test_gstack_plan_is_one_hop_with_a_fresh_schedule():
  plan = _plan("gstack", growth_frac=0.2)
  small, big = plan.stages
  assert plan.levels[small.level].num_layers == 1 and plan.levels[big.level].num_layers == 4
  assert (small.steps, big.steps) == (20, 80)
  assert big.lr.warmup == round(0.05 * 80) and big.lr.peak == TrainConfig().lr and big.lr.decay == "linear"


def test_stackbert_doubles_and_mslt_adds_top_layers_then_trains_all():
  sb = _plan("stackbert")
  assert [sb.levels[s.level].num_layers for s in sb.stages] == [1, 2, 4]
  assert [s.steps for s in sb.stages] == [12, 18, 70]
  ms = _plan("mslt")
  assert [ms.levels[s.level].num_layers for s in ms.stages] == [1, 2, 3, 4, 4]
  assert [s.view for s in ms.stages] == [FULL, FrozenBottom(1), FrozenBottom(2), FrozenBottom(3), FULL]


@pytest.mark.parametrize("method, opts, match", [
    ("gstack", {"factor": 3}, r"num_layers \(4\) to be a multiple of 3"),
    ("gstack", {"growth_frac": 1.0}, r"growth_frac .* must be in \(0, 1\)"),
    ("stackbert", {"stages": 4, "fracs": (0.1, 0.1, 0.1, 0.7)}, r"multiple of 8"),
    ("stackbert", {"fracs": (0.5, 0.5)}, r"one positive share per stage \(3\)"),
    ("stackbert", {"fracs": (0.1, 0.2, 0.3)}, r"must add up to 1, got \[0.1, 0.2, 0.3\] \(sum 0.6\)"),
    ("stackbert", {"order": "interleaved"}, r"stackbert\.order must be one of \('adjacent', 'stride'\)"),
    ("stackbert", {"growth": "half"}, r"stackbert\.growth must be one of \('copy', 'scaled', 'zero'\)"),
    ("mslt", {"stages": 3}, r"must divide the target's 4 layers"),
    ("ligo", {"width_factor": 3}, r"factor must divide the number of heads\. Set cycle\.ligo\.width_factor to a "
                                  r"divisor of num_heads=2"),  # (It said to pass a width scheme, which LiGO has not.)
    ("mslt", {"final_frac": 1.0}, r"final_frac must be in \[0, 1\)"),
])
def test_impossible_method_configs_are_refused_with_what_to_change(method, opts, match):
  with pytest.raises(ConfigError, match=match):
    _plan(method, **opts)


def test_too_few_steps_for_the_stages_is_said_as_such():
  # MSLT's 4 growth stages and its final one at train.steps=3: it said to raise final_frac, which made it worse.
  with pytest.raises(ValueError, match=r"train.steps=3 is fewer than the plan's 5 stages, each of which needs a step"):
    _plan("mslt", steps=3)


def test_a_warmup_longer_than_the_first_stage_is_refused():
  with pytest.raises(ConfigError, match=r"warm-up \(20 steps.*longer than the first stage \(12 steps\)"):
    method_of("stackbert").build_plan(M.preset("gpt-test").replace(num_layers=4), CycleConfig(method="stackbert"),
                                      TrainConfig(steps=100, warmup_frac=0.2))


# ------------------------------------------------------------------------------------------------- MSLT

def _frozen_step(cfg, view, batch):
  tx = OptimConfig(LrSchedule(1e-2, 10)).build()
  sc = StepConfig(cfg, ObjectiveConfig(mask_id=1), view=view)
  step = jax.jit(train_step_fn(sc, tx))
  return tx, step


def test_frozen_layers_stay_bit_identical_and_hold_no_optimizer_state():
  cfg = M.preset("gpt-test").replace(num_layers=3)
  view = FrozenBottom(2)
  vp = view.from_model(cfg, _noisy_params(cfg))
  batch = {"tokens": jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (4, 16)), jnp.int32)}
  tx, step = _frozen_step(cfg, view, batch)
  opt = tx.init(view.split(vp)[0])
  # The optimizer sees only the top layer and the head's own parameters: no moments for the frozen ones.
  assert set(head_only_names(cfg)) == {"ln_final"}
  n_moments = sum(x.size for x in jax.tree.leaves(opt) if x.ndim > 0)
  n_train = sum(x.size for x in jax.tree.leaves(vp["train"]))
  assert n_moments == 2 * n_train
  state = TrainState(vp, opt)
  for i in range(3):
    state, metrics = step(state, batch, jnp.int32(i))
  assert np.isfinite(float(metrics["loss"]))
  for a, b in zip(jax.tree.leaves(vp["frozen"]), jax.tree.leaves(state.params["frozen"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert all(np.any(np.asarray(a) != np.asarray(b))
             for a, b in zip(jax.tree.leaves(vp["train"]), jax.tree.leaves(state.params["train"])))
  # The view computes the model's function: its logits equal the plain model's on the same weights.
  x = batch["tokens"]
  np.testing.assert_allclose(view.apply(cfg, vp, x), M.apply(cfg, view.to_model(cfg, vp), x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["gpt", "bert", "deit"])
def test_a_frozen_stage_costs_its_analytic_forward_backward_split(family):
  """1 frozen + 1 trained layer: XLA's cost analysis (each loop body once) against the analytic count, and the
  saving against the full step's."""
  if family == "deit":
    cfg = M.ModelConfig("deit", 2, 4, 32, image_size=32, patch_size=4, num_channels=3, num_classes=10)
    batch = {"image": jnp.zeros((8, 32, 32, 3)), "label": jnp.zeros((8,), jnp.int32)}
  else:
    cfg = M.ModelConfig(family, 2, 4, 32, vocab_size=512, max_len=64)
    batch = {"tokens": jnp.zeros((8, 64), jnp.int32)}
  params = M.init_params(cfg, 0)

  def xla_flops(view):
    tx, step = _frozen_step(cfg, view, batch)
    vp = view.from_model(cfg, params)
    cost = step.lower(TrainState(vp, tx.init(view.split(vp)[0])), batch, jnp.int32(0)).compile().cost_analysis()
    return (cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"]

  view = FrozenBottom(1)
  frozen = xla_flops(view)
  analytic = view.train_flops_per_step(cfg, 8)
  # A backward pass through the frozen layer would cost about 20% more here, outside the tolerance.
  assert frozen == pytest.approx(analytic, rel=0.10), (frozen, analytic)
  assert analytic < 0.85 * FULL.train_flops_per_step(cfg, 8)


# ------------------------------------------------------------------------------------------------- LiGO

@pytest.mark.parametrize("family", ["gpt", "bert", "deit"])
def test_ligo_at_its_initial_operator_grows_as_decoalescing(family):
  from multilevel.cycles import ligo
  big = M.preset(f"{family}-test").replace(num_layers=4, num_heads=4, head_dim=8)
  m = O.make_mapping(big, width_factor=2, depth_factor=2, depth_mode="stride", depth_growth="copy")
  sp = _noisy_params(m.small)
  grown = jax.jit(ligo.materialise, static_argnums=2)(ligo.initial_operator(m, sp), sp, m)
  want = O.decoalesce(sp, m)
  for name, x in flatten(grown).items():  # Exact: one nonzero product per entry, and 1/n a power of two.
    np.testing.assert_array_equal(np.asarray(x), np.asarray(flatten(want)[name]), err_msg=name)


def test_ligo_operator_stage_trains_only_the_operator():
  from multilevel.cycles import ligo
  big = M.preset("bert-test").replace(num_layers=4, num_heads=4, head_dim=8)
  m = O.make_mapping(big, width_factor=2, depth_factor=2, depth_mode="stride", depth_growth="copy")
  view = ligo.LigoView(m)
  sp = _noisy_params(m.small)
  vp = {"frozen": sp, "train": ligo.initial_operator(m, sp)}
  batch = {"tokens": jnp.asarray(np.random.default_rng(0).integers(0, big.vocab_size, (4, 16)), jnp.int32)}
  tx, step = _frozen_step(big, view, batch)
  state = TrainState(vp, tx.init(vp["train"]))
  for i in range(2):
    state, _ = step(state, batch, jnp.int32(i))
  for a, b in zip(jax.tree.leaves(sp), jax.tree.leaves(state.params["frozen"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert any(np.any(np.asarray(a) != np.asarray(b))
             for a, b in zip(jax.tree.leaves(vp["train"]), jax.tree.leaves(state.params["train"])))
  # A step costs a big-model step plus building its weights (forward and backward).
  extra = view.train_flops_per_step(big, 4) - FULL.train_flops_per_step(big, 4)
  assert extra == 3 * ligo.materialise_flops(m, m.small) > 0


def test_ligo_needs_room_for_its_operator_steps():
  with pytest.raises(ConfigError, match=r"operator steps leave -?\d+ steps of train.steps=100"):
    _plan("ligo", operator_steps=90)


# ------------------------------------------------------------------------------------------ end to end

CASES = {  # One family per method keeps the suite short; the unit tests above cover every family.
    "gstack": ("bert", {"cycle.gstack.factor": 2}),
    "stackbert": ("deit", {"cycle.stackbert.stages": 2, "cycle.stackbert.fracs": (0.3, 0.7)}),
    "mslt": ("gpt", {"cycle.mslt.stages": 2}),
    "ligo": ("gpt", {"cycle.ligo.operator_steps": 5, "cycle.ligo.depth_factor": 1}),
    "msg": ("bert", {"cycle.msg.order": ("layers", "heads")}),  # Both mask paths: the layer ramp, the width masks.
    "core": ("gpt", {"cycle.core.chunk": 8}),  # Causal linear attention over 4 chunks of the 31 positions.
}


def _run(family, method, opts, workdir, fault=None, monkeypatch=None):
  c = tiny_config(family, levels=1, **{"cycle.method": method, "checkpoint.every": 10, **opts})
  return train_killed_at(c, workdir, fault, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(CASES))
def test_each_method_runs_evaluates_around_transitions_and_resumes_bit_for_bit(method, tmp_path, monkeypatch):
  family, opts = CASES[method]
  ref = _run(family, method, opts, tmp_path / "ref")
  plan_stages = ref["per_stage"]
  assert ref["method"] == method and len(plan_stages) >= 2 and np.isfinite(ref["final_eval_loss"])
  records = read_jsonl(str(tmp_path / "ref" / "metrics.jsonl"))
  events = [(r["stage"], r["event"]) for r in records if "event" in r]
  for i in range(1, len(plan_stages)):  # Evaluated right before and right after each transition.
    before = events.index((i - 1, "end_of_stage"))
    assert events[before + 1][0] == i and events[before + 1][1].startswith("after_"), events
  # The FLOPs of every stage are its steps times its view's step cost; the total is their sum.
  assert ref["total_flops"] == pytest.approx(sum(p["flops"] for p in plan_stages))
  # Killed right after the first transition (before its save), then in the middle of the next stage.
  work = tmp_path / "killed"
  first = plan_stages[0]["steps"]
  for fault in ("transition:1", f"step:{first + 3}"):
    with pytest.raises(Killed):
      _run(family, method, opts, work, fault, monkeypatch)
  monkeypatch.undo()
  resumed = _run(family, method, opts, work)
  assert resumed["params_sha256"] == ref["params_sha256"]
  assert resumed["final_eval_loss"] == ref["final_eval_loss"] and resumed["total_flops"] == ref["total_flops"]
  stable = lambda rs: [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rs]
  assert stable(read_jsonl(str(work / "metrics.jsonl"))) == stable(records)
  with open(work / "run.json") as f:
    assert json.load(f)["config"]["cycle"]["method"] == method
