"""A method written outside the package, as a user writes one (the README's "Writing a method"): its options come
from the config, it runs on the driver and resumes bit for bit; the plan's and the transition's bookkeeping mistakes
are refused naming the stage instead of surfacing as shape errors in a compiled step."""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

from multilevel import operators as O
from multilevel.cycles import driver as D
from multilevel.cycles.config import CycleConfig
from multilevel.cycles.plan import (METHODS, Method, Plan, Stage, Transition, fresh_optimizer, optim_for,
                                    register_method, split_steps)
from multilevel.train.optim import schedule_for
from multilevel.typed_config import ConfigError, check_fields, section_from
from tests.engine_util import ROOT, tiny_config


@dataclasses.dataclass(frozen=True)
class HalfStackConfig:
  """``cycle.halfstack``: the half-depth model's share of the steps."""

  small_frac: float = 0.3

  def __post_init__(self):
    check_fields(self, "cycle.halfstack")
    if not 0 < self.small_frac < 1:
      raise ConfigError(f"cycle.halfstack.small_frac must be in (0, 1), got {self.small_frac}.")


def halfstack_plan(model, cycle, train) -> Plan:
  """A model of half the layers for small_frac of the steps, then each layer doubled in place (i -> 2i, 2i+1)."""
  opts = cycle.halfstack
  m = O.make_mapping(model, width_factor=1, depth_factor=2, depth_mode="adjacent", depth_growth="zero")
  n_small, n_big = split_steps(train.steps, (opts.small_frac, 1 - opts.small_frac),
                               ("cycle.halfstack.small_frac", "1 - cycle.halfstack.small_frac"))
  optim = lambda n: optim_for(schedule_for(train, train.lr, n, round(train.warmup_frac * n)), train)
  stages = (Stage(index=0, level=1, kind="half", enter="init", steps=n_small, optim=optim(n_small)),
            Stage(index=1, level=0, kind="full", enter="grow", steps=n_big, optim=optim(n_big)))
  return Plan("halfstack", (model, m.small), stages, opts, (m,), train.seed)


def halfstack_transition(plan: Plan, src: Stage, dst: Stage) -> Transition:
  grow = lambda c: {"params": O.decoalesce(c["params"], plan.maps[0])}
  return Transition("grow", (("grow", grow), fresh_optimizer(dst)), "after_grow")


HALFSTACK = register_method(Method("halfstack", halfstack_plan, halfstack_transition, "half depth, then doubled",
                                   options=HalfStackConfig), replace=True)


def _config(**over):
  return tiny_config("gpt", levels=2, deep=True, **{"cycle.method": "halfstack", **over})


def test_its_options_are_a_config_section_like_the_packages_own():
  c = _config(**{"cycle.halfstack.small_frac": 0.5})  # The section is in the config tree once it is registered.
  cycle = section_from(CycleConfig, c.cycle, "cycle")
  assert cycle.halfstack == HalfStackConfig(0.5) and CycleConfig().halfstack == HalfStackConfig()
  assert cycle.as_dict()["halfstack"] == {"small_frac": 0.5}
  with pytest.raises(ConfigError, match=r"cycle.halfstack.small_frac must be in \(0, 1\)"):
    section_from(CycleConfig, {"method": "halfstack", "halfstack": {"small_frac": 2.0}}, "cycle")
  with pytest.raises(ConfigError, match="unknown key cycle.halfstak; the valid keys are method, .*, halfstack"):
    section_from(CycleConfig, {"halfstak": {}}, "cycle")
  with pytest.raises(ConfigError, match="cycle has no section 'quarterstack': a method defined outside"):
    CycleConfig().quarterstack
  assert not hasattr(CycleConfig(), "quarterstack")  # Still an AttributeError to getattr/hasattr.
  with pytest.raises(ValueError, match="registered twice .* register it with replace=True"):
    register_method(HALFSTACK)


