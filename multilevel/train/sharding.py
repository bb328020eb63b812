"""Sharding from the axis-role table: the same table that drives the operators says how to split every parameter.

A mesh has named axes, at least ``data`` and optionally ``fsdp`` (``train.mesh = "data:2,fsdp:2"``). The batch is
split over both; parameters and optimizer moments are split over ``fsdp`` (ZeRO-3 / FSDP), and XLA inserts the
all-gathers before use and the reduce-scatters of the gradients. Which axis of a parameter is split comes from its
roles (``multilevel.models.axes``) through two small tables, MaxText-style:

  role -> logical axis name   (``LOGICAL``: hidden-like roles are "embed", FFN roles "mlp", heads "heads")
  logical name -> mesh axis   (``FSDP_RULES``, in order of preference: one mesh axis per parameter)

A parameter whose preferred axes do not divide by the mesh axis size stays replicated on it; that choice is logged
once per parameter. The stacked-layer axis is never split (the blocks are scanned over it).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

from multilevel import models as M
from multilevel.models import axes as A
from multilevel.tree import flatten, unflatten
from multilevel.typed_config import ConfigError

MESH_AXES = ("data", "fsdp")  # The batch is split over all of them; parameters over "fsdp".

LOGICAL = {
    A.LAYERS: "layers",
    A.HIDDEN_IN: "embed", A.HIDDEN_OUT: "embed", A.EMBED: "embed", A.RESIDUAL: "embed",
    A.HEADS_IN: "heads", A.HEADS_OUT: "heads", A.KV_HEADS_OUT: "heads",
    A.FFN_IN: "mlp", A.FFN_OUT: "mlp",
}
FSDP_RULES = (("embed", "fsdp"), ("mlp", "fsdp"), ("heads", "fsdp"))

_LOGGED: set = set()


def parse_mesh(spec: str, num_devices: int) -> tuple[tuple[str, int], ...]:
  """``"data:2,fsdp:2"`` -> ``(("data", 2), ("fsdp", 2))``; ``""`` -> all ``num_devices`` on ``data``."""
  if not spec:
    return (("data", num_devices),)
  axes = []
  for part in spec.split(","):
    name, _, size = part.strip().partition(":")
    if name not in MESH_AXES or not size.strip().isdigit() or int(size) < 1:
      raise ConfigError(f"train.mesh={spec!r}: each entry must be <axis>:<size> with an axis in {MESH_AXES} and a "
                        f"positive size, e.g. 'data:2,fsdp:2'; got {part.strip()!r}.")
    if name in dict(axes):
      raise ConfigError(f"train.mesh={spec!r} names the axis {name!r} twice.")
    axes.append((name, int(size)))
  if "data" not in dict(axes):
    axes.insert(0, ("data", 1))
  total = int(np.prod([s for _, s in axes]))
  if total != num_devices:
    raise ConfigError(f"train.mesh={spec!r} has {total} devices but the run uses {num_devices} "
                      f"({jax.device_count()} visible over {jax.process_count()} process(es)); make the product of "
                      f"the sizes equal the devices, or set train.num_devices.")
  return tuple(axes)


def make_mesh(spec: str = "", num_devices: int | None = None) -> jax.sharding.Mesh:
  """The device mesh of ``spec`` over the first ``num_devices`` devices (all by default), with Auto axis types."""
  devices = jax.devices()
  n = len(devices) if not num_devices else int(num_devices)
  if n > len(devices):
    raise ConfigError(f"Asked for {n} devices but only {len(devices)} are visible ({devices[0].platform}, "
                      f"{jax.process_count()} process(es)); lower train.num_devices or train.mesh.")
  axes = parse_mesh(spec, n)
  if jax.process_count() > 1 and n != len(devices):  # Each process feeds its rows of each batch to its own devices.
    raise ConfigError(f"A run of {jax.process_count()} processes uses all their {len(devices)} devices (each process "
                      f"feeds its own); the mesh asks for {n}, which leaves out some process's devices. Set "
                      f"train.num_devices={len(devices)} or 0, and a train.mesh of {len(devices)} devices.")
  names, sizes = tuple(a for a, _ in axes), tuple(s for _, s in axes)
  return jax.make_mesh(sizes, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names), devices=devices[:n])


def axis_size(mesh, name: str) -> int:
  """Size of a mesh axis (1 if the mesh has no such axis); works on an ``AbstractMesh`` too."""
  return int(dict(mesh.shape).get(name, 1))


def batch_spec(mesh) -> P:
  """Rows of a batch split over every mesh axis (data and fsdp alike)."""
  return P(tuple(a for a in mesh.axis_names if a in MESH_AXES))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def param_spec(name: str, shape: Sequence[int], roles: Sequence, mesh, rules=FSDP_RULES) -> P:
  """The PartitionSpec of one parameter: the first axis, in the rules' order of preference, whose logical name maps
  to a mesh axis of size > 1 and whose length divides by it; none: replicated (logged once)."""
  spec: list = [None] * len(shape)
  for logical, mesh_axis in rules:
    size = axis_size(mesh, mesh_axis)
    if size <= 1 or mesh_axis in spec:
      continue
    candidates = [i for i, r in enumerate(roles) if LOGICAL.get(r) == logical]
    fits = [i for i in candidates if shape[i] % size == 0]
    if fits:
      spec[fits[0]] = mesh_axis
    elif candidates and (name, mesh_axis) not in _LOGGED:
      _LOGGED.add((name, mesh_axis))
      logging.info("Sharding: %s %s has no %s axis divisible by %s=%d; replicated on %s.", name, tuple(shape), logical,
                   mesh_axis, size, mesh_axis)
  return P(*spec)


@functools.lru_cache(maxsize=64)
def param_specs(cfg: M.ModelConfig, mesh) -> dict:
  """``{path: PartitionSpec}`` for every parameter of ``cfg`` on ``mesh`` (from the family's axis-role table)."""
  table = M.family_of(cfg).axes
  out = {}
  for name, x in flatten(M.abstract_params(cfg)).items():
    out[name] = param_spec(name, x.shape, table[name], mesh) if name in table else P()
  return out


def param_shardings(cfg: M.ModelConfig, mesh):
  """A tree of ``NamedSharding`` with the structure of ``cfg``'s parameters."""
  return unflatten({k: NamedSharding(mesh, s) for k, s in param_specs(cfg, mesh).items()})


def like_params(tree: Any, abstract_params: Any, shardings: Any, mesh) -> Any:
  """Shardings for ``tree`` (e.g. an optimizer state): every subtree with the structure of the parameters (Adam's
  moments) gets the parameters' shardings; every other leaf (counts, empty states) is replicated."""
  params_def = jax.tree.structure(abstract_params)
  rep = replicated(mesh)

  def walk(node):
    try:
      if jax.tree.structure(node) == params_def:
        return shardings
    except Exception:  # Not a pytree jax knows (cannot happen for optax states; kept defensive).
      pass
    children, treedef = jax.tree_util.tree_flatten(node, is_leaf=lambda x: x is not node)
    if len(children) == 1 and children[0] is node:
      return rep
    return jax.tree_util.tree_unflatten(treedef, [walk(c) for c in children])

  return walk(tree)
