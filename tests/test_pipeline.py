"""Tests of multilevel.data's batch pipeline (deterministic, resumable, split by process, its thread), the atomic
file writers, and DataConfig (the one home of the data defaults, what it coerces and refuses)."""

import json

import numpy as np
import pytest

from multilevel.data import DataConfig, default_config, make_data
from multilevel.data import pipeline
from tests.data_util import assert_same_batches, take


def _toy_iterator(seed=0, prefetch=2, process_index=0, process_count=1, n=50, batch=8):
  data = np.arange(n * 3).reshape(n, 3)

  def make_batch(positions, key, rows):
    return {"x": data[positions], "noise": np.random.default_rng(key).random(batch)[rows]}

  return pipeline.BatchIterator(n, batch, make_batch, seed=seed, process_index=process_index,
                                process_count=process_count, prefetch=prefetch)


def test_pipeline_deterministic_and_reshuffled_each_epoch():
  a, b, c = _toy_iterator(0), _toy_iterator(0, prefetch=0), _toy_iterator(1)
  xa, xb, xc = take(a, 12), take(b, 12), take(c, 12)
  assert_same_batches(xa, xb)
  assert not np.array_equal(xa[0]["x"], xc[0]["x"])
  # 50 // 8 = 6 steps per epoch; epoch 1 is another permutation; nothing repeats within an epoch.
  e0 = np.concatenate([x["x"][:, 0] for x in xa[:6]])
  e1 = np.concatenate([x["x"][:, 0] for x in xa[6:]])
  assert len(set(e0.tolist())) == 48 and not np.array_equal(e0, e1)
  for it in (a, b, c):
    it.close()


@pytest.mark.parametrize("k", [1, 5, 6, 9])
def test_pipeline_resume(k):
  it = _toy_iterator()
  take(it, k)
  state = json.loads(json.dumps(it.get_state()))
  expected = take(it, 4)
  restored = _toy_iterator()
  restored.set_state(state)
  assert_same_batches(take(restored, 4), expected)
  # set_state on a running iterator rewinds too.
  it.set_state(state)
  assert_same_batches(take(it, 4), expected)
  it.close()
  restored.close()


def test_pipeline_host_split_matches_global_batch():
  whole = take(_toy_iterator(prefetch=0), 7)
  hosts = [take(_toy_iterator(process_index=i, process_count=2), 7) for i in range(2)]
  for step in range(7):
    for key in ("x", "noise"):
      np.testing.assert_array_equal(np.concatenate([hosts[0][step][key], hosts[1][step][key]]), whole[step][key])


def test_pipeline_errors():
  with pytest.raises(ValueError, match="not divisible"):
    _toy_iterator(process_count=3)
  with pytest.raises(ValueError, match="fewer than one global batch"):
    _toy_iterator(n=5)
  with pytest.raises(ValueError, match="seed"):
    _toy_iterator(seed=1).set_state(_toy_iterator(seed=2).get_state())
  with pytest.raises(ValueError, match="Not a data iterator state"):
    _toy_iterator().set_state({"step": 1})


def test_pipeline_error_in_producer_reaches_caller():
  def bad(positions, key, rows):
    raise KeyError("boom")
  it = pipeline.BatchIterator(10, 2, bad, seed=0, process_index=0, process_count=1, prefetch=2)
  with pytest.raises(KeyError, match="boom"):
    next(it)


def test_pipeline_thread_stops_when_dropped():
  import gc
  import threading
  it = _toy_iterator()
  next(it)
  thread = it._thread
  assert thread.is_alive()
  del it
  gc.collect()
  thread.join(timeout=2)
  assert not thread.is_alive()
  assert not any(t.name.endswith("-prefetch") and t is thread for t in threading.enumerate())


def test_atomic_writers_leave_whole_files_only(tmp_path):
  from multilevel import files, metrics
  assert metrics.write_json_atomic is files.write_json_atomic
  path = tmp_path / "sub" / "out.json"
  files.write_json_atomic(str(path), {"b": 1, "a": [1, 2]})
  assert path.read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
  assert oct(path.stat().st_mode & 0o777) == "0o644"
  files.write_text_atomic(str(path), "new")
  assert path.read_text() == "new"
  with pytest.raises(RuntimeError, match="half way"):
    with files.atomic_path(str(path)) as tmp, open(tmp, "w") as f:
      f.write("half")
      raise RuntimeError("half way")
  assert path.read_text() == "new" and sorted(p.name for p in path.parent.iterdir()) == ["out.json"]


def test_default_config_fields():
  cfg = default_config()
  for field in ("name", "tokenizer", "vocab_size", "tokenizer_type", "val_fraction", "cache_dir",
                "augment", "prefetch", "max_eval_batches", "files", "text_field", "folder",
                "data_dir", "config_name", "split", "streaming"):
    assert hasattr(cfg, field), field
  assert cfg.vocab_size == 2048 and cfg.val_fraction == 0.05 and cfg.prefetch == 2


def test_data_config_is_the_one_home_of_the_defaults():
  import dataclasses
  assert default_config().to_dict() == dataclasses.asdict(DataConfig())
  assert DataConfig.from_config(default_config()) == DataConfig.from_config({}) == DataConfig()
  assert DataConfig.from_config({}).tokenizer_max_chars == 200_000_000  # a dict config no longer means "no cap"
  c = DataConfig(vocab_size=300)
  assert DataConfig.from_config(c) is c
  assert DataConfig.from_config(c.to_config()) == c


def test_data_config_coerces_what_is_safe():
  c = DataConfig.from_config({"val_fraction": 0, "vocab_size": np.int64(512), "files": ["a/*.txt", "b.txt"]})
  assert c.val_fraction == 0.0 and isinstance(c.val_fraction, float)
  assert c.vocab_size == 512 and type(c.vocab_size) is int
  assert c.files == ("a/*.txt", "b.txt")
  assert DataConfig.from_config({"files": "a/*.txt,b.txt", "augment": "strong"}).augment == "strong"


def test_data_config_refuses_unknown_keys_and_wrong_types():
  with pytest.raises(ValueError, match="unknown key.*vocab_sise.*valid keys are name, config_name.*vocab_size"):
    DataConfig.from_config({"vocab_sise": 512})
  cfg = default_config()
  cfg.unused = 1
  with pytest.raises(ValueError, match="unknown key.*unused"):
    make_data(cfg, kind="text", batch_size=4, seq_len=16, process_index=0, process_count=1)
  cases = [("vocab_size", "512", "int"), ("vocab_size", 512.0, "int"), ("streaming", 1, "bool"),
           ("prefetch", True, "int"), ("val_fraction", "0.1", "float"), ("files", ["a", 3], "str or a list of str"),
           ("tokenizer", None, "str"), ("augment", 1, "bool or str")]
  for key, value, expected in cases:
    with pytest.raises(TypeError) as e:
      DataConfig.from_config({key: value})
    assert f"data.{key} = {value!r}" in str(e.value) and f"expected {expected}" in str(e.value), str(e.value)
  with pytest.raises(TypeError, match="DataConfig, a ConfigDict or a dict"):
    DataConfig.from_config([("vocab_size", 512)])


def test_data_config_refuses_meaningless_values():
  with pytest.raises(ValueError, match="data.split is empty.*'train'"):
    DataConfig(split="")
  with pytest.raises(ValueError, match="sample_by must be one of document, paragraph, line"):
    DataConfig(sample_by="sentence")
  for bad in (1.0, -0.1):
    with pytest.raises(ValueError, match="val_fraction must be in"):
      DataConfig(val_fraction=bad)
