"""CoRe (cycles/core.py, models/relaxed.py): the exact FFN transform, linear attention (against a plain quadratic
reference, causal for GPT, blind to padding for BERT), the relaxed model's FLOPs against XLA, the plan and its
refusals. The driver's end-to-end run with a kill and a resume is in test_methods.py (CASES)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multilevel import models as M
from multilevel.cycles import CycleConfig, method_of
from multilevel.cycles.core import RelaxedView
from multilevel.models import relaxed as R
from multilevel.train import LrSchedule, ObjectiveConfig, OptimConfig, StepConfig, TrainState, train_step_fn
from multilevel.train.config import TrainConfig
from multilevel.train.views import FULL
from multilevel.typed_config import ConfigError, section_from


def _noisy_params(cfg, seed=0):
  p = M.init_params(cfg, seed)
  rng = np.random.default_rng(seed + 1)
  return jax.tree.map(lambda x: x + jnp.asarray(0.05 * rng.standard_normal(x.shape), x.dtype), p)


def _inputs(cfg, batch=3, seed=2):
  rng = np.random.default_rng(seed)
  if M.family_of(cfg).is_text:
    return jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, cfg.max_len)), jnp.int32)
  return jnp.asarray(rng.standard_normal((batch, cfg.image_size, cfg.image_size, cfg.num_channels)), jnp.float32)


@pytest.mark.parametrize("family", ["gpt", "bert", "deit"])
def test_the_ffn_transform_is_exact_and_the_full_switches_are_the_model(family):
  """The relaxed model (linear attention, rank-8 FFN) against the transformed model (W = U V) run with the same
  linear attention: equal logits at fp32 rounding (measured on this CPU: max |dlogit| 3.0e-7 for GPT and BERT,
  8.9e-8 for DeiT, logits of size ~1). With softmax attention and the full FFN the relaxed forward is the model."""
  cfg = M.preset(f"{family}-test")
  p, x = _noisy_params(cfg), _inputs(cfg)
  np.testing.assert_array_equal(R.relaxed_apply(cfg, p, x, rank=0, attention="softmax"), M.apply(cfg, p, x))
  view = RelaxedView(rank=8, chunk=4)
  relaxed = view.from_model(cfg, p)
  # Factors away from the SVD's structure, as training leaves them.
  relaxed = jax.tree.map(lambda a: a * (1 + 0.1 * jnp.sin(jnp.arange(a.size).reshape(a.shape))), relaxed)
  full = view.to_model(cfg, relaxed)
  M.check_params(full, cfg, "the transformed model")
  for name in ("attn", "ln_attn", "ln_mlp"):  # Attention weights (and everything outside the FFN) map unchanged.
    jax.tree.map(np.testing.assert_array_equal, full["layers"][name], relaxed["layers"][name])
  before = view.apply(cfg, relaxed, x)
  after = R.relaxed_apply(cfg, full, x, rank=0, attention="linear", chunk=4)
  dlogit = float(jnp.max(jnp.abs(before - after)))
  assert dlogit < 2e-6 * max(1.0, float(jnp.max(jnp.abs(before)))), dlogit
  # The factored tree is the relaxed module's own parameter structure, and the SVD start is the best rank-8 fit.
  shapes = jax.eval_shape(lambda: R.RelaxedBlocks(cfg, 8, "linear", 4, True).init(
      jax.random.key(0), jnp.zeros((1, cfg.seq_len, cfg.width)))["params"]["layers"])
  assert jax.tree.map(lambda a: a.shape, shapes) == jax.tree.map(lambda a: a.shape, view.abstract(cfg)["layers"])
  w = np.asarray(p["layers"]["mlp"]["fc1"]["kernel"][0], np.float64)
  s = np.linalg.svd(w, compute_uv=False)
  fit = np.asarray(R.expand_ffn(view.from_model(cfg, p))["layers"]["mlp"]["fc1"]["kernel"][0], np.float64)
  assert np.linalg.norm(w - fit) == pytest.approx(np.sqrt(np.sum(s[8:] ** 2)), rel=1e-4)


def _quadratic_reference(q, k, v, causal, mask):
  """Linear attention written as the full T x T matrix of phi(q).phi(k), masked, row-normalised."""
  a = jnp.einsum("bqhk,bshk->bhqs", R.phi(q), R.phi(k))
  t = q.shape[1]
  allowed = jnp.ones((1, 1, t, t), bool)
  if causal:
    allowed = allowed & jnp.tril(jnp.ones((t, t), bool))[None, None]
  if mask is not None:
    allowed = allowed & mask[:, None, None, :]
  a = jnp.where(allowed, a, 0.0)
  return jnp.einsum("bhqs,bshv->bqhv", a, v) / jnp.sum(a, -1).transpose(0, 2, 1)[..., None]


@pytest.mark.parametrize("causal", [True, False])
def test_linear_attention_equals_its_quadratic_form(causal):
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((2, 13, 3, 4)), jnp.float32) for _ in range(3))
  mask = None if causal else jnp.asarray(np.arange(13)[None] < np.array([[13], [9]]))
  want = _quadratic_reference(q, k, v, causal, mask)
  loss = lambda f: lambda *qkv: jnp.sum(jnp.sin(f(*qkv)))
  want_grads = jax.grad(loss(lambda *a: _quadratic_reference(*a, causal, mask)), argnums=(0, 1, 2))(q, k, v)
  for chunk in (1, 4, 13, 64):  # Chunks that divide the length, leave a remainder, or cover it.
    attend = lambda *a: R.linear_attention(*a, causal=causal, mask_BxT=mask, chunk=chunk)
    np.testing.assert_allclose(attend(q, k, v), want, rtol=2e-6, atol=2e-6, err_msg=f"chunk={chunk}")
    grads = jax.grad(loss(attend), argnums=(0, 1, 2))(q, k, v)  # Finite, padding included, and the same.
    for g, w in zip(grads, want_grads):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"chunk={chunk}")


def test_linear_attention_is_causal_for_gpt_and_blind_to_padding_for_bert():
  cfg = M.preset("gpt-test")
  p, x = _noisy_params(cfg), _inputs(cfg)
  run = lambda tokens: RelaxedView(8, chunk=4).apply(cfg, R.factor_ffn(p, 8), tokens)
  base, t = run(x), 9
  changed = run(x.at[:, t].set((x[:, t] + 1) % cfg.vocab_size))
  np.testing.assert_array_equal(changed[:, :t], base[:, :t])  # No earlier position sees a later token.
  assert np.all(np.any(np.asarray(changed[:, t:] != base[:, t:]), axis=-1))  # Every later one does.
  bert = M.preset("bert-test")
  pb, xb = _noisy_params(bert), _inputs(bert)
  mask = jnp.arange(bert.max_len)[None] < 11
  mask = jnp.broadcast_to(mask, xb.shape)
  run = lambda tokens: RelaxedView(8).apply(bert, R.factor_ffn(pb, 8), tokens, mask_BxT=mask)
  base, other = run(xb), run(xb.at[:, 11:].set(5))
  np.testing.assert_array_equal(other[:, :11], base[:, :11])


@pytest.mark.parametrize("family", ["gpt", "bert", "deit"])
def test_relaxed_flops_match_xla_within_10_percent(family):
  """One layer (XLA's cost analysis counts a loop body once), GPT with 4 chunks of 16 positions."""
  if family == "deit":
    cfg = M.ModelConfig("deit", 1, 4, 32, image_size=32, patch_size=4, num_channels=3, num_classes=10)
    batch = {"image": jnp.zeros((8, 32, 32, 3)), "label": jnp.zeros((8,), jnp.int32)}
  else:
    cfg = M.ModelConfig(family, 1, 4, 32, vocab_size=512, max_len=64)
    batch = {"tokens": jnp.zeros((8, 64), jnp.int32)}
  view = RelaxedView(rank=32, chunk=16)
  vp = view.from_model(cfg, M.init_params(cfg, 0))
  tx = OptimConfig(LrSchedule(1e-3, 10)).build()
  step = jax.jit(train_step_fn(StepConfig(cfg, ObjectiveConfig(mask_id=1), view=view), tx))
  cost = step.lower(TrainState(vp, tx.init(vp)), batch, jnp.int32(0)).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  analytic = view.train_flops_per_step(cfg, 8)
  assert cost["flops"] == pytest.approx(analytic, rel=0.10), (cost["flops"], analytic)
  assert analytic < 0.8 * FULL.train_flops_per_step(cfg, 8)


def _plan(steps=100, model=None, **opts):
  model = model or M.preset("gpt-test").replace(num_layers=4)
  cycle = section_from(CycleConfig, {"method": "core", **({"core": opts} if opts else {})}, "cycle")
  return method_of("core").build_plan(model, cycle, TrainConfig(steps=steps))


def test_the_plan_trains_the_relaxed_model_then_the_full_one_after_a_short_rewarmup():
  plan = _plan(relaxed_frac=0.3)
  relaxed, full = plan.stages
  assert plan.levels == (M.preset("gpt-test").replace(num_layers=4),) and relaxed.level == full.level == 0
  assert relaxed.view == RelaxedView(rank=32 // 4, chunk=64) and full.view is FULL
  assert (relaxed.steps, full.steps) == (30, 70)
  assert relaxed.lr.warmup == round(0.05 * 30) and full.lr.warmup == round(0.02 * 70)
  assert full.lr.peak == TrainConfig().lr and full.lr.decay == TrainConfig().decay


@pytest.mark.parametrize("opts, match", [
    ({"rank": 33}, r"rank=33 is impossible for width 32 .* min\(width, ffn_dim\) = 32"),
    ({"rank": -1}, r"rank must be >= 1"),
    ({"relaxed_frac": 1.0}, r"relaxed_frac .* must be in \(0, 1\)"),
    ({"chunk": 0}, r"chunk must be >= 1"),
    ({"rewarmup_frac": 1.5}, r"rewarmup_frac must be in \[0, 1\]"),
])
def test_bad_core_configs_are_refused_with_what_to_change(opts, match):
  with pytest.raises(ConfigError, match=match):
    _plan(**opts)


def test_a_family_with_its_own_blocks_is_refused_not_crashed():
  """LLaMA's blocks are not the shared core's: the relaxed model cannot be built from them (it failed with a bare
  KeyError 'fc1' inside the first train step before this check)."""
  with pytest.raises(ConfigError, match=r"family 'llama' has its own, which it cannot relax"):
    _plan(model=M.preset("llama-test").replace(num_layers=4))
