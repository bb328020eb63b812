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
formula: ``-0.0`` comes back as ``+0.0`` and infinities as NaN (``inf - inf``), which finite training never meets.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from multilevel.models import FAMILY
from multilevel.models import axes as A
from multilevel.operators.mapping import GroupMap, LevelMap
from multilevel.models import check_params
from multilevel.tree import flatten, unflatten


def _axis_rules(m: LevelMap, role: str) -> tuple[GroupMap, np.ndarray | None]:
  """The group map and the per-small-unit factor (None for 1) of an axis role under ``m``."""
  fam = FAMILY[m.large.family]
  if role == A.LAYERS:
    return m.layer_map, None
  space, side = role.split(":")
  gm = {"hidden": m.hidden_map, "heads": m.head_map, "ffn": m.ffn_map}[space]
  if side == "out":
    return gm, None
  if side == "in":
    return gm, gm.counts
  embed_scale = None
  if fam.tied_embedding:
    embed_scale = gm.counts if m.embed_factor is None else np.full(gm.n_small, m.embed_factor)
  if side == "embed":
    return gm, embed_scale
  if side == "residual":
    return gm, embed_scale if m.preln_exact else None
  raise ValueError(f"Unknown axis role {role!r}.")


def _members(gm: GroupMap) -> np.ndarray | None:
  """(n_small, k) large indices of each group, in index order, when every group has the same size k; else None."""
  if len(set(gm.counts.tolist())) != 1:
    return None
  return np.argsort(gm.g, kind="stable").reshape(gm.n_small, int(gm.counts[0]))


def _segment_sum(x, g: np.ndarray, n: int, axis: int, members: np.ndarray | None = None):
  """Sums along ``axis`` the entries that ``g`` sends to the same small unit.

  Equal groups (``members`` given) are gathered into a new axis of size k and reduced, several times faster on CPU
  than XLA's scatter-add; unequal groups fall back to ``segment_sum``.
  """
  if members is not None:
    y = jnp.take(x, jnp.asarray(members.reshape(-1)), axis=axis)
    y = y.reshape(x.shape[:axis] + members.shape + x.shape[axis + 1:])
    return jnp.sum(y, axis=axis + 1)
  moved = jnp.moveaxis(x, axis, 0)
  return jnp.moveaxis(jax.ops.segment_sum(moved, jnp.asarray(g), num_segments=n, indices_are_sorted=False), 0, axis)


def _bshape(v: np.ndarray, ndim: int, axis: int):
  shape = [1] * ndim
  shape[axis] = -1
  return v.reshape(shape)


def _coalesce_axis(x, axis: int, gm: GroupMap, scale):
  if len(gm.g) == gm.n_small and np.array_equal(gm.g, np.arange(gm.n_small)):
    return x  # Identity map on this axis.
  dt = x.dtype
  anchor = jnp.take(x, jnp.asarray(gm.first[gm.g]), axis=axis)
  diffs = _segment_sum(x - anchor, gm.g, gm.n_small, axis, _members(gm))
  mean = jnp.take(x, jnp.asarray(gm.first), axis=axis) + diffs / _bshape(gm.counts.astype(dt), x.ndim, axis)
  if scale is not None:
    mean = mean * _bshape(np.asarray(scale, dt), x.ndim, axis)
  return mean.astype(dt)


def _decoalesce_axis(x, axis: int, gm: GroupMap, scale):
  if len(gm.g) == gm.n_small and np.array_equal(gm.g, np.arange(gm.n_small)):
    return x
  dt = x.dtype
  y = jnp.take(x, jnp.asarray(gm.g), axis=axis)
  if scale is not None:
    y = y / _bshape(np.asarray(scale, dt)[gm.g], x.ndim, axis)
  return y.astype(dt)


def _depth_residual_coalesce(x, axis: int, gm: GroupMap, mode: str):
  """Layers merged for a residual-branch output under ``depth_growth`` 'scaled' (n * mean) or 'zero' (sum)."""
  if mode == "scaled":
    return _coalesce_axis(x, axis, gm, gm.counts)
  return _segment_sum(x, gm.g, gm.n_small, axis, _members(gm)).astype(x.dtype)


def _depth_residual_decoalesce(x, axis: int, gm: GroupMap, mode: str):
  if mode == "scaled":
    return _decoalesce_axis(x, axis, gm, gm.counts)
  y = jnp.take(x, jnp.asarray(gm.g), axis=axis)
  keep = (gm.first[gm.g] == np.arange(len(gm.g))).astype(x.dtype)  # 1 for each group's first layer, else 0.
  return (y * _bshape(keep, x.ndim, axis)).astype(x.dtype)


def _roles(m: LevelMap, name: str, ndim: int):
  table = FAMILY[m.large.family].axes
  if name not in table:
    raise ValueError(f"Parameter {name!r} has no axis roles in the {m.large.family} table; the tree does not come "
                     f"from a multilevel {m.large.family} model.")
  roles = table[name]
  if len(roles) != ndim:
    raise ValueError(f"Parameter {name!r} has {ndim} axes but the {m.large.family} table declares {len(roles)}.")
  return roles


def _transform(params: Mapping, m: LevelMap, axis_fn, order, depth_residual_fn):
  out = {}
  for name, x in flatten(params).items():
    x = jnp.array(x)  # A fresh array: the output never aliases the input, so either may be donated.
    roles = _roles(m, name, x.ndim)
    # Width axes first and depth last when coalescing; the reverse when growing (they commute; kept for clarity).
    axes = sorted((i for i, r in enumerate(roles) if r is not None), key=lambda i: order(roles[i] == A.LAYERS))
    for axis in axes:
      gm, scale = _axis_rules(m, roles[axis])
      if roles[axis] == A.LAYERS and A.RESIDUAL in roles and m.depth_growth != "copy" and m.changes_depth:
        x = depth_residual_fn(x, axis, gm, m.depth_growth)
      else:
        x = axis_fn(x, axis, gm, scale)
    out[name] = x
  return unflatten(out)


def coalesce(params: Mapping, mapping: LevelMap, *, check: bool = True) -> dict:
  """Merges heads, hidden and FFN units, then layers: the parameters of ``mapping.small``.

  Pure and jit-able (``jax.jit(coalesce, static_argnums=1)``). With ``check`` the input must have exactly the
  structure and shapes of a ``mapping.large`` model; a mismatch raises ValueError naming the parameter.
  """
  if check:
    check_params(params, mapping.large, "the tree to coalesce")
  return _transform(params, mapping, _coalesce_axis, lambda is_depth: is_depth, _depth_residual_coalesce)


def decoalesce(params: Mapping, mapping: LevelMap, *, check: bool = True) -> dict:
  """Grows ``mapping.small`` parameters back to ``mapping.large`` with the normalized transposes.

  ``coalesce(decoalesce(p, m), m)`` returns ``p`` bit for bit (group sizes that are powers of two; see the module
  docstring). Width growth keeps BERT's and DeiT's logits, and GPT's with ``preln_exact``; depth growth copies layers
  and does not keep the function.
  """
  if check:
    check_params(params, mapping.small, "the tree to de-coalesce")
  return _transform(params, mapping, _decoalesce_axis, lambda is_depth: not is_depth,
                    _depth_residual_decoalesce)
