"""The token file: a corpus tokenized once, memory-mapped by every run, host and epoch that reads it.

A token file is a folder of four files:

- ``tokens.bin``: every document's token ids followed by one end-of-document id, documents back to back, as raw
  little-endian ``uint16`` when the vocabulary fits in 65,536 ids, else ``uint32``;
- ``index.bin``: ``uint64`` document ends (the offset one past each document's end-of-document id), so document
  ``i`` is ``tokens[ends[i-1]:ends[i]]``;
- ``tokenizer.json``: the tokenizer that made the ids, when one was given, so the folder is enough to train on;
- ``meta.json``, written last: the format version, dtype, counts, vocabulary, the cache key and a CRC-32 per 4 MiB
  block of ``tokens.bin`` and of ``index.bin``.

``build`` writes the folder under a temporary name beside its final one and renames it into place when it is
complete, so a build that is killed leaves no token file (at most a ``.tmp-`` folder, which is never read and is
cleared by the next build). ``open_token_file`` checks the sizes and the checksums before it maps anything: a
truncated or damaged file raises ``TokenFileError`` naming the file and what to do. ``cached`` is open-or-build
under a key of the corpus, the tokenizer and the settings.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zlib
from typing import Any, Callable, Iterable

import numpy as np

from multilevel.files import atomic_folder, remove_stale_temporaries

FORMAT = "multilevel-token-file"
VERSION = 1
BLOCK_BYTES = 1 << 22  # Checksum granularity: 4 MiB.
TOKENS, INDEX, META, TOKENIZER = "tokens.bin", "index.bin", "meta.json", "tokenizer.json"
_INDEX_DTYPE = np.dtype("<u8")


class TokenFileError(ValueError):
  """A token file is missing, incomplete or damaged."""


def dtype_for(vocab_size: int) -> np.dtype:
  """``uint16`` when ids 0..vocab_size-1 fit in it, else ``uint32`` (both little-endian)."""
  if vocab_size <= 0:
    raise ValueError(f"vocab_size must be positive, got {vocab_size}.")
  if vocab_size <= 1 << 16:
    return np.dtype("<u2")
  if vocab_size <= 1 << 32:
    return np.dtype("<u4")
  raise ValueError(f"vocab_size {vocab_size} does not fit in 32-bit token ids.")


@dataclasses.dataclass(frozen=True)
class TokenFile:
  """An opened token file: ``tokens`` and ``ends`` are read-only memory maps."""
  path: str
  tokens: np.ndarray  # [num_tokens], uint16 or uint32.
  ends: np.ndarray  # [num_documents], uint64 offsets one past each document.
  meta: dict

  @property
  def num_tokens(self) -> int:
    return int(self.meta["num_tokens"])

  @property
  def num_documents(self) -> int:
    return int(self.meta["num_documents"])

  @property
  def vocab_size(self) -> int:
    return int(self.meta["vocab_size"])

  @property
  def eos_id(self) -> int:
    return int(self.meta["eos_id"])

  @property
  def description(self) -> str:
    return str(self.meta.get("description", ""))

  @property
  def tokenizer_path(self) -> str:
    """The tokenizer.json stored in the folder ('' when the file was built without one)."""
    path = os.path.join(self.path, TOKENIZER)
    return path if os.path.exists(path) else ""

  def document(self, i: int) -> np.ndarray:
    """Document ``i``'s ids, its end-of-document id included."""
    start = 0 if i == 0 else int(self.ends[i - 1])
    return self.tokens[start:int(self.ends[i])]

  def sequences(self, seq_len: int) -> np.ndarray:
    """A read-only [num_tokens // seq_len, seq_len] view: the stream cut into consecutive windows (the tail that
    does not fill one is left out)."""
    n = self.num_tokens // seq_len
    return self.tokens[:n * seq_len].reshape(n, seq_len)

  def split_documents(self, seq_len: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices into ``sequences(seq_len)`` that hold out whole documents.

    Documents are taken in a seeded order until they hold ``val_fraction`` of the tokens; a window lies in the
    validation split when all of it is in held-out documents, in the training split when none of it is, and is
    dropped otherwise, so no held-out token is ever trained on.
    """
    if val_fraction <= 0:
      return np.arange(self.num_tokens // seq_len), np.zeros(0, np.int64)
    if self.num_documents < 2:
      raise ValueError(f"The token file {self.path} holds {self.num_documents} document: holding out whole "
                       "documents needs two or more (or hold out sequences).")
    ends = np.asarray(self.ends, dtype=np.int64)
    sizes = np.diff(ends, prepend=0)
    order = np.random.default_rng([int(seed), 0xD0C5]).permutation(self.num_documents)
    taken = np.cumsum(sizes[order]) <= val_fraction * self.num_tokens
    taken[0] = True  # at least one document
    held = np.zeros(self.num_documents, bool)
    held[order[taken]] = True
    if held.all():
      held[order[-1]] = False
    n = self.num_tokens // seq_len
    starts = np.arange(n, dtype=np.int64) * seq_len
    first = np.searchsorted(ends, starts, side="right")  # the document of each window's first and last token
    last = np.searchsorted(ends, starts + seq_len - 1, side="right")
    count = np.concatenate([[0], np.cumsum(held)])  # held documents among the first k
    in_held = count[last + 1] - count[first]
    return np.flatnonzero(in_held == 0), np.flatnonzero(in_held == last - first + 1)

  @property
  def nbytes(self) -> int:
    return int(self.tokens.nbytes + self.ends.nbytes)


# ------------------------------------------------------------------ checks
def _block_crcs(path: str) -> list[int]:
  crcs = []
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(BLOCK_BYTES), b""):
      crcs.append(zlib.crc32(block))
  return crcs


def rebuild_hint(folder: str) -> str:
  """What a damaged token file's message says to do: right for one in the cache, which a run builds."""
  return f"Delete the folder (rm -r {folder}) and run again to rebuild it from the corpus."


def _damaged(path: str, what: str) -> TokenFileError:
  folder = os.path.dirname(path)
  return TokenFileError(f"The token file {folder} is damaged: {os.path.basename(path)} {what}. {rebuild_hint(folder)}")


def _check_file(path: str, nbytes: int, crcs: list[int]) -> None:
  if not os.path.exists(path):
    raise _damaged(path, "is missing")
  size = os.path.getsize(path)
  if size != nbytes:
    raise _damaged(path, f"holds {size:,} bytes where {META} says {nbytes:,} (truncated or overwritten)")
  found = _block_crcs(path)
  for i, (a, b) in enumerate(zip(found, crcs)):
    if a != b:
      raise _damaged(path, f"fails its checksum in block {i} (bytes {i * BLOCK_BYTES:,}-"
                           f"{min(nbytes, (i + 1) * BLOCK_BYTES):,})")
  if len(found) != len(crcs):
    raise _damaged(path, f"has {len(found)} checksum blocks where {META} lists {len(crcs)}")


def read_meta(folder: str) -> dict:
  path = os.path.join(folder, META)
  if not os.path.exists(path):
    what = "does not exist" if not os.path.isdir(folder) else f"has no {META}, so it is not a finished token file"
    raise TokenFileError(f"The token file {folder} {what}. Build it (it is built on the first run of its corpus), or "
                         "point the config at the folder of a finished one.")
  try:
    with open(path, encoding="utf-8") as f:
      meta = json.load(f)
  except (OSError, ValueError) as e:
    raise _damaged(path, f"is not readable JSON ({e})") from None
  if not isinstance(meta, dict) or meta.get("format") != FORMAT:
    raise TokenFileError(f"{path} is not the meta file of a token file (no format {FORMAT!r}).")
  if meta.get("version") != VERSION:
    raise TokenFileError(f"The token file {folder} has format version {meta.get('version')}, this code reads version "
                         f"{VERSION}; delete it to rebuild it.")
  return meta


def open_token_file(folder: str, *, verify: bool = True) -> TokenFile:
  """Opens a finished token file; ``verify`` checks every block's checksum (about 1 s per GB), not just sizes."""
  folder = os.path.abspath(os.path.expanduser(folder))
  meta = read_meta(folder)
  dtype = np.dtype(meta["dtype"])
  n, docs = int(meta["num_tokens"]), int(meta["num_documents"])
  tokens_path, index_path = os.path.join(folder, TOKENS), os.path.join(folder, INDEX)
  for path, nbytes, crcs in ((tokens_path, n * dtype.itemsize, meta["tokens_crc32"]),
                             (index_path, docs * _INDEX_DTYPE.itemsize, meta["index_crc32"])):
    if verify:
      _check_file(path, nbytes, crcs)
    elif not os.path.exists(path) or os.path.getsize(path) != nbytes:
      raise _damaged(path, f"is missing or does not hold the {nbytes:,} bytes {META} says")
  if n == 0:
    raise TokenFileError(f"The token file {folder} holds no tokens.")
  tokens = np.memmap(tokens_path, dtype=dtype, mode="r", shape=(n,))
  ends = np.memmap(index_path, dtype=_INDEX_DTYPE, mode="r", shape=(docs,))
  if docs and int(ends[-1]) != n:
    raise _damaged(index_path, f"ends at token {int(ends[-1]):,} but the file holds {n:,} tokens")
  return TokenFile(path=folder, tokens=tokens, ends=ends, meta=meta)


# ------------------------------------------------------------------- build
def _write_documents(out, documents: Iterable[Any], dtype: np.dtype, vocab_size: int, eos_id: int) -> list[int]:
  """Writes each document's ids and an end-of-document id to ``out``; returns the document ends."""
  num_tokens, ends, pending, pending_size = 0, [], [], 0
  for doc in documents:
    ids = np.asarray(doc)
    if ids.ndim != 1:
      raise ValueError(f"A document must be a 1-D sequence of ids, got shape {ids.shape}.")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
      raise ValueError(f"Document {len(ends)} holds ids outside [0, {vocab_size}): min {int(ids.min())}, "
                       f"max {int(ids.max())}.")
    row = np.empty(ids.size + 1, dtype=dtype)
    row[:-1], row[-1] = ids, eos_id
    pending.append(row)
    pending_size += row.size
    num_tokens += row.size
    ends.append(num_tokens)
    if pending_size >= 1 << 20:  # written in pieces of about a million tokens
      np.concatenate(pending).tofile(out)
      pending, pending_size = [], 0
  if pending:
    np.concatenate(pending).tofile(out)
  return ends


def build(folder: str, documents: Iterable[Any], *, vocab_size: int, eos_id: int, description: str = "",
          key: Any = None, tokenizer_json: str | None = None) -> TokenFile:
  """Writes the token file ``folder`` from ``documents`` (each a sequence of ids, the end-of-document id not
  included: it is appended here) and opens it.

  Written atomically: everything goes to a temporary folder beside ``folder``, renamed onto it once complete. If
  another process finished the same folder first, its file is kept and opened.
  """
  folder = os.path.abspath(os.path.expanduser(folder))
  remove_stale_temporaries(folder)
  dtype = dtype_for(vocab_size)
  if not 0 <= eos_id < vocab_size:
    raise ValueError(f"eos_id {eos_id} is not an id of a vocabulary of {vocab_size}.")
  with atomic_folder(folder) as tmp:
    with open(os.path.join(tmp, TOKENS), "wb") as out:
      ends = _write_documents(out, documents, dtype, vocab_size, eos_id)
    if not ends:
      raise ValueError(f"{description or 'The corpus'} holds no text: it gave no documents to tokenize, so no token "
                       "file was written.")
    np.asarray(ends, dtype=_INDEX_DTYPE).tofile(os.path.join(tmp, INDEX))
    if tokenizer_json is not None:
      with open(os.path.join(tmp, TOKENIZER), "w", encoding="utf-8") as f:
        f.write(tokenizer_json)
    meta = {"format": FORMAT, "version": VERSION, "dtype": dtype.str, "num_tokens": ends[-1],
            "num_documents": len(ends), "vocab_size": int(vocab_size), "eos_id": int(eos_id),
            "description": description, "key": key, "block_bytes": BLOCK_BYTES,
            "tokens_crc32": _block_crcs(os.path.join(tmp, TOKENS)),
            "index_crc32": _block_crcs(os.path.join(tmp, INDEX))}
    with open(os.path.join(tmp, META), "w", encoding="utf-8") as f:  # last: a folder with meta.json is complete
      json.dump(meta, f, indent=1, default=str)
    for entry in os.scandir(tmp):
      os.chmod(entry.path, 0o644)
  return open_token_file(folder)


def cached(cache_dir: str, key: Any, documents: Callable[[], Iterable[Any]], *, vocab_size: int, eos_id: int,
           description: str = "", tokenizer_json: str | None = None, on_build: Callable[[str], None] | None = None,
           on_reuse: Callable[[str], None] | None = None) -> TokenFile:
  """The token file of ``key`` under ``cache_dir/tokens/``: opened when it exists, else built from ``documents()``.

  ``key`` is any JSON-able identity of the corpus, tokenizer and settings; its hash names the folder.
  """
  from multilevel.data import common  # the fingerprint helper; imported here so the module stands alone
  folder = os.path.join(cache_dir, "tokens", common.fingerprint([VERSION, key]))
  if os.path.exists(os.path.join(folder, META)):
    if on_reuse is not None:
      on_reuse(folder)
    return open_token_file(folder)
  if on_build is not None:
    on_build(folder)
  return build(folder, documents(), vocab_size=vocab_size, eos_id=eos_id, description=description, key=key,
               tokenizer_json=tokenizer_json)
