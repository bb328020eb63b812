"""Tests of multilevel.operators: coalesce and de-coalesce round trips, jit versus eager, the matrix formulas
of method.md sections 3 and 5, and property tests (method.md sections 2-6 and 11.7). Function preservation:
test_operators_function.py; interpolation and bad input: test_operators_errors.py.

The shared configs, compiled operators and helpers are in ``tests/operator_util.py``.
"""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilevel import models as M
from multilevel import operators as O
from multilevel.models import axes as A
from multilevel.tree import flatten, unflatten
from tests.operator_util import (BASE, HOW, KINDS, assert_like_config, assert_tree_equal, coalesce, coalesce_c,
                                 coalesce_jit, decoalesce, decoalesce_c, decoalesce_jit, random_params, round_trip_c,
                                 roundtrip, summed_leaves)


# ------------------------------------------------------------------------------------------------- exact round trip

@pytest.mark.parametrize("how", list(HOW))
@pytest.mark.parametrize("kind", KINDS)
def test_coalesce_after_decoalesce_is_bit_exact(kind, how):
  m, small, grown, back = roundtrip(kind, how)
  assert (m.small.num_heads, m.small.num_layers) == {"width": (2, 4), "depth": (4, 2), "both": (2, 2)}[
      how.split("-")[0]]
  assert_tree_equal(back, small)


@pytest.mark.parametrize("how", list(HOW))
@pytest.mark.parametrize("kind", KINDS)
def test_outputs_have_the_shapes_of_a_fresh_model(kind, how):
  m, small, grown, back = roundtrip(kind, how)
  assert_like_config(grown, m.large)
  assert_like_config(back, m.small)
  # Coalescing a tree that is not a de-coalesced one (the normal use) gives the same shapes.
  assert_like_config(coalesce(random_params(m.large, seed=5), m), m.small)


@pytest.mark.parametrize("mode, copy_of", [("adjacent", [0, 0, 1, 1]), ("stride", [0, 1, 0, 1])])
def test_depth_growth_copies_layers_in_the_chosen_order(mode, copy_of):
  m, small, grown, _ = roundtrip("gpt", f"depth-{mode}")
  for name, leaf in flatten(grown["layers"]).items():
    np.testing.assert_array_equal(np.asarray(leaf), np.asarray(flatten(small["layers"])[name])[copy_of], name)


@pytest.mark.parametrize("mode", O.DEPTH_MODES)
@pytest.mark.parametrize("kind", ["bert", "deit-distill"])  # GPT and DeiT chains: test_property_* covers them.
def test_three_level_chain_round_trip(kind, mode):
  m1, m2 = O.make_chain(BASE[kind], levels=3, depth_mode=mode)
  assert (m1.small, m2.large) == (m2.large, m1.small)
  assert (m2.small.num_heads, m2.small.num_layers) == (1, 1)
  p = random_params(m2.small, seed=3)
  grown = decoalesce(decoalesce_c(p, m2), m1)  # m1 has the shapes of the "both" mappings above: eager is warm.
  assert_like_config(grown, BASE[kind])
  assert_tree_equal(coalesce_c(coalesce(grown, m1), m2), p)


@pytest.mark.parametrize("kind, preln_exact", [("gpt", True), ("deit-distill", False)])
def test_groups_of_four_are_bit_exact(kind, preln_exact):
  m = O.make_mapping(BASE[kind], width_factor=4, depth_factor=4, preln_exact=preln_exact)
  assert (m.heads, m.layers) == (((0, 1, 2, 3),), ((0, 1, 2, 3),))
  p = random_params(m.small, seed=4)
  grown, back = round_trip_c(p, m)
  assert_like_config(grown, m.large)
  assert_tree_equal(back, p)


