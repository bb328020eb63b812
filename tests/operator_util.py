"""Shared pieces of the multilevel.operators tests (test_operators*.py): the test configs and mappings, the
(compiled) operators, parameter draws and tree assertions.

Compilation dominates the run time on CPU, so the tests share a few tiny configs (see the note above ``coalesce``
below on eager versus compiled calls) and draw parameter trees with numpy instead of Flax ``init``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from multilevel import models as M
from multilevel import operators as O
from multilevel.models import axes as A
from multilevel.tree import flatten, unflatten

# Four "large" test models: four heads of 16, four layers. Every mapping below starts from one of these.
BASE = {
    "bert": M.preset("bert-test", num_layers=4, num_heads=4),
    "gpt": M.preset("gpt-test", num_layers=4, num_heads=4),
    "deit": M.preset("deit-test", num_layers=4, num_heads=4),
    "deit-distill": M.preset("deit-test", num_layers=4, num_heads=4, distill_token=True),
}
KINDS = tuple(BASE)

# One level of coalescing along width only, depth only, or both, in both depth modes.
HOW = {
    "width": dict(depth_factor=1),
    "depth-adjacent": dict(width_factor=1, depth_mode="adjacent"),
    "depth-stride": dict(width_factor=1, depth_mode="stride"),
    "both-adjacent": dict(depth_mode="adjacent"),
    "both-stride": dict(depth_mode="stride"),
}

# Compilation dominates: eager JAX compiles each primitive once per shape (whatever the scheme), so eager calls on
# the shapes of BASE and its standard mappings are nearly free after the first few; a jitted operator compiles once
# per static LevelMap (2-4 s here), which is far cheaper than eager mode on new shapes (10-25 s). So the tests on
# BASE's standard shapes run the operators eagerly (the plain API), and the bit-exact tests on other shapes (groups
# of 4, the chain's last level, depth groups of 3, the property tests) use versions compiled at XLA backend
# optimisation level 0, which halves the compile time. There every operation of a round trip is exact whatever the
# compiler does (averages of equal values, x_first + 0 / n; products and quotients by power-of-two group sizes), so
# no rewrite can change a bit; test_jit_matches_eager checks the default compilation against eager mode. Summing
# groups of 3 is not exact, and its rounding depends on the compilation (XLA turns x / 3 into x * (1/3)), so
# test_groups_of_three uses the default jit.
# The finite check reads concrete values only, so jitted callers switch it off explicitly (it would be skipped).
coalesce, decoalesce = O.coalesce, O.decoalesce
_coalesce, _decoalesce = (functools.partial(op, check_finite=False) for op in (O.coalesce, O.decoalesce))
coalesce_jit = jax.jit(_coalesce, static_argnums=1)
decoalesce_jit = jax.jit(_decoalesce, static_argnums=1)
_O0 = {"xla_backend_optimization_level": 0}
coalesce_c = jax.jit(_coalesce, static_argnums=1, compiler_options=_O0)
decoalesce_c = jax.jit(_decoalesce, static_argnums=1, compiler_options=_O0)


@functools.partial(jax.jit, static_argnums=1, compiler_options=_O0)
def round_trip_c(small, m):
  """(D(small), C(D(small))) as one compiled program (one compilation instead of two)."""
  grown = _decoalesce(small, m)
  return grown, _coalesce(grown, m)


apply_jit = jax.jit(M.apply, static_argnums=0)


# ----------------------------------------------------------------------------------------------------------- helpers

def random_params(cfg, seed=0, std=1.0):
  """A tree with the structure of ``cfg``: every leaf N(0, std), LayerNorm scales 1 + N(0, std) (numpy draws).

  With std 0.05-0.1 this stands in for "a fresh init plus noise" (DeiT's head is zero-initialised and GPT's init is
  small, so plain init gives near-constant logits) without paying for Flax init's compilation.
  """
  rng = np.random.default_rng(seed)
  flat = {}
  for name, a in sorted(flatten(M.abstract_params(cfg)).items()):
    x = std * rng.standard_normal(a.shape)
    if name.endswith("/scale"):
      x = x + 1.0
    flat[name] = jnp.asarray(x, a.dtype)
  return unflatten(flat)


def model_inputs(cfg, seed=0, batch=2):
  rng = np.random.default_rng(seed)
  if cfg.family == "deit":
    return jnp.asarray(rng.standard_normal((batch, cfg.image_size, cfg.image_size, cfg.num_channels)), jnp.float32)
  return jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, cfg.max_len)), jnp.int32)


def logits_of(cfg, params, seed=0):
  return np.asarray(apply_jit(cfg, params, model_inputs(cfg, seed)))


def assert_tree_equal(got, want):
  """Same tree structure, shapes and dtypes, and every leaf equal bit for bit."""
  assert jax.tree.structure(got) == jax.tree.structure(want)
  fg, fw = flatten(got), flatten(want)
  assert sorted(fg) == sorted(fw)
  for name in fw:
    assert fg[name].shape == fw[name].shape and fg[name].dtype == fw[name].dtype, name
    np.testing.assert_array_equal(np.asarray(fg[name]), np.asarray(fw[name]), err_msg=name)


def assert_like_config(tree, cfg):
  """``tree`` has exactly the structure, shapes and dtypes of a freshly initialised ``cfg`` model."""
  want = M.abstract_params(cfg)
  assert jax.tree.structure(tree) == jax.tree.structure(want)
  flat = flatten(tree)
  for name, a in flatten(want).items():
    assert (flat[name].shape, flat[name].dtype) == (a.shape, a.dtype), name


def summed_leaves(m):
  """{name: number of summed axes} for the leaves that coalescing sums (multiplies by the group size) under ``m``.

  Input sides are summed; embeddings too when tied to an LM head (BERT, GPT); residual outputs too with preln_exact
  on a tied model (method.md 3.2, 5.2). Everything else is averaged.
  """
  tied = m.large.family in ("bert", "gpt")
  summed = {A.HIDDEN_IN, A.HEADS_IN, A.FFN_IN}
  if tied:
    summed.add(A.EMBED)
    if m.preln_exact:
      summed.add(A.RESIDUAL)
  names = flatten(M.abstract_params(m.large))
  table = M.FAMILY[m.large.family].axes
  counts = {n: sum(r in summed for r in table[n]) for n in names}
  return {n: k for n, k in counts.items() if k}


@functools.cache
def roundtrip(kind, how):
  """(mapping, small, D(small), C(D(small))) for one of the standard mappings."""
  m = O.make_mapping(BASE[kind], **HOW[how])
  small = random_params(m.small, seed=1)
  grown = decoalesce(small, m)
  return m, small, grown, coalesce(grown, m)
