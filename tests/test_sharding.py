"""FSDP sharding from the axis-role table: the rules, a sharded run against one device, resuming on another mesh.

Runs with several fake CPU devices are subprocesses under a timeout (XLA's CPU all-reduce can deadlock when steps are
dispatched without waiting, ../shared/docs/environment.md; the driver then waits for every step's loss).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

from multilevel import models as M
from multilevel.train.sharding import param_specs, parse_mesh
from multilevel.typed_config import ConfigError
from tests.engine_util import ROOT, config_flags, run_cli

FOUR = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}


def test_the_axis_table_decides_which_axis_is_split():
  mesh = AbstractMesh((2, 4), ("data", "fsdp"))
  gpt2 = param_specs(M.preset("gpt2"), mesh)
  assert gpt2["word/embedding"] == P(None, "fsdp")  # The hidden axis, never the vocabulary.
  assert gpt2["layers/mlp/fc1/kernel"] == P(None, "fsdp", None)  # Hidden input before FFN output.
  assert gpt2["layers/mlp/fc1/bias"] == P(None, "fsdp")  # No hidden axis: the FFN one.
  assert gpt2["layers/attn/key/bias"] == P(None, "fsdp", None)  # No hidden, no FFN axis: the heads.
  assert all(spec[0] is None for name, spec in gpt2.items() if name.startswith("layers/"))  # Layers: scanned.
  bert = param_specs(M.preset("bert-large"), mesh)
  assert bert["mlm_bias"] == P(None) and bert["token_type"] == P(None, "fsdp")
  # Per device: a quarter of every split parameter.
  emb = NamedSharding(mesh, gpt2["word/embedding"]).shard_shape((50257, 768))
  assert emb == (50257, 192)


def test_an_axis_that_does_not_divide_stays_replicated():
  specs = param_specs(M.preset("gpt-test"), AbstractMesh((1, 3), ("data", "fsdp")))  # Width 32, 2 heads, FFN 128.
  assert specs["word/embedding"] == P(None, None) and specs["layers/mlp/fc1/bias"] == P(None, None)


def test_bad_meshes_are_refused():
  assert parse_mesh("", 4) == (("data", 4),) and parse_mesh("fsdp:4", 4) == (("data", 1), ("fsdp", 4))
  with pytest.raises(ConfigError, match="has 6 devices but the run uses 4"):
    parse_mesh("data:2,fsdp:3", 4)
  for bad in ("data:2,model:2", "data:two", "data:2,data:2"):
    with pytest.raises(ConfigError, match="train.mesh"):
      parse_mesh(bad, 4)


def _worker(spec: dict, env: dict, timeout=300):
  full = dict(os.environ, JAX_PLATFORMS="cpu", **env)
  full["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {env.get('XLA_FLAGS', '')}".strip()
  proc = subprocess.run([sys.executable, "-m", "tests.sharded_worker", json.dumps(spec)], cwd=ROOT, env=full,
                        capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
  return json.loads(line[len("RESULT "):])


@pytest.mark.slow
def test_an_fsdp_run_matches_one_device_and_holds_half_of_each_split_tree(tmp_path, gpt_reference):
  out = _worker({"workdir": str(tmp_path / "fsdp"), "overrides": {"train.mesh": "data:2,fsdp:2"}}, FOUR)
  assert out["devices"] == 4 and out["steps"] == gpt_reference["steps"]
  # Same global batch; only the order of the reductions differs.
  assert out["loss"] == pytest.approx(gpt_reference["final_eval_loss"], rel=1e-4)
  split = {k: v for k, v in out["shards"].items() if "fsdp" in v["spec"]}
  assert len(split) > 0.9 * len(out["shards"])  # Every parameter and moment with a hidden, FFN or head axis.
  assert any(k.startswith("mu") for k in split) and any(k.startswith("nu") for k in split)
  for name, v in out["shards"].items():
    (shard,) = v["shards"]
    ratio = np.prod(v["shape"]) / np.prod(shard)
    assert ratio == (2 if name in split else 1), (name, v)


@pytest.mark.slow
def test_a_run_resumes_on_a_mesh_of_another_shape(tmp_path, gpt_reference):
  fsdp = ["--config.train.mesh=data:2,fsdp:2"]
  one, four = config_flags("gpt", 2, False, {}), config_flags("gpt", 2, False, {}) + fsdp
  for name, first, then, env_first, env_then in (("4to1", four, one, FOUR, {}), ("1to4", one, four, {}, FOUR)):
    work = str(tmp_path / name)
    proc = run_cli(work, first, env={**env_first, "MULTILEVEL_FAULT": "step:30"})  # In the last stage.
    assert proc.returncode == 137, proc.stderr[-2000:]
    proc = run_cli(work, then, env=env_then)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(work, "summary.json")) as f:
      summary = json.load(f)
    assert summary["steps"] == gpt_reference["steps"]
    assert summary["final_eval_loss"] == pytest.approx(gpt_reference["final_eval_loss"], rel=1e-4)
