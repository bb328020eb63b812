"""Resumption: a run killed anywhere and restarted with the same command ends bit for bit where an uninterrupted run
ends; a missing, damaged or foreign checkpoint is a clear error, never a silent fresh start."""

import json
import os
import shutil

import pytest

from multilevel.checkpoint import CheckpointError
from multilevel.cycles.driver import train_and_evaluate
from tests.engine_util import config_flags, read_jsonl, run_cli, tiny_config

pytestmark = pytest.mark.slow

OVERRIDES = {"checkpoint.every": 10}
VOLATILE = ("train_seconds", "compile_seconds", "transition_seconds")


def _stable(records):
  return [{k: v for k, v in r.items() if k not in VOLATILE} for r in records]


def test_killed_runs_resume_bit_for_bit(tmp_path):
  """One run killed four times (mid-stage, right after two level transitions, during a save) vs. one never killed,
  both the real command line (the uninterrupted one compiles the steps into the persistent cache, and the five
  processes of the killed run load them instead of compiling them again)."""
  flags = config_flags("gpt", 3, True, OVERRIDES)
  proc = run_cli(str(tmp_path / "ref"), flags)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / "ref" / "summary.json") as f:
    ref = json.load(f)
  work = str(tmp_path / "killed")
  # Stages: 2 + 2 steps down, 20 at the bottom, 10 up at level 1, 20 at level 0 (global steps 0..54).
  for fault in ("step:7", "transition:3", "save:9", "step:47"):
    proc = run_cli(work, flags, env={"MULTILEVEL_FAULT": fault})
    assert proc.returncode == 137, f"fault {fault} did not fire (rc={proc.returncode}):\n{proc.stderr[-3000:]}"
  proc = run_cli(work, flags)
  assert proc.returncode == 0, proc.stderr[-3000:]
  killed = read_jsonl(os.path.join(work, "metrics.jsonl"))
  with open(os.path.join(work, "summary.json")) as f:
    summary = json.load(f)
  assert summary["params_sha256"] == ref["params_sha256"]
  assert summary["final_eval_loss"] == ref["final_eval_loss"]
  assert summary["total_flops"] == ref["total_flops"] and summary["steps"] == ref["steps"]
  assert _stable(killed) == _stable(read_jsonl(str(tmp_path / "ref" / "metrics.jsonl")))


def test_rerunning_a_finished_run_changes_nothing(tmp_path):
  c = tiny_config("gpt", levels=1, **{"train.steps": 12})
  a = train_and_evaluate(c, str(tmp_path))
  n = len(read_jsonl(str(tmp_path / "metrics.jsonl")))
  b = train_and_evaluate(c, str(tmp_path))
  assert a["params_sha256"] == b["params_sha256"] and len(read_jsonl(str(tmp_path / "metrics.jsonl"))) == n


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  work = tmp_path_factory.mktemp("finished")
  train_and_evaluate(tiny_config("gpt", levels=1, **{"train.steps": 12}), str(work))
  return work


def _copy(src, dst):
  shutil.copytree(src, dst)
  return str(dst)


def test_a_different_config_is_refused(finished_run, tmp_path):
  work = _copy(finished_run, tmp_path / "w")
  with pytest.raises(CheckpointError, match=r"different config[\s\S]*train.lr"):
    train_and_evaluate(tiny_config("gpt", levels=1, **{"train.steps": 12, "train.lr": 0.5}), work)


def test_what_only_evaluates_may_change_on_resume(finished_run, tmp_path):
  """How many held-out batches an evaluation reads, and how far the data is prefetched, do not change what is trained:
  a resume with other values continues the run (they were refused before)."""
  work = _copy(finished_run, tmp_path / "w")
  ref = train_and_evaluate(tiny_config("gpt", levels=1, **{"train.steps": 12}), str(finished_run))
  again = train_and_evaluate(tiny_config("gpt", levels=1, **{"train.steps": 12, "data.max_eval_batches": 1,
                                                             "data.prefetch": 0}), work)
  assert again["params_sha256"] == ref["params_sha256"]


def test_a_damaged_checkpoint_is_refused(finished_run, tmp_path):
  work = _copy(finished_run, tmp_path / "w")
  ckpts = os.path.join(work, "checkpoints")
  latest = max(int(d) for d in os.listdir(ckpts) if d.isdigit())
  for root, _, files in os.walk(os.path.join(ckpts, str(latest), "state")):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"\x00garbage")
  with pytest.raises(CheckpointError, match=f"Checkpoint {latest} .* could not be read"):
    train_and_evaluate(tiny_config("gpt", levels=1, **{"train.steps": 12}), work)


