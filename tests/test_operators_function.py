"""Tests of multilevel.operators: which growths keep the model's function (method.md sections 5 and B2).

The shared configs, compiled operators and helpers are in ``tests/operator_util.py``.
"""

import functools

import numpy as np
import pytest

from multilevel import operators as O
from tests.operator_util import BASE, HOW, assert_tree_equal, decoalesce, logits_of, random_params


# --------------------------------------------------------------------------------------------- function preservation

@functools.cache
def growth_error(kind, how="width", preln_exact=False, ln_eps=None):
  """Max |logits(D(theta_S)) - logits(theta_S)| and max |logits(theta_S)| on one batch, theta_S = init + noise."""
  cfg = BASE[kind] if ln_eps is None else BASE[kind].replace(ln_eps=ln_eps)
  m = O.make_mapping(cfg, preln_exact=preln_exact, **HOW[how])
  small = random_params(m.small, seed=11, std=0.1)
  want = logits_of(m.small, small)
  got = logits_of(m.large, decoalesce(small, m))
  return float(np.max(np.abs(got - want))), float(np.max(np.abs(want)))


@pytest.mark.parametrize("kind", ["bert", "deit", "deit-distill"])
def test_width_growth_keeps_the_function_bert_and_deit(kind):
  """BERT (post-LN, eps 1e-12) and DeiT (no embedding factor, eps 1e-6) at their default epsilons.

  Measured max |dlogit|: BERT 1.1e-6, DeiT 3.6e-7, DeiT+distill 5.1e-7, on logits up to 1.8, 0.8 and 0.5.
  """
  err, scale = growth_error(kind)
  assert 0.3 < scale < 30  # Non-trivial logits.
  assert err <= 1e-5


def test_width_growth_keeps_gpt_function_with_preln_exact_and_tiny_eps():
  """GPT with ``preln_exact=True`` and ``ln_eps=1e-12`` in the config: exact up to float32 (measured 1.1e-6 max
  |dlogit| on logits up to 1.8).

  The grown residual stream is the small one duplicated and halved; LayerNorm is scale-invariant only up to its
  epsilon (LN(x/2; eps) = LN(x; 4 eps)), so the tiny epsilon is what makes this an exact test (method.md 5.2).
  """
  err, scale = growth_error("gpt", preln_exact=True, ln_eps=1e-12)
  assert 0.3 < scale < 30
  assert err <= 1e-5


def test_gpt_width_growth_without_preln_exact_changes_the_function():
  """Reference behaviour (the official code): the embedding is halved but the branches are not, so pre-LN GPT's
  function changes (method.md B2). Measured max |dlogit| on logits up to 1.8: 0.62 (also 0.62 with ln_eps=1e-12);
  preln_exact brings it to 1.5e-3 at GPT's default eps 1e-5 (the halved residual stream meets LN's epsilon) and to
  1.1e-6 with eps 1e-12."""
  err_ref, _ = growth_error("gpt")
  err_ref_tiny_eps, _ = growth_error("gpt", ln_eps=1e-12)
  err_exact_default_eps, _ = growth_error("gpt", preln_exact=True)
  err_exact_tiny_eps, _ = growth_error("gpt", preln_exact=True, ln_eps=1e-12)
  assert err_ref > 1e-2 and err_ref_tiny_eps > 1e-2
  assert err_exact_default_eps < 1e-2
  assert err_exact_default_eps < err_ref / 50
  assert err_exact_tiny_eps < err_exact_default_eps


def test_preln_exact_is_a_no_op_for_deit():
  m_ref = O.make_mapping(BASE["deit"], depth_factor=1)
  m_exact = O.make_mapping(BASE["deit"], depth_factor=1, preln_exact=True)
  p = random_params(m_ref.small, seed=12)
  assert_tree_equal(decoalesce(p, m_exact), decoalesce(p, m_ref))


@pytest.mark.parametrize("kind", ["bert", "gpt", "deit"])
def test_depth_growth_does_not_keep_the_function(kind):
  """Layers are copied, so the grown model runs each small layer twice (method.md 5.2). Measured max |dlogit|:
  BERT 2.3, GPT 2.1, DeiT 0.53 (logits up to 2.8, 3.4, 1.4)."""
  err, _ = growth_error(kind, how="depth-adjacent")
  assert err > 1e-3



def test_unequal_width_groups_change_the_function():
  """Why make_mapping wants ``allow_unequal_width_groups``: with groups of sizes 1 and 3, BERT's width growth (exact
  for equal groups, above) changes the logits, since LayerNorm averages over the hidden copies. Measured max |dlogit|
  2.0 on logits up to 1.8 (9e-7 for the equal scheme [[0, 2], [1, 3]])."""
  m = O.make_mapping(BASE["bert"], width=[[0], [1, 2, 3]], depth_factor=1, allow_unequal_width_groups=True)
  small = random_params(m.small, seed=11, std=0.1)
  want = logits_of(m.small, small)
  err = float(np.max(np.abs(logits_of(m.large, decoalesce(small, m)) - want)))
  assert err > 1e-2, err
