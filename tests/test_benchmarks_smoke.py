"""The GPU and HF-throughput benchmark scripts still run (tiny shapes, CPU): guards them against API drift."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import gpu

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, timeout=300, env=None):
  env = dict(os.environ, JAX_PLATFORMS="cpu", **(env or {}))
  proc = subprocess.run([sys.executable] + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc.stdout


def test_gpu_script_smoke_throughput(tmp_path):
  out = tmp_path / "gpu.json"
  # Its own compilation cache: a cached executable keeps the HLO metadata (the name scopes the profile reads) of
  # whichever code compiled it first, since the cache key leaves metadata out.
  stdout = _run(["-m", "benchmarks.gpu", "--smoke", "--skip_cycle", "--workroot", str(tmp_path),
                 "--out", str(out)], env={"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax-cache")})
  res = json.loads(out.read_text())
  t = res["throughput"]
  assert t["big"]["layers"] == 2 and t["small"]["layers"] == 1 and t["small"]["heads"] == 1
  assert t["big"]["loss_finite"] and t["small"]["loss_finite"] and t["big"]["tokens_per_s"] > 0
  assert 0 < t["flops_ratio_small_big"] < 1
  assert "Step-time ratio small/big" in stdout
  for side in ("big", "small"):  # Each model's traced steps, split by part (benchmarks/step_profile.py).
    ms = t[side]["profile"]["ms"]
    assert ms["blocks"]["matmul"] > 0 and ms["vocab_loss"]["matmul"] > 0 and ms["optimizer"]["other"] > 0


def test_gpu_script_cycle_config():
  """The driver config of part 2 (without training): GPT-2 shape, overrides applied, levels as asked."""
  a = gpu.parse_args([])
  c = gpu.cycle_config(a, 2)
  assert (c.model.num_layers, c.model.num_heads, c.model.head_dim) == (12, 12, 64)
  assert (c.model.max_len, c.model.dtype, c.data.vocab_size) == (512, "bfloat16", 8192)
  assert (c.train.steps, c.train.batch_size, c.cycle.levels) == (400, 32, 2)
  assert gpu.cycle_config(a, 1).cycle.levels == 1
  s = gpu.parse_args(["--smoke"])
  assert gpu.cycle_config(s, 2).model.num_layers == 2
  # Every run under the stricter protocol's WSD by default; a variant of benchmarks.saving by name.
  assert c.train.decay == "wsd" and a.cycle_variants == ["default", "depth_only_fresh"]
  fresh = gpu.cycle_config(a, 2, "depth_only_fresh").cycle
  assert (fresh.small_init, fresh.width_factor, fresh.w_pre) == ("fresh", 1, 0.0)
  assert gpu.cycle_config(a, 2, "msg").cycle.method == "msg"
  assert gpu.cycle_config(a, 2, "depth_zero_split").cycle.split_noise == 0.1


def test_gpu_script_smoke_methods(tmp_path):
  """Part 2 end to end on tiny shapes: scratch, the default V-cycle and a saving.py variant through the driver, read
  as saving.py reads them: the script's defaults (the V-cycle and the planner-shaped depth-only schedule)."""
  out = tmp_path / "gpu.json"
  stdout = _run(["-m", "benchmarks.gpu", "--smoke", "--skip_throughput", "--cycle_variants=default,depth_only_fresh",
                 "--workroot", str(tmp_path), "--out", str(out)], timeout=600)
  c = json.loads(out.read_text())["cycle"]
  assert set(c["variants"]) == {"default", "depth_only_fresh"}
  assert c["variants"]["default"]["compare"]["flops_ratio_total"] < 1
  assert c["variants"]["depth_only_fresh"]["summary"]["final_eval_loss"] != c["variants"]["default"]["summary"][
      "final_eval_loss"]
  assert c["variants"]["default"]["driver_step_time_ratio_small_big"] > 0
  assert "| depth_only_fresh |" in stdout and "decay wsd" in stdout


