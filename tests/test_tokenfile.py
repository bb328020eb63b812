"""Tests of the token file (multilevel/data/tokenfile.py) and the offline corpora: local text only, no network."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from multilevel.data import corpora, default_config, make_data, tokenfile
from multilevel.data.tokenfile import TokenFileError
from tests.data_util import assert_same_batches, take

WORDS = ("the river runs under a stone bridge while the old mill turns and a cold wind comes down from the hills "
         "over fields of barley wheat and rye").split()


def _docs(n=60, seed=0):
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, size=rng.integers(15, 60))) + "." for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A tiny .jsonl corpus and a cache in which its tokenizer and token file are built once."""
  folder = tmp_path_factory.mktemp("corpus")
  path = folder / "docs.jsonl"
  path.write_text("\n".join(json.dumps({"text": d}) for d in _docs()) + "\n")
  cfg = default_config()
  cfg.files, cfg.cache_dir, cfg.vocab_size, cfg.prefetch = str(path), str(folder / "cache"), 300, 0
  make_data(cfg, kind="text", batch_size=4, seq_len=16, process_index=0, process_count=1)[0].close()
  (built,) = (folder / "cache" / "tokens").iterdir()
  return cfg, str(built)


def _make(cfg, **kw):
  args = dict(kind="text", batch_size=8, seq_len=16, seed=3, process_index=0, process_count=1)
  args.update(kw)
  return make_data(cfg, **args)


def _ids(n, vocab, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab, size=rng.integers(0, 40)) for _ in range(n)]


