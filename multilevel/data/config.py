"""The data section of a run's config, typed: ``DataConfig`` is the one home of every data default.

A run's config stays a ``ConfigDict`` (``default_config()``, overridden as ``--config.data.x=...``); ``make_data``
turns it into a ``DataConfig`` once, with ``DataConfig.from_config``, which refuses unknown keys and values of the
wrong type, and the rest of the package reads attributes.
"""

from __future__ import annotations

import dataclasses
import numbers
import types
import typing
from typing import Any, Mapping

import ml_collections

# Fields where an empty string has no meaning (each has a non-empty default).
_NOT_EMPTY = ("split", "text_field", "sample_by", "cache_dir")
SAMPLE_BY = ("document", "paragraph", "line")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """What ``make_data`` loads and how; see the package docstring for the sources."""

  # What to load.
  name: str = ""  # '' or 'default': the bundled corpus; text: an HF hub name ('wikitext'); images: 'tfds:<name>'.
  config_name: str = ""  # HF config, e.g. 'wikitext-103-raw-v1'.
  split: str = "train"  # HF / TFDS split used for training.
  eval_split: str = ""  # TFDS: split for evaluation ('' = test, else validation, else val_fraction).
  streaming: bool = False  # HF hub: stream instead of downloading the whole set.
  max_documents: int = 0  # Text: stop after this many documents (0 = all); handy when streaming.
  files: str | tuple[str, ...] = ""  # Text: comma-separated globs (or a list) of .txt/.md/.json/.jsonl/.parquet files.
  text_field: str = "text"  # Text: the field (column) of .json/.jsonl/.parquet rows and hub sets holding the text.
  sample_by: str = "document"  # .txt files: 'document' (one file one document), 'paragraph' or 'line'.
  folder: str = ""  # Images: a folder with one sub-folder per class (or train/ and val/ inside).
  data_dir: str = ""  # TFDS data dir ('' = $TFDS_DATA_DIR or ~/tensorflow_datasets).
  # Tokenizer.
  tokenizer: str = ""  # '' = train one and cache it; else a tokenizer.json path (or a hub name).
  tokenizer_type: str = "auto"  # 'bpe' | 'wordpiece' | 'auto' (wordpiece for BERT, bpe otherwise).
  vocab_size: int = 2048  # Size of a trained tokenizer's vocabulary, special tokens included.
  tokenizer_max_chars: int = 200_000_000  # Train the tokenizer on at most this much text (0 = all of it).
  # Pipeline.
  val_fraction: float = 0.05  # Share held out for validation (text; images whose source has no eval split).
  split_seed: int = 0  # Seed of the train/validation split (kept apart from the shuffle seed).
  cache_dir: str = "~/.cache/multilevel"  # Trained tokenizers and token streams.
  augment: bool | str = True  # Images, train only: random crop with padding + horizontal flip ('strong': + erasing).
  strong_augment: bool = False  # Images: add random erasing on top of augment.
  flip: bool = True  # Horizontal flips in augmentation (off for digits automatically).
  resize: bool = True  # Images larger than image_size: resize + center crop (needs Pillow).
  prefetch: int = 2  # Batches prepared ahead in a background thread (0 = none).
  num_workers: int = 4  # Threads decoding images for lazy sources (TFDS, folders).
  max_eval_batches: int = 16  # Validation batches per evaluation (0 = no evaluation).

  def __post_init__(self):
    for field in dataclasses.fields(self):
      object.__setattr__(self, field.name, _checked(field.name, getattr(self, field.name), _HINTS[field.name]))
    for name in _NOT_EMPTY:
      if not getattr(self, name):
        raise ValueError(f"cfg.{name} is empty; leave it out for the default {_DEFAULTS[name]!r}, or name one.")
    if self.sample_by not in SAMPLE_BY:
      raise ValueError(f"cfg.sample_by must be one of {', '.join(SAMPLE_BY)}, got {self.sample_by!r}.")
    if not 0 <= self.val_fraction < 1:
      raise ValueError(f"cfg.val_fraction must be in [0, 1), got {self.val_fraction}.")

  @classmethod
  def from_config(cls, c: DataConfig | ml_collections.ConfigDict | Mapping[str, Any]) -> DataConfig:
    """A DataConfig from a DataConfig, a ConfigDict or a dict; missing keys take the defaults above."""
    if isinstance(c, cls):
      return c
    if isinstance(c, ml_collections.ConfigDict):
      values = c.to_dict()
    elif isinstance(c, Mapping):
      values = dict(c)
    else:
      raise TypeError(f"The data config must be a DataConfig, a ConfigDict or a dict, got {type(c).__name__}.")
    unknown = sorted(set(values) - set(_DEFAULTS))
    if unknown:
      raise ValueError(f"The data config has unknown key(s) {', '.join(unknown)}; the valid keys are "
                       f"{', '.join(_DEFAULTS)}.")
    return cls(**values)

  def to_config(self) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dataclasses.asdict(self))


def default_config() -> ml_collections.ConfigDict:
  """The data section with the defaults of ``DataConfig``, as a ConfigDict for ``--config.data.x=...``."""
  return DataConfig().to_config()


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DataConfig)}
_HINTS = typing.get_type_hints(DataConfig)
_TYPE_NAMES = {bool: "bool", int: "int", float: "float (or int)", str: "str"}


def _checked(name: str, value: Any, hint: Any) -> Any:
  """``value`` as the type ``hint`` of field ``name`` (int to float, list of str to tuple), else a TypeError."""
  options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
  for option in options:
    if option is bool and isinstance(value, bool):
      return value
    if option is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
      return int(value)
    if option is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
      return float(value)
    if option is str and isinstance(value, str):
      return value
    if typing.get_origin(option) is tuple and isinstance(value, (list, tuple)) and all(
        isinstance(v, str) for v in value):
      return tuple(value)
  expected = " or ".join(_TYPE_NAMES.get(o, "a list of str") for o in options)
  raise TypeError(f"cfg.{name} = {value!r} has the wrong type {type(value).__name__}: expected {expected}.")
