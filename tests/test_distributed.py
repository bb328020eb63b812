"""Several processes on 127.0.0.1 (jax.distributed with CPU collectives): a run, kills and resumption, bad setups.

Each process is the real command line in a subprocess under a timeout, one CPU device each; the driver waits for
every step's loss on a multi-device CPU mesh (../shared/docs/environment.md).
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.engine_util import ROOT, config_flags

pytestmark = pytest.mark.slow

OVERRIDES = {"checkpoint.every": 10}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir: str, n: int = 2, flags=None, env=None, counts=None, timeout_s: int = 60, ids=None, extra=None):
  """Starts the processes ``ids`` (all ``n`` by default) of one run; ``counts`` overrides their --num_processes,
  ``extra`` ({process id: [flags]}) gives a process flags of its own."""
  port = _free_port()
  full_env = dict(os.environ, JAX_PLATFORMS="cpu", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", **(env or {}))
  procs = []
  for i in (range(n) if ids is None else ids):
    args = [sys.executable, "-m", "experiments.train", f"--workdir={workdir}",
            *(flags or config_flags("gpt", 2, False, OVERRIDES)), "--distributed",
            f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={(counts or [n] * n)[i]}",
            f"--process_id={i}", f"--distributed_timeout={timeout_s}", *(extra or {}).get(i, [])]
    procs.append(subprocess.Popen(args, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True))
  return procs


def _finish(procs, timeout=300):
  out = []
  for p in procs:
    stdout, stderr = p.communicate(timeout=timeout)
    out.append((p.returncode, stdout, stderr))
  return out


def _digest(stdout: str) -> str:
  return re.search(r"params sha256 ([0-9a-f]{64})", stdout).group(1)


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
  work = str(tmp_path_factory.mktemp("two") / "run")
  return work, _finish(_launch(work))


def test_two_processes_run_a_vcycle_and_agree(two_process_run, gpt_reference):
  work, results = two_process_run
  for rc, stdout, stderr in results:
    assert rc == 0, stderr[-3000:]
  d0, d1 = (_digest(stdout) for _, stdout, _ in results)
  assert d0 == d1
  with open(os.path.join(work, "summary.json")) as f:
    summary = json.load(f)  # Written by process 0 only.
  assert summary["params_sha256"] == d0 and summary["steps"] == gpt_reference["steps"]
  # The same global batch, split over two processes: only the order of the reductions differs.
  assert summary["final_eval_loss"] == pytest.approx(gpt_reference["final_eval_loss"], rel=1e-4)
  assert not os.path.exists(os.path.join(work, "metrics.jsonl.1"))


def _kill_when(procs, workdir: str, step: int, timeout=240):
  """SIGKILLs every process once the run's metrics show ``step`` (a moment inside a stage)."""
  deadline = time.monotonic() + timeout
  path = os.path.join(workdir, "metrics.jsonl")
  while time.monotonic() < deadline:
    if os.path.exists(path):
      with open(path) as f:
        if any(json.loads(ln).get("step", 0) >= step for ln in f if ln.strip()):
          break
    if any(p.poll() is not None for p in procs):
      break
    time.sleep(0.2)
  for p in procs:
    p.send_signal(signal.SIGKILL)
  return _finish(procs)


def test_killed_processes_resume_to_the_same_digest(two_process_run, tmp_path):
  _, results = two_process_run
  reference = _digest(results[0][1])
  work = str(tmp_path / "run")
  killed = _kill_when(_launch(work), work, step=5)  # Mid-stage, in the small model's stage.
  assert all(rc != 0 for rc, _, _ in killed)
  # Right after the grow transition, before its checkpoint: each process kills itself there.
  after = _finish(_launch(work, env={"MULTILEVEL_FAULT": "transition:2"}))
  assert all(rc != 0 for rc, _, _ in after), [e[-1500:] for _, _, e in after]
  final = _finish(_launch(work))
  for rc, _, stderr in final:
    assert rc == 0, stderr[-3000:]
  assert {_digest(stdout) for _, stdout, _ in final} == {reference}


def test_an_absent_coordinator_fails_in_bounded_time_with_one_message(tmp_path):
  t0 = time.monotonic()
  (rc, _, stderr), = _finish(_launch(str(tmp_path / "w"), n=2, timeout_s=5, ids=[1]))  # Process 0 never starts.
  assert rc == 1 and time.monotonic() - t0 < 60
  last = [ln for ln in stderr.splitlines() if ln.strip()][-1]
  assert last.startswith("error: No coordinator answers at 127.0.0.1:") and "Start process 0" in last


def test_processes_that_disagree_on_the_count_fail_together(tmp_path):
  results = _finish(_launch(str(tmp_path / "w"), counts=[2, 3], timeout_s=20))
  for rc, _, stderr in results:
    assert rc == 1, stderr[-2000:]
    assert [ln for ln in stderr.splitlines() if ln.strip()][-1].startswith(
        "error: The processes disagree on --num_processes (given [2, 3]")


def test_processes_given_different_configs_all_refuse_naming_the_keys(tmp_path):
  # Process 1 at another learning rate: both trained, to other parameters, and exited 0.
  work = str(tmp_path / "run")
  results = _finish(_launch(work, extra={1: ["--config.train.lr=0.01"]}, timeout_s=30), timeout=120)
  for rc, _, stderr in results:
    assert rc == 1, stderr[-3000:]
    last = [ln for ln in stderr.splitlines() if ln.strip()][-1]
    assert last.startswith("error: The processes were started with different settings of train.lr: every process"), \
        stderr[-2000:]
  assert not os.path.exists(work)  # Refused before the workdir.


def test_a_mesh_that_leaves_out_a_process_is_refused(tmp_path):
  # Two processes of one device each, a mesh of one: process 1 crashed on arrays it could not reach.
  work = str(tmp_path / "run")
  flags = config_flags("gpt", 2, False, {**OVERRIDES, "train.num_devices": 1})
  results = _finish(_launch(work, flags=flags, timeout_s=30), timeout=120)
  for rc, _, stderr in results:
    assert rc == 1, stderr[-3000:]
    last = [ln for ln in stderr.splitlines() if ln.strip()][-1]
    assert "error: A run of 2 processes uses all their 2 devices" in last, stderr[-2000:]
  assert not os.path.exists(work)
