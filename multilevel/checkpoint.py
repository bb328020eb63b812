"""Orbax checkpoints that resume anywhere in a V-cycle.

A checkpoint has two items: ``state`` (params, optimizer state, and the pre-coalescing snapshots that later
interpolations need) and ``meta`` (JSON: stage, step in stage, global step, data-iterator position, counters, the
config it belongs to). Orbax writes each save to a temporary folder and renames it when complete, so a save killed
half-way is never taken for a checkpoint; the previous one is used instead.

Orbax checks the structure of what it reads, not the bytes: a data file damaged in place (a bad disk, a partial copy)
can read back as other numbers without any error. So every save also records a CRC-32 of each array's bytes in the
``meta`` item (``checksums``; ``checkpoint.verify``, on by default), and a restore recomputes them and refuses a
checkpoint whose arrays differ, naming them. Checkpoints written without checksums are read as before.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import zlib
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from multilevel.typed_config import ConfigError, check_fields


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """The ``checkpoint`` section."""

  every: int = 200  # Steps between checkpoints (0: only at stage ends and transitions).
  keep: int = 2  # Checkpoints kept on disk.
  async_save: bool = True  # Write in the background while training goes on.
  verify: bool = True  # CRC-32 of every array at save, checked at restore (a damaged checkpoint is refused).

  def __post_init__(self):
    check_fields(self, "checkpoint")
    if self.every < 0 or self.keep < 1:
      raise ConfigError(f"checkpoint.every must be >= 0 and checkpoint.keep >= 1, got {self.every} and {self.keep}.")


class CheckpointError(RuntimeError):
  """A checkpoint is missing, unreadable, or belongs to another run."""


def after_divergence(directory: str) -> str:
  """What to do after a run diverged (a NaN loss or parameter), said the same way wherever it is found."""
  return (f"Nothing was saved after it: the last good checkpoint is in {directory}, and the same command resumes "
          f"from there with the same config. To train with a lower train.lr or a longer warm-up, start again in a "
          f"new --workdir (a resumed run keeps its config); or check the data.")


class Checkpointer:
  """Saves and restores ``(state tree, meta dict)`` pairs under ``directory``; ids are a save counter.

  Every failure of Orbax (or of tensorstore below it) ends in one ``CheckpointError`` that names the checkpoint
  folder, the cause and what to do; a save that fails leaves the previous checkpoints as they were.
  """

  def __init__(self, directory: str, *, keep: int = 2, async_save: bool = True, verify: bool = True):
    self.directory = os.path.abspath(os.path.expanduser(directory))
    self.verify = verify
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    try:
      self._mngr = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))
    except Exception as e:
      raise CheckpointError(f"Cannot use {self.directory} for checkpoints ({_cause(e)}). Check that the folder can "
                            f"be created and written, or choose another --workdir.") from None
    self._saving: Optional[int] = None
    _silence_closed_loop_callbacks()  # A background save can fail before any of our calls sees it.

  def latest(self) -> Optional[int]:
    return self._mngr.latest_step()

  def save(self, save_id: int, state: Any, meta: dict) -> None:
    self.wait()  # A failure of the previous, asynchronous save is reported under its own id.
    if self.verify:
      meta = dict(meta, checksums=tree_checksums(state))
    try:
      self._mngr.save(save_id, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        meta=ocp.args.JsonSave(meta)))
    except Exception as e:
      raise self._write_failed(save_id, e) from None
    self._saving = save_id

  def wait(self) -> None:
    try:
      self._mngr.wait_until_finished()
    except Exception as e:
      raise self._write_failed(self._saving, e) from None

  def restore_meta(self, save_id: int) -> dict:
    try:
      out = self._mngr.restore(save_id, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
      return dict(out["meta"])
    except Exception as e:  # Orbax raises many types for damaged files.
      raise CheckpointError(self._damaged(save_id, e)) from None

  def restore_state(self, save_id: int, abstract_state: Any) -> Any:
    """The state tree of checkpoint ``save_id`` restored into ``abstract_state``'s structure and shardings, its
    arrays checked against the checksums saved with it."""
    try:
      out = self._mngr.restore(save_id, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    except Exception as e:
      raise CheckpointError(self._damaged(save_id, e)) from None
    self._check(save_id, out["state"])
    return out["state"]

  def restore_saved(self, save_id: int) -> Any:
    """The state tree as saved (arrays on the default device), without a target tree: for reading a run's weights
    outside the driver. Its parameters are checked against the checksums saved with it (without a target tree the
    optimizer state comes back as plain containers, so only ``params`` is compared)."""
    try:
      out = self._mngr.restore(save_id, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    except Exception as e:
      raise CheckpointError(self._damaged(save_id, e)) from None
    self._check(save_id, {"params": out["state"]["params"]}, only_params=True)
    return out["state"]

  def _check(self, save_id: int, tree: Any, only_params: bool = False) -> None:
    if not self.verify:
      return
    saved = self.restore_meta(save_id).get("checksums")
    if saved is None:  # Written before checksums were recorded, or with checkpoint.verify off.
      return
    got = tree_checksums(tree)
    if only_params:
      saved = {k: v for k, v in saved.items() if k.startswith("params/")}
    bad = sorted(k for k in set(saved) | set(got) if saved.get(k) != got.get(k))
    if bad:
      raise CheckpointError(
          f"Checkpoint {save_id} in {self.directory} is damaged: {len(bad)} of its {len(saved)} arrays do not match "
          f"the checksums written when it was saved ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}). Delete "
          f"that checkpoint folder ({os.path.join(self.directory, str(save_id))}) to resume from an earlier one, or "
          f"start a new --workdir.")

  def _damaged(self, save_id: int, e: Exception) -> str:
    return (f"Checkpoint {save_id} in {self.directory} could not be read ({_cause(e)}). It is damaged or was written "
            f"by a different model/config. Delete that checkpoint folder ({os.path.join(self.directory, str(save_id))})"
            f" to resume from an earlier one, or start a new --workdir.")

  def _write_failed(self, save_id, e: Exception) -> CheckpointError:
    kept = [s for s in self._mngr.all_steps() if s != save_id]
    previous = (f"The last complete checkpoint ({max(kept)}) is intact: free the space (or fix the folder), then run "
                "the same command to resume from it." if kept else "No complete checkpoint exists yet: free the "
                "space (or fix the folder) and run the same command again.")
    return CheckpointError(f"Could not write checkpoint {save_id} to {self.directory} ({_cause(e)}). {previous}")

  def close(self) -> None:
    try:
      self._mngr.wait_until_finished()
    except Exception as e:
      raise self._write_failed(self._saving, e) from None
    finally:
      self._mngr.close()


def tree_checksums(tree: Any) -> dict[str, int]:
  """``{path: CRC-32}`` of every array leaf's bytes, its path the keys, attribute names and indices along the way
  joined by ``/`` (so a named tuple and the dict Orbax reads it back as without a target tree share paths). One
  array at a time comes to the host (``metrics.on_host``), so every process calls this and gets the same checksums."""
  from multilevel.metrics import on_host
  out = {}
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    a = on_host(x)
    name = "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
    # The bytes are read in place (a uint8 view; any dtype, bfloat16 included), after the shape and dtype.
    out[name] = zlib.crc32(a.reshape(-1).view(np.uint8), zlib.crc32(f"{a.shape}{a.dtype}".encode()))
  return out


def load_params(workdir: str) -> Any:
  """The parameters of a run's latest checkpoint (``WORKDIR/checkpoints``), as the level it was training held them;
  at the end of a run, the trained target model's (e.g. for ``multilevel.interop`` export)."""
  directory = os.path.join(os.path.abspath(os.path.expanduser(workdir)), "checkpoints")
  if not os.path.isdir(directory):
    raise CheckpointError(f"No checkpoints under {directory}: pass the --workdir of a run.")
  ckpt = Checkpointer(directory, async_save=False)
  try:
    latest = ckpt.latest()
    if latest is None:
      raise CheckpointError(f"No complete checkpoint in {directory}: the run wrote none yet (or they were deleted).")
    return ckpt.restore_saved(latest)["params"]
  finally:
    ckpt.close()


