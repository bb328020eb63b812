"""The fused attention against the explicit one, BERT's head at the masked positions only, the chunked loss."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from multilevel import models as M
from multilevel.models import parts
from multilevel.models.attention import attend
from multilevel.train import ObjectiveConfig
from multilevel.train.config import TrainConfig
from multilevel.train.losses import CPU_CHUNK_LOGITS, cross_entropy_sums, num_chunks, resolve_max_logits
from multilevel.train.objectives import mlm_mask
from multilevel.typed_config import ConfigError

apply_jit = jax.jit(M.apply, static_argnums=0, static_argnames=("features",))


def _lengths_mask(t, lengths):
  return jnp.arange(t)[None, :] < jnp.asarray(lengths)[:, None]


@functools.cache
def _params(cfg):
  p = jax.jit(M.init_params, static_argnums=0)(cfg, jax.random.key(0))
  rng = np.random.default_rng(1)  # Noise on every leaf: GPT's init is small and DeiT's head is zero.
  return jax.tree.map(lambda x: x + jnp.asarray(0.05 * rng.standard_normal(x.shape), x.dtype), p)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_matches_the_explicit_one_with_causal_and_padding_masks(causal):
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((3, 24, 4, 16)), jnp.float32) for _ in range(3))
  mask = _lengths_mask(24, [24, 13, 5])
  run = jax.jit(attend, static_argnames=("causal", "implementation"))
  fused = run(q, k, v, causal=causal, mask_BxS=mask, implementation="xla")
  ref = run(q, k, v, causal=causal, mask_BxS=mask, implementation="explicit")
  np.testing.assert_allclose(fused, ref, rtol=0, atol=1e-5)
  # Grouped-query attention: 2 key/value heads for the 4 query heads.
  fused = run(q, k[:, :, :2], v[:, :, :2], causal=causal, mask_BxS=mask, implementation="xla")
  ref = run(q, k[:, :, :2], v[:, :, :2], causal=causal, mask_BxS=mask, implementation="explicit")
  np.testing.assert_allclose(fused, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["bert", "gpt", "deit"])
def test_model_logits_are_the_same_with_either_attention(kind):
  cfg = M.preset(f"{kind}-test")
  p = _params(cfg)
  rng = np.random.default_rng(2)
  kw = {}
  if kind == "deit":
    x = jnp.asarray(rng.standard_normal((3, cfg.image_size, cfg.image_size, cfg.num_channels)), jnp.float32)
  else:
    x = jnp.asarray(rng.integers(0, cfg.vocab_size, (3, cfg.max_len)), jnp.int32)
  if kind == "bert":
    kw["mask_BxT"] = _lengths_mask(cfg.max_len, [cfg.max_len, 9, 3])
  fused = apply_jit(cfg.replace(attention="xla"), p, x, **kw)
  ref = apply_jit(cfg.replace(attention="explicit"), p, x, **kw)
  np.testing.assert_allclose(fused, ref, rtol=0, atol=1e-5)


def test_bert_head_at_the_masked_positions_is_the_full_head_gathered():
  cfg = M.preset("bert-test")
  p = _params(cfg)
  tokens = jnp.asarray(np.random.default_rng(3).integers(4, cfg.vocab_size, (4, cfg.max_len)), jnp.int32)
  obj = ObjectiveConfig(mask_id=1)
  inputs, pos_BxP, w_BxP = mlm_mask(tokens, jax.random.key(4), obj, cfg.vocab_size)
  assert pos_BxP.shape == (4, 2) and float(w_BxP.sum()) == 8.0  # round(0.15 * 16) = 2 per row.
  full = apply_jit(cfg, p, inputs)
  gathered = jnp.take_along_axis(full, pos_BxP[:, :, None], axis=1)
  np.testing.assert_allclose(apply_jit(cfg, p, inputs, positions_BxP=pos_BxP), gathered, rtol=0, atol=1e-5)
  # The head run as a part of the model takes the positions too.
  split = parts.apply_in_parts(cfg, parts.outer(p), [p["layers"]], inputs, positions_BxP=pos_BxP)
  np.testing.assert_allclose(split, gathered, rtol=0, atol=1e-5)
  # The loss on those positions is the full head's loss there.
  labels = jnp.take_along_axis(tokens, pos_BxP, axis=1)
  expect = optax.softmax_cross_entropy_with_integer_labels(gathered, labels).sum()
  h = apply_jit(cfg, p, inputs, positions_BxP=pos_BxP, features=True)
  got = cross_entropy_sums(h, p["word"]["embedding"], p["mlm_bias"], labels, w_BxP)["loss_sum"]
  np.testing.assert_allclose(got, expect, rtol=1e-6)


def _plain_loss(h, emb, bias_v, labels, weights):
  """The loss as autodiff of optax's cross-entropy sees it, and argmax's hits: what the engine's loss must equal."""
  logits = h @ emb.T + (0 if bias_v is None else bias_v[None, None, :])
  loss = jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, labels) * weights)
  return loss, jnp.sum((jnp.argmax(logits, -1) == labels) * weights)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("max_logits", [0, 2 * 4 * 50, -1])  # One chunk; 4 chunks of 4 (the last padded); auto.
