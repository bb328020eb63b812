"""Interpolation: blend the grown model with the same level's model as it was just before coalescing."""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np

from multilevel.operators.finite import require_finite
from multilevel.tree import check_same_structure, flatten, unflatten


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
  if isinstance(w_pre, (jax.Array, np.ndarray)):
    if w_pre.ndim != 0:
      raise ValueError(f"w_pre must be a scalar weight in [0, 1], got an array of shape {w_pre.shape}.")
    if not isinstance(w_pre, jax.core.Tracer) and not 0.0 <= float(w_pre) <= 1.0:  # (A traced one is unknown.)
      raise ValueError(f"w_pre is the weight of the pre-coalescing model and must lie in [0, 1], got {w_pre}.")
  elif isinstance(w_pre, bool) or not isinstance(w_pre, (int, float, np.number)) or not 0.0 <= float(w_pre) <= 1.0:
    raise ValueError(f"w_pre is the weight of the pre-coalescing model and must be a number in [0, 1], got "
                     f"{w_pre!r}.")
  check_same_structure(grown, pre, "the grown tree", "the pre-coalescing tree")
  if check_finite:
    require_finite(grown, "the grown tree")
    require_finite(pre, "the pre-coalescing tree")
  w = w_pre
  plain = lambda t: unflatten(flatten(t))  # Plain dicts: a FrozenDict and a dict of the same tree blend alike.
  return jax.tree.map(lambda g, p: ((1 - w) * g + w * p).astype(g.dtype), plain(grown), plain(pre))