@pytest.mark.parametrize("family, preln_exact", [("bert", False), ("gpt", True)])
def test_groups_of_three(family, preln_exact):
  """6 heads -> 2 and 6 layers -> 2 (groups of 3), with the default jit.

  Averaged axes (and the layer axis) are bit-exact for any group size: the mean is computed as
  ``x_first + sum(x_p - x_first) / n`` and the differences of a de-coalesced tree are exactly 0. Summed axes grow as
  ``y / 3`` and coalesce back as ``(y / 3) * 3``, which float32 rounds back to ``y`` only within one rounding (the
  coalescing.py docstring): measured at most 1 ulp, relative error 2**-23 = 1.19e-7, so rtol = 2.4e-7 (two ulps at the
  bottom of a binade) and atol = 0. GPT's residual output kernels with preln_exact have two summed axes (input
  summed, output scaled like the embedding): four roundings, measured up to 3 ulps and a relative error of
  2.38e-7 under jit, which rounds x / 3 as x * (1/3); they get twice the tolerance.
  """
  cfg = M.preset(f"{family}-test", num_layers=6, num_heads=6)
  m = O.make_mapping(cfg, width_factor=3, depth_factor=3, preln_exact=preln_exact)
  assert m.heads == ((0, 2, 4), (1, 3, 5)) and m.layers == ((0, 1, 2), (3, 4, 5))
  p = random_params(m.small, seed=6)
  grown = decoalesce_jit(p, m)
  assert_like_config(grown, m.large)
  back = flatten(coalesce_jit(grown, m))
  summed = summed_leaves(m)
  assert summed and len(summed) < len(back)
  assert max(summed.values()) == (2 if preln_exact else 1)
  worst_ulps = {1: 0.0, 2: 0.0}  # By the number of summed axes of a leaf.
  for name, want in flatten(p).items():
    got, want = np.asarray(back[name]), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, name
    if name in summed:
      np.testing.assert_allclose(got, want, rtol=2.4e-7 * summed[name], atol=0, err_msg=name)
      ulps = float(np.max(np.abs(got - want) / np.spacing(np.abs(want))))
      worst_ulps[summed[name]] = max(worst_ulps[summed[name]], ulps)
    else:
      np.testing.assert_array_equal(got, want, err_msg=name)
  assert worst_ulps[1] <= 1 and worst_ulps[2] <= 4, worst_ulps


@pytest.mark.parametrize("growth", ["copy", "zero", "scaled"])
def test_depth_groups_of_three(growth):
  """Layers merged in threes. 'copy' (averaged) and 'zero' (summed with exact zeros) are bit-exact; 'scaled' grows
  the residual-branch outputs as y / 3 and coalesces them as 3 * mean, within one rounding like a summed width axis
  (measured: 1 ulp), so those four leaves get rtol = 2.4e-7 and the rest must be bit-exact."""
  m = O.make_mapping(M.preset("gpt-test", num_layers=6, num_heads=4), width_factor=1, depth_factor=3,
                     depth_mode="stride", depth_growth=growth)
  assert m.layers == ((0, 2, 4), (1, 3, 5))
  p = random_params(m.small, seed=7)
  back = round_trip_c(p, m)[1]
  if growth != "scaled":
    assert_tree_equal(back, p)
    return
  residual = {"layers/attn/out/kernel", "layers/attn/out/bias", "layers/mlp/fc2/kernel", "layers/mlp/fc2/bias"}
  got = flatten(back)
  for name, want in flatten(p).items():
    if name in residual:
      np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want), rtol=2.4e-7, atol=0, err_msg=name)
    else:
      np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want), err_msg=name)


def test_jit_matches_eager():
  """``jax.jit(O.coalesce, static_argnums=1)`` (the LevelMap is hashable) computes exactly what eager mode does."""
  m = O.make_mapping(BASE["gpt"], depth_mode="stride", preln_exact=True)
  large = random_params(m.large, seed=8)
  small = coalesce_jit(large, m)
  assert_tree_equal(small, O.coalesce(large, m))
  assert_tree_equal(decoalesce_jit(small, m), O.decoalesce(small, m))


