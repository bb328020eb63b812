"""A user's own text data: what the data stack must not get silently wrong (found by an audit that fed it real-world
files). Local files only, no network."""

import json
import os
import subprocess
import sys

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before ``datasets`` is imported anywhere
os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from absl import logging  # noqa: E402

from multilevel.data import default_config, make_data, tokenfile  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = "the river runs under a stone bridge while the old mill turns and cold wind comes from the hills".split()


def _docs(n=40, seed=0):
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, size=rng.integers(15, 40))) + "." for _ in range(n)]


def _cfg(tmp_path, **kw):
  cfg = default_config()
  cfg.cache_dir, cfg.vocab_size, cfg.prefetch = str(tmp_path / "cache"), 300, 0
  cfg.update(kw)
  return cfg


def _make(cfg, **kw):
  train, _, info = make_data(cfg, **{**dict(kind="text", batch_size=4, seq_len=16, process_index=0,
                                              process_count=1), **kw})
  train.close()
  return info


def _first_document(info) -> str:
  from tokenizers import Tokenizer
  tf = tokenfile.open_token_file(info.token_file)
  return Tokenizer.from_file(tf.tokenizer_path).decode(tf.document(0).tolist())


def test_a_file_rewritten_to_the_same_size_and_mtime_is_tokenized_again(tmp_path):
  path = tmp_path / "a.txt"
  path.write_text("\n\n".join(_docs()))
  cfg = _cfg(tmp_path, files=str(path), tokenizer="", sample_by="paragraph")
  first = _make(cfg)
  st = os.stat(path)
  path.write_text("\n\n".join(_docs()).upper())  # Same size, other text; then the old mtime, to the nanosecond.
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert os.path.getsize(path) == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
  second = _make(cfg)
  assert second.token_file != first.token_file
  assert _first_document(second).strip().upper() == _first_document(second).strip()  # The new text, not the old.


def test_rows_without_a_text_are_counted_in_a_warning_and_named_when_none_has_one(tmp_path, monkeypatch):
  warned = []
  monkeypatch.setattr(logging, "warning", lambda fmt, *a: warned.append(fmt % a))
  rows = [{"text": d} for d in _docs()] + [{"other": "x"}, {"text": None}, {"text": 12345}, {"text": ["a", "b"]}]
  path = tmp_path / "rows.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  _make(_cfg(tmp_path, files=str(path)))
  assert len(warned) == 1, warned  # Read twice (tokenizer, token file), said once.
  assert "skipped 4 row(s) whose field 'text' is not a text: 2 missing or null (first at row 41), 1 of type int " \
         "(first at row 43), 1 of type list (first at row 44)" in warned[0]
  nums = tmp_path / "nums.jsonl"
  nums.write_text("\n".join(json.dumps({"text": i}) for i in range(5)) + "\n")
  with pytest.raises(ValueError, match=r"The json file .*nums.jsonl: no row holds a text in field 'text'; it holds 5 "
                                       r"of type int \(first at row 1\)\. "
                                       r"Set data.text_field"):
    _make(_cfg(tmp_path, files=str(nums)))


def test_a_special_token_written_in_the_text_is_encoded_as_text(tmp_path):
  path = tmp_path / "a.jsonl"
  docs = _docs()
  docs[0] = "the model emits <eos> then <pad> and <mask> tokens " + docs[0]
  path.write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
  info = _make(_cfg(tmp_path, files=str(path)))
  tf = tokenfile.open_token_file(info.token_file)
  assert tf.num_documents == len(docs)  # No false boundary at the '<eos>' inside the first document.
  ids = tf.document(0).tolist()
  assert ids[-1] == info.eos_id and not set(ids[:-1]) & {info.pad_id, info.eos_id, info.mask_id}
  assert _first_document(info).startswith("the model emits <eos> then <pad> and <mask> tokens")


def test_a_token_file_is_the_only_source_and_keeps_its_own_tokenizer(tmp_path):
  path = tmp_path / "a.jsonl"
  path.write_text("\n".join(json.dumps({"text": d}) for d in _docs()) + "\n")
  info = _make(_cfg(tmp_path, files=str(path)))
  folder = info.token_file
  for extra, named in (({"files": str(tmp_path / "nope" / "*.txt")}, "data.files"), ({"name": "gcide"}, "data.name"),
                       ({"max_documents": 5}, "data.max_documents")):
    with pytest.raises(ValueError, match=f"data.token_file is set, and so is {named}: a token file is the whole"):
      _make(_cfg(tmp_path, token_file=folder, **extra))
  # A tokenizer of the same size trained on other text would decode the ids to other words.
  other = tmp_path / "other.jsonl"
  other.write_text("\n".join(json.dumps({"text": d.upper() + " " + d[::-1]}) for d in _docs(seed=5)) + "\n")
  other_info, mine = _make(_cfg(tmp_path, files=str(other))), tokenfile.open_token_file(folder)
  other_tok = other_info.tokenizer_path
  assert other_info.vocab_size == mine.vocab_size  # The size check alone lets it through.
  with pytest.raises(ValueError, match="did not make the token file .* its vocabulary differs"):
    _make(_cfg(tmp_path, token_file=folder, tokenizer=other_tok))
  assert _make(_cfg(tmp_path, token_file=folder, tokenizer=mine.tokenizer_path)).token_file == folder


