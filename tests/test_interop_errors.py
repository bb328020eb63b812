"""Damaged checkpoint files: each raises a ``CheckpointFileError`` that names the file and says what to do, never a
safetensors, torch or json traceback. The files are real exports (``save_hf``, ``torch.save``), then truncated or
overwritten under ``tmp_path``."""

import json

import jax
import numpy as np
import pytest

pytest.importorskip("safetensors")

from safetensors.numpy import load_file, save_file  # noqa: E402

import multilevel.models as M  # noqa: E402
from multilevel import interop as I  # noqa: E402

DAMAGE = {
    "truncated": lambda raw: raw[:len(raw) // 2],
    "garbage": lambda raw: np.random.default_rng(0).integers(0, 256, len(raw), dtype=np.uint8).tobytes(),
    "empty": lambda raw: b"",
}


def damage(path, how):
  path.write_bytes(DAMAGE[how](path.read_bytes()))


@pytest.fixture(scope="module")
def tiny_gpt():
  cfg = M.preset("gpt-test")
  return cfg, jax.tree_util.tree_map(np.asarray, M.init_params(cfg, 0))


@pytest.fixture
def export(tiny_gpt, tmp_path):
  """A real ``save_hf`` folder of a tiny GPT, and its config and parameters."""
  cfg, params = tiny_gpt
  return I.save_hf(cfg, params, tmp_path / "export"), cfg, params


def raises_clear(path, *args, **kw):
  """``load_hf(*args, **kw)`` raises a ``CheckpointFileError`` naming ``path`` and a remedy, with no chained
  library traceback."""
  with pytest.raises(I.CheckpointFileError) as info:
    I.load_hf(*args, **kw)
  e = info.value
  assert path.name in str(e) and "again" in str(e), str(e)
  assert e.__cause__ is None and (e.__context__ is None or e.__suppress_context__), repr(e.__context__)
  return str(e)


@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_safetensors(export, how):
  out, _, _ = export
  damage(out / "model.safetensors", how)
  raises_clear(out / "model.safetensors", out)
  raises_clear(out / "model.safetensors", out / "model.safetensors")


@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_torch_bin(export, how):
  torch = pytest.importorskip("torch")
  out, cfg, params = export
  sd = {k: torch.from_numpy(v) for k, v in load_file(out / "model.safetensors").items()}
  (out / "model.safetensors").unlink()
  torch.save(sd, out / "pytorch_model.bin")
  c, p = I.load_hf(out)  # The undamaged file loads.
  assert c == cfg
  damage(out / "pytorch_model.bin", how)
  raises_clear(out / "pytorch_model.bin", out)


def _shard(out):
  """Splits ``model.safetensors`` into two shards and an index, as ``save_pretrained(max_shard_size=...)`` does."""
  sd = load_file(out / "model.safetensors")
  (out / "model.safetensors").unlink()
  names = sorted(sd)
  shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
  for shard, keys in shards.items():
    save_file({k: sd[k] for k in keys}, str(out / shard), metadata={"format": "pt"})
  index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
  (out / "model.safetensors.index.json").write_text(json.dumps(index))
  return list(shards)


def test_shard_index_naming_a_missing_shard(export):
  out, cfg, params = export
  shards = _shard(out)
  c, p = I.load_hf(out)  # All shards present: loads.
  assert c == cfg and all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(params)))
  (out / shards[1]).unlink()
  msg = raises_clear(out / "model.safetensors.index.json", out)
  assert shards[1] in msg and shards[0] not in msg


@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_shard_index(export, how):
  out, _, _ = export
  _shard(out)
  damage(out / "model.safetensors.index.json", how)
  raises_clear(out / "model.safetensors.index.json", out)


def test_damaged_shard(export):
  out, _, _ = export
  shards = _shard(out)
  damage(out / shards[0], "truncated")
  raises_clear(out / shards[0], out)


@pytest.mark.parametrize("how", list(DAMAGE) + ["not an object"])
def test_damaged_config_json(export, how):
  out, _, _ = export
  if how == "not an object":
    (out / "config.json").write_text("[1, 2]\n")
  else:
    damage(out / "config.json", how)
  raises_clear(out / "config.json", out)
  raises_clear(out / "config.json", out / "model.safetensors")
  with pytest.raises(I.CheckpointFileError, match="config.json"):
    I.config_from_hf(out)


def test_a_checkpoint_with_nan_or_inf_is_refused_naming_the_tensors(export, tmp_path):
  out, cfg, params = export
  sd = load_file(str(out / "model.safetensors"))
  name = next(k for k in sorted(sd) if k.endswith("c_fc.weight"))
  sd[name][0, 0] = np.inf
  sd["transformer.wte.weight"][1, 1] = np.nan  # Tied to the head: once reported as an "untied copy".
  save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(I.HFInteropError, match=r"NaN or infinity in .*c_fc.weight.*transformer.wte.weight.*Nothing "
                     "was imported"):
    I.load_hf(out)


def test_export_refuses_nonfinite_parameters_a_file_as_folder_and_a_bad_source(tiny_gpt, tmp_path):
  cfg, params = tiny_gpt
  bad = jax.tree_util.tree_map(np.array, params)
  bad["word"]["embedding"][0, 0] = np.nan
  with pytest.raises(I.HFInteropError, match="NaN or infinity in word/embedding.*nothing was exported"):
    I.save_hf(cfg, bad, tmp_path / "nan")
  assert not (tmp_path / "nan" / "model.safetensors").exists()
  (tmp_path / "afile").write_text("x")
  with pytest.raises(I.HFInteropError, match="is a file: save_hf writes config.json and model.safetensors into a "
                     "folder"):
    I.save_hf(cfg, params, tmp_path / "afile")
  with pytest.raises(I.HFInteropError, match="load_hf takes a save_pretrained folder.*got NoneType"):
    I.load_hf(None)