def test_jit_and_eager_round_differently_for_groups_of_three():
  """Not bit-identical with groups of 3: under jit XLA rewrites the division by the constant group size as a
  multiplication by its reciprocal, eager mode divides. On a general (not de-coalesced) tree the mean is
  ``x_first + sum(x_p - x_first) / 3``, so a rounding difference is relative to the inputs, not to the (possibly much
  smaller) result. Measured on the full tree: every leaf differs somewhere, by at most 3.3 ulps of the leaf's largest
  value (up to three summed roundings of sums of three terms, then the x3 scales); the bound asserted is 8. Eager
  mode is slow to compile on new shapes, so this runs on a few representative leaves (``check=False``)."""
  cfg = M.preset("gpt-test", num_layers=6, num_heads=6)
  m = O.make_mapping(cfg, width_factor=3, depth_factor=3, preln_exact=True)
  full = flatten(random_params(m.large, seed=20))
  names = ["word/embedding", "layers/attn/out/kernel", "layers/ln_mlp/scale"]
  large = unflatten({n: full[n] for n in names})
  got = flatten(jax.jit(functools.partial(O.coalesce, check=False), static_argnums=1)(large, m))
  want = flatten(O.coalesce(large, m, check=False))
  assert sorted(got) == sorted(want) == sorted(names)
  for name in want:
    g, w = np.asarray(got[name]), np.asarray(want[name])
    np.testing.assert_allclose(g, w, rtol=0, atol=8 * np.spacing(np.max(np.abs(w))), err_msg=name)


# ------------------------------------------------------------------------------------- the math of method.md 3 and 5

def _avg(g, n_small):
  """The averaging matrix P (n_small x n_large) of a group map g (method.md section 2)."""
  q = (np.asarray(g)[:, None] == np.arange(n_small)[None, :]).astype(np.float64)
  return (q / q.sum(0)).T


def _dup(g, n_small):
  """The duplication matrix Q (n_large x n_small)."""
  return (np.asarray(g)[:, None] == np.arange(n_small)[None, :]).astype(np.float64)


