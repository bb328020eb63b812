"""The adaptive hand-over (``cycle.small_stop='frontier'``): the rule, the plan it cuts, and a run that uses it."""

import json
import math

import pytest

from multilevel.cycles import build_plan
from multilevel.cycles.run_config import model_config
from multilevel.cycles.switch import FrontierSwitch
from multilevel.typed_config import ConfigError
from tests.engine_util import Killed, read_jsonl, tiny_config, train_killed_at

# The target's frontier: 1e12 FLOPs reach 5.0, 4e12 reach 4.0 (ln F linear in the loss between them).
POINTS = ((1e12, 5.0), (4e12, 4.0))


def test_the_targets_cost_per_nat_is_the_slope_of_its_log_linear_frontier():
  rule = FrontierSwitch(POINTS)
  # At 4.5 the frontier is at 2e12 FLOPs and d ln F / d(-L) = ln 4: 2e12 ln 4 FLOPs per nat.
  assert rule.target_cost_per_nat(4.5) == pytest.approx(2e12 * math.log(4), rel=1e-12)
  # Outside the measured losses the end segment is extrapolated: at 5.5, 0.5e12 FLOPs on the same line.
  assert rule.target_cost_per_nat(5.5) == pytest.approx(0.5e12 * math.log(4), rel=1e-12)
  assert rule.target_cost_per_nat(3.5) == pytest.approx(8e12 * math.log(4), rel=1e-12)


def test_the_rule_stops_where_the_small_model_pays_as_much_per_nat_as_the_target():
  rule = FrontierSwitch(POINTS, window=3, warmup=10)
  cost = 2e12 * math.log(4)  # The target's FLOPs per nat at 4.5.
  line = lambda per_nat: [(step, step * 1e10, 4.5 + (30 - step) * 1e10 / per_nat) for step in (20, 25, 30)]
  assert rule.decide(line(0.5 * cost)) is None  # Cheaper than the target per nat: go on.
  why = rule.decide(line(1.01 * cost))
  assert why["reason"] == "costlier" and why["loss"] == pytest.approx(4.5)
  assert why["small_cost"] == pytest.approx(1.01 * cost, rel=1e-9) and why["target_cost"] == pytest.approx(cost)
  assert rule.decide([(s, f, 4.6) for s, f, _ in line(cost)])["reason"] == "stalled"  # The loss stopped falling.
  assert rule.decide(line(1.01 * cost)[1:]) is None  # Fewer than `window` evaluations.
  # Evaluations inside the warm-up are not used: the same points moved into it are not enough.
  assert rule.decide([(s - 15, f, l) for s, f, l in line(1.01 * cost)]) is None


def _plan(**overrides):
  c = tiny_config("gpt", **overrides)
  return build_plan(model_config(c, None), c.cycle, c.train), c


def test_an_adaptive_plan_holds_the_rule_on_its_bottom_stage_and_cuts_only_there():
  plan, c = _plan(**{"cycle.small_stop": "frontier", "cycle.target_frontier": POINTS})
  bottom = next(s for s in plan.stages if s.kind == "bottom")
  assert isinstance(bottom.stop, FrontierSwitch) and bottom.stop.points == POINTS
  assert all(s.stop is None for s in plan.stages if s is not bottom)
  from multilevel.cycles.vcycle import build_plan as vcycle_plan
  from multilevel.cycles.config import CycleConfig
  from multilevel.train.config import TrainConfig
  from multilevel.typed_config import section_from
  cycle, train = section_from(CycleConfig, c.cycle, "cycle"), section_from(TrainConfig, c.train, "train")
  cut = vcycle_plan(plan.levels[0], cycle, train, cuts=((bottom.index, 6, 3),))
  cb = cut.stages[bottom.index]
  assert cb.steps == 6 and cb.stop is None and cb.optim == bottom.optim  # It keeps the schedule it trained with.
  assert cut.stages[-1].steps == plan.stages[-1].steps + 3
  assert [s.steps for s in cut.stages[:bottom.index]] == [s.steps for s in plan.stages[:bottom.index]]
  with pytest.raises(ValueError, match="only it is adaptive"):
    vcycle_plan(plan.levels[0], cycle, train, cuts=((0, 1, 0),))


@pytest.mark.parametrize("overrides, match", [
    ({"cycle.small_stop": "frontier"}, "target_frontier"),
    ({"cycle.small_stop": "frontier", "cycle.target_frontier": ((1e12, 5.0),)}, "two or more"),
    ({"cycle.small_stop": "frontier", "cycle.target_frontier": POINTS, "cycle.method": "gstack"}, "V-cycle option"),
    ({"cycle.small_stop": "frontier", "cycle.target_frontier": POINTS, "cycle.stop_window": 1}, "at least 2"),
    ({"cycle.small_stop": "sometimes"}, "small_stop must be one of"),
])
def test_bad_adaptive_configs_are_refused_with_what_to_change(overrides, match):
  with pytest.raises(ConfigError, match=match):
    _plan(**overrides)


