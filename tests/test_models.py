"""Tests of multilevel.models: forward shapes, the axes tables the operators rely on, masking, presets."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multilevel import models as M
from multilevel.models import axes as A
from multilevel.tree import flatten, unflatten

TINY = {
    "bert": M.preset("bert-test"),
    "gpt": M.preset("gpt-test"),
    "deit": M.preset("deit-test"),
    "deit-distill": M.preset("deit-test", distill_token=True),
}

apply_jit = jax.jit(M.apply, static_argnums=0)


@functools.cache
def params_of(kind, noise=0.05):
  """Fresh init plus N(0, noise) on every leaf (GPT's init is small, DeiT's head is zero)."""
  cfg = TINY[kind]
  p = jax.jit(M.init_params, static_argnums=0)(cfg, jax.random.key(0))
  rng = np.random.default_rng(1)
  return jax.tree.map(lambda x: x + jnp.asarray(noise * rng.standard_normal(x.shape), x.dtype), p)


def tokens(cfg, batch=2, length=None, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, length or cfg.max_len)), jnp.int32)


# ------------------------------------------------------------------------------------------------------- forward

@pytest.mark.parametrize("kind", ["bert", "gpt"])
def test_text_forward_shapes(kind):
  cfg = TINY[kind]
  for length in (cfg.max_len, 5):  # Full and shorter sequences.
    logits = apply_jit(cfg, params_of(kind), tokens(cfg, batch=3, length=length))
    assert logits.shape == (3, length, cfg.vocab_size) and logits.dtype == jnp.float32
    assert np.all(np.isfinite(logits))


def test_bert_accepts_token_types_and_mask():
  cfg = TINY["bert"]
  x = tokens(cfg)
  out = M.apply(cfg, params_of("bert"), x, jnp.ones_like(x), jnp.ones_like(x))
  assert out.shape == (2, cfg.max_len, cfg.vocab_size)
  # Token type 1 has its own embedding row, so it changes the logits.
  assert not np.allclose(out, M.apply(cfg, params_of("bert"), x))


@pytest.mark.parametrize("kind", ["deit", "deit-distill"])
def test_deit_forward_shapes(kind):
  cfg = TINY[kind]
  images = jnp.asarray(np.random.default_rng(0).standard_normal((3, cfg.image_size, cfg.image_size,
                                                                  cfg.num_channels)), jnp.float32)
  logits = apply_jit(cfg, params_of(kind), images)
  assert logits.shape == (3, cfg.num_classes) and logits.dtype == jnp.float32
  assert np.all(np.isfinite(logits)) and np.max(np.abs(logits)) > 1e-3
  # At init the head (and distillation head) is zero, so the logits are exactly zero.
  fresh = jax.jit(M.init_params, static_argnums=0)(cfg, jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(apply_jit(cfg, fresh, images)), 0.0)
  assert cfg.seq_len == cfg.num_patches + 1 + int(cfg.distill_token)
  with pytest.raises(ValueError, match="DeiT expects images of shape"):
    M.apply(cfg, params_of(kind), images[:, :4])


# ---------------------------------------------------------------------------------------------------- attention

def test_gpt_is_causal():
  """Changing token t leaves the logits at positions < t bit for bit unchanged, and changes those at >= t."""
  cfg = TINY["gpt"]
  x = tokens(cfg, batch=1)
  t = 9
  y = x.at[0, t].set((x[0, t] + 1) % cfg.vocab_size)
  a, b = np.asarray(apply_jit(cfg, params_of("gpt"), x)), np.asarray(apply_jit(cfg, params_of("gpt"), y))
  np.testing.assert_array_equal(a[:, :t], b[:, :t])
  assert np.all(np.max(np.abs(a[:, t:] - b[:, t:]), axis=-1) > 1e-6)


def test_bert_attends_both_ways_and_respects_the_mask():
  cfg = TINY["bert"]
  x = tokens(cfg, batch=1)
  last = cfg.max_len - 1
  y = x.at[0, last].set((x[0, last] + 1) % cfg.vocab_size)
  a, b = np.asarray(apply_jit(cfg, params_of("bert"), x)), np.asarray(apply_jit(cfg, params_of("bert"), y))
  assert np.all(np.max(np.abs(a[:, :last] - b[:, :last]), axis=-1) > 1e-6)  # Every earlier position sees it.
  # With the last key masked out, no other position can see the change.
  mask = jnp.ones_like(x).at[0, last].set(0)
  am = np.asarray(M.apply(cfg, params_of("bert"), x, None, mask))
  bm = np.asarray(M.apply(cfg, params_of("bert"), y, None, mask))
  np.testing.assert_array_equal(am[:, :last], bm[:, :last])


# ---------------------------------------------------------------------------------------------------- axes tables

# Sizes that are all different, so an axis with the wrong role cannot match by accident.
ODD = dict(num_layers=3, num_heads=5, head_dim=7, ffn_ratio=2, vocab_size=11, max_len=13, type_vocab_size=2)
ODD_CFGS = {
    "bert": M.ModelConfig("bert", **ODD),
    "gpt": M.ModelConfig("gpt", **ODD),
    "deit": M.ModelConfig("deit", 3, 5, 7, 2, image_size=12, patch_size=4, num_channels=2, num_classes=6),
    "deit-distill": M.ModelConfig("deit", 3, 5, 7, 2, image_size=12, patch_size=4, num_channels=2, num_classes=6,
                                  distill_token=True),
}


def _role_size(cfg, role):
  if role == A.LAYERS:
    return cfg.num_layers
  space = role.split(":")[0]
  return {"hidden": cfg.width, "heads": cfg.num_heads, "ffn": cfg.ffn_dim}[space]


@pytest.mark.parametrize("kind", list(ODD_CFGS))
def test_every_parameter_has_axis_roles_of_the_right_rank_and_size(kind):
  cfg = ODD_CFGS[kind]
  table = M.FAMILY[cfg.family].axes
  params = flatten(M.abstract_params(cfg))
  for name, leaf in params.items():
    assert name in table, f"{name} is missing from the {cfg.family} axes table"
    roles = table[name]
    assert len(roles) == leaf.ndim, (name, roles, leaf.shape)
    for size, role in zip(leaf.shape, roles):
      assert role is None or role in A.ROLES, (name, role)
      if role is not None:
        assert size == _role_size(cfg, role), (name, role, leaf.shape)
    if name.startswith("layers/"):
      assert roles[0] == A.LAYERS, name
    else:
      assert A.LAYERS not in roles, name
  # Every table entry is a real parameter; the distillation token and head exist only with distill_token.
  unused = set(table) - set(params)
  assert unused == (set() if cfg.distill_token or cfg.family != "deit" else {"dist", "head_dist/kernel",
                                                                              "head_dist/bias"})


def test_width_axes_have_no_unlabelled_width_sized_axis():
  """An axis of size width/heads/ffn left as None would silently not be coalesced; with ODD sizes none exists."""
  for cfg in ODD_CFGS.values():
    table = M.FAMILY[cfg.family].axes
    sizes = {cfg.width, cfg.num_heads, cfg.ffn_dim}
    for name, leaf in flatten(M.abstract_params(cfg)).items():
      for size, role in zip(leaf.shape, table[name]):
        assert role is not None or size not in sizes, (name, leaf.shape, table[name])


# ---------------------------------------------------------------------------------------------------------- presets

# Parameter counts of the reference models (Hugging Face BertForMaskedLM without pooler and GPT2LMHeadModel, both
# with the tied output embedding counted once; timm deit_{small,base}_patch16_224).
REFERENCE_COUNTS = {
    "bert-base": 109_514_298,
    "bert-large": 335_174_458,
    "gpt2": 124_439_808,
    "deit-s": 22_050_664,
    "deit-b": 86_567_656,
}


@pytest.mark.parametrize("name", sorted(M.PRESETS))
def test_presets_construct(name):
  cfg = M.preset(name)
  assert cfg == M.PRESETS[name] and hash(cfg) == hash(M.PRESETS[name])
  params = M.abstract_params(cfg)  # Shapes only: big presets are never initialised here.
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
  assert params["layers"]["attn"]["query"]["kernel"].shape == (cfg.num_layers, cfg.width, cfg.num_heads,
                                                                cfg.head_dim)
  if name in REFERENCE_COUNTS:
    assert M.num_params(params) == REFERENCE_COUNTS[name]


def test_num_params_without_embeddings():
  params = M.abstract_params(M.preset("gpt2"))
  assert M.num_params(params, exclude_embeddings=True) == 124_439_808 - 50257 * 768 - 1024 * 768


def test_config_validation():
  assert M.preset("gpt2", vocab_size=8192).vocab_size == 8192
  assert M.ModelConfig.from_dict(M.preset("deit-s").to_dict()) == M.preset("deit-s")
  assert (M.preset("bert-test").eps, M.preset("gpt-test").eps, M.preset("deit-test").eps) == (1e-12, 1e-5, 1e-6)
  assert M.preset("gpt-test", ln_eps=1e-12).eps == 1e-12
  with pytest.raises(ValueError, match="Unknown model preset 'gpt3'"):
    M.preset("gpt3")
  with pytest.raises(ValueError, match="family must be one of"):
    M.ModelConfig("t5")
  with pytest.raises(ValueError, match="num_heads must be a positive integer"):
    M.ModelConfig("gpt", num_heads=0)
  with pytest.raises(ValueError, match="not a multiple of patch_size"):
    M.ModelConfig("deit", image_size=10, patch_size=4)
  with pytest.raises(ValueError, match="Unknown model config keys"):
    M.ModelConfig.from_dict({"family": "gpt", "heads": 2})
  with pytest.raises(ValueError, match="dtype"):
    M.ModelConfig("gpt", dtype="float64")


def test_params_round_trip_through_flat_paths():
  p = M.abstract_params(TINY["deit-distill"])
  assert jax.tree.structure(unflatten(flatten(p))) == jax.tree.structure(p)


# ------------------------------------------------------------------------------------------------- run in parts

@pytest.mark.parametrize("kind", ["bert", "gpt", "deit"])
def test_a_model_run_in_parts_computes_the_whole_model(kind):
  from multilevel.models import parts
  cfg = TINY[kind]
  p = params_of(kind)
  x = tokens(cfg) if kind != "deit" else jnp.asarray(
      np.random.default_rng(0).standard_normal((2, cfg.image_size, cfg.image_size, cfg.num_channels)), jnp.float32)
  whole = M.apply(cfg, p, x)
  cut = jax.tree.map(lambda a: (a[:1], a[1:]), p["layers"])
  slices = [jax.tree.map(lambda t: t[i], cut, is_leaf=lambda t: isinstance(t, tuple)) for i in range(2)]
  split = parts.apply_in_parts(cfg, parts.outer(p), slices, x)
  np.testing.assert_allclose(split, whole, rtol=0, atol=1e-6)


def test_frozen_parts_get_no_gradient():
  from multilevel.models import parts
  cfg, p = TINY["gpt"], params_of("gpt")
  x = tokens(cfg)
  cut = jax.tree.map(lambda a: (a[:1], a[1:]), p["layers"])
  slices = [jax.tree.map(lambda t: t[i], cut, is_leaf=lambda t: isinstance(t, tuple)) for i in range(2)]
  g = jax.grad(lambda s: parts.apply_in_parts(cfg, parts.outer(p), s, x, frozen=1).sum())(slices)
  assert all(np.all(leaf == 0) for leaf in jax.tree.leaves(g[0]))
  assert any(np.any(leaf != 0) for leaf in jax.tree.leaves(g[1]))


def test_dense_layers_on_rows_have_the_same_parameters_and_outputs():
  """``transformer.over_rows`` (the blocks' dense layers on a (rows, features) view, for XLA's CPU autodiff) builds
  the same parameters as the layer on the (batch, length, ...) input, and computes the same outputs and gradients."""
  import flax.linen as nn

  from multilevel.models.transformer import over_rows

  class Rows(nn.Module):
    make: object
    feature_axes: int

    @nn.compact
    def __call__(self, x):
      return over_rows(self.make(name="layer"), x, self.feature_axes)

  class Direct(nn.Module):
    make: object

    @nn.compact
    def __call__(self, x):
      return self.make(name="layer")(x)

  rng = np.random.default_rng(0)
  cases = [(lambda **kw: nn.Dense(5, **kw), 1, (2, 3, 8)),
           (lambda **kw: nn.DenseGeneral((2, 3), **kw), 1, (2, 3, 8)),
           (lambda **kw: nn.DenseGeneral(4, axis=(-2, -1), **kw), 2, (2, 3, 2, 6))]
  for make, feature_axes, shape in cases:
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    rows, direct = Rows(make, feature_axes), Direct(make)
    p = rows.init(jax.random.key(1), x)
    q = direct.init(jax.random.key(1), x)
    assert jax.tree.map(np.shape, p) == jax.tree.map(np.shape, q)
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(q)):
      np.testing.assert_array_equal(a, b)  # The same initial values too.
    y, y_direct = rows.apply(p, x), direct.apply(p, x)
    assert y.shape == y_direct.shape == shape[:len(shape) - feature_axes] + y.shape[len(shape) - feature_axes:]
    np.testing.assert_allclose(y, y_direct, rtol=1e-6, atol=1e-6)
    grad = lambda m: jax.grad(lambda p, x: jnp.sum(jnp.sin(m.apply(p, x))), argnums=(0, 1))(p, x)
    for a, b in zip(jax.tree.leaves(grad(rows)), jax.tree.leaves(grad(direct))):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_layer_loop_unrolled_or_not_is_the_same_model():
  """``scan_unroll``: 0 = auto (every layer unrolled on the CPU backend, a loop elsewhere), n = n layers per loop
  iteration. The parameters and the function do not depend on it."""
  from multilevel.models.transformer import scan_unroll
  cfg = M.preset("gpt-test", num_layers=4)
  assert (scan_unroll(cfg, "cpu"), scan_unroll(cfg, "gpu"), scan_unroll(cfg, "tpu")) == (4, 1, 1)
  assert scan_unroll(cfg.replace(scan_unroll=2), "cpu") == 2 and scan_unroll(cfg.replace(scan_unroll=9), "gpu") == 4
  x = tokens(cfg)
  looped, unrolled = cfg.replace(scan_unroll=1), cfg.replace(scan_unroll=4)
  p = M.init_params(looped, 3)
  q = M.init_params(unrolled, 3)
  for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(q)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(apply_jit(unrolled, p, x), apply_jit(looped, p, x), rtol=0, atol=1e-5)
  with pytest.raises(ValueError, match="scan_unroll must be >= 0"):
    cfg.replace(scan_unroll=-1)


def test_params_of_another_config_are_named_as_such_not_as_a_scan_length():
  import dataclasses
  cfg = TINY["gpt"]
  p, x = params_of("gpt"), tokens(cfg)
  for other in (dataclasses.replace(cfg, num_layers=cfg.num_layers + 1),
                dataclasses.replace(cfg, num_heads=cfg.num_heads * 2)):
    for run in (M.apply, apply_jit):
      with pytest.raises(ValueError, match=r"has shape .* in params but .* both must come from the same model config"):
        run(other, p, x)


def test_residual_init_scales_each_branch_output_projection_and_auto_keeps_each_familys_own():
  """``residual_init``: 'auto' is bit for bit the family's own init (GPT scaled by 1/sqrt(2L), LLaMA and BERT plain);
  'scaled' / 'plain' change only the residual branches' output projections (attention out, FFN down / fc2)."""
  outs = {"gpt": ("attn/out/kernel", "mlp/fc2/kernel"), "llama": ("attn/out/kernel", "mlp/down/kernel"),
          "bert": ("attn/out/kernel", "mlp/fc2/kernel")}
  for family, preset, own, other in [("gpt", "gpt-test", "scaled", "plain"), ("llama", "llama-test", "plain", "scaled"),
                                     ("bert", "bert-test", "plain", "scaled")]:
    cfg = M.preset(preset, num_layers=2)  # (Eager init costs about a second per layer here; two show the rule.)
    init = lambda rule: flatten(jax.device_get(M.init_params(cfg.replace(residual_init=rule), 0)))
    auto, same, changed = init("auto"), init(own), init(other)
    assert auto.keys() == same.keys() == changed.keys()
    for name in auto:
      np.testing.assert_array_equal(auto[name], same[name])
      is_out = name.endswith(outs[family])
      assert is_out == (not np.array_equal(auto[name], changed[name])), (family, name)
      if is_out:
        std = {"scaled": 0.02 / np.sqrt(2 * cfg.num_layers), "plain": 0.02}
        assert abs(np.std(changed[name]) / std[other] - 1) < 0.15, (family, name, np.std(changed[name]))
  with pytest.raises(ValueError, match=r"residual_init must be one of \('auto', 'scaled', 'plain'\)"):
    M.ModelConfig("gpt", residual_init="gpt2")
