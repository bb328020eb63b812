"""The resumable, host-split, prefetching batch iterator shared by text and images.

Every batch is a pure function of (seed, epoch, step): the global batch at ``step`` of ``epoch`` holds the examples
``perm[step*B:(step+1)*B]`` of the epoch's seeded permutation, and host ``p`` of ``P`` takes its contiguous slice
``[p*B/P, (p+1)*B/P)``. So the same seed gives the same batches, the global batch does not depend on the number of
hosts, and the iterator's whole position is ``{'epoch', 'step'}`` (plus a few fields checked on restore).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator

import numpy as np

# make_batch(positions, key, rows) -> dict of numpy arrays.
#   positions: int64[B / P] indices into the split (this host's rows).
#   key: (seed, epoch, step) for per-batch randomness such as augmentation.
#   rows: slice of this host's rows within the global batch, so random draws made for the whole global batch can be
#         sliced host-invariantly.
MakeBatch = Callable[[np.ndarray, tuple, slice], dict]

STATE_VERSION = 1
_SHUFFLE_SALT = 0x5EED


def per_host_batch(global_batch: int, process_count: int) -> int:
  if global_batch <= 0:
    raise ValueError(f"batch_size must be positive, got {global_batch}.")
  if global_batch % process_count:
    raise ValueError(f"The global batch_size {global_batch} is not divisible by the number of hosts "
                     f"(jax.process_count() = {process_count}); choose a multiple of it.")
  return global_batch // process_count


class _Sampler:
  """The pure part: which examples, and their batch, at (epoch, step)."""

  def __init__(self, num_examples, global_batch, make_batch, seed, rows):
    self.num_examples, self.global_batch, self.seed = num_examples, global_batch, seed
    self.steps_per_epoch = num_examples // global_batch
    self._make_batch, self._rows = make_batch, rows
    self._perm_epoch, self._perm = -1, None
    self._lock = threading.Lock()

  def permutation(self, epoch: int) -> np.ndarray:
    with self._lock:
      if epoch != self._perm_epoch:
        rng = np.random.default_rng([self.seed, epoch, _SHUFFLE_SALT])
        self._perm, self._perm_epoch = rng.permutation(self.num_examples), epoch
      return self._perm

  def batch_at(self, epoch: int, step: int) -> dict:
    start = step * self.global_batch
    global_positions = self.permutation(epoch)[start:start + self.global_batch]
    return self._make_batch(global_positions[self._rows], (self.seed, epoch, step), self._rows)

  def advance(self, pos: tuple[int, int]) -> tuple[int, int]:
    epoch, step = pos
    return (epoch + 1, 0) if step + 1 >= self.steps_per_epoch else (epoch, step + 1)


def _produce(sampler: _Sampler, pos, stop: threading.Event, out: queue.Queue) -> None:
  """Prefetch thread body; holds no reference to the iterator, so dropping it stops us."""
  while not stop.is_set():
    try:
      item = (pos, sampler.batch_at(*pos))
    except BaseException as e:
      item = e
    while not stop.is_set():
      try:
        out.put(item, timeout=0.05)
        break
      except queue.Full:
        continue
    if isinstance(item, BaseException):
      return
    pos = sampler.advance(pos)


class BatchIterator:
  """Yields batches forever, reshuffling each epoch (seeded by seed and epoch)."""

  def __init__(self, num_examples: int, global_batch: int, make_batch: MakeBatch, *,
               seed: int, process_index: int, process_count: int, prefetch: int = 2, name: str = "data",
               identity: str = "", changed: str = "the corpus, tokenizer, seq_len or split changed"):
    self.num_examples = int(num_examples)
    self.global_batch = int(global_batch)
    self.batch_size = per_host_batch(global_batch, process_count)
    self.steps_per_epoch = self.num_examples // self.global_batch
    if self.steps_per_epoch == 0:
      raise ValueError(f"The {name} training split has {self.num_examples} examples, fewer than one global batch of "
                       f"{self.global_batch}: use more data or a smaller batch_size.")
    self.seed = int(seed)
    self.name = name
    self.identity = str(identity)  # What the examples are (e.g. a token file's hash); '' = not recorded.
    self.changed = changed  # What a different identity means, for the message.
    rows = slice(process_index * self.batch_size, (process_index + 1) * self.batch_size)
    self._sampler = _Sampler(self.num_examples, self.global_batch, make_batch, self.seed, rows)
    self._prefetch = max(0, int(prefetch))
    self._pos = (0, 0)  # (epoch, step) of the next batch handed to the caller.
    self._thread = self._stop = self._queue = None

  def batch_at(self, epoch: int, step: int) -> dict:
    """This host's batch at (epoch, step); a pure function of the seed."""
    return self._sampler.batch_at(epoch, step)

  # --------------------------------------------------------------- iterator
  def __iter__(self) -> Iterator[dict]:
    return self

  def __next__(self) -> dict:
    if self._prefetch == 0:
      batch = self._sampler.batch_at(*self._pos)
      self._pos = self._sampler.advance(self._pos)
      return batch
    if self._thread is None:
      self._stop = threading.Event()
      self._queue = queue.Queue(maxsize=self._prefetch)
      self._thread = threading.Thread(
          target=_produce, args=(self._sampler, self._pos, self._stop, self._queue),
          name=f"{self.name}-prefetch", daemon=True)
      self._thread.start()
    while True:
      try:
        item = self._queue.get(timeout=1.0)
        break
      except queue.Empty:
        if not self._thread.is_alive():
          raise RuntimeError(f"The {self.name} prefetch thread stopped unexpectedly.") from None
    if isinstance(item, BaseException):
      self._join()
      raise item
    pos, batch = item
    assert pos == self._pos, (pos, self._pos)
    self._pos = self._sampler.advance(pos)
    return batch

  def _join(self) -> None:
    if self._thread is not None:
      self._stop.set()
      self._thread.join()
      self._thread = self._stop = self._queue = None

  def close(self) -> None:
    """Stops the prefetch thread (the iterator can still be used afterwards)."""
    self._join()

  def __del__(self):
    stop = getattr(self, "_stop", None)
    if stop is not None:
      stop.set()

  # ------------------------------------------------------------------ state
  def get_state(self) -> dict[str, Any]:
    """The position of the next batch, as a small JSON-serializable dict."""
    epoch, step = self._pos
    state = {"version": STATE_VERSION, "epoch": int(epoch), "step": int(step),
             "seed": self.seed, "num_examples": self.num_examples, "global_batch": self.global_batch}
    if self.identity:
      state["identity"] = self.identity
    return state

  def set_state(self, state: dict[str, Any]) -> None:
    """Restores a position from ``get_state``; the next batch is the one that followed it."""
    try:
      epoch, step = int(state["epoch"]), int(state["step"])
    except (KeyError, TypeError, ValueError):
      raise ValueError(f"Not a data iterator state: {state!r}.") from None
    if state.get("identity") and self.identity and state["identity"] != self.identity:
      raise ValueError(f"The saved data state was made on other {self.name} data (identity {state['identity']}, this "
                       f"pipeline's is {self.identity}): {self.changed}. Restore with the data and data config of "
                       "the saved run.")
    for key in ("seed", "num_examples", "global_batch"):
      if key in state and int(state[key]) != getattr(self, key):
        raise ValueError(
            f"The saved data state has {key}={state[key]} but this pipeline has {key}={getattr(self, key)}; restore "
            "with the same data, data config, seed and batch size.")
    if epoch < 0 or not 0 <= step < self.steps_per_epoch:
      raise ValueError(f"Data state out of range: epoch={epoch}, step={step} (steps_per_epoch={self.steps_per_epoch}).")
    self._join()
    self._pos = (epoch, step)