def test_throughput_script_tiny(tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  out = tmp_path / "throughput.json"
  _run(["-m", "benchmarks.throughput", "--layers", "1", "--heads", "2", "--head_dim", "16", "--vocab", "256",
        "--seq", "16", "--batch", "4", "--warmup", "1", "--rounds", "1", "--steps", "1", "--out", str(out)])
  doc = json.loads(out.read_text())
  (run,) = doc["runs"].values()
  gpt, bert = run["results"]
  assert gpt["model"] == "gpt" and bert["model"] == "bert"
  # Same weights and batch: the first GPT losses agree across frameworks.
  assert abs(gpt["first_step_loss"]["ours"] - gpt["first_step_loss"]["hf"]) < 1e-3
  assert gpt["hf_tied_embeddings"] and bert["hf_tied_embeddings"]
  assert gpt["ratio_median"] > 0 and bert["ratio_median"] > 0


def test_xla_options_are_timed_each_in_its_own_process_against_the_baseline(tmp_path):
  """Each option runs in a child with XLA_FLAGS set (the baseline's ratio is 1 in every pass, the option's XLA_FLAGS
  reach the child), and a bad --threads is refused before any child starts."""
  out = tmp_path / "xla.json"
  tiny = ["--layers=1", "--heads=2", "--head_dim=16", "--vocab=256", "--seq=16", "--batch=2", "--warmup=1", "--steps=1"]
  _run(["-m", "benchmarks.xla_flags", *tiny, "--passes=2", "--options=,--xla_cpu_enable_fast_math=false",
        f"--out={out}"])
  doc = json.loads(out.read_text())
  base, other = doc["families"]["gpt"]["rows"]
  assert (base["option"], base["ratio"], base["ratio_min"], base["ratio_max"]) == ("", 1.0, 1.0, 1.0)
  assert other["option"] == "--xla_cpu_enable_fast_math=false" and other["ratio"] > 0
  assert len(base["losses"]) == 1 and base["losses"] == other["losses"]  # Same step, same numerics.
  assert doc["threads"] == 1 and len(doc["families"]["gpt"]["passes"]) == 2
  from benchmarks import xla_flags
  assert xla_flags.child_env("--a", 1)["XLA_FLAGS"] == "--a " + xla_flags.ONE_THREAD
  assert xla_flags.child_env("", 0)["XLA_FLAGS"] == ""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  bad = subprocess.run([sys.executable, "-m", "benchmarks.xla_flags", "--threads=3"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
  assert bad.returncode != 0 and "--threads must be 1 or 0" in bad.stderr


def test_loss_head_times_the_engines_loss_against_plain_autodiff_on_the_same_numbers(tmp_path):
  """Every loss of the comparison computes the same loss and hits (one chunk, 4 chunks, auto) as the plain one."""
  from benchmarks import loss_head
  a = loss_head.parse_args(["--shapes=2x8x4x16", "--max_logits=0,64,-1", "--rounds=2", "--calls=1", "--out="])
  res = loss_head.measure("2x8x4x16", a)
  plain, *engine = res["rows"]
  assert plain["loss"] == "plain autodiff" and plain["over_plain"] == 1.0
  assert [r["chunks"] for r in engine] == [1, 4, 1]
  for r in engine:
    assert r["loss_sum"] == pytest.approx(plain["loss_sum"], rel=1e-6) and r["correct"] == plain["correct"]
    assert r["median_ms"] > 0
  from absl import app
  for bad in ("2x8x4", "2x8x4x0", "2x8xfourx16"):
    with pytest.raises(app.UsageError, match="four positive integers"):
      loss_head.measure(bad, a)


def test_the_gpu_lease_script_parses_and_names_only_known_variants():
  """benchmarks/gpu_long_budget.sh runs once per lease: a syntax error or a renamed variant would waste it."""
  import re

  from benchmarks.variants import VARIANTS
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "gpu_long_budget.sh")
  assert subprocess.run(["bash", "-n", path]).returncode == 0
  bad = subprocess.run(["bash", path, "bogus"], capture_output=True, text=True)
  assert bad.returncode == 2 and "prepare or run" in bad.stderr
  named = {v for group in re.findall(r"--variants=([\w,]*)", open(path).read()) for v in group.split(",") if v}
  assert named and named <= set(VARIANTS), named - set(VARIANTS)
