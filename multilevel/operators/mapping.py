"""How a large model maps onto a small one: head groups, layer groups, and the options of each level.

A ``LevelMap`` is the whole description the operators need. It is a frozen, hashable dataclass, so it can be a static
argument of ``jax.jit``. Build one with ``make_mapping``; it validates the schemes and derives the small config.

The two classes are also the vocabulary the operators are written in, public for new ones: ``LevelMap.roles`` gives
each axis of a parameter its role, ``LevelMap.rule`` the group map and factor of a role, and a ``GroupMap``'s
``sum_groups``, ``mean_groups``, ``duplicate``, ``broadcast`` and ``members`` act along one axis.

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
import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from multilevel.models import FAMILY, ModelConfig
from multilevel.models import axes as A

Groups = tuple[tuple[int, ...], ...]
DEPTH_MODES = ("adjacent", "stride")
DEPTH_GROWTH = ("copy", "scaled", "zero")


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


def _check_groups(groups, n_large: int, what: str) -> Groups:
  if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
    raise ValueError(f"The {what} scheme must be a list of lists of indices, got {groups!r}.")
  out, seen = [], {}
  for i, entry in enumerate(groups):
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


@dataclasses.dataclass(frozen=True)
class LevelMap:
  """One level of coalescing: ``large`` -> ``small``.

  Attributes:
    heads: width scheme, one entry per small head listing the large heads merged into it (groups of one size, unless
      ``make_mapping`` was given ``allow_unequal_width_groups``).
    layers: depth scheme, one entry per small layer listing the large layers merged into it.
    embed_factor: for models whose embedding is tied to the LM head (BERT, GPT, LLaMA with ``tie_embeddings``),
      coalescing multiplies the averaged embedding columns by this factor and growth divides by it. ``None``
      (default) uses each group's size, which is the reference code's factor 2 for pairs and keeps BERT's logits
      exactly on growth for equal groups of any size.
      Ignored for DeiT and untied LLaMA, whose embeddings are averaged like any output.
    preln_exact: also scale residual-branch outputs (attention and FFN output projections) by the embedding rule,
      which makes width growth function-preserving for pre-LN GPT and tied LLaMA (exact up to the norm's epsilon;
      method.md 5.2). Default False = the reference behaviour. Not meaningful for post-LN BERT (raises); a no-op for
      DeiT and untied LLaMA, whose width growth keeps the function without it.
    depth_growth: how merged layers come back on growth. 'copy' (the reference): every copy is the small layer,
      which does not keep the function. For the residual-branch outputs (attention and FFN output projections)
      only: 'scaled' divides each copy's output by the group size (coalescing multiplies the average back), so a
      grown stack adds about the small layer's update once; 'zero' keeps the first copy and zeroes the others'
      outputs (coalescing sums), so for pre-LN models (GPT, DeiT) the new layers start as identities and depth
      growth keeps the function exactly. Both keep ``coalesce(decoalesce(p)) == p`` (bit for bit for
      'zero'; for 'scaled' when the layer groups have power-of-two sizes, within a rounding otherwise).
    kv_heads: key/value-head scheme under grouped-query attention (``kv_groups``), one entry per small key/value
      head; () when the model has no GQA (its key/value heads are its query heads).
  """

  large: ModelConfig
  small: ModelConfig
  heads: Groups
  layers: Groups
  embed_factor: Optional[float] = None
  preln_exact: bool = False
  depth_growth: str = "copy"
  kv_heads: Groups = ()

  @functools.cached_property
  def head_map(self) -> GroupMap:
    return GroupMap.from_groups(self.heads, self.large.num_heads)

  @functools.cached_property
  def kv_map(self) -> GroupMap:
    """The map of the key/value heads (grouped-query attention); the head map when there is no GQA scheme."""
    if not self.kv_heads:
      return self.head_map
    return GroupMap.from_groups(self.kv_heads, self.large.kv_heads)

  @functools.cached_property
  def hidden_map(self) -> GroupMap:
    return self.head_map.expand(self.large.head_dim)

  @functools.cached_property
  def ffn_map(self) -> GroupMap:
    return self.head_map.expand(self.large.ffn_dim // self.large.num_heads)

  @functools.cached_property
  def layer_map(self) -> GroupMap:
    return GroupMap.from_groups(self.layers, self.large.num_layers)

  @property
  def changes_depth(self) -> bool:
    return len(self.layers) != self.large.num_layers

  def roles(self, name: str, ndim: int) -> tuple:
    """The axis roles (``multilevel.models.axes``) of parameter ``name`` with ``ndim`` axes, from the family table.

    Raises ValueError when the table has no such parameter or declares another number of axes.
    """
    family = self.large.family
    table = FAMILY[family].axes
    if name not in table:
      raise ValueError(f"Parameter {name!r} has no axis roles in the {family} table; the tree does not come from a "
                       f"multilevel {family} model.")
    roles = table[name]
    if len(roles) != ndim:
      raise ValueError(f"Parameter {name!r} has {ndim} axes but the {family} table declares {len(roles)}.")
    return roles

  def rule(self, role: str) -> tuple[GroupMap, np.ndarray | None]:
    """How an axis of role ``role`` maps: its group map and the per-small-unit factor s (None for s = 1).

    Coalescing gives ``y_i = s_i * mean_{p in G_i} x_p`` and growth ``x_p = y_{g(p)} / s_{g(p)}``: s = 1 on output
    sides and layers, the group sizes on input sides, the embedding factor on tied embeddings (and on residual
    outputs with ``preln_exact``). The layer axis's residual-branch rule under ``depth_growth`` is the operators'.
    """
    if role not in A.ROLES:
      raise ValueError(f"Unknown axis role {role!r}; the roles are {A.ROLES}.")
    if role == A.LAYERS:
      return self.layer_map, None
    space, side = role.split(":")
    gm = {"hidden": self.hidden_map, "heads": self.head_map, "kv": self.kv_map, "ffn": self.ffn_map}[space]
    if side == "out":
      return gm, None
    if side == "in":
      return gm, gm.counts
    embed_scale = None
    if FAMILY[self.large.family].ties(self.large):
      embed_scale = gm.counts if self.embed_factor is None else np.full(gm.n_small, self.embed_factor)
    if side == "embed":
      return gm, embed_scale
    return gm, embed_scale if self.preln_exact else None  # The residual side.

  def describe(self) -> str:
    L, S = self.large, self.small
    return (f"{L.family} L{L.num_layers}/d{L.width}/h{L.num_heads} -> L{S.num_layers}/d{S.width}/h{S.num_heads} "
            f"(heads {[list(g) for g in self.heads]}, layers {[list(g) for g in self.layers]}"
            + (f", key/value heads {[list(g) for g in self.kv_heads]})" if self.kv_heads else ")"))


def make_mapping(large: ModelConfig, *, width=None, depth=None, width_factor: int = 2, depth_factor: int = 2,
                 depth_mode: str = "adjacent", embed_factor: Optional[float] = None, preln_exact: bool = False,
                 depth_growth: str = "copy", allow_unequal_width_groups: bool = False) -> LevelMap:
  """Validates the schemes and returns the ``LevelMap`` from ``large`` to the derived small config.

  ``width``/``depth`` are explicit schemes; when ``None`` the defaults halve (``*_factor``), and a factor of 1 keeps
  that dimension. ``depth_mode`` chooses the default depth grouping ('adjacent' = paper, 'stride' = reference json).
  A width scheme whose groups have different sizes is refused unless ``allow_unequal_width_groups``: the operators
  are well defined on it, but no growth from it keeps the function (LayerNorm averages over the duplicated units),
  and ``preln_exact`` refuses it whatever the opt-in. Layer groups may have any sizes.
  """
  if not isinstance(large, ModelConfig):
    raise TypeError(f"make_mapping needs a ModelConfig for the large model, got {type(large).__name__}.")
  heads = default_width_groups(large.num_heads, width_factor) if width is None else width
  heads = _check_groups(heads, large.num_heads, "heads")
  layers = default_depth_groups(large.num_layers, depth_factor, depth_mode) if depth is None else depth
  layers = _check_groups(layers, large.num_layers, "layers")
  if preln_exact and not FAMILY[large.family].pre_ln:
    raise ValueError(f"preln_exact applies to pre-LN models (gpt, deit); {large.family} is post-LN and its width "
                     f"growth is already function-preserving. Leave preln_exact=False.")
  sizes = sorted({len(g) for g in heads})
  if preln_exact and len(sizes) > 1:
    raise ValueError(f"preln_exact keeps the function only when every small head merges the same number of large "
                     f"heads (LayerNorm averages over the duplicated units); the width scheme "
                     f"{[list(g) for g in heads]} has groups of sizes {sizes}. Use equal groups, or "
                     f"preln_exact=False (with allow_unequal_width_groups=True).")
  if len(sizes) > 1 and not allow_unequal_width_groups:
    raise ValueError(f"The width scheme {[list(g) for g in heads]} merges different numbers of large heads into the "
                     f"small heads (group sizes {sizes}). Coalescing and growth are well defined on it, but the grown "
                     f"model cannot compute the small model's function: LayerNorm averages over the hidden units, "
                     f"where the copies of a larger group weigh more. Use groups of equal size, or pass "
                     f"allow_unequal_width_groups=True to accept that growth changes the function.")
  if embed_factor is not None and not embed_factor > 0:
    raise ValueError(f"embed_factor must be positive (or None for the group size), got {embed_factor}.")
  if depth_growth not in DEPTH_GROWTH:
    raise ValueError(f"depth_growth must be one of {DEPTH_GROWTH}, got {depth_growth!r}.")
  if large.ffn_dim % large.num_heads:
    raise ValueError(f"The FFN width {large.ffn_dim} is not a multiple of num_heads={large.num_heads}: width "
                     f"coalescing merges the FFN units in num_heads chunks alongside the heads. Pick an FFN width "
                     f"(ffn_size) divisible by the number of heads.")
  kv, small_kv = (), large.num_kv_heads and len(heads)  # Without GQA, key/value heads are the query heads.
  if large.kv_heads != large.num_heads:
    kv = kv_groups(large, heads)
    small_kv = len(kv)
  small_ffn = large.ffn_size // large.num_heads * len(heads) if large.ffn_size else 0
  small = large.replace(num_heads=len(heads), num_layers=len(layers), num_kv_heads=small_kv, ffn_size=small_ffn)
  return LevelMap(large, small, heads, layers, None if embed_factor is None else float(embed_factor),
                  bool(preln_exact), depth_growth, kv)


def make_chain(large: ModelConfig, levels: int, *, widths=None, depths=None, **kw) -> list[LevelMap]:
  """``levels - 1`` maps, each shrinking the previous small model: a multi-level hierarchy.

  ``widths``/``depths`` give one explicit scheme per transition (``None`` entries use the default halving), each in
  the indices of that transition's large model; other keywords (``allow_unequal_width_groups`` among them) go to
  every ``make_mapping`` call.
  """
  for one, many in (("width", "widths"), ("depth", "depths")):
    if kw.get(one) is not None and levels > 2:
      raise ValueError(f"make_chain got one explicit {one} scheme for {levels - 1} transitions; a scheme indexes one "
                       f"level's model only. Pass {many}=[scheme per transition] (None for the default).")
  n = levels - 1
  for name, seq in (("widths", widths), ("depths", depths)):
    if seq is not None and len(seq) != n:
      raise ValueError(f"make_chain({name}=...) needs one scheme per transition: {n} for {levels} levels, "
                       f"got {len(seq)}.")
  maps, cfg = [], large
  for i in range(n):
    extra = dict(kw)
    if widths is not None:
      extra["width"] = widths[i]
    if depths is not None:
      extra["depth"] = depths[i]
    maps.append(make_mapping(cfg, **extra))
    cfg = maps[-1].small
  return maps
