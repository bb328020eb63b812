"""What a user's mistake gets before anything trains: a data source the model cannot read, float16 on a CPU, too many
levels for the model, and the helper commands' (plot, plan, export) bad arguments, each one clear line."""

import os
import subprocess
import sys

import pytest

from multilevel.cycles.driver import train_and_evaluate
from multilevel.typed_config import ConfigError
from tests.engine_util import ROOT, SIGINT_DEFAULT, tiny_config


@pytest.fixture
def corpus(tmp_path):
  d = tmp_path / "corpus"
  d.mkdir()
  (d / "a.txt").write_text("Some text of the user's own. " * 50)
  return d


@pytest.mark.parametrize("family, overrides, error, match", [
    ("gpt", lambda c: {"data.folder": str(c)}, ValueError, "data.folder=.* is an image folder, for image models"),
    ("deit", lambda c: {"data.files": str(c / "a.txt")}, ValueError, "data.files is a text source; an image model"),
    ("gpt", lambda c: {"data.name": "shakespeare", "data.files": str(c / "a.txt")}, ValueError,
     "Both data.name='shakespeare' and data.files are set"),
    ("gpt", lambda c: {"data.files": str(c)}, FileNotFoundError, r"is a folder: give the files in it, e.g. '.*\*\.txt'"),
    ("gpt", lambda c: {"model.dtype": "float16"}, ConfigError, "XLA's CPU backend has no float16 matrix multiply"),
    ("gpt", lambda c: {"cycle.levels": 3}, ConfigError,
     r"cycle.levels=3: level 1 \(1 layers, 1 heads\) cannot be coalesced again .* Use fewer cycle.levels"),
])
def test_a_run_the_model_cannot_do_is_refused_before_its_workdir_is_made(tmp_path, corpus, family, overrides, error,
                                                                         match):
  work = tmp_path / "w"
  with pytest.raises(error, match=match):
    train_and_evaluate(tiny_config(family, **overrides(corpus)), str(work))
  assert not work.exists()


def _tool(module, *args):
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
  assert lines[-1].startswith("error: "), proc.stderr[-2000:]
  return lines[-1]


def test_plot_of_a_folder_that_is_no_run_is_one_line(tmp_path):
  assert "No metrics.jsonl in" in _tool("experiments.plot", str(tmp_path / "nothing"))


def test_export_refuses_a_missing_run_and_a_file_as_out_in_one_line(tmp_path):
  (tmp_path / "afile").write_text("x")
  line = _tool("experiments.export", f"--workdir={tmp_path / 'none'}", f"--out={tmp_path / 'hf'}")
  assert "No folder" in line and "pass the --workdir of a finished experiments.train run" in line
  line = _tool("experiments.export", f"--workdir={tmp_path / 'none'}", f"--out={tmp_path / 'afile'}")
  assert "is a file: pass a folder" in line


@pytest.mark.parametrize("args, match", [
    (["--steps=0"], "--steps must be a positive number"),
    (["--steps=4"], r"The target's pilots would run \[1\] steps: its frontier needs two budgets"),
    (["--steps=40", "--set=train.stepz=3"], "^error: unknown key 'train.stepz'; valid keys of train: "),
    (["--steps=40", "--lr_scales=abc"], r"--lr_scales takes multiples of the target's peak LR"),
    (["--steps=40", "--lr_scales=-2"], r"--lr_scales takes positive multiples"),
    (["--steps=40", "--small_pilots=0,40"], r"--small_pilots takes positive numbers of steps"),
    (["--steps=40", "--max_levels=5"], r"--max_levels must be 2 or 3"),
    (["--steps=40", "--handover_jump=-1"], r"--handover_jump must be >= 0 nats"),
    (["--steps=40", "--small_from=nope.json"], r"--small_from: no file nope.json"),
    (["--steps=40", f"--target_from={ROOT}/benchmarks/results/deit_wsd_lr1e-3.json"],
     r"--target_from: .*deit_wsd_lr1e-3.json holds deit runs, and the config is a gpt model"),
    (["--steps=40", f"--target_from={ROOT}/benchmarks/results/checkpoint_cost.json"],
     r"checkpoint_cost.json is not a benchmarks.saving result"),
])
def test_plan_refuses_bad_arguments_in_one_line_before_any_pilot(tmp_path, args, match):
  import re
  config = os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test"
  line = _tool("experiments.plan", f"--config={config}", f"--workdir={tmp_path / 'p'}", *args)
  assert re.search(match, line), line
  assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("override, expected", [
    ("--config.train.steps=abc", "error: --config.train.steps=abc: train.steps takes an integer (its default here is"),
    ("--config.tensorboard=maybe", "error: --config.tensorboard=maybe: tensorboard takes True or False"),
])
def test_an_override_of_the_wrong_type_says_what_the_key_takes(tmp_path, override, expected):
  config = os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test"
  line = _tool("experiments.train", f"--config={config}", f"--workdir={tmp_path / 'w'}", override)
  assert line.startswith(expected), line
  assert not (tmp_path / "w").exists()