@pytest.mark.parametrize("key", ["max_documents", "max_eval_batches", "prefetch", "tokenizer_max_chars"])
def test_negative_counts_are_refused(tmp_path, key):
  with pytest.raises(ValueError, match=f"data.{key} must be >= 0"):
    _make(_cfg(tmp_path, **{key: -1}))


def _build_tokens(*flags):
  return subprocess.run([sys.executable, "-m", "experiments.build_tokens", *flags], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})


@pytest.mark.slow
def test_build_tokens_refuses_bad_flags_in_one_line_before_building(tmp_path):
  (tmp_path / "out").mkdir()
  cache = tmp_path / "cache"
  gpt = "--config=experiments/configs/gpt.py:test"
  for flags, message in (([gpt, f"--out={tmp_path / 'out'}"], "already exists; name a folder that does not exist yet"),
                         ([gpt, "--steps=ten"], "--steps takes step counts separated by commas"),
                         ([gpt, "--steps=1.5"], "--steps takes positive whole step counts"),
                         (["--config=experiments/configs/deit.py:test"], "deit is an image family")):
    proc = _build_tokens(*flags, f"--config.data.cache_dir={cache}")
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and line.startswith("error: ") and message in line, proc.stderr
    assert "Traceback" not in proc.stderr
  assert not cache.exists()  # Nothing was built for a command that was refused.


def test_a_utf8_byte_order_mark_is_not_text_and_utf16_files_are_named_as_such(tmp_path):
  docs = _docs()
  for i, d in enumerate(docs):
    (tmp_path / f"{i:02d}.txt").write_bytes(b"\xef\xbb\xbf" + d.encode())  # UTF-8 with a BOM, as some editors save.
  info = _make(_cfg(tmp_path, files=str(tmp_path / "*.txt")))
  assert _first_document(info) == docs[0]
  wide = tmp_path / "wide" / "a.txt"
  wide.parent.mkdir()
  wide.write_text(" ".join(docs), encoding="utf-16")
  with pytest.raises(ValueError, match=r"it is UTF-16 text .* Convert it to UTF-8 \(iconv -f utf-16 -t utf-8\)"):
    _make(_cfg(tmp_path, files=str(wide)))


