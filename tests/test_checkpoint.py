"""multilevel/checkpoint.py: a checkpoint whose bytes were changed in place (it still reads) is refused by its
checksums; one written without checksums still reads."""

import os

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from multilevel.checkpoint import Checkpointer, CheckpointError, tree_checksums


def _state():
  rng = np.random.default_rng(0)
  params = {"dense": {"kernel": jnp.asarray(rng.normal(size=(256, 256)), jnp.float32),  # Random: zstd stores it raw.
                      "bias": jnp.zeros((256,), jnp.float32)}}
  return {"params": params, "opt_state": optax.adam(1e-3).init(params)}


def _save(directory, verify=True):
  ckpt = Checkpointer(str(directory), async_save=False, verify=verify)
  ckpt.save(0, _state(), {"note": "x"})
  ckpt.close()


def _flip_bytes_in_place(directory):
  """XORs 64 bytes in the middle of the largest tensor data file of checkpoint 0 (its size unchanged)."""
  data = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(directory, "0", "state")) for f in fs
          if os.sep + "d" + os.sep in os.path.join(r, f)]
  path = max(data, key=os.path.getsize)
  with open(path, "r+b") as f:
    raw = bytearray(f.read())
    mid = len(raw) // 2
    raw[mid:mid + 64] = bytes(b ^ 0x5A for b in raw[mid:mid + 64])
    f.seek(0)
    f.write(raw)


def test_checksums_name_every_array_by_path_and_follow_its_bytes():
  a = _state()
  sums = tree_checksums(a)
  assert {"params/dense/kernel", "params/dense/bias", "opt_state/0/mu/dense/kernel", "opt_state/0/count"} <= set(sums)
  b = _state()
  b["params"]["dense"]["bias"] = b["params"]["dense"]["bias"].at[3].set(1e-30)
  changed = {k for k in sums if tree_checksums(b)[k] != sums[k]}
  assert changed == {"params/dense/bias"}
  # The same bytes as another dtype or shape are another array.
  assert tree_checksums({"x": jnp.zeros((2, 2), jnp.float32)}) != tree_checksums({"x": jnp.zeros((4,), jnp.float32)})
  assert tree_checksums({"x": jnp.zeros((4,), jnp.float32)}) != tree_checksums({"x": jnp.zeros((4,), jnp.int32)})


def test_a_checkpoint_changed_in_place_is_refused_naming_its_arrays(tmp_path):
  d = tmp_path / "ckpt"
  _save(d)
  abstract = _state()
  ckpt = Checkpointer(str(d), async_save=False)
  restored = ckpt.restore_state(0, abstract)  # Intact: reads back exactly.
  np.testing.assert_array_equal(restored["params"]["dense"]["kernel"], abstract["params"]["dense"]["kernel"])
  ckpt.close()
  _flip_bytes_in_place(str(d))
  ckpt = Checkpointer(str(d), async_save=False)
  with pytest.raises(CheckpointError, match=r"Checkpoint 0 in .* is damaged: 1 of its \d+ arrays do not match the "
                     r"checksums .*params/dense/kernel.*Delete that checkpoint folder"):
    ckpt.restore_state(0, abstract)
  with pytest.raises(CheckpointError, match="is damaged"):
    ckpt.restore_saved(0)  # The export path reads the parameters through the same check.
  ckpt.close()
  # What the check prevents: read without it, the damaged array comes back as other numbers and no error.
  ckpt = Checkpointer(str(d), async_save=False, verify=False)
  silent = ckpt.restore_state(0, abstract)
  ckpt.close()
  assert not np.array_equal(silent["params"]["dense"]["kernel"], abstract["params"]["dense"]["kernel"])


def test_a_checkpoint_saved_without_checksums_still_reads(tmp_path):
  d = tmp_path / "ckpt"
  _save(d, verify=False)
  ckpt = Checkpointer(str(d), async_save=False)
  assert "checksums" not in ckpt.restore_meta(0)
  out = ckpt.restore_state(0, _state())
  ckpt.close()
  np.testing.assert_array_equal(out["params"]["dense"]["kernel"], _state()["params"]["dense"]["kernel"])


def test_the_cost_benchmark_times_both_settings_on_a_tiny_preset():
  from benchmarks import checkpoint_cost
  out = checkpoint_cost.measure("gpt-tiny", checkpoint_cost.parse_args(["--rounds=2", "--out="]))
  assert len(out["rounds"]) == 2 and out["state_gib"] > 0 and out["checksums_s"] > 0
  for key in ("save_s_plain", "save_s_verified", "restore_s_plain", "restore_s_verified", "save_ratio"):
    assert out[key] > 0
