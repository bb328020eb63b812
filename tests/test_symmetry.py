"""operators.split_noise: breaks the symmetry of a grown model's copies without changing its function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multilevel import models as M
from multilevel import operators as O
from multilevel.tree import flatten
from tests.operator_util import (BASE, assert_like_config, assert_tree_equal, coalesce, decoalesce, logits_of,
                                 model_inputs, random_params)


def _grown(kind, preln_exact=False):
  m = O.make_mapping(BASE[kind], preln_exact=preln_exact)  # Width and depth halved, plain layer copies.
  small = random_params(m.small, seed=21, std=0.1)
  return m, small, decoalesce(small, m)


@pytest.mark.parametrize("kind", ["bert", "gpt", "deit-distill"])
def test_split_noise_keeps_the_function_and_coalesces_back(kind):
  m, small, grown = _grown(kind, preln_exact=kind == "gpt")
  split = O.split_noise(grown, m, scale=0.5, seed=3)
  assert_like_config(split, m.large)
  want = logits_of(m.large, grown)
  got = logits_of(m.large, split)
  assert np.max(np.abs(want)) > 0.1  # Non-trivial logits (DeiT's are the smallest, 0.25).
  # Large weight changes (half of each kernel's own std on every merged read side) and the same outputs.
  moved = {n: float(jnp.max(jnp.abs(a - flatten(grown)[n]))) for n, a in flatten(split).items()}
  assert moved["layers/mlp/fc2/kernel"] > 0.01 and moved["layers/attn/out/kernel"] > 0.01
  assert moved["layers/attn/query/kernel"] > 0.01  # Hidden copies are read here.
  assert all(v == 0 for n, v in moved.items() if n.endswith(("bias", "scale")) or "embedding" in n)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
  # The noise sums to zero inside every group: coalescing gives the small model back (up to rounding).
  for name, a in flatten(coalesce(split, m)).items():
    np.testing.assert_allclose(np.asarray(a), np.asarray(flatten(small)[name]), rtol=1e-5, atol=1e-6, err_msg=name)


def test_split_noise_breaks_the_symmetry_of_the_gradients():
  m, _, grown = _grown("gpt", preln_exact=True)
  cfg, x = m.large, model_inputs(m.large, seed=5)
  grad = jax.jit(jax.grad(lambda p: jnp.mean(M.apply(cfg, p, x) ** 2)))
  copies = np.flatnonzero(m.ffn_map.g == m.ffn_map.g[0])  # FFN units that are copies of small unit 0.
  assert len(copies) == 2

  def spread(params):
    g = np.asarray(grad(params)["layers"]["mlp"]["fc1"]["kernel"])  # (layers, hidden, ffn)
    a, b = g[..., copies[0]], g[..., copies[1]]
    return float(np.max(np.abs(a - b)) / np.max(np.abs(a)))

  assert spread(grown) < 1e-6  # Copies get the same gradient: they would stay copies forever.
  assert spread(O.split_noise(grown, m, scale=0.1, seed=0)) > 1e-2


def test_split_noise_options():
  m, _, grown = _grown("deit")
  assert_tree_equal(O.split_noise(grown, m, scale=0.0), grown)
  a, b = O.split_noise(grown, m, scale=0.1, seed=1), O.split_noise(grown, m, scale=0.1, seed=2)
  assert not np.array_equal(np.asarray(a["layers"]["mlp"]["fc2"]["kernel"]),
                            np.asarray(b["layers"]["mlp"]["fc2"]["kernel"]))
  assert_tree_equal(O.split_noise(grown, m, scale=0.1, seed=1), a)  # Deterministic in the seed.
  with pytest.raises(ValueError, match="scale must be >= 0"):
    O.split_noise(grown, m, scale=-1.0)
  with pytest.raises(ValueError):  # A tree of the small model is not a grown tree.
    O.split_noise(random_params(m.small), m, scale=0.1)
