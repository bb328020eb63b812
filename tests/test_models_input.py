"""Tests of multilevel.models on input it cannot take: ids out of range (refused eagerly, NaN under jit, never wrapped to
the last row), token types, shapes, config values, nested lists, and parameter trees of another config."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multilevel import models as M


def tokens(cfg, batch=2, length=None, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, length or cfg.max_len)), jnp.int32)


def test_inputs_the_model_cannot_take_are_refused_with_the_limit():
  cfg = M.preset("gpt-test")
  params = M.init_params(cfg, 0)
  with pytest.raises(ValueError, match=r"17 tokens is longer than the model's max_len=16"):
    M.apply(cfg, params, jnp.zeros((1, 17), jnp.int32))
  with pytest.raises(ValueError, match=r"in \[0, vocab_size=128\); these range over \[121, 128\]"):
    M.apply(cfg, params, jnp.arange(129)[None, -8:])
  with pytest.raises(ValueError, match="integer ids of shape"):
    M.apply(cfg, params, jnp.zeros((1, 4), jnp.float32))
  with pytest.raises(ValueError, match="longer than the model's max_len"):  # Shapes are checked under jit too.
    jax.jit(lambda p, t: M.apply(cfg, p, t))(params, jnp.zeros((2, 20), jnp.int32))
  bert = M.preset("bert-test")
  with pytest.raises(ValueError, match="vocab_size=128"):
    M.apply(bert, M.init_params(bert, 0), jnp.full((1, 4), -1, jnp.int32))
  deit = M.preset("deit-test")
  with pytest.raises(ValueError, match=r"\(batch, 8, 8, 1\) \(image_size=8, num_channels=1\), got \(2, 8, 8, 3\)"):
    M.apply(deit, M.init_params(deit, 0), jnp.zeros((2, 8, 8, 3)))


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_a_negative_token_id_reads_nan_under_jit_instead_of_wrapping_to_the_last_row(family):
  kw = dict(num_kv_heads=1) if family == "llama" else {}
  cfg = M.ModelConfig(family, 1, 2, 8, vocab_size=16, max_len=8, **kw)
  params = M.init_params(cfg, 0)
  f = jax.jit(functools.partial(M.apply, cfg))
  ok = jnp.array([[1, 2, 3, 15]])
  assert np.isfinite(np.asarray(f(params, ok))).all()
  bad = np.asarray(f(params, ok.at[0, 1].set(-1)))
  assert np.isnan(bad[0, 1:]).all()  # Position 1 and every later one attending to it (a masked NaN value is NaN too).
  wrapped = np.asarray(f(params, ok.at[0, 1].set(15)))  # What the lookup used to return for -1: the last row.
  assert np.isfinite(wrapped).all()
  with pytest.raises(ValueError, match=r"these range over \[-1, 15\]"):
    M.apply(cfg, params, ok.at[0, 1].set(-1))  # Outside jit: refused.


def test_bert_token_types_are_checked_like_tokens():
  cfg = M.ModelConfig("bert", 1, 2, 8, vocab_size=16, max_len=8, type_vocab_size=2)
  params = M.init_params(cfg, 0)
  toks = jnp.array([[1, 2, 3, 4]])
  with pytest.raises(ValueError, match=r"Token type ids must lie in \[0, type_vocab_size=2\); these range over \[0, 5\]"):
    M.apply(cfg, params, toks, jnp.array([[0, 1, 5, 0]]))
  with pytest.raises(ValueError, match=r"integers of the tokens' shape \(1, 4\)"):
    M.apply(cfg, params, toks, jnp.array([[0, 1]]))
  f = jax.jit(functools.partial(M.apply, cfg))
  good = np.asarray(f(params, toks, jnp.array([[0, 1, 1, 0]])))
  assert np.isfinite(good).all()
  bad = np.asarray(f(params, toks, jnp.array([[0, -1, 1, 0]])))
  assert np.isnan(bad).all()  # BERT attends both ways: every position sees the NaN.


@pytest.mark.parametrize("family, kw, match", [
    ("gpt", dict(num_heads="2"), r"num_heads must be an integer, got '2' \(str\)"),
    ("gpt", dict(num_layers=2.5), r"num_layers must be an integer, got 2.5"),
    ("gpt", dict(vocab_size=True), "vocab_size must be an integer, got True"),
    ("gpt", dict(ln_eps=-0.5), "ln_eps must be >= 0, or -1 for the family's default"),
    ("gpt", dict(ln_eps=float("nan")), "ln_eps must be a finite number"),
    ("bert", dict(type_vocab_size=0), "type_vocab_size must be a positive integer"),
    ("deit", dict(patch_size=0), "patch_size must be a positive integer"),
    ("deit", dict(num_classes=0), "num_classes must be a positive integer"),
])
def test_model_config_refuses_values_that_would_fail_deep_inside_the_model(family, kw, match):
  with pytest.raises(ValueError, match=match):
    M.ModelConfig(family, **kw)


@pytest.mark.parametrize("family", ["gpt", "bert"])
def test_nested_lists_of_ids_are_taken_as_arrays(family):
  cfg = M.ModelConfig(family, 1, 2, 8, vocab_size=16, max_len=8)
  params = M.init_params(cfg, np.int64(0))
  extra = ([[0, 1, 0]],) if family == "bert" else ()
  got = M.apply(cfg, params, [[1, 2, 3]], *extra)
  want = M.apply(cfg, params, jnp.array([[1, 2, 3]]), *(jnp.array(e) for e in extra))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_tree_with_parameters_the_config_does_not_have_is_refused_not_run_without_them():
  import dataclasses
  untied = M.preset("llama-test")
  p = M.init_params(untied, 0)
  x = tokens(untied)
  with pytest.raises(ValueError, match=r"only in params: \['lm_head/kernel'\]"):  # Flax ignored the head: 9.8 off.
    M.apply(dataclasses.replace(untied, tie_embeddings=True), p, x)
  with pytest.raises(ValueError, match=r"only in params: \['extra/kernel'\]"):
    M.apply(untied, {**p, "extra": p["lm_head"]}, x)
