"""Errors that reach a user first: one clear line on the command line, checks before anything is written, a locked
workdir, damaged checkpoints and a full disk, bad schemes."""

import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from multilevel.checkpoint import CheckpointError
from multilevel.cycles import build_plan
from multilevel.cycles.driver import Runner, train_and_evaluate
from multilevel.cycles.preflight import check_batch
from multilevel.train.config import TrainConfig
from multilevel.typed_config import ConfigError
from multilevel.workdir import WorkdirLock, WorkdirLockedError
from tests.engine_util import ROOT, config_flags, run_cli, tiny_config

pytestmark = pytest.mark.slow

FLAGS = config_flags("gpt", 2, False, {})


def _one_error_line(proc):
  """The command failed with one 'error:' line as its last output and no Python traceback anywhere."""
  assert proc.returncode == 1, proc.stderr[-2000:]
  lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
  assert lines[-1].startswith("error: "), proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  return lines[-1]


def test_an_unknown_config_key_is_named_with_the_valid_keys_of_its_section(tmp_path):
  proc = run_cli(str(tmp_path / "w"), FLAGS + ["--config.cycle.levls=1"], timeout=120)
  line = _one_error_line(proc)
  assert "unknown key 'cycle.levls'" in line and "levels" in line and "w_pre" in line
  proc = run_cli(str(tmp_path / "w"), FLAGS + ["--config.nothing=1"], timeout=120)
  assert "unknown key 'nothing'" in _one_error_line(proc)
  assert not os.path.exists(tmp_path / "w")


def test_an_expected_error_is_one_line_and_debug_shows_the_traceback(tmp_path):
  bad = FLAGS + ["--config.cycle.width_schemes=[[0, 1]"]
  line = _one_error_line(run_cli(str(tmp_path / "w"), bad, timeout=120))
  assert "cycle.width_schemes is not valid JSON" in line
  proc = run_cli(str(tmp_path / "w"), bad + ["--debug"], timeout=120)
  assert proc.returncode != 0 and "Traceback" in proc.stderr and "ConfigError" in proc.stderr
  assert not os.path.exists(tmp_path / "w")  # Refused before anything was written.


@pytest.mark.parametrize("override, message", [
    ({"train.grad_accum": 0}, "train.grad_accum must be a positive integer"),
    ({"train.grad_accum": 3}, "cannot be split into train.grad_accum=3"),
    ({"cycle.width_schemes": "[[[0], [1]], [[0, 1]]]"}, "cycle.width_schemes needs one scheme per level transition"),
    ({"cycle.depth_schemes": "{"}, "cycle.depth_schemes is not valid JSON"),
    ({"cycle.optimizer_policy": "keep"}, "cycle.optimizer_policy must be one of"),
    ({"model.num_layers": 0}, "^model.num_layers must be a positive integer"),  # The run config's name for it.
])
def test_bad_configs_are_refused_before_the_workdir_is_written(tmp_path, override, message):
  work = tmp_path / "w"
  with pytest.raises(ConfigError, match=message):
    train_and_evaluate(tiny_config("gpt", levels=2, **override), str(work))
  assert not os.path.exists(work)


