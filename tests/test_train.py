"""The train step's pieces: MLM masking, gradient accumulation, moment carrying, and FLOPs against XLA."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from multilevel import models as M
from multilevel import operators as O
from multilevel.train import (LrSchedule, ObjectiveConfig, OptimConfig, StepConfig, TrainState, carry_moments,
                              mlm_corrupt, train_flops_per_step, train_step_fn)


def test_mlm_masking_is_15_percent_split_80_10_10():
  tokens = jax.random.randint(jax.random.key(0), (64, 512), 5, 1000)
  obj = ObjectiveConfig(mask_id=3, mlm_prob=0.15)
  inputs, weights = mlm_corrupt(tokens, jax.random.key(1), obj, 1000)
  picked = np.asarray(weights) > 0
  frac = picked.mean()
  assert 0.14 < frac < 0.16
  masked = (np.asarray(inputs) == 3) & picked
  changed = (np.asarray(inputs) != np.asarray(tokens)) & picked & ~masked
  assert 0.78 < masked.sum() / picked.sum() < 0.82
  assert 0.08 < changed.sum() / picked.sum() < 0.11  # Random replacements (a few hit the same token).
  assert np.array_equal(np.asarray(inputs)[~picked], np.asarray(tokens)[~picked])  # Unpicked tokens untouched.


def test_padding_is_never_picked():
  tokens = jnp.where(jnp.arange(64)[None] < 32, 7, 0).repeat(16, 0)
  _, weights = mlm_corrupt(tokens, jax.random.key(2), ObjectiveConfig(mask_id=3, pad_id=0), 100)
  assert float(weights[:, 32:].sum()) == 0.0 and float(weights[:, :32].sum()) > 0


@pytest.mark.parametrize("family", ["gpt", "deit"])
def test_gradient_accumulation_matches_one_big_batch(family):
  cfg = M.preset(f"{family}-test", dropout=0.0)
  params = M.init_params(cfg, 0)
  tx = optax.sgd(1.0)  # Linear in the gradient, so the new parameters compare the gradients themselves.
  obj = ObjectiveConfig(label_smoothing=0.0)
  if family == "gpt":
    batch = {"tokens": jax.random.randint(jax.random.key(1), (8, cfg.max_len), 0, cfg.vocab_size)}
  else:
    batch = {"image": jax.random.normal(jax.random.key(1), (8, 8, 8, 1)),
             "label": jax.random.randint(jax.random.key(2), (8,), 0, cfg.num_classes)}
  outs = []
  for accum in (1, 2, 4):
    step = jax.jit(train_step_fn(StepConfig(cfg, obj, accum), tx))
    st, m = step(TrainState(params, tx.init(params)), batch, jnp.int32(0))
    outs.append((st.params, float(m["loss"])))
  for p, loss in outs[1:]:
    assert loss == pytest.approx(outs[0][1], rel=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), p, outs[0][0])


def test_carry_moments_maps_adam_state_and_keeps_its_count():
  cfg = M.preset("gpt-test", num_heads=4, num_layers=2)
  m = O.make_mapping(cfg)
  params = M.init_params(cfg, 0)
  tx = OptimConfig(LrSchedule(1e-3, 10)).build()
  state = tx.init(params)
  grads = jax.tree.map(jnp.ones_like, params)
  for _ in range(3):
    _, state = tx.update(grads, state, params)
  small = O.coalesce(params, m)
  fresh = tx.init(small)
  carried = carry_moments(state, fresh, lambda t: O.coalesce(t, m, check=False))
  adam = lambda s: [x for x in jax.tree.leaves(s, is_leaf=lambda y: isinstance(y, optax.ScaleByAdamState))
                    if isinstance(x, optax.ScaleByAdamState)][0]
  old, new = adam(state), adam(carried)
  assert int(new.count) == int(old.count) == 3
  expect_mu = O.coalesce(old.mu, m, check=False)
  jax.tree.map(np.testing.assert_array_equal, new.mu, expect_mu)
  # The learning-rate schedule's own counter restarts with the new stage.
  counts = [int(x) for x in jax.tree.leaves(carried) if getattr(x, "dtype", None) == jnp.int32 and x.ndim == 0]
  assert 0 in counts


@pytest.mark.parametrize("family", ["gpt", "bert", "deit"])
def test_analytic_flops_match_xla_within_10_percent(family):
  """One layer, so XLA's cost analysis (which counts a loop body once) sees every matmul exactly once."""
  if family == "deit":
    cfg = M.ModelConfig("deit", 1, 4, 32, image_size=32, patch_size=4, num_channels=3, num_classes=10)
    batch = {"image": jnp.zeros((8, 32, 32, 3)), "label": jnp.zeros((8,), jnp.int32)}
  else:
    cfg = M.ModelConfig(family, 1, 4, 32, vocab_size=512, max_len=64)
    batch = {"tokens": jnp.zeros((8, 64), jnp.int32)}
  params = M.init_params(cfg, 0)
  tx = OptimConfig(LrSchedule(1e-3, 10)).build()
  step = jax.jit(train_step_fn(StepConfig(cfg, ObjectiveConfig(mask_id=1)), tx))
  cost = step.lower(TrainState(params, tx.init(params)), batch, jnp.int32(0)).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  analytic = train_flops_per_step(cfg, 8)
  assert cost["flops"] == pytest.approx(analytic, rel=0.10), (cost["flops"], analytic)


def test_clear_compiled_drops_the_kept_steps_and_their_memory_maps():
  from multilevel.train import build_steps, make_mesh, put_batch
  from multilevel.train.step import clear_compiled
  from tests.conftest import memory_maps
  cfg = M.preset("gpt-test", dropout=0.0, num_layers=3)  # A shape no other test of this file compiles.
  sc, oc, mesh = StepConfig(cfg, ObjectiveConfig()), OptimConfig(LrSchedule(1e-3, 10)), make_mesh("", 1)
  batch = {"tokens": np.asarray(jax.random.randint(jax.random.key(1), (4, cfg.max_len), 0, cfg.vocab_size))}

  def run():
    steps = build_steps(sc, oc, mesh)
    state = steps.init_state(jax.device_put(M.init_params(cfg, 0), steps.shardings.params))
    state, m = steps.train(state, put_batch(batch, mesh), jnp.int32(0))
    return steps, float(m["loss"]), jax.tree.map(np.asarray, state.params)

  clear_compiled()
  before = memory_maps()
  steps, loss, params = run()
  assert build_steps(sc, oc, mesh) is steps  # Kept for the next run of this config...
  kept = memory_maps()
  clear_compiled()
  assert build_steps.cache_info().currsize == 0  # ...until dropped,
  if before is not None:  # (Linux) with the mappings of its compiled code.
    assert kept - memory_maps() > (kept - before) // 2
  again, loss2, params2 = run()
  assert again is not steps and loss2 == loss  # Compiled again, the same numbers.
  jax.tree.map(np.testing.assert_array_equal, params2, params)
