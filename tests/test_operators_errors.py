"""Tests of multilevel.operators: interpolation (method.md section 6) and clear errors on bad schemes, configs
and trees.

The shared configs, compiled operators and helpers are in ``tests/operator_util.py``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multilevel import operators as O
from multilevel.tree import flatten, unflatten
from tests.operator_util import BASE, HOW, assert_like_config, assert_tree_equal, decoalesce, logits_of, random_params


# ----------------------------------------------------------------------------------------------------- interpolation

def test_interpolate_endpoints_are_exact():
  grown, pre = random_params(BASE["gpt"], seed=13), random_params(BASE["gpt"], seed=14)
  assert_tree_equal(O.interpolate(grown, pre, w_pre=0.0), grown)
  assert_tree_equal(O.interpolate(grown, pre, w_pre=1.0), pre)
  assert_tree_equal(O.interpolate(grown, pre, w_pre=0), grown)
  mid = O.interpolate(grown, pre, w_pre=0.25)
  assert_like_config(mid, BASE["gpt"])
  g, p = np.asarray(grown["word"]["embedding"]), np.asarray(pre["word"]["embedding"])
  np.testing.assert_allclose(np.asarray(mid["word"]["embedding"]), 0.75 * g + 0.25 * p, rtol=1e-6, atol=1e-6)
  # A traced weight (under jit) is not range-checked, but computes the same blend.
  traced = jax.jit(lambda w: O.interpolate(grown, pre, w_pre=w))(jnp.float32(0.25))
  np.testing.assert_allclose(np.asarray(traced["word"]["embedding"]), 0.75 * g + 0.25 * p, rtol=1e-6, atol=1e-6)


def test_interpolation_error_grows_with_w_pre():
  """As the reference testbench: the grown model D(theta_S) mixed with an unrelated "pre" model; the mean
  |dlogit| against the grown model is 0 at w_pre = 0 and grows with w_pre. Measured on BERT: 0, 0.34, 0.60, 0.71,
  0.83 for w_pre = 0, .25, .5, .75, 1 (the reference reports 0.18/0.32/0.39/0.44 for its sizes)."""
  m = O.make_mapping(BASE["bert"], **HOW["width"])
  grown = decoalesce(random_params(m.small, seed=15, std=0.1), m)
  pre = random_params(m.large, seed=16, std=0.1)
  base = logits_of(m.large, grown)
  errs = [float(np.mean(np.abs(logits_of(m.large, O.interpolate(grown, pre, w_pre=w)) - base)))
          for w in (0.0, 0.25, 0.5, 0.75, 1.0)]
  assert errs[0] == 0.0
  assert all(a < b for a, b in zip(errs, errs[1:])), errs


def test_interpolate_rejects_mismatched_trees_and_bad_weights():
  cfg = BASE["gpt"]
  grown = random_params(cfg, seed=17)
  other = flatten(random_params(cfg, seed=18))
  wrong_shape = dict(other)
  wrong_shape["layers/mlp/fc1/bias"] = jnp.zeros((4, 3))
  with pytest.raises(ValueError, match="layers/mlp/fc1/bias"):
    O.interpolate(grown, unflatten(wrong_shape), w_pre=0.5)
  missing = dict(other)
  del missing["ln_final/scale"]
  with pytest.raises(ValueError, match="ln_final/scale"):
    O.interpolate(grown, unflatten(missing), w_pre=0.5)
  wrong_dtype = dict(other)
  wrong_dtype["position"] = other["position"].astype(jnp.bfloat16)
  with pytest.raises(ValueError, match="position"):
    O.interpolate(grown, unflatten(wrong_dtype), w_pre=0.5)
  with pytest.raises(ValueError, match="same model config"):
    O.interpolate(grown, random_params(O.make_mapping(cfg).small), w_pre=0.5)
  for w in (-0.1, 1.5, float("nan")):
    with pytest.raises(ValueError, match=r"w_pre .*\[0, 1\]"):
      O.interpolate(grown, unflatten(other), w_pre=w)


# --------------------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kw, match", [
    (dict(width=[[0, 2]]), r"heads scheme leaves large indices \[1, 3\] unassigned"),  # Does not cover all heads.
    (dict(width=[[0, 2], [1, 3], []]), "non-empty"),
    (dict(width=[[0, 2], [1, 4]]), r"index 4, out of range.*4 heads"),
    (dict(width=[[0, 2], [2, 3]]), "heads scheme uses large index 2 twice"),
    (dict(width=[0, 1, 2, 3]), "must be a non-empty list"),
    (dict(width="0123"), "list of lists"),
    (dict(width=[[0, 1.0], [2, 3]]), "not an integer"),
    (dict(depth=[[0, 1, 2]]), r"layers scheme leaves large indices \[3\] unassigned"),
    (dict(depth=[[0, 1], [1, 2, 3]]), "layers scheme uses large index 1 twice"),
    (dict(depth=[[0, 1], [2, 5]]), "out of range"),
    # Growth would run the small layers in another order (it permuted the stack: 8 nats off the logits).
    (dict(depth=[[2, 3], [0, 1]]), r"runs the small layers in another order .* \[\[0, 1\], \[2, 3\]\]"),
    (dict(depth=[[1, 2], [0, 3]]), "runs the small layers in another order"),
    (dict(depth=[[0, 1], [2, 3]], depth_mode="middle"), "depth_mode must be one of"),  # Checked beside a scheme too.
    (dict(width=[[0, 2], [1, 3]], width_factor=1), "both an explicit width scheme and width_factor=1"),
    (dict(embed_factor="2"), "embed_factor must be a positive number"),
    (dict(width_factor=3), "4 heads by a width factor of 3: the factor must divide"),
    (dict(depth_factor=3), "4 layers by a depth factor of 3: the factor must divide"),
    (dict(width_factor=0), "must divide"),
    (dict(depth_mode="middle"), "depth_mode must be one of"),
    (dict(embed_factor=0.0), "embed_factor must be a positive number"),
])
def test_bad_schemes_raise_clear_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    O.make_mapping(BASE["gpt"], **kw)


def test_preln_exact_needs_equal_width_groups():
  with pytest.raises(ValueError, match=r"same number of large heads.*sizes \[1, 3\]"):
    O.make_mapping(BASE["gpt"], width=[[0], [1, 2, 3]], preln_exact=True)
  m = O.make_mapping(BASE["gpt"], width=[[0], [1, 2, 3]], allow_unequal_width_groups=True)  # Well defined.
  assert m.small.num_heads == 2


def test_unequal_width_groups_need_the_explicit_opt_in():
  unequal = [[0], [1, 2, 3]]
  why = r"group sizes \[1, 3\]\).*LayerNorm.*pass allow_unequal_width_groups=True"
  with pytest.raises(ValueError, match=why):
    O.make_mapping(BASE["gpt"], width=unequal)
  with pytest.raises(ValueError, match=why):
    O.make_chain(BASE["bert"], 3, widths=[unequal, None])
  with pytest.raises(ValueError, match="preln_exact keeps the function only when"):  # The opt-in does not lift it.
    O.make_mapping(BASE["gpt"], width=unequal, preln_exact=True, allow_unequal_width_groups=True)
  assert O.make_mapping(BASE["deit"], width=unequal, allow_unequal_width_groups=True).heads == ((0,), (1, 2, 3))
  m1, m2 = O.make_chain(BASE["bert"], 3, widths=[unequal, None], allow_unequal_width_groups=True)
  assert m1.heads == ((0,), (1, 2, 3)) and m2.small.num_heads == 1
  assert O.make_mapping(BASE["gpt"], depth=[[0], [1, 2, 3]]).layers == ((0,), (1, 2, 3))  # Layer groups: any sizes.


def test_chain_takes_one_explicit_scheme_per_transition():
  m1, m2 = O.make_chain(BASE["gpt"], 3, widths=[[[0, 1], [2, 3]], None], depths=[None, [[0, 1]]])
  assert m1.heads == ((0, 1), (2, 3)) and m2.heads == ((0, 1),)  # None: the default halving of 2 heads.
  assert m1.layers == ((0, 1), (2, 3)) and m2.layers == ((0, 1),)
  assert m2.small.num_heads == 1 and m2.small.num_layers == 1
  with pytest.raises(ValueError, match="one explicit width scheme for 2 transitions.*widths="):
    O.make_chain(BASE["gpt"], 3, width=[[0, 1], [2, 3]])
  with pytest.raises(ValueError, match="one scheme per transition: 2 for 3 levels, got 1"):
    O.make_chain(BASE["gpt"], 3, depths=[[[0, 1], [2, 3]]])
  assert O.make_chain(BASE["gpt"], 2, width=[[0, 2], [1, 3]])[0].heads == ((0, 2), (1, 3))


def test_preln_exact_is_rejected_for_post_ln_bert():
  with pytest.raises(ValueError, match="preln_exact.*post-LN"):
    O.make_mapping(BASE["bert"], preln_exact=True)
  with pytest.raises(TypeError, match="ModelConfig"):
    O.make_mapping({"family": "gpt"})


def test_trees_that_do_not_match_the_config_are_rejected():
  m = O.make_mapping(BASE["gpt"])
  large = flatten(random_params(m.large, seed=19))
  missing = dict(large)
  del missing["layers/attn/query/bias"]
  with pytest.raises(ValueError, match="only in a gpt model.*layers/attn/query/bias"):
    O.coalesce(unflatten(missing), m)
  extra = dict(large)
  extra["layers/attn/extra"] = jnp.zeros((4, 2))
  with pytest.raises(ValueError, match="only in the tree to coalesce.*layers/attn/extra"):
    O.coalesce(unflatten(extra), m)
  wrong = dict(large)
  wrong["word/embedding"] = jnp.zeros((128, 32))
  with pytest.raises(ValueError, match=r"'word/embedding' has shape \(128, 32\) in the tree to coalesce but "
                                       r"\(128, 64\)"):
    O.coalesce(unflatten(wrong), m)
  # A large tree handed to decoalesce (or a small one to coalesce) names the first parameter whose shape is off.
  with pytest.raises(ValueError, match="Parameter 'layers/.*' has shape .* in the tree to de-coalesce"):
    O.decoalesce(unflatten(large), m)
  with pytest.raises(ValueError, match="tree to coalesce"):
    O.coalesce(random_params(m.small), m)
  with pytest.raises(ValueError, match="tree to coalesce"):  # Another family's tree.
    O.coalesce(random_params(BASE["bert"]), m)
  with pytest.raises(TypeError, match="parameter tree"):
    O.coalesce([1, 2], m)



# -------------------------------------------------------------------------------------------------- non-finite trees

# Each operator applied to a tree t of the shapes it takes, with the name its error gives t.
FINITE_OPS = {
    "coalesce": ("the tree to coalesce", lambda m, t, **kw: O.coalesce(t, m, **kw)),
    "decoalesce": ("the tree to de-coalesce", lambda m, t, **kw: O.decoalesce(t, m, **kw)),
    "split_noise": ("the tree to break the symmetry of", lambda m, t, **kw: O.split_noise(t, m, scale=0.1, **kw)),
    "interpolate-grown": ("the grown tree",
                          lambda m, t, **kw: O.interpolate(t, random_params(m.large), w_pre=0.5, **kw)),
    "interpolate-pre": ("the pre-coalescing tree",
                        lambda m, t, **kw: O.interpolate(random_params(m.large), t, w_pre=0.5, **kw)),
}


@pytest.mark.parametrize("op", list(FINITE_OPS))
def test_trees_with_nan_or_infinity_are_refused(op):
  what, run = FINITE_OPS[op]
  m = O.make_mapping(BASE["gpt"])
  flat = flatten(random_params(m.small if op == "decoalesce" else m.large, seed=22))
  bad = dict(flat)
  bad["word/embedding"] = flat["word/embedding"].at[3, 1].set(jnp.inf)
  bad["layers/mlp/fc1/kernel"] = flat["layers/mlp/fc1/kernel"].at[0, 1, 2].set(jnp.nan).at[1, 0, 0].set(jnp.nan)
  with pytest.raises(ValueError, match=rf"'layers/mlp/fc1/kernel' of {what} holds 2 NaN and 0 infinite values .*"
                                       rf"diverged.*pass check_finite=False"):
    run(m, unflatten(bad))  # The first offending path in path order, not the first leaf of the dict.
  inf_only = dict(flat, **{"word/embedding": bad["word/embedding"]})
  with pytest.raises(ValueError, match=f"'word/embedding' of {what} holds 0 NaN and 1 infinite values"):
    run(m, unflatten(inf_only))
  out = flatten(run(m, unflatten(bad), check_finite=False))  # The opt-out maps it anyway.
  assert np.isnan(np.asarray(out["layers/mlp/fc1/kernel"])).any()


def test_the_finite_check_is_skipped_under_jit():
  """Traced values cannot be inspected at trace time: under jit a NaN goes through unchecked (and no trace error)."""
  grown = random_params(BASE["gpt"], seed=23)
  pre = flatten(random_params(BASE["gpt"], seed=24))
  pre["position"] = pre["position"].at[0, 0].set(jnp.nan)
  pre = unflatten(pre)
  out = jax.jit(functools.partial(O.interpolate, w_pre=0.5))(grown, pre)
  assert np.isnan(np.asarray(out["position"])).sum() == 1
  out = jax.jit(lambda w: O.interpolate(grown, pre, w_pre=w))(0.5)  # Concrete trees closed over by a trace.
  assert np.isnan(np.asarray(out["position"])).sum() == 1


def test_interpolate_takes_a_real_scalar_weight_and_mixed_container_types():
  from flax.core import freeze
  cfg = BASE["gpt"]
  grown, pre = random_params(cfg, seed=3), random_params(cfg, seed=4)
  for w in ("0.5", None, True, jnp.array([0.5, 0.5]), np.array(1.5), jnp.float32(2.0), jnp.float32(np.nan)):
    with pytest.raises(ValueError, match="w_pre"):
      O.interpolate(grown, pre, w_pre=w)
  mixed = O.interpolate(freeze(grown), pre, w_pre=0.25)  # A FrozenDict beside a dict: the same blend.
  assert_tree_equal(mixed, O.interpolate(grown, pre, w_pre=0.25))
  traced = jax.jit(lambda w: O.interpolate(grown, pre, w_pre=w, check_finite=False))(jnp.float32(0.25))
  assert_tree_equal(traced, O.interpolate(grown, pre, w_pre=0.25))


def test_operators_name_a_wrong_mapping_a_wrapped_tree_and_bad_factors_or_levels():
  cfg = BASE["gpt"]
  params = random_params(cfg, seed=5)
  m = O.make_mapping(cfg)
  for bad in (None, cfg, params):
    with pytest.raises(TypeError, match=r"mapping must be a LevelMap from operators.make_mapping"):
      O.coalesce(params, bad)
  with pytest.raises(TypeError, match="decoalesce.*mapping must be a LevelMap"):
    O.decoalesce(params, None)
  with pytest.raises(ValueError, match=r"wrapped as \{'params': \.\.\.\}.*pass tree\['params'\]"):
    O.coalesce({"params": params}, m)
  with pytest.raises(TypeError, match="width_factor must be an integer"):
    O.make_mapping(cfg, width_factor=2.0)
  with pytest.raises(ValueError, match="both an explicit width scheme and width_factor=4"):
    O.make_mapping(cfg, width=[list(g) for g in m.heads], width_factor=4)
  for levels in (0, 2.0):
    with pytest.raises(ValueError, match="levels, an integer >= 1"):
      O.make_chain(cfg, levels)
  zero = O.make_mapping(cfg, depth_growth="zero")
  grown = O.decoalesce(O.coalesce(params, zero), zero)
  with pytest.raises(TypeError, match=r"fresh_layers\(grown, fresh, mapping\): mapping must be a LevelMap"):
    O.fresh_layers(grown, zero, params)  # Arguments swapped.
  with pytest.raises(TypeError, match=r"split_noise\(grown, mapping, scale=\.\.\.\): mapping must be a LevelMap"):
    O.split_noise(params, cfg, scale=0.1)
  with pytest.raises(ValueError, match="scale must be a number >= 0"):
    O.split_noise(grown, zero, scale="0.1")
  with pytest.raises(ValueError, match=r"make_chain: transition \d+ .* Use fewer levels or a larger model"):
    O.make_chain(cfg, 12)


def test_numpy_schemes_are_taken_and_lists_or_shapes_as_leaves_are_named():
  import functools

  from multilevel import models as M
  cfg = BASE["gpt"]
  by_array = O.make_mapping(cfg, width=np.array([[0, 2], [1, 3]]), depth=[np.array([0, 1]), np.array([2, 3])])
  assert by_array == O.make_mapping(cfg, width=[[0, 2], [1, 3]], depth=[[0, 1], [2, 3]])
  m = O.make_mapping(cfg)
  params = random_params(cfg, seed=6)
  flat = flatten(params)
  flat["ln_final/scale"] = flat["ln_final/scale"].tolist()
  with pytest.raises(TypeError, match=r"'ln_final/scale' of the tree to coalesce is a list, not an array"):
    O.coalesce(unflatten(flat), m)
  with pytest.raises(TypeError, match=r"holds shapes .*run the operator under jax.eval_shape"):
    O.coalesce(M.abstract_params(cfg), m)
  shapes = jax.eval_shape(functools.partial(O.coalesce, mapping=m, check_finite=False), M.abstract_params(cfg))
  assert jax.tree.map(lambda s: s.shape, shapes) == jax.tree.map(np.shape, O.coalesce(params, m))
