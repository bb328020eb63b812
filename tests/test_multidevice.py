"""Data parallelism over two (fake) CPU devices gives the one-device result.

Runs in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=2 under a timeout: on 2 CPU cores XLA's
CPU all-reduce can deadlock when steps are dispatched without blocking (environment.md); the driver blocks on each
step's loss before dispatching the next-but-one, and the timeout turns any hang into a failure, not a stuck CI.
"""

import json
import os

import pytest

from tests.engine_util import config_flags, run_cli

pytestmark = pytest.mark.slow


def test_two_devices_match_one(tmp_path, gpt_reference):
  one = gpt_reference
  flags = config_flags("gpt", 2, False, {"train.num_devices": 2})
  proc = run_cli(str(tmp_path / "two"), flags, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
                 timeout=240)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(tmp_path, "two", "summary.json")) as f:
    two = json.load(f)
  assert two["steps"] == one["steps"] and two["total_flops"] == one["total_flops"]
  # Same global batch, split over two devices: only the order of the gradient reduction differs.
  assert two["final_eval_loss"] == pytest.approx(one["final_eval_loss"], rel=2e-4)
  assert "(2 devices" in proc.stderr


def test_core_on_two_devices_matches_one(tmp_path):
  # CoRe's relaxed start (an SVD per FFN matrix) deadlocked XLA on a CPU mesh of two devices: now computed on one.
  from multilevel.cycles.driver import train_and_evaluate
  from tests.engine_util import tiny_config
  core = {"cycle.method": "core", "cycle.core.chunk": 8}
  one = train_and_evaluate(tiny_config("gpt", levels=1, **core), str(tmp_path / "one"))
  flags = [f for f in config_flags("gpt", 1, False, {**core, "train.num_devices": 2})
           if not f.startswith("--config.cycle.levels")]  # (A V-cycle option: CoRe refuses it.)
  proc = run_cli(str(tmp_path / "two"), flags, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
                 timeout=240)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(tmp_path, "two", "summary.json")) as f:
    two = json.load(f)
  assert two["final_eval_loss"] == pytest.approx(one["final_eval_loss"], rel=2e-4)