@pytest.mark.parametrize("kind", ["gpt", "deit"])
def test_coalesce_and_decoalesce_match_the_matrix_formulas(kind):
  """Index maps against method.md's dense matrices, in float64, for a non-default (unsorted) scheme.

  Dense kernels: K_S = Q_in^T K_L P_out^T and K_L = P_in^T K_S Q_out^T; LayerNorm: P gamma / Q gamma; tied
  embeddings (GPT): E_S = 2 E_L P_h^T and E_L = E_S Q_h^T / 2; DeiT: positions and patch conv averaged, head input
  summed; layers: R (averaging) down and copies up.
  """
  cfg = BASE[kind]
  heads, layers = ((3, 0), (2, 1)), ((0, 3), (1, 2))
  m = O.make_mapping(cfg, width=heads, depth=layers)
  hd, d, f = cfg.head_dim, cfg.width, cfg.ffn_dim
  g_head = np.empty(4, int)
  for i, grp in enumerate(heads):
    g_head[list(grp)] = i
  g_h = (g_head[:, None] * hd + np.arange(hd)).reshape(-1)
  g_f = (g_head[:, None] * (f // 4) + np.arange(f // 4)).reshape(-1)
  g_l = np.array([0, 1, 1, 0])
  P_h, Q_h, P_f, Q_f = _avg(g_h, d // 2), _dup(g_h, d // 2), _avg(g_f, f // 2), _dup(g_f, f // 2)
  R, G = _avg(g_l, 2), _dup(g_l, 2)

  large32, small32 = random_params(cfg, seed=9), random_params(m.small, seed=10)
  got = {k: np.asarray(v) for k, v in flatten(coalesce(large32, m)).items()}
  grown = {k: np.asarray(v) for k, v in flatten(decoalesce(small32, m)).items()}
  large = {k: np.asarray(v, np.float64) for k, v in flatten(large32).items()}
  small = {k: np.asarray(v, np.float64) for k, v in flatten(small32).items()}
  close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)

  def layers_down(x):  # Per-layer result, then layers averaged by R.
    return np.einsum("ij,j...->i...", R, x)

  qk = lambda k: k.reshape(4, d, d)  # (L, in, heads*head_dim)
  want = layers_down(np.einsum("pi,lpq,oq->lio", Q_h, qk(large["layers/attn/query/kernel"]), P_h))
  close(got["layers/attn/query/kernel"].reshape(2, d // 2, d // 2), want)
  want = layers_down(np.einsum("pi,lpq,oq->lio", Q_h, large["layers/attn/out/kernel"].reshape(4, d, d), P_h))
  close(got["layers/attn/out/kernel"].reshape(2, d // 2, d // 2), want)
  close(got["layers/mlp/fc1/kernel"], layers_down(np.einsum("pi,lpq,oq->lio", Q_h, large["layers/mlp/fc1/kernel"],
                                                             P_f)))
  close(got["layers/mlp/fc2/kernel"], layers_down(np.einsum("pi,lpq,oq->lio", Q_f, large["layers/mlp/fc2/kernel"],
                                                             P_h)))
  close(got["layers/mlp/fc1/bias"], layers_down(large["layers/mlp/fc1/bias"] @ P_f.T))
  close(got["layers/ln_attn/scale"], layers_down(large["layers/ln_attn/scale"] @ P_h.T))
  close(got["ln_final/bias"], large["ln_final/bias"] @ P_h.T)
  # Growth: K_L = P_in^T K_S Q_out^T, layer j a copy of small layer g_l(j).
  want = np.einsum("ip,lio,qo->lpq", P_h, small["layers/mlp/fc1/kernel"], Q_f)
  close(grown["layers/mlp/fc1/kernel"], want[g_l])
  want = np.einsum("ip,lio,qo->lpq", P_h, small["layers/attn/value/kernel"].reshape(2, d // 2, d // 2), Q_h)
  close(grown["layers/attn/value/kernel"].reshape(4, d, d), want[g_l])
  close(grown["layers/ln_mlp/bias"], (small["layers/ln_mlp/bias"] @ Q_h.T)[g_l])
  np.testing.assert_array_equal(np.einsum("ij,jk->ik", R, G), np.eye(2))  # R G = I (method.md 11.7c).
  np.testing.assert_array_equal(P_h @ Q_h, np.eye(d // 2))  # P Q = I.

  if kind == "gpt":  # Tied embeddings: coalesced columns summed (factor 2 for pairs), grown ones halved.
    close(got["word/embedding"], 2 * large["word/embedding"] @ P_h.T)
    close(got["position"], 2 * large["position"] @ P_h.T)
    close(grown["word/embedding"], small["word/embedding"] @ Q_h.T / 2)
  else:  # DeiT: no factor; the classifier's input is summed and grows halved.
    close(got["pos"], large["pos"] @ P_h.T)
    close(got["cls"], large["cls"] @ P_h.T)
    close(got["patch/kernel"], large["patch/kernel"] @ P_h.T)
    close(got["patch/bias"], large["patch/bias"] @ P_h.T)
    close(got["head/kernel"], Q_h.T @ large["head/kernel"])
    close(got["head/bias"], large["head/bias"])
    close(grown["head/kernel"], P_h.T @ small["head/kernel"])
    close(grown["pos"], small["pos"] @ Q_h.T)

@pytest.mark.parametrize("groups", [((3, 0), (2, 1)), ((0,), (1, 2, 3))])  # Equal (gathered) and unequal groups.
def test_group_map_primitives_match_the_matrices(groups):
  """The public vocabulary along one axis: sum_groups is Q^T, mean_groups is P, duplicate is Q (exact on copies)."""
  gm = O.GroupMap.from_groups(groups, 4)
  P, Q = _avg(gm.g, gm.n_small), _dup(gm.g, gm.n_small)
  x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
  y = x[:, :2]
  close = functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-6)
  close(gm.sum_groups(x, 1), np.einsum("pi,apb->aib", Q, x))
  close(gm.mean_groups(x, 1), np.einsum("ip,apb->aib", P, x))
  close(gm.sum_groups(x.transpose(0, 2, 1), 2), np.einsum("pi,apb->abi", Q, x))  # Any axis.
  np.testing.assert_array_equal(gm.duplicate(y, 1), np.einsum("pi,aib->apb", Q, y))
  np.testing.assert_array_equal(gm.mean_groups(gm.duplicate(y, 1), 1), y)
  assert (gm.n_small, gm.n_large, gm.is_identity) == (2, 4, False)
  assert gm.first_mask.tolist() == ([False, False, True, True] if len(groups[0]) == 2 else [True, True, False, False])
  assert gm.members is None if len(groups[0]) == 1 else gm.members.tolist() == [[0, 3], [1, 2]]
  assert gm.broadcast(gm.counts, 3, 1).shape == (1, 2, 1) and gm.broadcast(gm.g, 2, 0).shape == (4, 1)
  with pytest.raises(ValueError, match=r"one entry per small \(2\) or large \(4\) unit, got shape \(3,\)"):
    gm.broadcast(np.ones(3), 3, 1)
  assert O.GroupMap.from_groups(((0,), (1,)), 2).is_identity


def test_level_map_rules_and_roles():
  """``LevelMap.roles`` reads the family table; ``LevelMap.rule`` gives each role its group map and factor."""
  m = O.make_mapping(BASE["gpt"], preln_exact=True)
  assert m.roles("layers/mlp/fc2/kernel", 3) == (A.LAYERS, A.FFN_IN, A.RESIDUAL)
  h = m.hidden_map
  for role, gm, scale in [(A.LAYERS, m.layer_map, None), (A.HIDDEN_OUT, h, None), (A.EMBED, h, h.counts),
                          (A.HEADS_IN, m.head_map, m.head_map.counts), (A.FFN_IN, m.ffn_map, m.ffn_map.counts),
                          (A.RESIDUAL, h, h.counts)]:  # preln_exact: residual outputs follow the embedding.
    got_gm, got_scale = m.rule(role)
    assert got_gm is gm, role
    assert (got_scale is None) if scale is None else np.array_equal(got_scale, scale), role
  deit = O.make_mapping(BASE["deit"], embed_factor=3.0)
  assert deit.rule(A.EMBED)[1] is None  # Not tied to a head: averaged whatever the factor.
  np.testing.assert_array_equal(O.make_mapping(BASE["gpt"], embed_factor=3.0).rule(A.EMBED)[1], np.full(32, 3.0))
  assert O.make_mapping(BASE["gpt"]).rule(A.RESIDUAL)[1] is None
  with pytest.raises(ValueError, match="Unknown axis role 'hidden:sideways'"):
    m.rule("hidden:sideways")
  with pytest.raises(ValueError, match="'mlp/fc9' has no axis roles in the gpt table"):
    m.roles("mlp/fc9", 2)
  with pytest.raises(ValueError, match="has 2 axes but the gpt table declares 3"):
    m.roles("layers/mlp/fc2/kernel", 2)


# -------------------------------------------------------------------------------------------------- property tests

@st.composite
def level_maps(draw):
  kind = draw(st.sampled_from(KINDS))
  num_heads = draw(st.sampled_from([2, 4, 6, 8]))
  num_layers = draw(st.sampled_from([1, 2, 3, 4]))
  cfg = BASE[kind].replace(num_heads=num_heads, num_layers=num_layers)
  # Width: a random permutation of the heads cut into equal groups of a power-of-two size.
  size = draw(st.sampled_from([s for s in (1, 2, 4, 8) if num_heads % s == 0]))
  perm = draw(st.permutations(range(num_heads)))
  width = [list(perm[i:i + size]) for i in range(0, num_heads, size)]
  preln_exact = kind != "bert" and draw(st.booleans())
  # Depth: either a default grouping in a drawn mode, or a random partition (any sizes) of the layers.
  if draw(st.booleans()):
    factor = draw(st.sampled_from([f for f in range(1, num_layers + 1) if num_layers % f == 0]))
    depth = O.default_depth_groups(num_layers, factor, draw(st.sampled_from(O.DEPTH_MODES)))
  else:
    perm = draw(st.permutations(range(num_layers)))
    cuts = sorted(draw(st.sets(st.integers(1, num_layers - 1), max_size=num_layers - 1))) if num_layers > 1 else []
    bounds = [0] + cuts + [num_layers]
    # Any members, listed in layer order of their first member (growth keeps the small layers' order).
    depth = sorted((list(perm[a:b]) for a, b in zip(bounds, bounds[1:])), key=lambda g: g[0])
  # 'scaled' depth growth divides by the layer group size: bit-exact only for powers of two (see
  # test_depth_groups_of_three); 'copy' and 'zero' are exact for any partition.
  growths = ["copy", "zero"] + (["scaled"] if all(len(g) in (1, 2, 4) for g in depth) else [])
  return O.make_mapping(cfg, width=width, depth=depth, preln_exact=preln_exact,
                        depth_growth=draw(st.sampled_from(growths)))


@settings(max_examples=15, deadline=None)
@given(m=level_maps(), seed=st.integers(0, 2**16))
def test_property_round_trip_is_bit_exact(m, seed):
  assert m.small.num_heads == len(m.heads) and m.small.num_layers == len(m.layers)
  assert len({len(g) for g in m.heads}) == 1
  small = random_params(m.small, seed=seed)
  grown, back = round_trip_c(small, m)
  assert_like_config(grown, m.large)
  assert_tree_equal(back, small)
