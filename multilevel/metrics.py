"""Metrics: JSON lines (the record of a run), TensorBoard events, and the run summary."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

import jax
import numpy as np

from multilevel.files import write_json_atomic  # noqa: F401  (re-exported: callers import it from here)
from multilevel.tree import flatten


class MetricsWriter:
  """Appends one JSON object per record to ``metrics.jsonl`` and mirrors scalars to TensorBoard.

  ``truncate(n)`` keeps the first ``n`` records: a resumed run drops what was logged after its checkpoint, so the
  file reads as if the run had never stopped. TensorBoard's events files cannot be cut, so the events logged after
  the last kept record's step are hidden instead (a purge step, which TensorBoard honours when it reads them).
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True, enabled: bool = True):
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.enabled = enabled
    self.count = 0
    self._tb = None
    self._tb_dir = None
    if enabled and tensorboard:
      try:
        import tensorboardX  # noqa: F401  (optional: the JSON lines are the record)
        self._tb_dir = os.path.join(workdir, "tensorboard")
      except ImportError:
        pass
    self._f = open(self.path, "a", encoding="utf-8") if enabled else None

  def _open_tb(self, purge_step: int | None = None) -> None:
    from tensorboardX import SummaryWriter
    if self._tb is not None:
      self._tb.close()
    # TensorBoard reads a directory's events files in name order; names carry only whole seconds, so a second
    # writer within the same second would overwrite the first one's file without a suffix that orders them.
    self._tb = SummaryWriter(self._tb_dir, purge_step=purge_step, filename_suffix=f".{time.time_ns()}")

  def truncate(self, n: int) -> None:
    if not self.enabled:
      return
    self._f.close()
    lines = []
    if os.path.exists(self.path):
      with open(self.path, encoding="utf-8") as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    if len(lines) < n:
      from absl import logging
      logging.warning("%s holds %d records where the checkpoint resumed from counts %d: the records before it were "
                      "deleted or cut short. Training continues and appends from here; the history that is gone is "
                      "not in the file (nor in plots made from it).", self.path, len(lines), n)
    tmp = self.path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write("".join(ln + "\n" for ln in lines[:n]))
    os.replace(tmp, self.path)
    self._f = open(self.path, "a", encoding="utf-8")
    self.count = min(n, len(lines))
    if self._tb_dir is not None:
      steps = [int(json.loads(ln).get("step", 0)) for ln in lines[:n]]
      self._open_tb(purge_step=max(steps) + 1 if steps else 0)

  def write(self, record: dict[str, Any]) -> None:
    if not self.enabled:
      return
    record = {k: _plain(v) for k, v in record.items() if v is not None}
    self._f.write(json.dumps(record) + "\n")
    self.count += 1
    if self._tb_dir is not None:
      if self._tb is None:
        self._open_tb()
      step = int(record.get("step", 0))
      for k, v in record.items():
        if isinstance(v, (int, float)) and k != "step":
          self._tb.add_scalar(k, v, step)

  def flush(self) -> None:
    if self.enabled:
      self._f.flush()
      os.fsync(self._f.fileno())
      if self._tb is not None:
        self._tb.flush()

  def close(self) -> None:
    if self.enabled:
      self.flush()
      self._f.close()
      if self._tb is not None:
        self._tb.close()


def _plain(v):
  if isinstance(v, (np.generic, np.ndarray)) or hasattr(v, "item"):
    try:
      return v.item()
    except (ValueError, AttributeError):
      return np.asarray(v).tolist()
  return v


def read_metrics(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    raise FileNotFoundError(f"No metrics.jsonl in {workdir}: is it a multilevel run directory?")
  with open(path, encoding="utf-8") as f:
    return [json.loads(ln) for ln in f if ln.strip()]


def on_host(x) -> np.ndarray:
  """One array as a contiguous numpy array on this host; an array sharded over several processes is gathered (a
  collective: every process must call this for it)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.ascontiguousarray(np.asarray(jax.device_get(x)))


def params_digest(params) -> str:
  """sha256 over every parameter's path, shape, dtype and bytes, in path order: equal digests = equal trees.

  One parameter at a time comes to the host (``on_host``), never the whole tree, so every process calls this and
  gets the same digest."""
  h = hashlib.sha256()
  for name, x in sorted(flatten(params).items()):
    x = on_host(x)
    h.update(f"{name}:{x.shape}:{x.dtype};".encode())
    h.update(x.tobytes())
  return h.hexdigest()