def load_run(workdir: str):
  """``(ModelConfig, params)`` of a finished run: the target model as the run ended, checked against the digest its
  ``summary.json`` recorded (``params_sha256``), ready for ``multilevel.models.apply`` or ``interop.save_hf``."""
  from multilevel.metrics import params_digest
  from multilevel.models import ModelConfig
  path = os.path.join(os.path.expanduser(workdir), "summary.json")
  if not os.path.isdir(os.path.expanduser(workdir)):
    raise CheckpointError(f"No folder {workdir}: pass the --workdir of a finished experiments.train run.")
  if not os.path.exists(path):
    raise CheckpointError(f"No summary.json in {workdir}: the run has not finished (run the same command to finish "
                          f"it), or this is not a run's --workdir.")
  with open(path, encoding="utf-8") as f:
    summary = json.load(f)
  params = load_params(workdir)
  if params_digest(params) != summary["params_sha256"]:
    raise CheckpointError(f"The latest checkpoint in {workdir} is not the parameters the run ended with (its digest "
                          f"differs from summary.json's params_sha256): the folder was changed after the run.")
  return ModelConfig.from_dict(summary["model"]), params


def _cause(e: Exception) -> str:
  """The innermost cause of an Orbax error in a few words (tensorstore nests them in long chains)."""
  while e.__cause__ is not None and e.__cause__ is not e:
    e = e.__cause__
  text = " ".join(str(e).split())
  return f"{type(e).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def _silence_closed_loop_callbacks() -> None:
  """Installed once per process. After an Orbax read or write fails, tensorstore's I/O threads still complete their pending operations and call
  back into the asyncio loop Orbax has closed; Python would print each ``RuntimeError('Event loop is closed')`` as
  an unraisable exception (hundreds of tracebacks after the real error). Those, and only those, are dropped."""
  previous = sys.unraisablehook
  if getattr(previous, "_multilevel_filter", False):
    return

  def hook(args):
    if isinstance(args.exc_value, RuntimeError) and str(args.exc_value) == "Event loop is closed":
      return
    previous(args)

  hook._multilevel_filter = True
  sys.unraisablehook = hook


