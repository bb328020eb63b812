"""Orbax checkpoints that resume anywhere in a V-cycle.

A checkpoint has two items: ``state`` (params, optimizer state, and the pre-coalescing snapshots that later
interpolations need) and ``meta`` (JSON: stage, step in stage, global step, data-iterator position, counters, the
config it belongs to). Orbax writes each save to a temporary folder and renames it when complete, so a save killed
half-way is never taken for a checkpoint; the previous one is used instead.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  """A checkpoint is missing, unreadable, or belongs to another run."""


class Checkpointer:
  """Saves and restores ``(state tree, meta dict)`` pairs under ``directory``; ids are a save counter."""

  def __init__(self, directory: str, *, keep: int = 2, async_save: bool = True):
    self.directory = os.path.abspath(os.path.expanduser(directory))
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    self._mngr = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

  def latest(self) -> Optional[int]:
    return self._mngr.latest_step()

  def save(self, save_id: int, state: Any, meta: dict) -> None:
    self._mngr.save(save_id, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                      meta=ocp.args.JsonSave(meta)))

  def wait(self) -> None:
    self._mngr.wait_until_finished()

  def restore_meta(self, save_id: int) -> dict:
    try:
      out = self._mngr.restore(save_id, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
      return dict(out["meta"])
    except Exception as e:  # Orbax raises many types for damaged files.
      raise CheckpointError(self._damaged(save_id, e)) from e

  def restore_state(self, save_id: int, abstract_state: Any) -> Any:
    try:
      out = self._mngr.restore(save_id, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
      return out["state"]
    except Exception as e:
      raise CheckpointError(self._damaged(save_id, e)) from e

  def _damaged(self, save_id: int, e: Exception) -> str:
    return (f"Checkpoint {save_id} in {self.directory} could not be read ({type(e).__name__}: {str(e)[:300]}). "
            f"It is damaged or was written by a different model/config. Delete that checkpoint folder to resume "
            f"from an earlier one, or start a new --workdir.")

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()


def abstract_like(tree: Any, sharding) -> Any:
  """ShapeDtypeStructs with ``sharding`` for every leaf (Orbax restore targets)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def config_diff(saved: dict, current: dict, prefix: str = "") -> list[str]:
  """Keys whose values differ between two nested JSON dicts."""
  out = []
  for k in sorted(set(saved) | set(current)):
    a, b = saved.get(k, "<missing>"), current.get(k, "<missing>")
    if isinstance(a, dict) and isinstance(b, dict):
      out += config_diff(a, b, f"{prefix}{k}.")
    elif a != b:
      out.append(f"{prefix}{k}: saved {json.dumps(a)} vs now {json.dumps(b)}")
  return out


class _QuietOrbax:
  """A logging filter that drops Orbax's per-save INFO chatter (warnings and errors still pass)."""

  def filter(self, record) -> bool:
    return record.levelno >= 30 or "orbax" not in (record.pathname or "")


def quiet_orbax_logs() -> None:
  import logging as pylogging
  for handler in pylogging.getLogger().handlers + pylogging.getLogger("absl").handlers:
    handler.addFilter(_QuietOrbax())
  pylogging.getLogger("absl").addFilter(_QuietOrbax())
