"""Group maps along one axis (``GroupMap``) and the schemes they come from: which large heads, key/value heads
and layers merge into each small one (``default_width_groups``, ``kv_groups``, ``default_depth_groups``, checked by
``check_groups``).

Width scheme (the reference format): one entry per small-model head, listing the large-model heads merged into it,
e.g. ``[[0, 6], [1, 7], ..., [5, 11]]``. The same grouping is applied, chunk by chunk, to the hidden channels (chunks
of ``head_dim``) and to the FFN units (chunks of ``ffn_dim / num_heads``), exactly as the reference code does.

Grouped-query attention (LLaMA's ``num_kv_heads``): the key/value heads follow the query heads. Large key/value
head j serves query heads ``j r .. j r + r - 1`` (r = num_heads / num_kv_heads); the small heads those query heads
merge into must share one small key/value head, into which j merges (``kv_groups``). The small model's key/value
heads are the finest grouping that allows this, and they must serve equal runs of consecutive small heads, as GQA
requires; a scheme that would need anything else is refused.

Depth scheme: one entry per small layer listing the large layers merged into it. ``depth_mode='adjacent'`` (the
paper: layers 2i and 2i+1) or ``'stride'`` (the reference ``L6-H6.json``: layers i and i + L/2).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from multilevel.models import ModelConfig

Groups = tuple[tuple[int, ...], ...]
DEPTH_MODES = ("adjacent", "stride")


@dataclasses.dataclass(frozen=True)
class GroupMap:
  """A group map g: large index p -> small index g(p), with group sizes and each group's first member (the one its
  scheme entry lists first).

  The methods are the operators' vocabulary along one axis of an array (method.md section 2: P averages, Q
  duplicates): ``sum_groups`` is Q^T, ``mean_groups`` is P, ``duplicate`` is Q. They take the axis explicitly and
  work on concrete arrays and tracers alike (the map itself is static numpy).
  """

  g: np.ndarray  # (n_large,) int32
  counts: np.ndarray  # (n_small,) int32
  first: np.ndarray  # (n_small,) int32

  @classmethod
  def from_groups(cls, groups: Groups, n_large: int) -> "GroupMap":
    g = np.empty(n_large, np.int32)
    for i, members in enumerate(groups):
      g[list(members)] = i
    counts = np.array([len(m) for m in groups], np.int32)
    first = np.array([m[0] for m in groups], np.int32)
    return cls(g, counts, first)

  def expand(self, chunk: int) -> "GroupMap":
    """The map on units cut into chunks of ``chunk``: unit c of chunk j goes to unit c of chunk g(j)."""
    off = np.arange(chunk, dtype=np.int32)
    g = (self.g[:, None] * chunk + off).reshape(-1)
    first = (self.first[:, None] * chunk + off).reshape(-1)
    counts = np.repeat(self.counts, chunk)
    return GroupMap(g, counts, first)

  @property
  def n_small(self) -> int:
    return len(self.counts)

  @property
  def n_large(self) -> int:
    return len(self.g)

  @property
  def is_identity(self) -> bool:
    """Every large unit is its own group, in order: the axis does not change."""
    return self.n_large == self.n_small and np.array_equal(self.g, np.arange(self.n_small))

  @property
  def members(self) -> np.ndarray | None:
    """(n_small, k) large indices of each group, in index order, when every group has the same size k; else None."""
    if len(set(self.counts.tolist())) != 1:
      return None
    return np.argsort(self.g, kind="stable").reshape(self.n_small, int(self.counts[0]))

  @property
  def first_mask(self) -> np.ndarray:
    """(n_large,) bool: True for the first member of each group."""
    return self.first[self.g] == np.arange(self.n_large)

  def broadcast(self, v, ndim: int, axis: int) -> np.ndarray:
    """A per-unit vector (one entry per small or per large unit) shaped to broadcast along ``axis`` of ``ndim``."""
    v = np.asarray(v)
    if v.shape not in ((self.n_small,), (self.n_large,)):
      raise ValueError(f"broadcast needs one entry per small ({self.n_small}) or large ({self.n_large}) unit, got "
                       f"shape {v.shape}.")
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)

  def sum_groups(self, x, axis: int):
    """Sums along ``axis`` the entries of each group: n_large -> n_small entries.

    Equal groups are gathered into a new axis of size k and reduced, several times faster on CPU than XLA's
    scatter-add; unequal groups fall back to ``segment_sum``.
    """
    members = self.members
    if members is not None:
      y = jnp.take(x, jnp.asarray(members.reshape(-1)), axis=axis)
      y = y.reshape(x.shape[:axis] + members.shape + x.shape[axis + 1:])
      return jnp.sum(y, axis=axis + 1)
    moved = jnp.moveaxis(x, axis, 0)
    summed = jax.ops.segment_sum(moved, jnp.asarray(self.g), num_segments=self.n_small, indices_are_sorted=False)
    return jnp.moveaxis(summed, 0, axis)

  def mean_groups(self, x, axis: int):
    """Averages along ``axis`` the entries of each group, as ``x_first + sum_p (x_p - x_first) / n``.

    Written so rather than ``sum / n`` because it is exact on copies: when every member equals the first, the
    differences are exactly zero and the mean is the first member bit for bit, for any group size.
    """
    anchor = jnp.take(x, jnp.asarray(self.first[self.g]), axis=axis)
    diffs = self.sum_groups(x - anchor, axis)
    n = self.broadcast(self.counts.astype(x.dtype), x.ndim, axis)
    return jnp.take(x, jnp.asarray(self.first), axis=axis) + diffs / n

  def duplicate(self, y, axis: int):
    """Copies each small unit to every member of its group along ``axis``: n_small -> n_large entries."""
    return jnp.take(y, jnp.asarray(self.g), axis=axis)


def check_groups(groups, n_large: int, what: str) -> Groups:
  if isinstance(groups, np.ndarray):  # An (n_small, k) array of indices, or its rows: taken as the lists they hold.
    groups = groups.tolist()
  if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
    raise ValueError(f"The {what} scheme must be a list of lists of indices, got {groups!r}.")
  out, seen = [], {}
  for i, entry in enumerate(groups):
    if isinstance(entry, np.ndarray):
      entry = entry.tolist()
    if isinstance(entry, (int, np.integer)) or not isinstance(entry, Sequence) or len(entry) == 0:
      raise ValueError(f"{what} scheme entry {i} is {entry!r}; each entry must be a non-empty list of large-model "
                       f"{what} indices merged into small {what} {i}.")
    for idx in entry:
      if not isinstance(idx, (int, np.integer)) or isinstance(idx, bool):
        raise ValueError(f"{what} scheme entry {i} holds {idx!r}, which is not an integer index.")
      if not 0 <= idx < n_large:
        raise ValueError(f"{what} scheme entry {i} holds index {idx}, out of range: the large model has "
                         f"{n_large} {what} (valid indices 0..{n_large - 1}).")
      if idx in seen:
        raise ValueError(f"{what} scheme uses large index {idx} twice (entries {seen[idx]} and {i}); every large "
                         f"index must appear in exactly one entry.")
      seen[idx] = i
    out.append(tuple(int(x) for x in entry))
  missing = sorted(set(range(n_large)) - set(seen))
  if missing:
    raise ValueError(f"{what} scheme leaves large indices {missing} unassigned; every one of the {n_large} large "
                     f"{what} must appear in exactly one entry.")
  return tuple(out)


def default_width_groups(num_heads: int, factor: int) -> Groups:
  """Small head i merges large heads i, i + H_S, i + 2 H_S, ... (the paper's and the reference's halving)."""
  if factor < 1 or num_heads % factor:
    raise ValueError(f"Cannot shrink {num_heads} heads by a width factor of {factor}: the factor must divide the "
                     f"number of heads. Pass an explicit width scheme instead.")
  n_s = num_heads // factor
  return tuple(tuple(i + k * n_s for k in range(factor)) for i in range(n_s))


def kv_groups(large: ModelConfig, heads: Groups) -> Groups:
  """The key/value-head scheme that goes with the query-head scheme ``heads`` under grouped-query attention: one
  entry per small key/value head listing the large key/value heads merged into it.

  Raises ValueError when no small GQA model fits: the small heads tied together by shared key/value heads must form
  equal runs of consecutive heads (small query head i reads key/value head i // (heads per key/value head)).
  """
  n_large, n_kv = large.num_heads, large.kv_heads
  per_kv = n_large // n_kv
  g = GroupMap.from_groups(heads, n_large).g
  parent = list(range(len(heads)))  # Union-find over small heads: those that must share a key/value head.

  def root(i):
    while parent[i] != i:
      parent[i] = parent[parent[i]]
      i = parent[i]
    return i

  for j in range(n_kv):
    served = sorted({int(g[p]) for p in range(j * per_kv, (j + 1) * per_kv)})
    for i in served[1:]:
      parent[root(i)] = root(served[0])
  components: dict[int, list[int]] = {}
  for i in range(len(heads)):
    components.setdefault(root(i), []).append(i)
  runs = sorted(components.values())
  sizes = sorted({len(c) for c in runs})
  shown = [list(h) for h in heads]
  if len(sizes) > 1:
    raise ValueError(f"The width scheme {shown} leaves no grouped-query layout for the small model: with "
                     f"{per_kv} query heads per key/value head in the large model, the small heads that must share a "
                     f"key/value head are {runs}, groups of sizes {sizes}, so num_kv_heads would not divide "
                     f"num_heads={len(heads)}. Merge query heads in matching places of the key/value groups that merge "
                     f"(head j*{per_kv}+t with head j'*{per_kv}+t), as the default halving does when its factor "
                     f"divides num_kv_heads.")
  size = sizes[0]
  for k, c in enumerate(runs):
    if c != list(range(k * size, (k + 1) * size)):
      raise ValueError(f"The width scheme {shown} splits a grouped-query-attention group: the small heads {runs} "
                       f"must each share one key/value head (their large query heads read the same key/value heads), "
                       f"but small query head i reads key/value head i // {size}, so each such set must be a run of "
                       f"{size} consecutive small heads. Reorder the scheme's entries so that they are.")
  kv_of = lambda i: sorted({p // per_kv for p in heads[i]})
  return tuple(tuple(sorted({j for i in c for j in kv_of(i)})) for c in runs)


def default_depth_groups(num_layers: int, factor: int, mode: str) -> Groups:
  """Adjacent: small layer i merges large layers (r i .. r i + r - 1). Stride: i, i + L_S, i + 2 L_S, ..."""
  if mode not in DEPTH_MODES:
    raise ValueError(f"depth_mode must be one of {DEPTH_MODES}, got {mode!r}.")
  if factor < 1 or num_layers % factor:
    raise ValueError(f"Cannot shrink {num_layers} layers by a depth factor of {factor}: the factor must divide the "
                     f"number of layers. Pass an explicit depth scheme instead.")
  n_s = num_layers // factor
  if mode == "adjacent":
    return tuple(tuple(factor * i + k for k in range(factor)) for i in range(n_s))
  return tuple(tuple(i + k * n_s for k in range(factor)) for i in range(n_s))