def abstract_like(tree: Any, shardings) -> Any:
  """ShapeDtypeStructs with the ``shardings`` (a tree like ``tree``, or one sharding for every leaf): Orbax restore
  targets, read straight into place on the current mesh, whatever mesh wrote them."""
  if isinstance(shardings, jax.sharding.Sharding):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings), tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def config_diff(saved: dict, current: dict, prefix: str = "", defaults: dict | None = None) -> list[str]:
  """Keys whose values differ between two nested JSON dicts.

  With ``defaults`` (a dict of the same shape), a key the saved config lacks is not a difference when its current
  value is its default: a field added to the library after the checkpoint was written, left at its default (which
  by this library's rule computes what the code did before the field existed), does not block a resume."""
  out = []
  for k in sorted(set(saved) | set(current)):
    a, b = saved.get(k, "<missing>"), current.get(k, "<missing>")
    d = defaults.get(k, "<missing>") if isinstance(defaults, dict) else "<missing>"
    if isinstance(a, dict) and isinstance(b, dict):
      out += config_diff(a, b, f"{prefix}{k}.", d if isinstance(d, dict) else None)
    elif a == "<missing>" and b == d and b != "<missing>":
      continue
    elif a != b:
      out.append(f"{prefix}{k}: saved {json.dumps(a)} vs now {json.dumps(b)}")
  return out


class _QuietOrbax:
  """A logging filter for Orbax's records: its per-save INFO chatter is dropped, its warnings and errors pass as one
  line each (without the traceback of its background threads: the CheckpointError that follows says what failed)."""

  def filter(self, record) -> bool:
    if "orbax" not in (record.pathname or ""):
      return True
    record.exc_info, record.exc_text = None, None
    return record.levelno >= 30


class _AbandonedFutures:
  """Drops asyncio's "exception was never retrieved" records: after a failed save or restore they are the futures
  Orbax's closed event loop left behind, reported at exit after the one CheckpointError that says what failed."""

  def filter(self, record) -> bool:
    return "exception was never retrieved" not in str(record.msg)


def quiet_orbax_logs() -> None:
  import logging as pylogging
  for handler in pylogging.getLogger().handlers + pylogging.getLogger("absl").handlers:
    handler.addFilter(_QuietOrbax())
  pylogging.getLogger("absl").addFilter(_QuietOrbax())
  pylogging.getLogger("asyncio").addFilter(_AbandonedFutures())
