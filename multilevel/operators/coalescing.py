"""Coalescing and de-coalescing (the paper's C and D): pure functions from parameter tree to parameter tree.

Each parameter's axes carry a role from the family's table (``multilevel.models.axes``). Along an axis mapped by a
group map g (large unit p -> small unit g(p), group sizes n), with a per-group factor s:
- coalesce: ``y_i = s_i * mean_{p in G_i} x_p``;  de-coalesce: ``x_p = y_{g(p)} / s_{g(p)}``.
Output sides use s = 1 (average / copy); input sides use s = n (sum / divide), so a dense kernel becomes
``K_S = Q_in^T K_L P_out^T`` and grows back as ``K_L = P_in^T K_S Q_out^T`` (method.md sections 3 and 5).

The mean is computed as ``x_first + sum_p (x_p - x_first) / n``: for a de-coalesced tree all members of a group are
equal, the differences are exactly zero, and coalescing returns the small tree bit for bit for any group size on the
averaged axes; on summed axes it is bit-exact when the group size is a power of two (``n * (x / n) == x``), and
within a few roundings otherwise (under jit XLA may rewrite ``x / 3`` as ``x * (1/3)``). A consequence of the
formula: ``-0.0`` comes back as ``+0.0`` and an infinity as NaN (``inf - inf``); by default the operators refuse
trees that hold NaN or infinity (``check_finite``, ``finite.py``).
"""

from __future__ import annotations

from typing import Mapping

import jax.numpy as jnp
import numpy as np

from multilevel.models import axes as A
from multilevel.models import check_params
from multilevel.operators.finite import require_finite
from multilevel.operators.groups import GroupMap
from multilevel.operators.mapping import LevelMap, check_mapping
from multilevel.tree import flatten, unflatten


def _coalesce_axis(x, axis: int, gm: GroupMap, scale):
  if gm.is_identity:
    return x
  dt = x.dtype
  mean = gm.mean_groups(x, axis)
  if scale is not None:
    mean = mean * gm.broadcast(np.asarray(scale, dt), x.ndim, axis)
  return mean.astype(dt)


def _decoalesce_axis(x, axis: int, gm: GroupMap, scale):
  if gm.is_identity:
    return x
  dt = x.dtype
  y = gm.duplicate(x, axis)
  if scale is not None:
    y = y / gm.broadcast(np.asarray(scale, dt)[gm.g], x.ndim, axis)
  return y.astype(dt)


def _depth_residual_coalesce(x, axis: int, gm: GroupMap, mode: str):
  """Layers merged for a residual-branch output under ``depth_growth`` 'scaled' (n * mean) or 'zero' (sum)."""
  if mode == "scaled":
    return _coalesce_axis(x, axis, gm, gm.counts)
  return gm.sum_groups(x, axis).astype(x.dtype)


def _depth_residual_decoalesce(x, axis: int, gm: GroupMap, mode: str):
  """Layers grown for a residual-branch output: each copy divided by the group size ('scaled'), or the first copy
  kept and the others zeroed ('zero')."""
  if mode == "scaled":
    return _decoalesce_axis(x, axis, gm, gm.counts)
  keep = gm.first_mask.astype(x.dtype)
  return (gm.duplicate(x, axis) * gm.broadcast(keep, x.ndim, axis)).astype(x.dtype)


def _transform(params: Mapping, m: LevelMap, axis_fn, order, depth_residual_fn):
  out = {}
  for name, x in flatten(params).items():
    x = jnp.array(x)  # A fresh array: the output never aliases the input, so either may be donated.
    roles = m.roles(name, x.ndim)
    # Width axes first and depth last when coalescing; the reverse when growing (they commute; kept for clarity).
    axes = sorted((i for i, r in enumerate(roles) if r is not None), key=lambda i: order(roles[i] == A.LAYERS))
    for axis in axes:
      gm, scale = m.rule(roles[axis])
      if roles[axis] == A.LAYERS and A.RESIDUAL in roles and m.depth_growth != "copy" and m.changes_depth:
        x = depth_residual_fn(x, axis, gm, m.depth_growth)
      else:
        x = axis_fn(x, axis, gm, scale)
    out[name] = x
  return unflatten(out)


def coalesce(params: Mapping, mapping: LevelMap, *, check: bool = True, check_finite: bool = True) -> dict:
  """Merges heads, hidden and FFN units, then layers: the parameters of ``mapping.small``.

  Pure and jit-able (``jax.jit(functools.partial(coalesce, check_finite=False), static_argnums=1)``). With ``check``
  the input must have exactly the structure and shapes of a ``mapping.large`` model; a mismatch raises ValueError
  naming the parameter. With ``check_finite`` a NaN or an infinity raises ValueError naming the parameter; the check
  reads concrete arrays only, so it is skipped under jit.
  """
  check_mapping(mapping, "coalesce(params, mapping)")
  if check:
    check_params(params, mapping.large, "the tree to coalesce")
  if check_finite:
    require_finite(params, "the tree to coalesce")
  return _transform(params, mapping, _coalesce_axis, lambda is_depth: is_depth, _depth_residual_coalesce)


def decoalesce(params: Mapping, mapping: LevelMap, *, check: bool = True, check_finite: bool = True) -> dict:
  """Grows ``mapping.small`` parameters back to ``mapping.large`` with the normalized transposes.

  ``coalesce(decoalesce(p, m), m)`` returns ``p`` bit for bit (on summed axes when the group sizes are powers of two;
  see the module docstring). Which growths keep the logits (method.md 5.2; width groups of equal sizes): width
  growth keeps BERT's and DeiT's, and GPT's with ``preln_exact`` (up to LayerNorm's epsilon); depth growth keeps
  the pre-LN families' (GPT, DeiT) with ``depth_growth='zero'``, whose extra layers start as identities, and not
  with 'copy' (the default) or 'scaled'. ``check`` and ``check_finite`` as for ``coalesce``.
  """
  check_mapping(mapping, "decoalesce(params, mapping)")
  if check:
    check_params(params, mapping.small, "the tree to de-coalesce")
  if check_finite:
    require_finite(params, "the tree to de-coalesce")
  return _transform(params, mapping, _decoalesce_axis, lambda is_depth: not is_depth,
                    _depth_residual_decoalesce)
