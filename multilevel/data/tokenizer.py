"""Tokenizers from the ``tokenizers`` library: train (and cache) or load one.

Tokenizers trained here are byte-level BPE (GPT) or WordPiece (BERT) and always hold the special tokens '<pad>',
'<eos>', '<mask>', '<unk>' as ids 0-3.
"""

from __future__ import annotations

import dataclasses
import os
import unicodedata
from typing import Callable, Iterable, Iterator

from absl import logging
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from multilevel.data import common
from multilevel.files import write_text_atomic

SPECIAL_TOKENS = ("<pad>", "<eos>", "<mask>", "<unk>")
# Names looked up, in order, in a tokenizer that was not trained here.
_ALIASES = {
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|padding|>"),
    "eos": ("<eos>", "</s>", "<|endoftext|>", "[SEP]", "<|eos|>"),
    "mask": ("<mask>", "[MASK]", "<|mask|>"),
    "unk": ("<unk>", "[UNK]", "<|unk|>"),
}


@dataclasses.dataclass(frozen=True)
class LoadedTokenizer:
  tokenizer: Tokenizer
  path: str
  vocab_size: int
  pad_id: int
  eos_id: int
  mask_id: int
  unk_id: int
  kind: str  # 'bpe', 'wordpiece' or the model type of a loaded file.


def resolve_type(tokenizer_type: str, model_family: str) -> str:
  t = (tokenizer_type or "auto").lower()
  if t == "auto":
    return "wordpiece" if model_family.lower().startswith("bert") else "bpe"
  if t not in ("bpe", "wordpiece"):
    raise ValueError(f"data.tokenizer_type must be 'bpe', 'wordpiece' or 'auto', got {tokenizer_type!r}.")
  return t


def new_tokenizer(kind: str, vocab_size: int) -> tuple[Tokenizer, trainers.Trainer]:
  """An untrained tokenizer of ``kind`` and its trainer."""
  if vocab_size < len(SPECIAL_TOKENS) + 1:
    raise ValueError(f"data.vocab_size={vocab_size} is too small to train a tokenizer.")
  if kind == "bpe":
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  elif kind == "wordpiece":
    tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##")
  else:
    raise ValueError(f"Unknown tokenizer kind {kind!r}.")
  return tok, trainer


def _capped(texts: Iterable[str], max_chars: int) -> Iterator[str]:
  total = 0
  for text in texts:
    if max_chars and total >= max_chars:
      return
    total += len(text)
    yield text


def _continuation_tokens(texts: Iterable[str], normalizer) -> list[str]:
  """'##c' for every word character c of the normalized corpus, sorted."""
  chars = set()
  for text in texts:
    chars.update(normalizer.normalize_str(text))
  punct = lambda c: unicodedata.category(c)[0] in "PS" or (c.isascii() and not c.isalnum())
  return ["##" + c for c in sorted(chars) if not c.isspace() and not punct(c)]


def _train_wordpiece(texts: Callable[[], Iterable[str]], vocab_size: int, max_chars: int):
  """A WordPiece trained reproducibly.

  The ``tokenizers`` WordPiece trainer gives '##c' tokens ids in hash-map order, and those ids break ties between
  merges, so two runs on the same text can give different vocabularies (huggingface/tokenizers issue 1794). Declaring
  every '##c' up front (as trainer special tokens, in sorted order) fixes their ids; the trained vocabulary is then
  rebuilt into a plain WordPiece model whose only special tokens are SPECIAL_TOKENS.
  """
  tok, _ = new_tokenizer("wordpiece", vocab_size)
  continuation = _continuation_tokens(_capped(texts(), max_chars), tok.normalizer)
  trainer = trainers.WordPieceTrainer(
      vocab_size=vocab_size, min_frequency=2, show_progress=False,
      special_tokens=list(SPECIAL_TOKENS) + continuation, continuing_subword_prefix="##")
  tok.train_from_iterator(_capped(texts(), max_chars), trainer=trainer)
  out = Tokenizer(models.WordPiece(vocab=tok.get_vocab(), unk_token="<unk>", continuing_subword_prefix="##"))
  out.normalizer, out.pre_tokenizer, out.decoder = tok.normalizer, tok.pre_tokenizer, tok.decoder
  out.add_special_tokens(list(SPECIAL_TOKENS))
  return out


