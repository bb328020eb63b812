"""Depth growth that keeps the function: ``depth_growth='zero'`` (with ``preln_exact`` for GPT's width)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multilevel import models as M
from multilevel import operators as O


def _noisy(params, std=0.1, seed=3):
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + std * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def _inputs(cfg):
  if cfg.family == "deit":
    return (jax.random.normal(jax.random.key(0), (2, cfg.image_size, cfg.image_size, cfg.num_channels)),)
  return (jax.random.randint(jax.random.key(0), (2, cfg.max_len), 0, cfg.vocab_size),)


@pytest.mark.parametrize("family", ["gpt", "deit"])
@pytest.mark.parametrize("mode", ["adjacent", "stride"])
def test_zero_depth_growth_keeps_pre_ln_logits(family, mode):
  cfg = M.preset(f"{family}-test", num_layers=4, num_heads=4, ln_eps=1e-12)
  m = O.make_mapping(cfg, preln_exact=family == "gpt", depth_growth="zero", depth_mode=mode)
  small = _noisy(M.init_params(m.small, 1))
  x = _inputs(cfg)
  err = float(jnp.max(jnp.abs(M.apply(m.small, small, *x) - M.apply(cfg, O.decoalesce(small, m), *x))))
  assert err <= 1e-5  # Measured about 1e-6 (GPT) and 5e-7 (DeiT); plain copies give 0.2-1.
  copy = O.make_mapping(cfg, preln_exact=family == "gpt", depth_mode=mode)
  err_copy = float(jnp.max(jnp.abs(M.apply(m.small, small, *x) - M.apply(cfg, O.decoalesce(small, copy), *x))))
  assert err_copy > 1e-2


@pytest.mark.parametrize("growth", ["scaled", "zero"])
@pytest.mark.parametrize("family", ["gpt", "bert", "deit"])
def test_depth_growth_options_round_trip_bit_for_bit(family, growth):
  cfg = M.preset(f"{family}-test", num_layers=4, num_heads=4)
  for depth_factor in (2, 4):
    m = O.make_mapping(cfg, depth_factor=depth_factor, depth_growth=growth)
    small = _noisy(M.init_params(m.small, 2))
    back = O.coalesce(O.decoalesce(small, m), m)
    jax.tree.map(np.testing.assert_array_equal, back, small)


def test_zero_growth_zeroes_only_the_extra_copies_of_residual_outputs():
  cfg = M.preset("gpt-test", num_layers=4)
  m = O.make_mapping(cfg, width_factor=1, depth_growth="zero")
  grown = O.decoalesce(_noisy(M.init_params(m.small, 0)), m)
  out = np.asarray(grown["layers"]["attn"]["out"]["kernel"])
  fc2 = np.asarray(grown["layers"]["mlp"]["fc2"]["bias"])
  assert np.all(out[[1, 3]] == 0) and np.all(fc2[[1, 3]] == 0)
  assert np.all(out[[0, 2]] != 0)
  q = np.asarray(grown["layers"]["attn"]["query"]["kernel"])
  np.testing.assert_array_equal(q[0], q[1])  # Every other parameter is copied as usual.


def test_bad_depth_growth_is_refused():
  with pytest.raises(ValueError, match="depth_growth must be one of"):
    O.make_mapping(M.preset("gpt-test"), depth_growth="identity")