def test_it_runs_on_the_driver_and_resumes_bit_for_bit(tmp_path, monkeypatch):
  from tests.engine_util import Killed, train_killed_at
  whole = D.train_and_evaluate(_config(), str(tmp_path / "whole"))
  assert [s["kind"] for s in whole["per_stage"]] == ["half", "full"] and whole["method"] == "halfstack"
  with pytest.raises(Killed):
    train_killed_at(_config(), tmp_path / "killed", "transition:1", monkeypatch)
  monkeypatch.undo()
  resumed = D.train_and_evaluate(_config(), str(tmp_path / "killed"))
  assert resumed["params_sha256"] == whole["params_sha256"]
  # Another small_frac is another run: the resume refuses it, naming the option.
  with pytest.raises(Exception, match="cycle.halfstack.small_frac: saved 0.3 vs now 0.5"):
    D.train_and_evaluate(_config(**{"cycle.halfstack.small_frac": 0.5}), str(tmp_path / "killed"))


@pytest.mark.parametrize("mistake, message", [
    ("index", r"stage 0 has index 1; a stage's index is its position in the plan"),
    ("level", r"stage 1:full@L2 names level 2, but the plan has levels 0..1"),
    ("enter", r"the first stage enters by 'grow'; it must enter by 'init'"),
])
def test_plan_bookkeeping_mistakes_are_refused_naming_the_stage(mistake, message):
  plan = halfstack_plan(*_typed())
  s0, s1 = plan.stages
  bad = {"index": (dataclasses.replace(s0, index=1), s1), "level": (s0, dataclasses.replace(s1, level=2)),
         "enter": (dataclasses.replace(s0, enter="grow"), s1)}[mistake]
  with pytest.raises(ValueError, match=message):
    dataclasses.replace(plan, stages=bad)


def _typed():
  from multilevel.cycles.run_config import RunConfig, model_config
  c = _config()
  run = RunConfig.from_config(c)
  return model_config(run, None), run.cycle, run.train


def test_a_transition_that_keeps_the_small_models_optimizer_state_is_refused_before_a_save(tmp_path, monkeypatch):
  def no_fresh_optimizer(plan, src, dst):
    return Transition("grow", (("grow", lambda c: {"params": O.decoalesce(c["params"], plan.maps[0])}),),
                      "after_grow")
  monkeypatch.setitem(METHODS._items, "halfstack", dataclasses.replace(HALFSTACK, transition=no_fresh_optimizer))
  with pytest.raises(ValueError, match=r"Transition 'grow' into stage 1:full@L0 returns optimizer state that do not "
                                       r"fit that stage's model \(L4/d32/h4\): .* is \(2, 4, 8\) float32 where the "
                                       r"stage's is \(4, 4, 8\) float32.*fresh_optimizer\(dst\)"):
    D.train_and_evaluate(_config(**{"checkpoint.every": 1}), str(tmp_path / "w"))
  monkeypatch.undo()  # The method fixed: the same command resumes from the small stage's last checkpoint ...
  resumed = D.train_and_evaluate(_config(**{"checkpoint.every": 1}), str(tmp_path / "w"))
  whole = D.train_and_evaluate(_config(**{"checkpoint.every": 1}), str(tmp_path / "whole"))
  assert resumed["params_sha256"] == whole["params_sha256"]  # ... as if the mistake had never run.


@pytest.mark.slow
def test_a_method_from_the_users_own_module_runs_from_the_command_line(tmp_path):
  """A config file that imports the method's module: --config.cycle.<name>.<key>= works as for the package's."""
  (tmp_path / "my_method.py").write_text("from tests.test_method_plugin import HALFSTACK  # registers it\n")
  (tmp_path / "my_config.py").write_text(
      "import my_method  # beside this file, as a user keeps them\n"
      "from experiments.configs import gpt\n"
      "def get_config(arg):\n"
      "  return gpt.get_config(arg)\n")
  flags = [f"--config={tmp_path / 'my_config.py'}:test", "--config.cycle.method=halfstack",
           "--config.cycle.halfstack.small_frac=0.5", "--config.model.num_layers=4", "--config.model.num_heads=4",
           "--config.model.head_dim=8", "--config.progress=False", "--config.tensorboard=False",
           f"--config.data.cache_dir={os.path.join(ROOT, '.cache', 'test-data')}", "--config.model.scan_unroll=1"]
  proc = subprocess.run([sys.executable, "-m", "experiments.train", f"--workdir={tmp_path / 'w'}", *flags], cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  import json
  summary = json.loads((tmp_path / "w" / "summary.json").read_text())
  steps = [s["steps"] for s in summary["per_stage"]]
  assert summary["method"] == "halfstack" and steps[0] == steps[1] and np.isfinite(summary["final_eval_loss"])
