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

  TensorBoard gets two runs: ``tensorboard/`` every scalar against the step, and ``tensorboard/by_flops/`` the
  target model's evaluations against the GFLOPs spent so far (the x axis on which methods are compared: a step of a
  smaller model costs less; the evaluations right after a transition and the smaller models' are left out, as the
  benchmarks read a curve).

  ``truncate(n)`` keeps the first ``n`` records: a resumed run drops what was logged after its checkpoint, so the
  file reads as if the run had never stopped. TensorBoard's events files cannot be cut, so the events logged after
  the last kept record's step (or FLOPs) are hidden instead (a purge step, which TensorBoard honours when it reads
  them).
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True, enabled: bool = True):
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.enabled = enabled
    self.count = 0
    self._tb = None
    self._tb_dir = None
    self._tbf = None  # The FLOPs-axis writer, under tensorboard/by_flops.
    if enabled and tensorboard:
      try:
        import tensorboardX  # noqa: F401  (optional: the JSON lines are the record)
        self._tb_dir = os.path.join(workdir, "tensorboard")
      except ImportError:
        pass
    # Line-buffered: each record reaches the file as it is logged, so a plot of a run in progress is current (the
    # fsync waits for flush(), at checkpoints).
    self._f = open(self.path, "a", encoding="utf-8", buffering=1) if enabled else None

  def _open_tb(self, purge_step: int | None = None, purge_flops: int | None = None) -> None:
    from tensorboardX import SummaryWriter
    for w in (self._tb, self._tbf):
      if w is not None:
        w.close()
    # TensorBoard reads a directory's events files in name order; names carry only whole seconds, so a second
    # writer within the same second would overwrite the first one's file without a suffix that orders them.
    suffix = f".{time.time_ns()}"
    self._tb = SummaryWriter(self._tb_dir, purge_step=purge_step, filename_suffix=suffix)
    self._tbf = SummaryWriter(os.path.join(self._tb_dir, "by_flops"), purge_step=purge_flops,
                              filename_suffix=suffix)

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
    kept = []  # Parsed, TensorBoard or not: a damaged line would count as a record and push a real one out.
    for number, ln in enumerate(lines[:n], 1):
      try:
        kept.append(json.loads(ln))
      except json.JSONDecodeError as e:
        raise ValueError(f"{self.path}, record {number}, is not a JSON record ({e}): the file was edited or "
                         f"damaged. Delete that line (or the file, losing the curve before the checkpoint) and run "
                         f"the same command again.") from None
    tmp = self.path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write("".join(ln + "\n" for ln in lines[:n]))
    os.replace(tmp, self.path)
    self._f = open(self.path, "a", encoding="utf-8", buffering=1)
    self.count = min(n, len(lines))
    if self._tb_dir is not None:
      # Events from the last kept step on are hidden and that step's kept records written again: a transition at
      # that step, logged again by the resumed run, then appears once. The same on the FLOPs axis.
      last = max((int(r.get("step", 0)) for r in kept), default=-1)
      points = [p for p in map(_flops_point, kept) if p is not None]
      last_flops = max(points, default=-1)
      self._open_tb(purge_step=max(last, 0), purge_flops=max(last_flops, 0))
      for r in kept:
        if int(r.get("step", 0)) == last:
          self._tb_scalars(r, flops_axis=False)
        if _flops_point(r) == last_flops:
          self._tb_scalars(r, step_axis=False)

  def write(self, record: dict[str, Any]) -> None:
    if not self.enabled:
      return
    record = {k: _plain(v) for k, v in record.items() if v is not None}
    self._f.write(json.dumps(record) + "\n")
    self.count += 1
    if self._tb_dir is not None:
      if self._tb is None:
        self._open_tb()
      self._tb_scalars(record)

  def _tb_scalars(self, record: dict[str, Any], step_axis: bool = True, flops_axis: bool = True) -> None:
    """A record's numbers as TensorBoard scalars at its step; an evaluation right after a transition (an ``after_*``
    event: a model never trained in that form) under its own tag, ``eval_loss/after_decoalesce``, not on the curve.
    A target model's evaluation also goes on the FLOPs axis."""
    step = int(record.get("step", 0))
    event = str(record.get("event", ""))
    suffix = f"/{event}" if event.startswith("after_") else ""
    # As floats: an int past 2^63 (the FLOPs of a paper-size run) overflows TensorBoard's int conversion.
    numbers = {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if step_axis:
      for k, v in numbers.items():
        if k != "step":
          self._tb.add_scalar(k + suffix if k.startswith("eval_") else k, v, step)
    flops = _flops_point(record)
    if flops_axis and flops is not None:
      for k, v in numbers.items():
        if k.startswith("eval_"):
          self._tbf.add_scalar(k, v, flops)

  def flush(self) -> None:
    if self.enabled:
      self._f.flush()
      os.fsync(self._f.fileno())
      if self._tb is not None:
        self._tb.flush()
        self._tbf.flush()

  def close(self) -> None:
    if self.enabled:
      self.flush()
      self._f.close()
      if self._tb is not None:
        self._tb.close()
        self._tbf.close()


def _flops_point(record: dict[str, Any]) -> int | None:
  """The GFLOPs at which a record goes on TensorBoard's FLOPs axis: a target model's (level 0) evaluation, not one
  right after a transition (as ``eval_curve`` reads a run); else None."""
  if not any(k.startswith("eval_") for k in record) or "flops" not in record or record.get("level", 0) != 0:
    return None
  if str(record.get("event", "")).startswith("after_"):
    return None
  return int(record["flops"] // 1e9)  # In GFLOPs: TensorBoard's steps are int64, and runs reach 1e20 FLOPs and more.


def _plain(v):
  if isinstance(v, (np.generic, np.ndarray)) or hasattr(v, "item"):
    try:
      return v.item()
    except (ValueError, AttributeError):
      return np.asarray(v).tolist()
  return v


def read_metrics(workdir: str) -> list[dict]:
  """The records of ``workdir/metrics.jsonl``. A last line cut short (a crash or a full disk while writing it) is
  left out with a warning; a damaged line before it is refused naming the file and the line."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    raise FileNotFoundError(f"No metrics.jsonl in {workdir}: is it a multilevel run directory?")
  with open(path, encoding="utf-8") as f:
    lines = [(i, ln) for i, ln in enumerate(f, 1) if ln.strip()]
  out = []
  for k, (number, line) in enumerate(lines):
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError as e:
      if k == len(lines) - 1 and not line.endswith("\n"):
        from absl import logging
        logging.warning("%s: its last line (%d) is cut short and is left out (%s).", path, number, e)
        break
      raise ValueError(f"{path}, line {number}, is not a JSON record ({e}): the file was edited or damaged. Delete "
                       f"that line to read the rest.") from None
  return out


def eval_curve(records, target_only: bool = True, metric: str = "eval_loss") -> list[tuple[float, float, float]]:
  """(FLOPs, seconds, value) of the evaluations of a run's records (``read_metrics``), in order: with
  ``target_only`` those of the target model (level 0) alone, as the savings are read. Seconds are the training
  steps' plus the level changes' (``wall_seconds``); the evaluations logged right after a transition (``after_*``
  events: models never trained in that form) have no FLOPs of their own and are left out."""
  out = []
  for r in records:
    if metric in r and "flops" in r and (not target_only or r["level"] == 0):
      out.append((r["flops"], r["train_seconds"] + r.get("transition_seconds", 0.0), r[metric]))
  return out


def wall_seconds(summary: dict) -> float:
  """A run's wall-clock cost: its training steps plus the level-change operators (compiles and evals excluded)."""
  return summary["train_seconds"] + summary.get("transition_seconds", 0.0)


def reach(points, target: float):
  """FLOPs and seconds at which the curve (``eval_curve``) first reaches ``target`` (linear between evaluations),
  else None."""
  prev = None
  for f, s, v in points:
    if v <= target:
      if prev is None or prev[2] == v:
        return f, s
      pf, ps, pv = prev
      w = (pv - target) / (pv - v)
      return pf + w * (f - pf), ps + w * (s - ps)
    prev = (f, s, v)
  return None


def value_at(points, flops: float):
  """The curve's value at ``flops`` (linear between evaluations; clamped at the ends)."""
  if flops <= points[0][0]:
    return points[0][2]
  for (f0, _, v0), (f1, _, v1) in zip(points, points[1:]):
    if f0 <= flops <= f1:
      return v0 + (v1 - v0) * (flops - f0) / max(f1 - f0, 1e-30)
  return points[-1][2]


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