def test_chunked_cross_entropy_equals_the_plain_one_in_value_and_gradient(bias, max_logits):
  rng = np.random.default_rng(5)
  b, t, d, v = 2, 13, 8, 50
  h = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
  emb = jnp.asarray(rng.standard_normal((v, d)), jnp.float32)
  bias_v = jnp.asarray(rng.standard_normal((v,)), jnp.float32) if bias else None
  top = jnp.argmax(h @ emb.T + (0 if bias_v is None else bias_v[None, None, :]), -1)  # About half the labels are hits.
  labels = jnp.where(jnp.asarray(rng.random((b, t)) < 0.5), top, jnp.asarray(rng.integers(0, v, (b, t)))).astype(
      jnp.int32)
  weights = jnp.asarray(rng.random((b, t)) < 0.7, jnp.float32)

  def loss(h, emb, bias_v):
    s = cross_entropy_sums(h, emb, bias_v, labels, weights, max_logits=max_logits)
    return s["loss_sum"], s

  (got, sums), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(h, emb, bias_v)
  (expect, correct), expect_grads = jax.value_and_grad(
      lambda *a: _plain_loss(*a, labels, weights), argnums=(0, 1, 2), has_aux=True)(h, emb, bias_v)
  np.testing.assert_allclose(got, expect, rtol=1e-6)
  assert float(sums["correct"]) == float(correct) > 0 and float(sums["count"]) == float(jnp.sum(weights))
  assert len(jax.tree.leaves(grads)) == len(jax.tree.leaves(expect_grads)) == (3 if bias else 2)
  for a, c in zip(jax.tree.leaves(expect_grads), jax.tree.leaves(grads)):
    np.testing.assert_allclose(c, a, rtol=1e-5, atol=1e-6)


def test_a_tie_with_the_label_counts_as_a_hit():
  """A hit is the label's logit reaching the row's maximum (no argmax): with equal logits every token is a hit."""
  h, emb = jnp.ones((1, 3, 4)), jnp.zeros((5, 4))
  s = cross_entropy_sums(h, emb, None, jnp.asarray([[0, 2, 4]]), jnp.ones((1, 3)))
  assert float(s["correct"]) == 3.0
  np.testing.assert_allclose(s["loss_sum"], 3 * np.log(5.0), rtol=1e-6)


def test_max_logits_auto_sizes_chunks_for_the_cpu_cache_and_only_bounds_memory_elsewhere():
  assert resolve_max_logits(-1, "cpu") == CPU_CHUNK_LOGITS == 1 << 20
  assert resolve_max_logits(-1, "gpu") == resolve_max_logits(-1, "tpu") == 1 << 25
  assert resolve_max_logits(0, "cpu") == 0 and resolve_max_logits(1000, "gpu") == 1000
  assert num_chunks(32 * 127, 1024, -1) == 4 and num_chunks(32 * 127, 1024, 0) == 1  # The GPT benchmark model.
  assert TrainConfig().max_logits == ObjectiveConfig().max_logits == -1  # Auto unless a config says otherwise.
  with pytest.raises(ValueError, match="max_logits must be -1"):
    resolve_max_logits(-2)
  with pytest.raises(ConfigError, match="train.max_logits must be -1"):
    TrainConfig(max_logits=-5)


def test_chunked_loss_does_the_plain_loss_matmuls_once():
  """XLA's cost analysis counts a loop body once: C chunks' body times C is the plain loss's forward + backward
  (6 N d V), so the chunked step computes no logits twice and the analytic FLOPs stay exact."""
  b, t, d, v, c = 4, 32, 32, 256, 4
  args = (jnp.zeros((b, t, d)), jnp.zeros((v, d)), jnp.zeros((v,)), jnp.zeros((b, t), jnp.int32), jnp.ones((b, t)))

  def flops(max_logits):
    f = lambda h, e, bias, y, w: cross_entropy_sums(h, e, bias, y, w, max_logits=max_logits)["loss_sum"]
    cost = jax.jit(jax.grad(f, argnums=(0, 1, 2))).lower(*args).compile().cost_analysis()
    return (cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"]

  plain, chunked = flops(0), flops(b * t * v // c)
  matmuls = 6 * b * t * d * v
  assert plain == pytest.approx(matmuls, rel=0.1)
  assert c * chunked == pytest.approx(plain, rel=0.1)