def test_a_config_built_in_code_is_typed_and_checked_like_the_command_line(tmp_path):
  d = tiny_config("gpt", levels=2).to_dict()
  d["train"]["lr"] = "fast"
  with pytest.raises(ConfigError, match="train.lr = 'fast' has the wrong type str: expected float"):
    train_and_evaluate(d, str(tmp_path / "w"))
  d = tiny_config("gpt", levels=2).to_dict()
  d["cycle"]["depth_grow"] = "zero"
  with pytest.raises(ConfigError, match="unknown key cycle.depth_grow; the valid keys are method, levels"):
    train_and_evaluate(d, str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w")


def test_the_corrected_command_then_runs(tmp_path):
  work = str(tmp_path / "w")
  with pytest.raises(ConfigError):
    train_and_evaluate(tiny_config("gpt", levels=1, **{"train.steps": 4, "train.grad_accum": 3}), work)
  s = train_and_evaluate(tiny_config("gpt", levels=1, **{"train.steps": 4, "train.grad_accum": 2}), work)
  assert s["steps"] == 4


def test_the_batch_must_split_over_the_devices():
  mesh = types.SimpleNamespace(devices=np.empty(4))
  with pytest.raises(ConfigError, match=r"microbatches of 6 rows, which do not split over the 4 devices"):
    check_batch(TrainConfig(batch_size=12, grad_accum=2), mesh)
  check_batch(TrainConfig(batch_size=16, grad_accum=2), mesh)


def test_unequal_width_groups_need_the_opt_in():
  c = tiny_config("gpt", levels=2, deep=True, **{"cycle.width_schemes": "[[[0, 1, 2], [3]]]",
                                                  "cycle.preln_exact": False})
  from multilevel.cycles.run_config import model_config
  with pytest.raises(ValueError, match="allow_unequal_width_groups"):
    build_plan(model_config(c, None), c.cycle, c.train)
  c.cycle.allow_unequal_width_groups = True
  plan = build_plan(model_config(c, None), c.cycle, c.train)
  assert plan.levels[1].num_heads == 2


def test_a_workdir_in_use_is_refused(tmp_path):
  work = str(tmp_path / "w")
  holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                             "from multilevel.workdir import WorkdirLock; lock = WorkdirLock(sys.argv[2]); "
                             "print('locked', flush=True); time.sleep(120)", ROOT, work],
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(WorkdirLockedError, match=rf"in use by another run \(pid {holder.pid} "):
      Runner(tiny_config("gpt", levels=1), work)
    assert not os.path.exists(os.path.join(work, "run.json"))
  finally:
    holder.kill()
    holder.wait()
  lock = WorkdirLock(work)  # Free again once its holder is gone, even killed.
  lock.release()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  work = tmp_path_factory.mktemp("finished")
  train_and_evaluate(tiny_config("gpt", levels=2), str(work / "run"))
  return work / "run"


def test_a_damaged_checkpoint_ends_in_one_message(finished, tmp_path):
  work = tmp_path / "w"
  shutil.copytree(finished, work)
  latest = max(int(d) for d in os.listdir(work / "checkpoints") if d.isdigit())
  data = [os.path.join(r, f) for r, _, fs in os.walk(work / "checkpoints" / str(latest) / "state") for f in fs
          if os.sep + "d" + os.sep in os.path.join(r, f)]
  assert data
  for path in data:  # The tensor data (not the metadata): tensorstore then fails inside Orbax's event loop.
    with open(path, "wb") as f:
      f.write(b"\x00garbage")
  line = _one_error_line(run_cli(str(work), FLAGS, timeout=200))
  assert f"Checkpoint {latest} in {work / 'checkpoints'} could not be read" in line and "Delete that checkpoint" in line


