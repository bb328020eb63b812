"""The data section of a run's config, typed: ``DataConfig`` is the one home of every data default.

A run's config stays a ``ConfigDict`` (``default_config()``, overridden as ``--config.data.x=...``); ``make_data``
turns it into a ``DataConfig`` once, with ``DataConfig.from_config``, which refuses unknown keys and values of the
wrong type, and the rest of the package reads attributes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ml_collections

from multilevel.typed_config import check_fields, section_from

# Fields where an empty string has no meaning (each has a non-empty default).
_NOT_EMPTY = ("split", "text_field", "sample_by", "cache_dir", "val_split")
SAMPLE_BY = ("document", "paragraph", "line")
VAL_SPLITS = ("sequences", "documents")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """What ``make_data`` loads and how; see the package docstring for the sources."""

  # What to load.
  # '' or 'default': the bundled corpus; text: an offline corpus ('shakespeare', 'docs', 'gcide', 'docs+gcide',
  # ..., see data/corpora.py) or an HF hub name ('wikitext'); images: 'tfds:<name>'.
  name: str = ""
  config_name: str = ""  # HF config, e.g. 'wikitext-103-raw-v1'.
  split: str = "train"  # HF / TFDS split used for training.
  eval_split: str = ""  # TFDS: split for evaluation ('' = test, else validation, else val_fraction).
  streaming: bool = False  # HF hub: stream instead of downloading the whole set.
  # HF hub: the data set's revision (a branch, tag or commit) to read. '' = the latest at the first run; its token
  # file is then reused without asking the hub again, so pin a revision when the set may change.
  revision: str = ""
  max_documents: int = 0  # Text: stop after this many documents (0 = all); handy when streaming.
  files: str | tuple[str, ...] = ""  # Text: comma-separated globs (or a list) of .txt/.md/.json/.jsonl/.parquet files.
  text_field: str = "text"  # Text: the field (column) of .json/.jsonl/.parquet rows and hub sets holding the text.
  sample_by: str = "document"  # .txt files: 'document' (one file one document), 'paragraph' or 'line'.
  folder: str = ""  # Images: a folder with one sub-folder per class (or train/ and val/ inside).
  data_dir: str = ""  # TFDS data dir ('' = $TFDS_DATA_DIR or ~/tensorflow_datasets).
  token_file: str = ""  # Text: the folder of a token file built before (it holds its tokenizer); skips the corpus.
  # Tokenizer.
  tokenizer: str = ""  # '' = train one and cache it; else a tokenizer.json path (or a hub name).
  tokenizer_type: str = "auto"  # 'bpe' | 'wordpiece' | 'auto' (wordpiece for BERT, bpe otherwise).
  vocab_size: int = 2048  # Size of a trained tokenizer's vocabulary, special tokens included.
  tokenizer_max_chars: int = 200_000_000  # Train the tokenizer on at most this much text (0 = all of it).
  # Pipeline.
  val_fraction: float = 0.05  # Share held out for validation (text; images whose source has no eval split).
  split_seed: int = 0  # Seed of the train/validation split (kept apart from the shuffle seed).
  # Text: hold out 'sequences' (a seeded share of the seq_len windows) or whole 'documents' (never trained on; the
  # windows across a held-out document's edge are dropped).
  val_split: str = "sequences"
  cache_dir: str = "~/.cache/multilevel"  # Trained tokenizers and token streams.
  augment: bool | str = True  # Images, train only: random crop with padding + horizontal flip ('strong': + erasing).
  strong_augment: bool = False  # Images: add random erasing on top of augment.
  flip: bool = True  # Horizontal flips in augmentation (off for digits automatically).
  # Images not image_size x image_size: the short side resized to image_size (bicubic, up or down), then a centre
  # crop (needs Pillow); False: never resampled, smaller images zero-padded, larger ones refused.
  resize: bool = True
  prefetch: int = 2  # Batches prepared ahead in a background thread (0 = none).
  num_workers: int = 4  # Threads decoding images for lazy sources (TFDS, folders).
  max_eval_batches: int = 16  # Validation batches per evaluation (0 = no evaluation).

  def __post_init__(self):
    check_fields(self, "data")
    for name in _NOT_EMPTY:
      if not getattr(self, name):
        raise ValueError(f"data.{name} is empty; leave it out for the default {_DEFAULTS[name]!r}, or name one.")
    if self.sample_by not in SAMPLE_BY:
      raise ValueError(f"data.sample_by must be one of {', '.join(SAMPLE_BY)}, got {self.sample_by!r}.")
    if not 0 <= self.val_fraction < 1:
      raise ValueError(f"data.val_fraction must be in [0, 1), got {self.val_fraction}.")
    for name in ("max_documents", "max_eval_batches", "prefetch", "tokenizer_max_chars"):
      if getattr(self, name) < 0:
        raise ValueError(f"data.{name} must be >= 0 (0 = {_ZERO_MEANS[name]}), got {getattr(self, name)}.")
    if self.val_split not in VAL_SPLITS:
      raise ValueError(f"data.val_split must be one of {', '.join(VAL_SPLITS)}, got {self.val_split!r}.")

  @classmethod
  def from_config(cls, c: DataConfig | ml_collections.ConfigDict | Mapping[str, Any], section: str = "data"
                  ) -> DataConfig:
    """A DataConfig from a DataConfig, a ConfigDict or a dict; missing keys take the defaults above, unknown keys
    and wrong types are refused naming ``section.key`` (the run config passes ``section="data"``)."""
    return section_from(cls, c, section)

  def to_config(self) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dataclasses.asdict(self))


def default_config() -> ml_collections.ConfigDict:
  """The data section with the defaults of ``DataConfig``, as a ConfigDict for ``--config.data.x=...``."""
  return DataConfig().to_config()


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DataConfig)}
_ZERO_MEANS = {"max_documents": "all", "max_eval_batches": "no evaluation", "prefetch": "none",
               "tokenizer_max_chars": "all of the text"}