def train_or_load_cached(texts: Callable[[], Iterable[str]], *, kind: str, vocab_size: int,
                         corpus_key: str, cache_dir: str, max_chars: int = 0) -> str:
  """Path of a tokenizer trained on ``texts()``, cached under cache_dir/tokenizers.

  Training is deterministic (same text, same file), so hosts that train their own copy agree.
  """
  path = os.path.join(cache_dir, "tokenizers",
                      f"{kind}-v{vocab_size}-{common.fingerprint([corpus_key, max_chars, 2])}.json")
  if os.path.exists(path):
    logging.info("Using cached %s tokenizer %s", kind, path)
    return path
  logging.info("Training a %s tokenizer (vocab %d) on %s", kind, vocab_size, corpus_key)
  if kind == "wordpiece":
    tok = _train_wordpiece(texts, vocab_size, max_chars)
  else:
    tok, trainer = new_tokenizer(kind, vocab_size)
    tok.train_from_iterator(_capped(texts(), max_chars), trainer=trainer)
  if tok.get_vocab_size() <= len(SPECIAL_TOKENS):
    raise ValueError(f"The corpus {corpus_key} gave no tokens to train a tokenizer on: is it empty?")
  write_text_atomic(path, tok.to_str())
  return path


def _find(tok: Tokenizer, role: str) -> int | None:
  for name in _ALIASES[role]:
    idx = tok.token_to_id(name)
    if idx is not None:
      return int(idx)
  return None


def load(spec: str, *, model_family: str = "gpt") -> LoadedTokenizer:
  """Loads a tokenizer.json path (or a directory holding one, or a hub name)."""
  path = os.path.expanduser(spec)
  if os.path.isdir(path):
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
      raise FileNotFoundError(f"data.tokenizer={spec!r} is a folder without a tokenizer.json; name the tokenizer.json "
                              f"file itself, or set data.tokenizer to '' to train one on the corpus.")
    path = os.path.join(path, "tokenizer.json")
  if os.path.exists(path):
    try:
      tok = Tokenizer.from_file(path)
    except Exception as e:  # the Rust side raises a bare Exception
      raise ValueError(f"{path} is not a tokenizers JSON file ({e}); give a tokenizer.json saved by the tokenizers "
                       "library, or data.tokenizer = '' to train one.") from None
  elif path.endswith(".json") or spec.startswith((".", "/", "~")) or os.path.isabs(spec):
    raise FileNotFoundError(f"Tokenizer file {spec!r} does not exist; fix data.tokenizer, or set it to '' to train a "
                            "tokenizer on the corpus.")
  else:
    common.check_hub_reachable(f"Tokenizer {spec!r} (not a local file)")
    try:
      tok = Tokenizer.from_pretrained(spec)
    except Exception as e:
      raise ValueError(f"Could not load tokenizer {spec!r} from the hub: {e}") from None
  return describe(tok, path, model_family=model_family)


def describe(tok: Tokenizer, path: str, *, model_family: str = "gpt") -> LoadedTokenizer:
  """Finds the special tokens; clear errors when the model needs one that is missing."""
  eos, pad, mask, unk = (_find(tok, r) for r in ("eos", "pad", "mask", "unk"))
  if eos is None:
    raise ValueError(f"Tokenizer {path} has no end-of-document token (looked for {', '.join(_ALIASES['eos'])}); "
                     "packing needs one. Add it to the tokenizer.")
  if mask is None and model_family.lower().startswith("bert"):
    raise ValueError(f"Tokenizer {path} has no mask token (looked for {', '.join(_ALIASES['mask'])}) but "
                     f"model_family={model_family!r} needs one for masked-language modelling. Add it, or train one "
                     "with data.tokenizer = ''.")
  if pad is None:
    logging.warning("Tokenizer %s has no pad token; using the eos id %d as pad_id.", path, eos)
    pad = eos
  kind = type(tok.model).__name__.lower()
  return LoadedTokenizer(tokenizer=tok, path=path, vocab_size=tok.get_vocab_size(with_added_tokens=True),
                         pad_id=pad, eos_id=eos, mask_id=-1 if mask is None else mask,
                         unk_id=-1 if unk is None else unk, kind=kind)
