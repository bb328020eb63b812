"""Breaking the symmetry of a grown model without changing its function.

De-coalescing makes exact copies: every unit of a merged group (a head, a hidden or an FFN unit) carries the same
value everywhere in the network, and units that are equal get equal gradients, so without help they stay copies
forever and the grown model keeps the small model's capacity. The paper breaks the tie by interpolating with the
model from before coalescing, which moves the function away from the small model's (measured here: +0.26 nats on GPT
at 21 tokens per parameter, about 200 steps of training to win back).

``split_noise`` breaks it without moving the function. Wherever copies are *read* (the input side of a kernel:
``HIDDEN_IN``, ``HEADS_IN``, ``FFN_IN``), it adds to each copy's weights noise that sums to zero over the copies of
the group, so ``sum_c (w/n + delta_c) x = w x`` for equal ``x_c = x``: the output is unchanged (up to rounding) and
the copies' incoming gradients now differ. Units that were not merged (groups of one) get no noise; embeddings,
LayerNorms and biases are left alone. Coalescing the result gives back the small model up to rounding, since the
noise sums to zero inside every group.

``fresh_layers`` does the same for depth: the layers that ``depth_growth='zero'`` adds start as identities (their
residual outputs zero) but copy a neighbour's other weights; it draws those weights fresh and keeps the zeros.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from multilevel.models import axes as A
from multilevel.models import check_params
from multilevel.operators.finite import require_finite
from multilevel.operators.groups import GroupMap
from multilevel.operators.mapping import LevelMap, check_mapping
from multilevel.tree import flatten, unflatten

READ_SIDES = (A.HIDDEN_IN, A.HEADS_IN, A.FFN_IN)


def _center_in_groups(r, axis: int, gm: GroupMap):
  """``r`` minus its mean over each group along ``axis``: sums to zero (up to rounding) within every group."""
  sums = gm.sum_groups(r, axis)
  return r - gm.duplicate(sums / gm.broadcast(gm.counts.astype(r.dtype), r.ndim, axis), axis)


def split_noise(grown: Mapping, mapping: LevelMap, *, scale: float, seed: int = 0, check: bool = True,
                check_finite: bool = True) -> dict:
  """Adds zero-sum noise across the copies of every merged unit, on the read side of each kernel.

  Args:
    grown: parameters of ``mapping.large``, normally ``decoalesce(small, mapping)``.
    mapping: the level map the tree was grown with.
    scale: noise standard deviation relative to each parameter's own standard deviation (0 returns ``grown``).
    seed: PRNG seed; each parameter draws from its own fold of the key.
    check: require exactly the structure and shapes of a ``mapping.large`` model.
    check_finite: refuse a NaN or an infinity (ValueError naming the parameter); skipped under jit, where the
      values are tracers.

  Returns a new tree. When the copies in ``grown`` are exact (a de-coalesced tree, before interpolation), the
  model computes the same function up to fp32 rounding.
  """
  check_mapping(mapping, "split_noise(grown, mapping, scale=...)")
  if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) or not scale >= 0.0:
    raise ValueError(f"split_noise scale must be a number >= 0 (relative noise level), got {scale!r}.")
  if check:
    check_params(grown, mapping.large, "the tree to break the symmetry of")
  if check_finite:
    require_finite(grown, "the tree to break the symmetry of")
  key = jax.random.PRNGKey(seed)
  out = {}
  for index, (name, x) in enumerate(sorted(flatten(grown).items())):
    x = jnp.array(x)
    roles = mapping.roles(name, x.ndim)
    axes = [i for i, r in enumerate(roles) if r in READ_SIDES]
    maps = [mapping.rule(roles[i])[0] for i in axes]
    merged = [(i, gm) for i, gm in zip(axes, maps) if int(gm.counts.max()) > 1]
    if merged and scale:
      r = jax.random.normal(jax.random.fold_in(key, index), x.shape, jnp.float32)
      for axis, gm in merged:  # Centering along one axis keeps the zero sums along the others.
        r = _center_in_groups(r, axis, gm)
      x = (x + float(scale) * jnp.std(x.astype(jnp.float32)) * r).astype(x.dtype)
    out[name] = x
  return unflatten(out)


def fresh_layers(grown: Mapping, fresh: Mapping, mapping: LevelMap, *, check: bool = True,
                 check_finite: bool = True) -> dict:
  """The layers that depth growth added, drawn fresh instead of copied, still as identities.

  Under ``depth_growth='zero'`` every layer a group adds (all but the first of each group) is a copy of the small
  layer whose residual-branch outputs (attention and FFN output projections, ``RESIDUAL``) are zero, so it starts
  as an identity of a pre-LN model. Here those added layers take every other parameter (queries, keys, values, the
  FFN's input side, their norms) from ``fresh``, a random initialisation of ``mapping.large``, and keep the zero
  outputs: the function is the grown model's (exactly, for pre-LN families), but the new layers' features are new
  rather than a neighbour's. The first layer of each group is ``grown``'s, as are all parameters without a layer
  axis (embeddings, the final norm). Apply it after ``split_noise``, not before: the noise keeps the function only
  over exact copies, and the added layers' residual outputs are set to zero here, whatever ``grown`` holds there.

  Args:
    grown: parameters of ``mapping.large``, normally ``decoalesce(small, mapping)`` (optionally split-noised).
    fresh: a random initialisation of ``mapping.large`` (``models.init_params``).
    mapping: the level map the tree was grown with; it must change depth with ``depth_growth='zero'``.
    check: require both trees to have exactly the structure and shapes of a ``mapping.large`` model.
    check_finite: refuse a NaN or an infinity in either tree (skipped under jit).
  """
  check_mapping(mapping, "fresh_layers(grown, fresh, mapping)")
  if not mapping.changes_depth:
    raise ValueError(f"fresh_layers replaces the layers that depth growth adds, but this mapping keeps the depth "
                     f"({mapping.large.num_layers} layers at both levels); there is nothing to draw fresh.")
  if mapping.depth_growth != "zero":
    raise ValueError(f"fresh_layers keeps the added layers' residual outputs at zero, as depth_growth='zero' grows "
                     f"them; this mapping grows depth with {mapping.depth_growth!r}, whose added layers are not "
                     f"identities. Make the mapping with depth_growth='zero'.")
  if check:
    check_params(grown, mapping.large, "the grown tree")
    check_params(fresh, mapping.large, "the fresh initialisation")
  if check_finite:
    require_finite(grown, "the grown tree")
    require_finite(fresh, "the fresh initialisation")
  added = ~mapping.layer_map.first_mask
  new = flatten(fresh)
  out = {}
  for name, x in flatten(grown).items():
    x = jnp.array(x)
    roles = mapping.roles(name, x.ndim)
    if A.LAYERS in roles:
      axis = roles.index(A.LAYERS)
      # The residual outputs are set to zero again, not kept: noise that split_noise put there cancels only over
      # copies, which the fresh weights are not.
      value = jnp.zeros_like(x) if A.RESIDUAL in roles else jnp.asarray(new[name], x.dtype)
      x = jnp.where(mapping.layer_map.broadcast(added, x.ndim, axis), value, x)
    out[name] = x
  return unflatten(out)
