"""Text corpora for BERT / GPT: load, tokenize once into a token file, cut into fixed-length sequences.

Corpora: the named offline corpora of ``corpora.py`` (Shakespeare by default; ``docs`` for long budgets), local
.txt/.md/.json/.jsonl/.parquet files and Hugging Face hub data sets, both read through ``datasets``, or a token file
built before (``cfg.token_file``). Documents are tokenized once into a token file (``tokenfile.py``: one '<eos>'
after each document, uint16 ids where the vocabulary fits) under cfg.cache_dir/tokens/, keyed by the corpus, the
tokenizer and the settings; every later run, epoch and host memory-maps it, cuts it into sequences of seq_len and
reads them at random, so even a corpus larger than memory costs no load time.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Iterable, Iterator

import numpy as np
from absl import logging

from multilevel.data import common
from multilevel.data import corpora
from multilevel.data import damaged
from multilevel.data import pipeline
from multilevel.data import tokenfile
from multilevel.data import tokenizer as tokenizer_lib
from multilevel.data.config import DataConfig
from multilevel.data.corpora import TextSource

_CACHE_VERSION = 3  # 3: special tokens' text inside documents encoded as text; no UTF-8 BOM in .txt; paragraphs.
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")  # A line of nothing but spaces and tabs, between two newlines.
_EXTENSIONS = {".txt": "text", ".md": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


# ------------------------------------------------------------------ sources
def resolve_files(files) -> list[str]:
  """Sorted, de-duplicated files matching a glob or a list of globs / paths."""
  if isinstance(files, str):
    patterns = [f.strip() for f in files.split(",") if f.strip()]
  else:
    patterns = [str(f) for f in files]
  paths, missing = [], []
  for pattern in patterns:
    pattern = os.path.expanduser(str(pattern))
    if os.path.isdir(pattern):
      raise FileNotFoundError(f"{pattern} (data.files) is a folder: give the files in it, e.g. "
                              f"'{os.path.join(pattern, '*.txt')}' (or '**/*.txt' for its sub-folders too).")
    found = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    (paths.extend(found) if found else missing.append(pattern))
  if missing:
    split = (" data.files is split at commas into globs: for a path with a comma in it, put ? in the comma's place."
             if isinstance(files, str) and "," in files else "")
    raise FileNotFoundError(f"No file matches {' and '.join(repr(m) for m in missing)} (data.files); check the path or "
                            f"glob (relative paths are from the current directory).{split}")
  return sorted(set(paths))


def _file_stamp(path: str) -> tuple:
  """What the cache keys a local file by: its size and its modification and change times in nanoseconds. The
  change time (ctime) moves on every write and cannot be set back, so a file rewritten in place within the same
  second, or replaced by an equal-sized copy that kept another file's mtime (cp -p, rsync -a), is read again."""
  st = os.stat(path)
  return (path, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _rows_to_texts(dataset, text_field: str, what: str, max_documents: int) -> Iterator[str]:
  """The texts of ``dataset``'s rows, in order. Rows whose field is missing, null or not a string are skipped and
  counted: a warning says how many once the rows are read, and an error says what the field held if no row held
  text. Rows of blank text are skipped without a word (they hold nothing to train on)."""
  count, skipped, first = 0, {}, {}
  for i, row in enumerate(dataset):
    if text_field not in row:
      raise ValueError(f"{what} has no field {text_field!r} (it has {sorted(row)}); set data.text_field to the column "
                       "holding the text.")
    text = row[text_field]
    if not isinstance(text, str):
      kind = "missing or null" if text is None else f"of type {type(text).__name__}"
      skipped[kind] = skipped.get(kind, 0) + 1
      first.setdefault(kind, i + 1)
      continue
    if not text.strip():
      continue
    yield text
    count += 1
    if max_documents and count >= max_documents:
      break
  if not skipped:
    return
  kinds = ", ".join(f"{n} {kind} (first at row {first[kind]})" for kind, n in skipped.items())
  if count == 0:
    raise ValueError(f"{what}: no row holds a text in field {text_field!r}; it holds {kinds}. Set data.text_field to "
                     f"the column holding the text.")
  message = f"{what}: skipped {sum(skipped.values())} row(s) whose field {text_field!r} is not a text: {kinds}."
  if message not in _WARNED:  # The tokenizer's training and the token file read the same rows: say it once.
    _WARNED.add(message)
    logging.warning("%s", message)


_WARNED: set[str] = set()


def files_source(cfg: DataConfig) -> TextSource:
  paths = resolve_files(cfg.files)
  builders = {_EXTENSIONS.get(os.path.splitext(p)[1].lower()) for p in paths}
  unknown = [p for p in paths if _EXTENSIONS.get(os.path.splitext(p)[1].lower()) is None]
  if unknown:
    raise ValueError(f"data.files holds {len(unknown)} file(s) that this cannot read: {', '.join(unknown[:3])}"
                     f"{', ...' if len(unknown) > 3 else ''}. Text is read from {', '.join(sorted(_EXTENSIONS))} files "
                     f"(uncompressed); convert those, or leave them out of the glob.")
  if len(builders) != 1:
    kinds = {b: [p for p in paths if _EXTENSIONS[os.path.splitext(p)[1].lower()] == b][0] for b in sorted(builders)}
    raise ValueError(f"data.files mixes kinds of file ({', '.join(f'{b}: {p}' for b, p in kinds.items())}); give one "
                     f"kind per run (plain text, json/jsonl or parquet), e.g. by converting the others to it.")
  builder = builders.pop()
  sample_by, max_docs = cfg.sample_by, cfg.max_documents
  # utf-8-sig: a byte-order mark some editors put first in a UTF-8 file is not text (json files drop it already).
  kwargs = {"sample_by": sample_by, "encoding": "utf-8-sig"} if builder == "text" else {}
  stats = [_file_stamp(p) for p in paths]
  field = "text" if builder == "text" else cfg.text_field

  def rows():
    import logging as std_logging

    import datasets
    # Its json reader logs a damaged file before raising; damaged.named_on_failure then says it in one line, naming
    # the line to fix (and keeps the raw cause where it cannot).
    std_logging.getLogger("datasets.packaged_modules.json.json").setLevel(std_logging.CRITICAL)
    # Streaming reads the files as they are: no Arrow copy in the HF cache.
    found = datasets.load_dataset(builder, data_files=paths, split="train", streaming=True, **kwargs)
    if builder != "text" or sample_by != "paragraph":
      yield from found
      return
    for row in found:  # datasets cuts paragraphs at '\n\n' only; a blank line holding spaces or tabs ends one too.
      for paragraph in _BLANK_LINE.split(row["text"]):
        yield {"text": paragraph}

  def documents():
    checked = damaged.named_on_failure(rows(), paths, builder)  # a damaged file is named, not a pyarrow trace
    what = f"The {builder} file {paths[0]}" if len(paths) == 1 else f"The {len(paths)} {builder} files {paths[0]}, ..."
    return _rows_to_texts(checked, field, what, max_docs)

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
      ds = datasets.load_dataset(name, config_name, split=split, streaming=cfg.streaming,
                                 revision=cfg.revision or None)
    except (ConnectionError, FileNotFoundError, OSError) as e:
      raise ValueError(f"{what} could not be loaded from the hub: {e}") from None
    return _rows_to_texts(ds, text_field, what, max_docs)

  key = ["hub", name, config_name, split, text_field, max_docs] + ([cfg.revision] if cfg.revision else [])
  revision = f", revision {cfg.revision!r}" if cfg.revision else ""
  unpinned = (f"{what}: the tokens read from the hub before (%s) are reused; the hub is not asked for a newer "
              f"version. Set data.revision to pin one, or delete that folder to read the set again.")
  return TextSource(key=key, documents=documents, description=f"{what}, split {split!r}{revision}",
                    on_reuse="" if cfg.revision else unpinned)


def text_source(cfg: DataConfig) -> TextSource:
  if cfg.files:
    return files_source(cfg)
  source = corpora.named(cfg.name)
  if source is not None:
    return source
  if cfg.name.startswith("tfds:"):
    raise ValueError(f"data.name={cfg.name!r}: TFDS names are for images; for text give an HF name, one of the offline "
                     f"corpora ({', '.join(corpora.CORPORA)}) or data.files.")
  return hub_source(cfg)


# ------------------------------------------------------------ token file
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


def _encoded(source: TextSource, tok: tokenizer_lib.LoadedTokenizer) -> Iterator[list[int]]:
  """Each document's ids. A special token's text inside a document ('<eos>', '<mask>', '[SEP]', ...) is encoded as
  the text it is, not as that token: a corpus that mentions '<eos>' gets no false document boundary, nor a BERT
  corpus false masks (nanoGPT's encode_ordinary does the same)."""
  was = tok.tokenizer.encode_special_tokens
  tok.tokenizer.encode_special_tokens = True
  seen = set() if tok.unk_id < 0 else None  # A tokenizer without an unknown token can drop characters.
  try:
    for chunk in _chunks(source.documents()):
      if seen is not None:
        for text in chunk:
          seen.update(text)
      for enc in tok.tokenizer.encode_batch_fast(chunk, add_special_tokens=False):
        yield enc.ids
    if seen:
      _warn_dropped(source, tok, seen)
  finally:
    tok.tokenizer.encode_special_tokens = was


def _warn_dropped(source: TextSource, tok: tokenizer_lib.LoadedTokenizer, chars: set) -> None:
  """Says which characters of the text the tokenizer encodes as nothing (a BPE without an unknown token or byte
  fallback leaves out what its alphabet lacks): the model would never see them, and nothing else would say so."""
  shown = sorted(c for c in chars if c.isprintable() and not c.isspace())
  encoded = tok.tokenizer.encode_batch_fast(shown, add_special_tokens=False)
  dropped = [c for c, enc in zip(shown, encoded) if not enc.ids]
  if dropped:
    logging.warning("%d distinct character(s) of %s have no token in the tokenizer %s, which has no unknown token: "
                    "they are left out of the token file as if they were not in the text (%s). Use a tokenizer with "
                    "an unknown token or byte fallback (a byte-level BPE), or set data.tokenizer='' to train one on "
                    "this corpus.", len(dropped), source.description, tok.path,
                    " ".join(repr(c) for c in dropped[:12]) + (" ..." if len(dropped) > 12 else ""))


def _say_reused(source: TextSource, folder: str) -> None:
  if source.on_reuse:
    logging.info(source.on_reuse, folder)


def token_file(source: TextSource, tok: tokenizer_lib.LoadedTokenizer, cache_dir: str) -> tokenfile.TokenFile:
  """The corpus' token file under cache_dir/tokens/, tokenized on the first call only."""
  tok_id = common.file_sha1(tok.path) if os.path.exists(tok.path) else common.fingerprint(tok.tokenizer.to_str())
  key = ["text", _CACHE_VERSION, source.key, tok_id, tok.vocab_size, tok.eos_id]
  tf = tokenfile.cached(
      cache_dir, key, lambda: _encoded(source, tok), vocab_size=tok.vocab_size, eos_id=tok.eos_id,
      description=source.description, tokenizer_json=tok.tokenizer.to_str(),
      on_build=lambda folder: logging.info("Tokenizing %s into %s", source.description, folder),
      on_reuse=lambda folder: _say_reused(source, folder))
  if tf.num_tokens == tf.num_documents:
    raise ValueError(f"{source.description} holds no text (0 tokens after tokenizing): check the files or "
                     "data.text_field.")
  return tf


def get_tokenizer(cfg: DataConfig, source: TextSource, model_family: str, cache_dir: str):
  if cfg.tokenizer:
    tok = tokenizer_lib.load(cfg.tokenizer, model_family=model_family)
    if cfg.vocab_size != DataConfig.vocab_size and cfg.vocab_size != tok.vocab_size:
      logging.warning("data.vocab_size=%d sizes a tokenizer trained here; data.tokenizer=%s is given and has %d "
                      "tokens, which the model uses.", cfg.vocab_size, cfg.tokenizer, tok.vocab_size)
    return tok
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
  if cfg.token_file:
    try:
      tf = tokenfile.open_token_file(cfg.token_file)
    except tokenfile.TokenFileError as e:  # No corpus here to rebuild it from: say where a good copy comes from.
      folder = os.path.abspath(os.path.expanduser(cfg.token_file))
      raise tokenfile.TokenFileError(str(e).replace(
          tokenfile.rebuild_hint(folder), "It was given as data.token_file, so no run rebuilds it: copy it again from "
          "where it was built, or build it anew with python -m experiments.build_tokens --config=... --out=DIR.")
      ) from None
    tok_spec = cfg.tokenizer or tf.tokenizer_path
    if not tok_spec:
      raise ValueError(f"The token file {tf.path} holds no tokenizer.json; name its tokenizer with data.tokenizer.")
    tok = tokenizer_lib.load(tok_spec, model_family=model_family)
    if tok.vocab_size != tf.vocab_size or tok.eos_id != tf.eos_id:
      raise ValueError(f"The tokenizer {tok.path} (vocab {tok.vocab_size}, eos {tok.eos_id}) did not make the token "
                       f"file {tf.path} (vocab {tf.vocab_size}, eos {tf.eos_id}).")
    if cfg.tokenizer and tf.tokenizer_path:
      from tokenizers import Tokenizer
      if Tokenizer.from_file(tf.tokenizer_path).get_vocab() != tok.tokenizer.get_vocab():
        raise ValueError(f"data.tokenizer={cfg.tokenizer!r} did not make the token file {tf.path}: its vocabulary "
                         f"differs from the tokenizer.json the token file holds, so the ids would decode to other "
                         f"text. Leave data.tokenizer out to use the token file's own.")
    what = tf.description or tf.path
  else:
    cache = common.cache_dir(cfg.cache_dir)
    source = text_source(cfg)
    tok = get_tokenizer(cfg, source, model_family, cache)
    tf = token_file(source, tok, cache)
    what = source.description
  seqs = tf.sequences(seq_len)
  num_seqs = len(seqs)
  if num_seqs < 2:
    raise ValueError(f"{what} has {tf.num_tokens} tokens, fewer than two sequences of seq_len={seq_len}: use more "
                     "text or a shorter seq_len.")
  if cfg.val_split == "documents":
    instead = ("hold out windows instead (data.val_split='sequences')" + (
        ", or cut the .txt files into more documents (data.sample_by='paragraph' or 'line')"
        if cfg.files and not cfg.token_file and cfg.sample_by == "document" else ""))
    if tf.num_documents < 2 and cfg.val_fraction > 0:
      raise ValueError(f"{what} holds {tf.num_documents} document, and data.val_split='documents' holds out whole "
                       f"documents: it needs two or more. {instead[0].upper()}{instead[1:]}.")
    train_idx, val_idx = tf.split_documents(seq_len, cfg.val_fraction, cfg.split_seed)
    dropped = num_seqs - len(train_idx) - len(val_idx)
    if dropped > 0.1 * num_seqs:
      logging.warning("data.val_split='documents' drops %d of the %d windows of %d tokens (those that cross a "
                      "held-out document's edge) and holds out %d: the documents are short against seq_len. To "
                      "lose none, %s.", dropped, num_seqs, seq_len, len(val_idx), instead)
  else:
    train_idx, val_idx = common.split_indices(num_seqs, cfg.val_fraction, cfg.split_seed)

  def batch_fn(index):
    def make_batch(positions, key, rows):
      del key, rows
      return {"tokens": np.asarray(seqs[index[positions]], dtype=np.int32)}
    return make_batch

  identity = common.fingerprint([tf.meta["tokens_crc32"], tf.num_tokens, seq_len, cfg.val_fraction, cfg.split_seed]
                                + ([cfg.val_split] if cfg.val_split != "sequences" else []))
  train = pipeline.BatchIterator(
      len(train_idx), batch_size, batch_fn(train_idx), seed=seed, process_index=process_index,
      process_count=process_count, prefetch=cfg.prefetch, name="text", identity=identity)
  evaluation = pipeline.EvalBatches(
      len(val_idx), batch_size, batch_fn(val_idx), process_index=process_index,
      process_count=process_count, max_batches=cfg.max_eval_batches, name="text")
  held_out = " (held-out documents)" if cfg.val_split == "documents" else ""
  description = (f"{what}: {tf.num_tokens:,} tokens in {tf.num_documents:,} documents, "
                 f"{tok.kind} tokenizer (vocab {tok.vocab_size}), {len(train_idx):,} train / {len(val_idx):,} "
                 f"validation sequences of {seq_len}{held_out}")
  logging.info("Text data: %s (token file %s)", description, tf.path)
  info = common.DataInfo(vocab_size=tok.vocab_size, pad_id=tok.pad_id, eos_id=tok.eos_id,
                         mask_id=tok.mask_id, num_train_examples=len(train_idx),
                         num_eval_examples=len(val_idx), description=description, token_file=tf.path,
                         tokenizer_path=os.path.abspath(tok.path) if os.path.exists(tok.path) else tok.path)
  return train, evaluation, info