def test_a_vcycle_option_on_another_methods_command_line_is_refused(tmp_path):
  config = os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test"
  # gstack reads cycle.gstack.* only: w_pre was ignored, then recorded (a resume without it was refused).
  line = _tool("experiments.train", f"--config={config}", f"--workdir={tmp_path / 'w'}", "--config.cycle.method=gstack",
               "--config.cycle.gstack.factor=2", "--config.cycle.w_pre=0.1")
  assert line.startswith("error: --config.cycle.w_pre is not read by this run: an option of the V-cycle "
                         "(cycle.method='vcycle'); method 'gstack' reads only cycle.gstack.*. Leave it out"), line
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("cycle, argv, message", [
    ({"small_init": "fresh", "w_pre": 0.0, "down_fracs": (0.2,)},
     ["--config.cycle.small_init=fresh", "--config.cycle.w_pre=0", "--config.cycle.down_fracs=(0.2,)"],
     "--config.cycle.down_fracs is not read by this run: cycle.small_init='fresh' starts the smallest model from its "
     "own initialisation, so there are no down stages. Leave it out, or change the setting that leaves it unread."),
    ({"levels": 1, "split_noise": 0.1}, ["--config.cycle.levels=1", "--config.cycle.split_noise=0.1"],
     "--config.cycle.split_noise is not read by this run: cycle.levels=1 trains the target alone, from scratch."),
    ({"stop_window": 8}, ["--config.cycle.stop_window=8"],
     "--config.cycle.stop_window is not read by this run: cycle.small_stop='fixed' ends the smallest stage after"),
])
def test_a_vcycle_option_its_shape_leaves_out_is_refused(monkeypatch, cycle, argv, message):
  # The same keys are read in another shape, and the family configs set them for every run: only a command line
  # that sets one is refused (it would change nothing).
  from experiments import train
  from experiments.configs import gpt
  config = gpt.get_config("test")
  config.cycle.update(cycle)
  reported = []

  def fail(m):
    reported.append(m)
    raise SystemExit(1)

  monkeypatch.setattr(train, "_fail", fail)
  with pytest.raises(SystemExit):
    train.check_method_reads(["train"] + argv, config)
  assert reported[0].startswith(message), reported[0]
  # The same config without that key on the command line passes, as does a key the shape reads.
  train.check_method_reads(["train", argv[0] if len(argv) > 1 else "--config.cycle.lr_scales=(1,2)"], config)


def test_a_workdir_that_is_a_file_is_one_line(tmp_path):
  (tmp_path / "afile").write_text("")
  proc = subprocess.run([sys.executable, "-m", "experiments.train", f"--config={ROOT}/experiments/configs/gpt.py:test",
                         f"--workdir={tmp_path / 'afile'}"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].endswith("is a file, not a folder: name a folder (it is created if "
                                                        "missing).")


def test_ctrl_c_in_the_planner_is_one_line(tmp_path):
  config = os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test"
  proc = subprocess.run([*SIGINT_DEFAULT, "-m", "experiments.plan", f"--config={config}",
                         f"--workdir={tmp_path / 'p'}", "--steps=64", "--candidates=depth", "--lr_scales=2",
                         "--max_levels=2"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "JAX_PLATFORMS": "cpu", "MULTILEVEL_FAULT": "step:2:sigint"})
  assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines()[-1].startswith("interrupted: run the same command again: the finished pilots")