def test_missing_checkpoints_are_refused(finished_run, tmp_path):
  work = _copy(finished_run, tmp_path / "w")
  shutil.rmtree(os.path.join(work, "checkpoints"))
  with pytest.raises(CheckpointError, match="no complete checkpoint"):
    train_and_evaluate(tiny_config("gpt", levels=1, **{"train.steps": 12}), work)


def test_a_field_added_since_the_checkpoint_blocks_resume_only_away_from_its_default():
  from multilevel.checkpoint import config_diff
  from multilevel.cycles.run_config import default_resolved_config
  defaults = default_resolved_config()
  saved = {"model": {"family": "gpt", "num_layers": 2}, "train": {"lr": 0.1}}
  now = {"model": {"family": "gpt", "num_layers": 2, "rope_factor": defaults["model"]["rope_factor"]},
         "train": {"lr": 0.1}}
  assert config_diff(saved, now, defaults=defaults) == []
  assert config_diff(saved, now) == ["model.rope_factor: saved \"<missing>\" vs now 8.0"]  # Without defaults.
  moved = {**now, "model": {**now["model"], "rope_factor": 2.0}}
  assert config_diff(saved, moved, defaults=defaults) == ["model.rope_factor: saved \"<missing>\" vs now 2.0"]
  # A value the saved config has is compared as always, default or not.
  assert config_diff({"train": {"lr": 0.5}}, {"train": {"lr": 0.1}}, defaults=defaults) == [
      "train.lr: saved 0.5 vs now 0.1"]


def test_a_resume_compares_only_what_the_method_reads_and_what_the_run_recorded():
  from multilevel.checkpoint import config_diff
  from multilevel.cycles.resume import compared
  from multilevel.cycles.run_config import default_resolved_config
  defaults = default_resolved_config()

  def diff(saved, now):
    return config_diff(*compared(saved, now), defaults=defaults)

  def cfg(method="vcycle", train=None, **cycle):
    return {"cycle": {**defaults["cycle"], "method": method, **cycle}, "train": {**defaults["train"], **(train or {})}}

  # Recorded before such options were refused: a gstack run's w_pre, a V-cycle run's msg section (no way back).
  assert diff(cfg("gstack", w_pre=0.1), cfg("gstack")) == []
  assert diff(cfg(msg={**defaults["cycle"]["msg"], "ramp_frac": 0.2}), cfg()) == []
  assert diff(cfg(w_pre=0.1), cfg()) != []  # The V-cycle reads it.
  # Nor the V-cycle's keys that its shape leaves out: a small model from its own init has no down stages, scratch
  # reads none of them, a fixed small stage no target frontier; the keys that set the shape are still compared.
  assert diff(cfg(small_init="fresh", w_pre=0.0, down_fracs=[0.2]), cfg(small_init="fresh", w_pre=0.0)) == []
  assert diff(cfg(down_fracs=[0.2]), cfg()) != []
  assert diff(cfg(levels=1, split_noise=0.1, lr_scales=[1, 2]), cfg(levels=1)) == []
  assert diff(cfg(levels=1), cfg()) != []
  assert diff(cfg(target_frontier=[[1e9, 4.0]]), cfg()) == []
  assert diff(cfg(small_stop="frontier", target_frontier=[[1e9, 4.0]]), cfg(small_stop="frontier")) != []
  # A method registered from outside may read the V-cycle's keys: they are compared for it.
  assert diff(cfg("halfstack", w_pre=0.1), cfg("halfstack")) != []
  # eval_every, recorded for adaptive stages since today: an older run without it resumes; a recorded one must agree.
  old = cfg()
  old["train"].pop("eval_every", None)
  assert diff(old, cfg(train={"eval_every": 20})) == []
  assert diff(cfg(train={"eval_every": 2}), cfg(train={"eval_every": 4})) != []
  # The evaluation's size likewise: compared where both sides recorded it (an adaptive run), not where one did not
  # (a checkpoint of an older version recorded it for every run, as it did data.prefetch).
  from multilevel.cycles.run_config import RunConfig, resolved_config
  from multilevel.models import ModelConfig

  def run_cfg(adaptive, **data):
    d = resolved_config(RunConfig.from_config({"data": data}), ModelConfig(), adaptive=adaptive)
    return {**d, "cycle": cfg()["cycle"]}

  older = run_cfg(False)
  older["data"].update(max_eval_batches=16, prefetch=2)
  assert "max_eval_batches" not in run_cfg(False)["data"] and "prefetch" not in run_cfg(False)["data"]
  assert diff(older, run_cfg(False, max_eval_batches=3, prefetch=0)) == []
  assert diff(run_cfg(True, max_eval_batches=16), run_cfg(True, max_eval_batches=3)) == [
      "data.max_eval_batches: saved 16 vs now 3"]
  assert diff(run_cfg(True, max_eval_batches=16), run_cfg(True, max_eval_batches=16, prefetch=0)) == []
