"""Parameter-tree helpers: flat '/'-joined paths, and checks that a tree matches a model config."""

from __future__ import annotations

from typing import Any, Mapping

import jax

from multilevel.models import ModelConfig, abstract_params


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """``{'a': {'b': x}}`` -> ``{'a/b': x}`` (plain dicts and FrozenDicts)."""
  out = {}
  for k, v in tree.items():
    name = f"{prefix}{k}"
    if isinstance(v, Mapping):
      out.update(flatten(v, name + "/"))
    else:
      out[name] = v
  return out


def unflatten(flat: Mapping[str, Any]) -> dict:
  out: dict = {}
  for name, v in flat.items():
    node = out
    *parents, leaf = name.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  return out


def check_same_structure(a: Mapping, b: Mapping, what_a: str, what_b: str) -> None:
  """Raises ValueError naming the first paths where two trees differ in structure, shape or dtype."""
  fa, fb = flatten(a), flatten(b)
  only_a, only_b = sorted(set(fa) - set(fb)), sorted(set(fb) - set(fa))
  if only_a or only_b:
    raise ValueError(f"{what_a} and {what_b} have different parameters: only in {what_a}: {only_a[:5]}; only in "
                     f"{what_b}: {only_b[:5]}. Both must come from the same model config.")
  for name in sorted(fa):
    sa, sb = tuple(fa[name].shape), tuple(fb[name].shape)
    if sa != sb:
      raise ValueError(f"Parameter {name!r} has shape {sa} in {what_a} but {sb} in {what_b}; both must come from "
                       f"the same model config.")
    da, db = jax.numpy.dtype(fa[name].dtype), jax.numpy.dtype(fb[name].dtype)
    if da != db:
      raise ValueError(f"Parameter {name!r} has dtype {da} in {what_a} but {db} in {what_b}.")


def check_matches_config(params: Mapping, cfg: ModelConfig, what: str = "params") -> None:
  """Raises ValueError unless ``params`` has exactly the structure and shapes of a fresh model of ``cfg``."""
  if not isinstance(params, Mapping):
    raise TypeError(f"{what} must be a parameter tree (nested dict), got {type(params).__name__}.")
  check_same_structure(params, abstract_params(cfg), what,
                       f"a {cfg.family} model with L={cfg.num_layers}, heads={cfg.num_heads}, width={cfg.width}")