def test_a_planned_vcycle_gets_the_rule_on_its_small_stage_and_a_scratch_plan_is_left_alone():
  from multilevel.cycles.switch import online_stop
  planned = {"cycle.method": "vcycle", "cycle.levels": 2, "cycle.small_frac": 0.7, "train.steps": 100}
  got = online_stop(planned, [[1e12, 5], [4e12, 4]])  # As plan.json stores them: lists.
  assert got == {**planned, "cycle.small_stop": "frontier", "cycle.target_frontier": POINTS}
  assert _plan(**{k: v for k, v in got.items() if k != "train.steps"})[0].stages  # A config the driver builds.
  scratch = {"cycle.levels": 1, "train.steps": 100}
  assert online_stop(scratch, POINTS) == scratch
  with pytest.raises(ValueError, match="at least two"):
    online_stop(planned, POINTS[:1])


# Evaluations every 2 steps: the 20-step bottom stage of the 40-step test V-cycle is evaluated at its steps 2, 4, ...
RUN = {"train.eval_every": 2, "checkpoint.every": 5, "cycle.stop_window": 3}
CHEAP = ((1.0, 100.0), (2.0, 0.0))  # A target that pays next to nothing per nat: the rule fires at its first chance.
DEAR = ((1e20, 10.0), (1e30, 0.0))  # One that pays ~1e25 FLOPs per nat here: the rule never fires.


def _run(workdir, frontier, fault=None, monkeypatch=None, **extra):
  c = tiny_config("gpt", **RUN, **extra, **({"cycle.small_stop": "frontier", "cycle.target_frontier": frontier}
                                            if frontier else {}))
  return train_killed_at(c, workdir, fault, monkeypatch)


@pytest.mark.slow
def test_a_run_stops_its_small_stage_gives_the_rest_to_the_target_and_resumes_bit_for_bit(tmp_path, monkeypatch):
  fixed = _run(tmp_path / "fixed", None)
  never = _run(tmp_path / "never", DEAR)
  # A rule that never fires changes nothing: the same bits as the fixed plan.
  assert never["params_sha256"] == fixed["params_sha256"] and never["cuts"] == []
  ref = _run(tmp_path / "ref", CHEAP)
  (stage, steps, extra), = ref["cuts"]
  planned = fixed["per_stage"][stage]
  assert ref["per_stage"][stage]["steps"] == steps < planned["steps"]
  # The first chance: the third evaluation after the one warm-up step (stage steps 2, 4, 6).
  assert steps == 6
  # The unused small steps' FLOPs went to the target: as many whole target steps as they pay for.
  small_step = planned["flops"] / planned["steps"]
  big_step = fixed["per_stage"][-1]["flops"] / fixed["per_stage"][-1]["steps"]
  assert extra == int((planned["steps"] - steps) * small_step // big_step) and extra > 0
  assert ref["per_stage"][-1]["steps"] == fixed["per_stage"][-1]["steps"] + extra
  assert fixed["total_flops"] - big_step < ref["total_flops"] <= fixed["total_flops"]
  records = read_jsonl(str(tmp_path / "ref" / "metrics.jsonl"))
  stop, = [r["stop"] for r in records if "stop" in r]
  assert stop["steps"] == steps and stop["extra_target_steps"] == extra and stop["reason"] in ("costlier", "stalled")
  ends = [r for r in records if r.get("event") == "end_of_stage" and r["stage"] == stage]
  assert len(ends) == 1 and ends[0]["step"] == sum(p["steps"] for p in ref["per_stage"][:stage + 1])
  # Killed in the small stage before the rule fired (its evaluations so far come back from the checkpoint), right
  # after the growth that follows the cut, and in the target's extra steps.
  work = tmp_path / "killed"
  start = sum(p["steps"] for p in ref["per_stage"][:stage])
  for fault in (f"step:{start + 5}", f"transition:{stage + 1}", f"step:{ref['steps'] - 2}"):
    with pytest.raises(Killed):
      _run(work, CHEAP, fault, monkeypatch)
  monkeypatch.undo()
  resumed = _run(work, CHEAP)
  assert resumed["params_sha256"] == ref["params_sha256"] and resumed["cuts"] == ref["cuts"]
  assert resumed["total_flops"] == ref["total_flops"] and resumed["final_eval_loss"] == ref["final_eval_loss"]
  stable = lambda rs: [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rs]
  assert stable(read_jsonl(str(work / "metrics.jsonl"))) == stable(records)
  with open(work / "run.json") as f:
    assert json.load(f)["config"]["cycle"]["small_stop"] == "frontier"
  # The rule decides at evaluations, so their spacing is part of the run here (a resume at eval_every=4 stopped
  # the stage elsewhere, silently): refused.
  from multilevel.checkpoint import CheckpointError
  from multilevel.cycles.driver import train_and_evaluate
  other = tiny_config("gpt", **{**RUN, "train.eval_every": 4},
                      **{"cycle.small_stop": "frontier", "cycle.target_frontier": CHEAP})
  with pytest.raises(CheckpointError, match=r"different config: train.eval_every"):
    train_and_evaluate(other, str(work))
