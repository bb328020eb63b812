"""How a large model maps onto a small one: head groups, layer groups, and the options of each level.

A ``LevelMap`` is the whole description the operators need. It is a frozen, hashable dataclass, so it can be a static
argument of ``jax.jit``. Build one with ``make_mapping``; it validates the schemes and derives the small config.

The two classes are also the vocabulary the operators are written in, public for new ones: ``LevelMap.roles`` gives
each axis of a parameter its role, ``LevelMap.rule`` the group map and factor of a role, and a ``GroupMap``'s
``sum_groups``, ``mean_groups``, ``duplicate``, ``broadcast`` and ``members`` act along one axis.

The group maps and the width, key/value and depth schemes they are built from live in ``groups.py``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import numpy as np

from multilevel.models import FAMILY, ModelConfig
from multilevel.models import axes as A
from multilevel.operators.groups import (DEPTH_MODES, GroupMap, Groups, check_groups, default_depth_groups,
                                         default_width_groups, kv_groups)

DEPTH_GROWTH = ("copy", "scaled", "zero")


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
    if not self.changes_width:  # Any FFN width, divisible by the heads or not (SmolLM's 1536 over 9 heads).
      return GroupMap.from_groups(tuple((i,) for i in range(self.large.ffn_dim)), self.large.ffn_dim)
    return self.head_map.expand(self.large.ffn_dim // self.large.num_heads)

  @functools.cached_property
  def layer_map(self) -> GroupMap:
    return GroupMap.from_groups(self.layers, self.large.num_layers)

  @property
  def changes_depth(self) -> bool:
    return len(self.layers) != self.large.num_layers

  @property
  def changes_width(self) -> bool:
    return not _identity(self.heads)

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
  for name, factor, scheme in (("width_factor", width_factor, width), ("depth_factor", depth_factor, depth)):
    if isinstance(factor, bool) or not isinstance(factor, (int, np.integer)):
      raise TypeError(f"make_mapping: {name} must be an integer (2 halves, 1 keeps), got {factor!r}.")
    if scheme is not None and (factor not in (2, 1) or (factor == 1 and _merges(scheme))):  # (2 is the default.)
      raise ValueError(f"make_mapping got both an explicit {name.split('_')[0]} scheme and {name}={factor}: the "
                       f"scheme decides the grouping, so leave {name} at its default.")
  if depth_mode not in DEPTH_MODES:
    raise ValueError(f"depth_mode must be one of {DEPTH_MODES}, got {depth_mode!r}.")
  heads = default_width_groups(large.num_heads, width_factor) if width is None else width
  heads = check_groups(heads, large.num_heads, "heads")
  layers = default_depth_groups(large.num_layers, depth_factor, depth_mode) if depth is None else depth
  layers = check_groups(layers, large.num_layers, "layers")
  firsts = [g[0] for g in layers]
  if firsts != sorted(firsts):
    order = sorted(layers, key=lambda g: g[0])
    raise ValueError(f"The depth scheme {[list(g) for g in layers]} runs the small layers in another order than the "
                     f"large model: the first layer listed in each entry (where growth puts that small layer's "
                     f"function; {firsts}) must increase from entry to entry, or the grown model runs its stack "
                     f"out of order. List the entries in layer order, e.g. {[list(g) for g in order]}.")
  if preln_exact and not FAMILY[large.family].pre_ln:
    raise ValueError(f"preln_exact applies to pre-LN models (gpt, deit, llama); {large.family} is post-LN and its width "
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
  if embed_factor is not None and (isinstance(embed_factor, bool) or not isinstance(
      embed_factor, (int, float, np.integer, np.floating)) or not embed_factor > 0):
    raise ValueError(f"embed_factor must be a positive number (or None for the group size), got {embed_factor!r}.")
  if depth_growth not in DEPTH_GROWTH:
    raise ValueError(f"depth_growth must be one of {DEPTH_GROWTH}, got {depth_growth!r}.")
  if large.ffn_dim % large.num_heads and not _identity(heads):
    raise ValueError(f"The FFN width {large.ffn_dim} is not a multiple of num_heads={large.num_heads}: width "
                     f"coalescing merges the FFN units in num_heads chunks alongside the heads. Pick an FFN width "
                     f"(ffn_size) divisible by the number of heads, or keep the width (width_factor=1: depth only).")
  kv, small_kv = (), large.num_kv_heads and len(heads)  # Without GQA, key/value heads are the query heads.
  if large.kv_heads != large.num_heads:
    kv = kv_groups(large, heads)
    small_kv = len(kv)
  small_ffn = large.ffn_size // large.num_heads * len(heads) if large.ffn_size and not _identity(heads) else \
      large.ffn_size
  small = large.replace(num_heads=len(heads), num_layers=len(layers), num_kv_heads=small_kv, ffn_size=small_ffn)
  return LevelMap(large, small, heads, layers, None if embed_factor is None else float(embed_factor),
                  bool(preln_exact), depth_growth, kv)


def check_mapping(mapping, call: str) -> None:
  """TypeError unless ``mapping`` is a LevelMap; ``call`` is the operator's signature, to show where it goes."""
  if not isinstance(mapping, LevelMap):
    raise TypeError(f"{call}: mapping must be a LevelMap from operators.make_mapping(config), got "
                    f"{type(mapping).__name__}.")


def _merges(scheme) -> bool:
  """A scheme (as given, before validation) with an entry that merges several units."""
  try:
    return any(len(g) > 1 for g in scheme)
  except TypeError:
    return False  # Not a list of lists: check_groups says so.


def _identity(groups) -> bool:
  """Every unit kept as it is: groups (0,), (1,), ..."""
  return all(tuple(g) == (i,) for i, g in enumerate(groups))


class ChainError(ValueError):
  """``make_chain``'s refusal of a transition past the first: ``transition`` (its index), ``level`` (the config that
  could not be coalesced again) and ``reason`` (``make_mapping``'s error) let a caller say it in its own terms."""

  def __init__(self, message: str, transition: int, level: ModelConfig, reason: ValueError):
    super().__init__(message)
    self.transition, self.level, self.reason = transition, level, reason


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
  if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or levels < 1:
    raise ValueError(f"make_chain needs levels, an integer >= 1 (1 = the large model alone), got {levels!r}.")
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
    try:
      maps.append(make_mapping(cfg, **extra))
    except ValueError as e:
      if i == 0:
        raise
      raise ChainError(f"make_chain: transition {i} (level {i}, {cfg.num_layers} layers and {cfg.num_heads} heads, to "
                       f"level {i + 1}) fails: {e} Use fewer levels or a larger model.", i, cfg, e) from None
    cfg = maps[-1].small
  return maps
