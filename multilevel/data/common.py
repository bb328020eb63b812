"""Shared pieces of the data package: DataInfo, cache and offline helpers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
from typing import Any
from urllib.parse import urlparse

import numpy as np

TRUE_STRINGS = ("1", "true", "yes", "on")


@dataclasses.dataclass(frozen=True)
class DataInfo:
  """What ``make_data`` loaded; everything the model and the logs need."""
  vocab_size: int = 0
  pad_id: int = -1
  eos_id: int = -1
  mask_id: int = -1
  num_classes: int = 0
  image_shape: tuple[int, int, int] | None = None
  num_train_examples: int = 0
  description: str = ""
  tokenizer_path: str = ""
  num_eval_examples: int = 0
  token_file: str = ""  # Text: the folder of the token file the batches are read from.
  class_names: tuple[str, ...] = ()  # Images from a folder: the class of each label, in label order.
  image_mean: tuple[float, ...] = ()  # Images: the per-channel normalisation the batches carry (of [0, 1] pixels).
  image_std: tuple[float, ...] = ()


def cache_dir(path: str) -> str:
  """``path`` (cfg.cache_dir) made absolute and created."""
  path = os.path.abspath(os.path.expanduser(path))
  os.makedirs(path, exist_ok=True)
  return path


def fingerprint(obj: Any, length: int = 16) -> str:
  """A stable short hash of a JSON-able object."""
  blob = json.dumps(obj, sort_keys=True, default=str).encode()
  return hashlib.sha1(blob).hexdigest()[:length]


def file_sha1(path: str, length: int = 16) -> str:
  h = hashlib.sha1()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()[:length]


def hub_offline() -> bool:
  """True when the user told HF libraries to stay offline."""
  return any(os.environ.get(k, "").strip().lower() in TRUE_STRINGS for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def check_hub_reachable(what: str, timeout: float = 3.0) -> None:
  """Fails at once (ValueError) when the Hugging Face hub cannot be used.

  No retry loop: offline flags raise immediately, otherwise one TCP connect with a short timeout decides.
  """
  hint = ("Download it on a machine with network (or run once there to fill the cache), or point data.files at local "
          ".txt/.json/.jsonl/.parquet files.")
  if hub_offline():
    raise ValueError(f"{what} needs the Hugging Face hub, but HF_DATASETS_OFFLINE or HF_HUB_OFFLINE is set. {hint}")
  endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
  parsed = urlparse(endpoint)
  host = parsed.hostname or "huggingface.co"
  port = parsed.port or (80 if parsed.scheme == "http" else 443)
  try:
    socket.create_connection((host, port), timeout=timeout).close()
  except OSError as e:
    raise ValueError(f"{what} needs the Hugging Face hub, but {host}:{port} cannot be reached ({e}). {hint}") from None


def process_info(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  """(index, count) of this host; from JAX unless given."""
  if process_index is None or process_count is None:
    import jax
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} is not in [0, {process_count}).")
  return int(process_index), int(process_count)


def split_indices(n: int, val_fraction: float, split_seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Seeded (train, validation) index arrays over n examples, each sorted."""
  if not 0 <= val_fraction < 1:
    raise ValueError(f"data.val_fraction must be in [0, 1), got {val_fraction}.")
  n_val = min(n - 1, max(1, int(round(n * val_fraction)))) if val_fraction > 0 else 0
  perm = np.random.default_rng([int(split_seed), 0xDA7A]).permutation(n)
  return np.sort(perm[n_val:]), np.sort(perm[:n_val])