class EvalBatches:
  """Callable returning a fresh iterable over the same fixed validation batches."""

  def __init__(self, num_examples: int, global_batch: int, make_batch: MakeBatch, *,
               process_index: int, process_count: int, max_batches: int, name: str = "data"):
    self.batch_size = per_host_batch(global_batch, process_count)
    self.global_batch = int(global_batch)
    self.num_batches = min(int(num_examples) // self.global_batch, max(0, int(max_batches)))
    if self.num_batches == 0 and max_batches > 0:
      raise ValueError(f"The {name} validation split has {num_examples} examples, fewer than one global batch of "
                       f"{global_batch}: raise data.val_fraction, use more data, or lower batch_size (or set "
                       "data.max_eval_batches = 0 to skip evaluation).")
    self._rows = slice(process_index * self.batch_size, (process_index + 1) * self.batch_size)
    self._make_batch = make_batch
    self._batches = None
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return self.num_batches

  def __call__(self) -> Iterator[dict]:
    with self._lock:
      if self._batches is None:
        batches = []
        for step in range(self.num_batches):
          positions = np.arange(step * self.global_batch, (step + 1) * self.global_batch)
          batches.append(self._make_batch(positions[self._rows], (0, 0, step), self._rows))
        self._batches = batches
    return iter(self._batches)