def test_a_full_disk_ends_in_one_message_and_the_run_resumes_exactly(tmp_path):
  over = {"checkpoint.every": 10}
  ref = train_and_evaluate(tiny_config("gpt", levels=2, **over), str(tmp_path / "ref"))
  flags = config_flags("gpt", 2, False, over)
  work = str(tmp_path / "w")
  assert run_cli(work, flags, env={"MULTILEVEL_FAULT": "step:7"}).returncode == 137  # Checkpoints 0 to 2 exist.
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
  # The command line with writes past 40 KiB failing (EFBIG, as a full disk fails with ENOSPC; Python ignores
  # SIGXFSZ), the limit set in the child itself.
  full_disk = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (40 << 10, 40 << 10)); "
               "sys.argv = ['train'] + sys.argv[1:]; runpy.run_module('experiments.train', run_name='__main__')")
  proc = subprocess.run([sys.executable, "-c", full_disk, f"--workdir={work}", *flags], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  line = _one_error_line(proc)
  assert f"Could not write checkpoint 3 to {work}/checkpoints" in line and "(2) is intact" in line
  assert run_cli(work, flags).returncode == 0
  with open(os.path.join(work, "summary.json")) as f:
    assert json.load(f)["params_sha256"] == ref["params_sha256"]


def test_ctrl_c_ends_in_one_line_and_the_same_command_resumes_exactly(tmp_path):
  over = {"checkpoint.every": 10}
  ref = train_and_evaluate(tiny_config("gpt", levels=2, **over), str(tmp_path / "ref"))
  flags = config_flags("gpt", 2, False, over)
  work = str(tmp_path / "w")
  proc = run_cli(work, flags, env={"MULTILEVEL_FAULT": "step:15:sigint"})
  assert proc.returncode == 130, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
  assert last == f"interrupted: run the same command to resume {work} from its last complete checkpoint."
  assert not os.path.exists(os.path.join(work, "summary.json"))
  assert run_cli(work, flags).returncode == 0
  with open(os.path.join(work, "summary.json")) as f:
    assert json.load(f)["params_sha256"] == ref["params_sha256"]


def test_a_started_run_without_checkpoints_says_what_to_do(finished, tmp_path):
  work = tmp_path / "w"
  shutil.copytree(finished, work)
  shutil.rmtree(work / "checkpoints")
  with pytest.raises(CheckpointError, match="Start a new --workdir, or delete"):
    train_and_evaluate(tiny_config("gpt", levels=2), str(work))


def test_a_run_refused_after_taking_the_workdir_leaves_nothing_there(tmp_path):
  blank = tmp_path / "blank.txt"
  blank.write_text("  \n\n")
  # A data refusal found while loading, after the lock: the workdir the run created is gone again ...
  with pytest.raises(ValueError, match="holds no text"):
    Runner(tiny_config("gpt", levels=1, **{"data.files": str(blank)}), str(tmp_path / "new"))
  assert not os.path.exists(tmp_path / "new")
  # ... a folder the user made stays, emptied (it held the lock) ...
  os.makedirs(tmp_path / "made")
  with pytest.raises(ValueError, match="holds no text"):
    Runner(tiny_config("gpt", levels=1, **{"data.files": str(blank)}), str(tmp_path / "made"))
  assert os.listdir(tmp_path / "made") == []
  # ... and a refused init_from (at the start of run(), after checkpoints/ and metrics.jsonl were opened) the same.
  with pytest.raises(ValueError, match="init_from=.*missing does not exist"):  # (Checked before the lock.)
    Runner(tiny_config("gpt", levels=1, init_from=str(tmp_path / "missing")), str(tmp_path / "init"))
  assert not os.path.exists(tmp_path / "init")
  os.makedirs(tmp_path / "notweights")
  with pytest.raises(Exception, match="No weights in"):
    train_and_evaluate(tiny_config("gpt", levels=1, init_from=str(tmp_path / "notweights")), str(tmp_path / "init"))
  assert not os.path.exists(tmp_path / "init")
  # A workdir that held anything before the run is left as it was.
  os.makedirs(tmp_path / "kept")
  (tmp_path / "kept" / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="holds no text"):
    Runner(tiny_config("gpt", levels=1, **{"data.files": str(blank)}), str(tmp_path / "kept"))
  assert sorted(os.listdir(tmp_path / "kept")) == [".lock", "notes.txt"]


def test_a_workdir_that_cannot_be_written_says_so_and_what_to_do(tmp_path, monkeypatch):
  import errno

  from multilevel import workdir as W

  def read_only(path, *a):
    raise OSError(errno.EROFS, "Read-only file system", path)

  monkeypatch.setattr(W.os, "open", read_only)  # (Root writes through chmod; a read-only mount is what users meet.)
  with pytest.raises(PermissionError, match=r"Cannot write in --workdir=.* \(Read-only file system\).*Make it "
                                            r"writable, or choose another --workdir"):
    WorkdirLock(str(tmp_path / "w"))


def test_init_from_with_a_method_that_starts_small_is_refused_before_the_workdir_is_made(tmp_path, monkeypatch):
  import multilevel.data

  def loads(*a, **k):
    raise AssertionError("the data was loaded before the config's refusal")

  monkeypatch.setattr(multilevel.data, "make_data", loads)
  c = tiny_config("gpt", levels=1, init_from=str(tmp_path), **{"cycle.method": "gstack", "cycle.gstack.factor": 2})
  with pytest.raises(ConfigError, match=r"init_from=.* gives the target model's weights, but method 'gstack' starts "
                                        r"by training a smaller model"):
    Runner(c, str(tmp_path / "w"))  # (It was refused after the data and tokenizer had loaded into the workdir.)
  assert not os.path.exists(tmp_path / "w")
