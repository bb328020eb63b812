"""Parameter trees as flat ``'/'``-joined paths: the one path vocabulary of the package.

A parameter is named by its path in the nested dict, joined by ``'/'`` (``"layers/attn/query/kernel"``): the axis
tables of the model families, the operators, the decay mask, the checkpoint digests and the interop tables all use
these names.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

SEP = "/"


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """``{'a': {'b': x}}`` -> ``{'a/b': x}`` (plain dicts and FrozenDicts)."""
  out = {}
  for k, v in tree.items():
    name = f"{prefix}{k}"
    if isinstance(v, Mapping):
      out.update(flatten(v, name + SEP))
    else:
      out[name] = v
  return out


def unflatten(flat: Mapping[str, Any]) -> dict:
  """The inverse of ``flatten``."""
  out: dict = {}
  for name, v in flat.items():
    node = out
    *parents, leaf = name.split(SEP)
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  return out


def check_same_structure(a: Mapping, b: Mapping, what_a: str, what_b: str) -> None:
  """Raises ValueError naming the first paths where two trees differ in structure, shape or dtype."""
  if not isinstance(a, Mapping) or not isinstance(b, Mapping):
    bad = what_a if not isinstance(a, Mapping) else what_b
    raise TypeError(f"{bad} must be a parameter tree (nested dict), got "
                    f"{type(a if bad == what_a else b).__name__}.")
  fa, fb = flatten(a), flatten(b)
  only_a, only_b = sorted(set(fa) - set(fb)), sorted(set(fb) - set(fa))
  if only_a or only_b:
    raise ValueError(f"{what_a} and {what_b} have different parameters: only in {what_a}: {only_a[:5]}; only in "
                     f"{what_b}: {only_b[:5]}. Both must come from the same model config.")
  for name in sorted(fa):
    for tree, what in ((fa, what_a), (fb, what_b)):
      if not hasattr(tree[name], "dtype"):
        raise TypeError(f"Parameter {name!r} of {what} is a {type(tree[name]).__name__}, not an array: give arrays "
                        f"(jax.tree.map(jnp.asarray, tree, is_leaf=lambda x: isinstance(x, list)) converts lists).")
    sa, sb = tuple(np.shape(fa[name])), tuple(np.shape(fb[name]))
    if sa != sb:
      raise ValueError(f"Parameter {name!r} has shape {sa} in {what_a} but {sb} in {what_b}; both must come from "
                       f"the same model config.")
    da, db = np.dtype(fa[name].dtype), np.dtype(fb[name].dtype)
    if da != db:
      raise ValueError(f"Parameter {name!r} has dtype {da} in {what_a} but {db} in {what_b}: cast the tree to "
                       f"{db} first (jax.tree.map(lambda x: x.astype(jnp.{db}), tree)).")