def test_file_lists_that_cannot_be_read_say_why(tmp_path):
  (tmp_path / "com,ma").mkdir()
  (tmp_path / "com,ma" / "a.txt").write_text(" ".join(_docs()))
  with pytest.raises(FileNotFoundError, match="data.files is split at commas into globs: for a path with a comma"):
    _make(_cfg(tmp_path, files=str(tmp_path / "com,ma" / "*.txt")))
  _make(_cfg(tmp_path, files=str(tmp_path / "com?ma" / "*.txt")))  # The workaround the message gives.
  (tmp_path / "b.csv").write_text("text\nhello\n")
  (tmp_path / "c.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
  with pytest.raises(ValueError, match=r"data.files holds 1 file\(s\) that this cannot read: .*b.csv"):
    _make(_cfg(tmp_path, files=f"{tmp_path / 'com?ma' / '*.txt'},{tmp_path / 'b.csv'}"))
  with pytest.raises(ValueError, match=r"data.files mixes kinds of file \(json: .*c.jsonl, text: .*a.txt\)"):
    _make(_cfg(tmp_path, files=f"{tmp_path / 'com?ma' / '*.txt'},{tmp_path / 'c.jsonl'}"))
  (tmp_path / "tok").mkdir()
  with pytest.raises(FileNotFoundError, match="is a folder without a tokenizer.json; name the tokenizer.json"):
    _make(_cfg(tmp_path, files=str(tmp_path / "c.jsonl"), tokenizer=str(tmp_path / "tok")))


def test_holding_out_whole_short_documents_says_what_it_costs(tmp_path, monkeypatch):
  warned = []
  monkeypatch.setattr(logging, "warning", lambda fmt, *a: warned.append(fmt % a))
  path = tmp_path / "short.txt"
  path.write_text("\n".join(" ".join(d.split()[:6]) for d in _docs(300)))  # Lines of ~8 tokens, windows of 16.
  cfg = _cfg(tmp_path, files=str(path), sample_by="line", val_split="documents", val_fraction=0.2)
  _make(cfg)
  assert any("data.val_split='documents' drops" in w and "data.val_split='sequences'" in w for w in warned), warned
  warned.clear()
  _make(_cfg(tmp_path, files=str(path), sample_by="line"))
  assert not warned  # Windows held out: nothing dropped, nothing said.
  with pytest.raises(ValueError, match=r"holds 1 document, .* needs two or more. Hold out windows instead .*, or cut "
                                       r"the .txt files into more documents \(data.sample_by='paragraph' or 'line'\)"):
    _make(_cfg(tmp_path, files=str(path), val_split="documents"))


def test_a_damaged_token_file_given_by_the_user_is_not_promised_a_rebuild(tmp_path):
  path = tmp_path / "a.jsonl"
  path.write_text("\n".join(json.dumps({"text": d}) for d in _docs()) + "\n")
  import shutil
  given = tmp_path / "carried"
  shutil.copytree(_make(_cfg(tmp_path, files=str(path))).token_file, given)
  with open(given / "tokens.bin", "r+b") as f:
    f.truncate(10)
  with pytest.raises(tokenfile.TokenFileError, match="is damaged: tokens.bin holds 10 bytes.* It was given as "
                                                     "data.token_file, so no run rebuilds it: copy it again"):
    _make(_cfg(tmp_path, token_file=str(given)))


def test_paragraphs_end_at_blank_lines_that_hold_spaces(tmp_path):
  docs = _docs(12)
  path = tmp_path / "p.txt"
  seps = ["\n\n", "\n  \n", "\n\t\n", "\n\n\n\n"]
  path.write_text("".join(d + seps[i % 4] for i, d in enumerate(docs)))
  info = _make(_cfg(tmp_path, files=str(path), sample_by="paragraph", max_eval_batches=0), seq_len=8)
  tf = tokenfile.open_token_file(info.token_file)
  assert tf.num_documents == len(docs)  # datasets alone cuts at '\n\n' only: 6 documents.
  assert _first_document(info).strip() == docs[0]


def test_a_vocab_size_beside_a_given_tokenizer_is_said_to_be_unused(tmp_path, monkeypatch):
  path = tmp_path / "a.jsonl"
  path.write_text("\n".join(json.dumps({"text": d}) for d in _docs()) + "\n")
  tok = _make(_cfg(tmp_path, files=str(path))).tokenizer_path  # Trained here, vocab 300.
  warned = []
  monkeypatch.setattr(logging, "warning", lambda fmt, *a: warned.append(fmt % a))
  info = _make(_cfg(tmp_path, files=str(path), tokenizer=tok, vocab_size=1000))
  assert info.vocab_size <= 300
  assert any("data.vocab_size=1000 sizes a tokenizer trained here" in w for w in warned), warned


def test_characters_a_tokenizer_without_unk_drops_are_named(tmp_path, monkeypatch):
  from tokenizers import Tokenizer, models, pre_tokenizers
  letters = sorted(set("".join(WORDS)) | {"."})
  vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<mask>"] + letters)}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # No unk token, no byte fallback.
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.save(str(tmp_path / "tok.json"))
  docs = _docs()
  docs[3] = "the café → bridge " + docs[3]
  path = tmp_path / "a.txt"
  path.write_text("\n\n".join(docs) + "\n")
  warned = []
  monkeypatch.setattr(logging, "warning", lambda msg, *a: warned.append(msg % a))
  _make(_cfg(tmp_path, files=str(path), tokenizer=str(tmp_path / "tok.json"), sample_by="paragraph"))
  dropped = [w for w in warned if "have no token in the tokenizer" in w]
  assert len(dropped) == 1 and dropped[0].startswith("2 distinct character(s)") and "'é' '→'" in dropped[0], warned
  # A tokenizer trained here has an unknown token: nothing to say.
  warned.clear()
  _make(_cfg(tmp_path, files=str(path), sample_by="paragraph"))
  assert not [w for w in warned if "have no token" in w], warned


def test_a_hub_set_is_read_at_its_pinned_revision_and_cached_per_revision(tmp_path, monkeypatch):
  import datasets

  from multilevel.data import common
  calls = []

  def load_dataset(name, config_name=None, *, split, streaming, revision):
    calls.append(revision)
    return [{"text": d} for d in _docs(seed=1 if revision == "v2" else 0)]

  monkeypatch.setattr(datasets, "load_dataset", load_dataset)
  monkeypatch.setattr(common, "check_hub_reachable", lambda what: None)
  said = []
  monkeypatch.setattr(logging, "info", lambda msg, *a: said.append(msg % a))
  base = dict(name="someone/corpus")
  first = _make(_cfg(tmp_path, **base))
  assert set(calls) == {None}  # (Read for the tokenizer, then for the token file.)
  read = len(calls)
  again = _make(_cfg(tmp_path, **base))
  assert len(calls) == read and again.token_file == first.token_file  # Read once, then reused ...
  assert any("the hub is not asked for a newer version. Set data.revision" in s for s in said), said
  said.clear()
  v2 = _make(_cfg(tmp_path, revision="v2", **base))  # ... and a pinned revision is its own corpus.
  assert calls[-1] == "v2" and v2.token_file != first.token_file
  read = len(calls)
  _make(_cfg(tmp_path, revision="v2", **base))
  assert len(calls) == read and not any("newer version" in s for s in said), said
  with pytest.raises(ValueError, match=r"data.revision='v2' picks a version of a Hugging Face hub data set .* "
                                       r"this run reads data.files"):
    _make(_cfg(tmp_path, files=str(tmp_path / "*.txt"), revision="v2"))
