"""Interpolation: blend the grown model with the same level's model as it was just before coalescing."""

from __future__ import annotations

from typing import Mapping

import jax

from multilevel.operators.finite import require_finite
from multilevel.tree import check_same_structure


def interpolate(grown: Mapping, pre: Mapping, *, w_pre: float, check_finite: bool = True) -> dict:
  """``(1 - w_pre) * grown + w_pre * pre``, leaf by leaf.

  Args:
    grown: the de-coalesced parameters ``D(theta_{k+1})``.
    pre: the parameters of the same level snapshotted right before it was coalesced (never another run's model:
      the reference script's bug B1).
    w_pre: the weight of ``pre``, the symmetry breaker; the paper uses 0.5 for BERT and 0.25 for GPT and DeiT.
      0 returns ``grown``, 1 returns ``pre``.
    check_finite: refuse a NaN or an infinity in either tree (ValueError naming the parameter). The check reads
      concrete arrays only, so it is skipped under jit.
  """
  if not isinstance(w_pre, jax.Array) and not 0.0 <= float(w_pre) <= 1.0:
    raise ValueError(f"w_pre is the weight of the pre-coalescing model and must lie in [0, 1], got {w_pre}.")
  check_same_structure(grown, pre, "the grown tree", "the pre-coalescing tree")
  if check_finite:
    require_finite(grown, "the grown tree")
    require_finite(pre, "the pre-coalescing tree")
  w = w_pre
  return jax.tree.map(lambda g, p: ((1 - w) * g + w * p).astype(g.dtype), dict(grown), dict(pre))