# ------------------------------------------------------------------ format
def test_build_from_text_round_trips_the_tokens(corpus):
  cfg, folder = corpus
  tf = tokenfile.open_token_file(folder)
  from tokenizers import Tokenizer
  tok = Tokenizer.from_file(tf.tokenizer_path)
  docs = _docs()
  assert tf.num_documents == len(docs) and tf.tokens.dtype == np.uint16 and tf.vocab_size <= 300
  for i in (0, 17, len(docs) - 1):
    expected = tok.encode(docs[i], add_special_tokens=False).ids + [tf.eos_id]
    np.testing.assert_array_equal(tf.document(i), expected)
  assert tok.decode(tf.document(5).tolist()) == docs[5]  # byte-level BPE: the text comes back exactly
  assert int(tf.ends[-1]) == tf.num_tokens == os.path.getsize(os.path.join(folder, "tokens.bin")) // 2
  seqs = tf.sequences(16)
  assert seqs.shape == (tf.num_tokens // 16, 16) and not seqs.flags.writeable
  np.testing.assert_array_equal(seqs[3], tf.tokens[48:64])
  # The batches are the sequences of the file, as int32.
  train, _, info = _make(cfg)
  batch = next(train)["tokens"]
  assert batch.dtype == np.int32 and all(any((row == s).all() for s in seqs) for row in batch[:2])
  assert info.vocab_size == tf.vocab_size and info.eos_id == tf.eos_id


@pytest.mark.parametrize("vocab, dtype", [(300, np.uint16), (65536, np.uint16), (65537, np.uint32),
                                          (200_000, np.uint32)])
def test_uint16_where_the_vocabulary_fits_else_uint32(tmp_path, vocab, dtype):
  assert tokenfile.dtype_for(vocab) == dtype
  docs = _ids(30, vocab) + [np.array([vocab - 1, 0])]
  tf = tokenfile.build(str(tmp_path / "t"), docs, vocab_size=vocab, eos_id=1)
  assert tf.tokens.dtype == dtype and tf.num_documents == 31
  assert os.path.getsize(tmp_path / "t" / "tokens.bin") == tf.num_tokens * np.dtype(dtype).itemsize
  for i, doc in enumerate(docs):
    np.testing.assert_array_equal(tf.document(i), list(doc) + [1])
  with pytest.raises(ValueError, match="outside"):
    tokenfile.build(str(tmp_path / "u"), [np.array([vocab])], vocab_size=vocab, eos_id=1)


def test_cached_reuses_the_file_and_keys_on_settings(tmp_path):
  calls = []

  def docs(seed):
    calls.append(seed)
    return _ids(10, 500, seed)

  a = tokenfile.cached(str(tmp_path), ["k", 1], lambda: docs(1), vocab_size=500, eos_id=0)
  b = tokenfile.cached(str(tmp_path), ["k", 1], lambda: docs(1), vocab_size=500, eos_id=0)
  c = tokenfile.cached(str(tmp_path), ["k", 2], lambda: docs(2), vocab_size=500, eos_id=0)
  assert calls == [1, 2] and a.path == b.path != c.path
  np.testing.assert_array_equal(a.tokens, b.tokens)
  # A second build of a finished folder (a host that lost the race) keeps the first one.
  again = tokenfile.build(a.path, _ids(3, 500, 9), vocab_size=500, eos_id=0)
  np.testing.assert_array_equal(again.tokens, a.tokens)
  assert sorted(p.name for p in (tmp_path / "tokens").iterdir()) == sorted({os.path.basename(a.path),
                                                                             os.path.basename(c.path)})


# ------------------------------------------------------- hosts and resume
@pytest.mark.parametrize("hosts", [2, 4])
def test_process_split_is_disjoint_and_covers_each_epoch(corpus, hosts):
  cfg, folder = corpus
  from multilevel.data import common
  seqs = tokenfile.open_token_file(folder).sequences(16)
  where = {s.tobytes(): i for i, s in enumerate(seqs)}
  assert len(where) == len(seqs)  # every window distinct, so a row names its sequence
  train_idx, val_idx = common.split_indices(len(seqs), cfg.val_fraction, cfg.split_seed)
  steps = len(train_idx) // 8
  for epoch in range(2):
    read = []
    for p in range(hosts):
      train, _, _ = _make(cfg, process_index=p, process_count=hosts)
      if epoch:
        train.set_state(dict(train.get_state(), epoch=epoch, step=0))
      for b in take(train, steps):
        assert b["tokens"].shape == (8 // hosts, 16)
        read.extend(where[r.astype(np.uint16).tobytes()] for r in b["tokens"])
    assert len(set(read)) == len(read) == steps * 8  # disjoint: no sequence read twice in an epoch
    assert set(read) <= set(train_idx.tolist()) and not set(read) & set(val_idx.tolist())
    assert len(train_idx) - len(read) < 8  # covering: only the tail short of one global batch waits an epoch


def test_host_rows_concatenate_to_the_global_batch(corpus):
  cfg, _ = corpus
  whole = take(_make(cfg)[0], 5)
  parts = [take(_make(cfg, process_index=p, process_count=2)[0], 5) for p in range(2)]
  for step in range(5):
    np.testing.assert_array_equal(np.concatenate([parts[0][step]["tokens"], parts[1][step]["tokens"]]),
                                  whole[step]["tokens"])


def test_resume_from_a_stored_position_gives_the_same_next_batches(corpus):
  cfg, _ = corpus
  background = cfg.copy_and_resolve_references()
  background.prefetch = 2
  train, _, info = _make(background)
  steps = info.num_train_examples // 8
  take(train, steps - 1)  # the next batches cross into the second epoch (a new permutation)
  state = json.loads(json.dumps(train.get_state()))
  expected = take(train, 4)
  train.close()
  assert state["identity"]
  restored, _, _ = _make(cfg)
  restored.set_state(state)
  assert_same_batches(take(restored, 4), expected)
  # The batches are a pure function of (seed, epoch, step): the iterator's batch_at agrees.
  assert_same_batches([restored.batch_at(1, 0)], [expected[1]])
  state_elsewhere = dict(state, identity="0" * 16)
  with pytest.raises(ValueError, match="other text data"):
    restored.set_state(state_elsewhere)


def test_a_copied_token_file_gives_the_same_data(corpus, tmp_path):
  cfg, folder = corpus
  carried = tmp_path / "carried"
  shutil.copytree(folder, carried)
  direct, ev_direct, info = _make(cfg)
  other = default_config()
  other.token_file, other.prefetch = str(carried), 0
  copied, ev_copied, info2 = _make(other)
  assert_same_batches(take(copied, 3), take(direct, 3))
  assert_same_batches(list(ev_copied()), list(ev_direct()))
  assert info2.vocab_size == info.vocab_size and info2.tokenizer_path == str(carried / "tokenizer.json")
  copied.set_state(direct.get_state())  # the same identity: a run can resume on the copy
  os.remove(carried / "tokenizer.json")
  with pytest.raises(ValueError, match="holds no tokenizer.json"):
    _make(other)


# ----------------------------------------------------------------- damage
def test_truncated_or_corrupted_file_is_refused(corpus, tmp_path):
  _, folder = corpus
  cases = {
      "truncated": ("tokens.bin", lambda b: b[:-6], "tokens.bin holds .* bytes where meta.json says .*truncated"),
      "corrupted": ("tokens.bin", lambda b: b[:100] + bytes([b[100] ^ 0x40]) + b[101:],
                    "tokens.bin fails its checksum in block 0"),
      "index": ("index.bin", lambda b: b[:-1] + bytes([b[-1] ^ 1]), "index.bin fails its checksum"),
      "meta": ("meta.json", lambda b: b[:len(b) // 2], "meta.json is not readable JSON"),
  }
  for case, (name, damage, message) in cases.items():
    copy = tmp_path / case
    shutil.copytree(folder, copy)
    (copy / name).write_bytes(damage((copy / name).read_bytes()))
    with pytest.raises(TokenFileError, match=f"The token file {copy} is damaged: {message}.*rm -r {copy}"):
      tokenfile.open_token_file(str(copy))
  os.remove(tmp_path / "truncated" / "meta.json")
  with pytest.raises(TokenFileError, match="has no meta.json, so it is not a finished token file"):
    tokenfile.open_token_file(str(tmp_path / "truncated"))
  with pytest.raises(TokenFileError, match="does not exist"):
    tokenfile.open_token_file(str(tmp_path / "nowhere"))


def test_a_damaged_cached_file_is_named_by_the_run(corpus, tmp_path):
  cfg, folder = corpus
  cache = tmp_path / "cache"
  shutil.copytree(os.path.dirname(os.path.dirname(folder)), cache)
  (tokens,) = cache.glob("tokens/*/tokens.bin")
  with open(tokens, "r+b") as f:
    f.truncate(tokens.stat().st_size - 2)
  damaged = cfg.copy_and_resolve_references()
  damaged.cache_dir = str(cache)
  with pytest.raises(TokenFileError, match="is damaged: tokens.bin holds .*Delete the folder"):
    _make(damaged)


# ---------------------------------------------------------------- atomic
def test_an_interrupted_build_leaves_no_token_file(tmp_path):
  def docs():
    yield from _ids(5, 300)
    raise KeyboardInterrupt  # a Ctrl-C half way

  with pytest.raises(KeyboardInterrupt):
    tokenfile.cached(str(tmp_path), "k", docs, vocab_size=300, eos_id=1)
  assert list((tmp_path / "tokens").iterdir()) == []
  with pytest.raises(ValueError, match="The corpus holds no text"):
    tokenfile.build(str(tmp_path / "tokens" / "empty"), [], vocab_size=300, eos_id=1)
  assert list((tmp_path / "tokens").iterdir()) == []


def test_a_killed_build_leaves_only_a_temporary_folder_that_is_never_read(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  script = textwrap.dedent(f"""
      import sys, time
      sys.path.insert(0, {root!r})
      import numpy as np
      from multilevel.data import tokenfile
      def docs():
        for i in range(10**6):
          if i == 3:
            print("writing", flush=True)
          yield np.arange(2000) % 300
          time.sleep(0.01)
      tokenfile.build({str(tmp_path / "t")!r}, docs(), vocab_size=300, eos_id=1)
      """)
  proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline().strip() == "writing"
    time.sleep(0.2)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  left = [p.name for p in tmp_path.iterdir()]
  assert len(left) == 1 and left[0].startswith(".t.tmp-")  # no final folder: nothing can open it
  with pytest.raises(TokenFileError, match="does not exist"):
    tokenfile.open_token_file(str(tmp_path / "t"))
  stale = tmp_path / left[0]
  os.utime(stale, (time.time() - 7200, time.time() - 7200))  # two hours old: a dead build's
  tf = tokenfile.build(str(tmp_path / "t"), _ids(4, 300), vocab_size=300, eos_id=1)
  assert tf.num_documents == 4 and [p.name for p in tmp_path.iterdir()] == ["t"]


# ---------------------------------------------------------------- corpora
def test_offline_corpora_are_named_and_missing_packages_say_what_to_install(monkeypatch):
  assert set(corpora.CORPORA) == {"shakespeare", "kernel-docs", "python-docs", "docs", "gcide"}
  assert corpora.named("").key == corpora.named("shakespeare").key and corpora.named("wikitext") is None
  monkeypatch.setattr(corpora, "KERNEL_TARBALLS", "/nonexistent/linux-source-*.tar.xz")
  monkeypatch.setattr(corpora, "PYTHON_DOCS", "/nonexistent/python3.*/html/_sources")
  with pytest.raises(FileNotFoundError, match="apt-get install linux-source-6.12"):
    corpora.named("docs")
  with pytest.raises(FileNotFoundError, match="apt-get install python3.11-doc"):
    corpora.named("python-docs")


def test_rest_cleaning_and_kernel_member_filter():
  text = (".. SPDX-License-Identifier: GPL-2.0\n\n=====\nTitle\n=====\n\nSome   prose.  \n\n\n\n"
          "Section\n-------\n\n.. note::\n   Keep this.\n")
  assert corpora.clean_rest(text) == "Title\n\nSome   prose.\n\nSection\n\n.. note::\n   Keep this.\n"
  keep = ["linux-source-6.12/Documentation/admin-guide/README.rst", "linux-source-6.12/Documentation/x/notes.txt"]
  drop = ["linux-source-6.12/Documentation/translations/zh_CN/index.rst",
          "linux-source-6.12/Documentation/devicetree/bindings/a.yaml",
          "linux-source-6.12/Documentation/devicetree/bindings/b.txt",
          "linux-source-6.12/Documentation/logo.gif", "linux-source-6.12/drivers/Documentation/a.rst",
          "linux-source-6.12/tools/x/Documentation/a.rst"]
  assert [corpora._kernel_member(n) for n in keep + drop] == [True] * 2 + [False] * 6


def test_python_docs_corpus_when_installed(tmp_path, monkeypatch):
  """A fake documentation tree in the Debian layout: files in sorted order, cleaned, one document each."""
  root = tmp_path / "python3.99" / "html" / "_sources"
  (root / "library").mkdir(parents=True)
  (root / "library" / "os.rst.txt").write_text(":mod:`os`\n=========\n\nMiscellaneous interfaces.\n")
  (root / "about.rst.txt").write_text("About\n*****\n\nThese documents.\n")
  monkeypatch.setattr(corpora, "PYTHON_DOCS", str(tmp_path / "python3.*" / "html" / "_sources"))
  source = corpora.named("python-docs")
  assert list(source.documents()) == ["About\n\nThese documents.\n", ":mod:`os`\n\nMiscellaneous interfaces.\n"]
  assert "python3.99" in source.description and source.key[1] == "python3.99"


def test_gcide_corpus_and_joined_names(tmp_path, monkeypatch):
  """A fake dictd file: header entries dropped, source tags removed, 200 entries a document; '+' joins corpora."""
  import gzip
  entries = [f"Word{i} \\Word{i}\\, n.\n   A sense of word {i}.\n   [1913 Webster]\n\n         A quotation. --Shak.\n"
             f"   [WordNet 1.5 +PJC]" for i in range(250)]
  path = tmp_path / "gcide.dict.dz"
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.write("\n\n00-database-url\n   ftp://example\n\n" + "\n\n".join(entries) + "\n")
  monkeypatch.setattr(corpora, "GCIDE", str(path))
  docs = list(corpora.named("gcide").documents())
  assert len(docs) == 2 and docs[0].startswith("Word0 \\Word0\\, n.\n   A sense of word 0.\n\n         A quotation.")
  assert "Webster" not in docs[0] + docs[1] and "00-database" not in docs[0] and docs[1].count("\\, n.") == 50
  joined = corpora.named("gcide+shakespeare")
  assert joined.key[0] == "gcide+shakespeare" and joined.description.startswith("gcide+shakespeare: the Collab")
  assert corpora.named("gcide+nonsense") is None


@pytest.mark.slow
def test_build_tokens_command_states_the_epoch_and_copies_the_file(corpus, tmp_path):
  cfg, folder = corpus
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = tmp_path / "carried"
  result = subprocess.run(
      [sys.executable, "-m", "experiments.build_tokens", "--config=experiments/configs/gpt.py:test",
       f"--config.data.files={cfg.files}", f"--config.data.cache_dir={cfg.cache_dir}", "--config.data.vocab_size=300",
       "--steps=1e1", f"--out={out}"],
      cwd=root, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": root})
  assert result.returncode == 0, result.stderr[-2000:]
  tf = tokenfile.open_token_file(str(out))
  assert f"token file {folder}: {tf.num_tokens:,} tokens (uint16)" in result.stdout  # the cached file, not a rebuild
  assert "10 steps of 8x32: 2,560 tokens = " in result.stdout and "held out" in result.stdout
  assert f"--config.data.token_file={out}" in result.stdout


def test_held_out_documents_are_never_trained_on(corpus, tmp_path):
  cfg, folder = corpus
  tf = tokenfile.open_token_file(folder)
  train_idx, val_idx = tf.split_documents(16, 0.2, seed=0)
  doc_of = np.searchsorted(np.asarray(tf.ends, np.int64), np.arange(tf.num_tokens), side="right")
  val_docs = {int(d) for i in val_idx for d in doc_of[i * 16:(i + 1) * 16]}
  train_docs = {int(d) for i in train_idx for d in doc_of[i * 16:(i + 1) * 16]}
  assert val_docs and not val_docs & train_docs  # whole documents, on one side only
  held_tokens = sum(tf.document(d).size for d in val_docs)
  assert 0.1 * tf.num_tokens < held_tokens <= 0.2 * tf.num_tokens
  dropped = tf.num_tokens // 16 - len(train_idx) - len(val_idx)
  assert 0 < dropped <= 2 * len(val_docs)  # only the windows across a held-out document's edge
  np.testing.assert_array_equal(tf.split_documents(16, 0.2, seed=0)[1], val_idx)
  assert not np.array_equal(tf.split_documents(16, 0.2, seed=1)[1], val_idx)
  documents = cfg.copy_and_resolve_references()
  documents.val_split, documents.val_fraction = "documents", 0.2
  train, evaluation, info = _make(documents)
  assert info.num_train_examples == len(train_idx) and "(held-out documents)" in info.description
  seqs = tf.sequences(16)
  held = {seqs[i].tobytes() for i in val_idx}
  assert all(r.astype(np.uint16).tobytes() in held for b in evaluation() for r in b["tokens"])
  assert not any(r.astype(np.uint16).tobytes() in held for b in take(train, 10) for r in b["tokens"])
  with pytest.raises(ValueError, match="val_split must be one of sequences, documents"):
    _make(dict(documents.to_dict(), val_split="windows"))
