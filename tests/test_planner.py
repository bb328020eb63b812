"""The planner (multilevel/cycles/planner.py, experiments/plan.py): stage lengths that realise the bound's hand-over."""

import math
import os
import subprocess
import sys

import pytest

from multilevel.cycles import build_plan, planner
from multilevel.cycles.planner import Candidate, Frontier

from engine_util import CACHE, ROOT


def loglinear(name, l_hi, l_lo, f_at_hi, per_nat, n=5):
  pts = [(f_at_hi * math.exp(per_nat * i * (l_hi - l_lo) / (n - 1)), l_hi - (l_hi - l_lo) * i / (n - 1))
         for i in range(n)]
  return Frontier(name, tuple(pts))


STEP = 1e9  # The target's FLOPs per step.
TARGET = loglinear("target", 6.0, 4.0, 100 * STEP, 2.0)  # 100 steps reach 6.0, ~5460 reach 4.0.


def test_the_plan_trains_the_small_model_to_the_switch_loss_and_the_target_for_the_rest():
  # The small model: a quarter of the target's cost at every loss down to 5.0, its step a quarter of the target's.
  small = Candidate("halve", loglinear("small", 6.0, 5.0, 25 * STEP, 2.0), STEP / 4, 4.0, {}, 1e11)
  steps = 2000
  p = planner.plan_vcycle(TARGET, STEP, steps, [small], target_pilot_flops=2e11)
  assert p["switch_loss"] == pytest.approx(5.0, abs=0.01)
  # The small stage: the steps its frontier needs to reach 5.0 (F_s(5.0) / step); the target's: what its frontier
  # still needs from 5.0 to the budget's loss.
  assert p["small_steps"] == pytest.approx(small.frontier.cost(5.0) / (STEP / 4), rel=0.02)
  assert p["big_steps"] == pytest.approx(steps - TARGET.cost(5.0) / STEP, rel=0.02)
  bound = planner.bound_at([small.frontier, TARGET], TARGET.loss_at(steps * STEP))["bound_saving"]
  assert p["predicted_saving"] == pytest.approx(bound - 1 / steps, abs=0.01)  # One coalescing step more.
  assert p["net_saving"] == pytest.approx(p["predicted_saving"] - 3e11 / (steps * STEP), rel=1e-9)
  o = p["overrides"]
  assert o["cycle.levels"] == 2 and o["train.steps"] == steps and o["cycle.lr_scales"] == (1.0, 4.0)
  assert o["cycle.w_pre"] == 0.0 and o["cycle.split_noise"] == 0.1  # Breaks the grown copies' symmetry.
  # The small model starts from its own initialisation, as its pilots did: no down stage.
  assert o["cycle.small_init"] == "fresh" and "cycle.down_fracs" not in o
  assert round(o["cycle.small_frac"] * steps) == p["small_steps"]
  assert round(o["cycle.up_fracs"][0] * steps) == p["big_steps"]


def test_the_best_candidate_wins_and_a_useless_one_gives_scratch():
  cheap = Candidate("depth", loglinear("d", 6.0, 4.5, 50 * STEP, 2.0), STEP / 2, 2.0, {"cycle.width_factor": 1})
  cheaper = Candidate("halve", loglinear("h", 6.0, 5.0, 25 * STEP, 2.0), STEP / 4, 4.0, {})
  # Halving both saves 3/4 F_T(5.0) = 75 e^2 steps; depth only 1/2 F_T(4.5) = 50 e^3 steps: depth wins.
  p = planner.plan_vcycle(TARGET, STEP, 3000, [cheaper, cheap])
  assert p["method"] == "vcycle from depth" and p["overrides"]["cycle.width_factor"] == 1
  assert p["overrides"]["cycle.lr_scales"] == (1.0, 2.0)
  rows = {r["candidate"]: r["saving"] for r in p["candidates"]}
  assert rows["depth"] > rows["halve"] > 0
  dear = Candidate("width", loglinear("w", 6.0, 5.0, 300 * STEP, 2.0), 2 * STEP, 4.0, {"cycle.depth_factor": 1})
  s = planner.plan_vcycle(TARGET, STEP, 3000, [dear])
  assert s["method"] == "scratch" and s["overrides"]["cycle.levels"] == 1 and s["predicted_saving"] == 0.0
  assert "no hand-over pays" in planner.describe(s)


def test_a_budget_before_the_targets_frontier_is_refused_and_one_past_it_is_planned_inside_it():
  small = Candidate("halve", loglinear("small", 6.0, 5.0, 25 * STEP, 2.0), STEP / 4, 4.0)
  with pytest.raises(ValueError, match="at shorter budgets"):
    planner.plan_vcycle(TARGET, STEP, 50, [small])
  # Past the target's pilots (5460 steps reach 4.0), the hand-over is still found where both were measured, and
  # scratch at the budget costs exactly the budget.
  far = planner.plan_vcycle(TARGET, STEP, 20000, [small])
  assert far["budget_beyond_pilots"] and far["target_loss"] == pytest.approx(4.0)
  assert far["switch_loss"] == pytest.approx(5.0, abs=0.01)
  assert far["predicted_saving"] == pytest.approx(0.75 * TARGET.cost(5.0) / (20000 * STEP) - 1 / 20000, rel=0.02)
  assert "the budget is past them" in planner.describe(far)
  near = planner.plan_vcycle(TARGET, STEP, 2000, [small])
  assert not near["budget_beyond_pilots"] and near["target_loss"] == pytest.approx(TARGET.loss_at(2000 * STEP))


def test_the_planned_overrides_build_a_vcycle_with_those_stage_lengths():
  from engine_util import tiny_config
  from experiments.configs.common import override
  from multilevel.cycles.run_config import model_config
  small = Candidate("halve", loglinear("small", 6.0, 5.0, 25 * STEP, 2.0), STEP / 4, 4.0, {})
  p = planner.plan_vcycle(TARGET, STEP, 2000, [small])
  c = override(tiny_config("gpt", levels=2), p["overrides"])
  plan = build_plan(model_config(c, None), c.cycle, c.train)
  assert [s.steps for s in plan.stages] == [p["small_steps"], p["big_steps"]]
  assert [s.enter for s in plan.stages] == ["init", "grow"] and plan.stages[0].level == 1
  assert plan.stages[0].lr.peak == pytest.approx(4.0 * c.train.lr)


@pytest.mark.slow
def test_the_plan_command_runs_pilots_and_writes_a_config_the_driver_runs(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
  config = os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test"
  sets = ["--set=data.cache_dir=" + CACHE, "--set=train.batch_size=4"]
  cmd = [sys.executable, "-m", "experiments.plan", f"--config={config}", "--steps=8", f"--workdir={tmp_path}",
         "--target_pilots=4,8", "--small_pilots=4,8", "--lr_scales=4", "--candidates=halve", *sets,
         f"--compilation_cache={os.path.join(ROOT, '.cache', 'jax-tests')}"]
  r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "plan:" in r.stdout and "pilots cost" in r.stdout
  # Cached: a second plan reads the finished pilots back and prints the same plan.
  again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0 and again.stdout == r.stdout
  run = subprocess.run([sys.executable, "-m", "experiments.train", f"--config={tmp_path / 'plan_config.py'}",
                        f"--workdir={tmp_path / 'run'}", "--config.progress=False", "--config.tensorboard=False",
                        f"--compilation_cache={os.path.join(ROOT, '.cache', 'jax-tests')}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  assert "final eval loss" in run.stdout
  # Another seed of the candidate's longest pilot (the config's own seed, 42, is not run twice): its budget counts as
  # the two seeds' mean.
  import json
  seeded = subprocess.run(cmd + ["--pilot_seeds=42,7"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
  assert seeded.returncode == 0, seeded.stderr[-3000:]
  with open(tmp_path / "plan.json") as f:
    pilots = [p for p in json.load(f)["pilots"] if p["model"] == "halve"]
  assert [(p["steps"], p.get("seed")) for p in pilots] == [(4, None), (8, None), (8, 7)]
  assert pilots[2]["final_eval_loss"] != pilots[1]["final_eval_loss"]
  c = planner.candidate_from_runs("halve", pilots)
  assert dict(c.frontier.points)[pilots[1]["total_flops"]] == pytest.approx(
      (pilots[1]["final_eval_loss"] + pilots[2]["final_eval_loss"]) / 2)


def test_the_plan_command_plans_from_benchmark_frontiers_and_its_config_loads(tmp_path):
  import importlib.util
  import json
  from multilevel.cycles.run_config import model_config
  target = tmp_path / "saving.json"
  target.write_text(json.dumps({"budgets": [
      {"steps": round(f / STEP), "scratch": {"total_flops": f, "final_eval_loss": l}} for f, l in TARGET.points]}))
  small = loglinear("small", 6.0, 5.0, 25 * STEP, 2.0)
  level = tmp_path / "L1.json"
  level.write_text(json.dumps({"level": 1, "set": {"cycle.width_factor": "1"}, "runs": [
      {"steps": round(f / (STEP / 4)), "lr_scale": s, "total_flops": f, "final_eval_loss": l + (s == 2) * 0.1}
      for s in (2, 4) for f, l in small.points]}))
  config = os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-m", "experiments.plan", f"--config={config}", "--steps=2000",
                      f"--workdir={tmp_path / 'w'}", f"--target_from={target}", f"--small_from={level}"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "plan: vcycle from L1 width_factor=1" in r.stdout
  spec = importlib.util.spec_from_file_location("planned", tmp_path / "w" / "plan_config.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  with open(tmp_path / "w" / "plan.json") as f:
    p = json.load(f)["plan"]
  assert c.cycle.width_factor == 1 and c.train.steps == 2000 and tuple(c.cycle.lr_scales) == (1.0, 4.0)
  doc = module.__doc__
  assert "Made " in doc and "by: python -m experiments.plan --config=" in doc and "plan.json" in doc
  assert c.cycle.depth_growth == "zero"  # GPT's own default.
  # BERT's config keeps the copy rule; its plan grows by the zero rule unless --set says otherwise.
  bert_config = os.path.join(ROOT, "experiments", "configs", "bert.py") + ":test"
  for extra, rule in (([], "zero"), (["--set=cycle.depth_growth=copy"], "copy")):
    work = tmp_path / f"bert-{rule}"
    r = subprocess.run([sys.executable, "-m", "experiments.plan", f"--config={bert_config}", "--steps=2000",
                        f"--workdir={work}", f"--target_from={target}", f"--small_from={level}", *extra],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    spec = importlib.util.spec_from_file_location(f"planned_{rule}", work / "plan_config.py")
    planned = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(planned)
    assert planned.get_config().cycle.depth_growth == rule
    assert ("BERT grows depth by the zero rule" in r.stdout) == (rule == "zero")
  stages = build_plan(model_config(c, None), c.cycle, c.train).stages
  assert [s.steps for s in stages] == [p["small_steps"], p["big_steps"]]
  # Planned again with the jump an earlier run of it measured at its growth: a later hand-over, a smaller saving.
  run = tmp_path / "run"
  run.mkdir()
  run.joinpath("metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
      {"step": 50, "stage": 1, "level": 1, "event": "end_of_stage", "eval_loss": 5.0},
      {"step": 50, "stage": 2, "level": 0, "event": "after_decoalesce", "eval_loss": 5.2}]) + "\n")
  args = [sys.executable, "-m", "experiments.plan", f"--config={config}", "--steps=2000", f"--workdir={tmp_path / 'j'}",
          f"--target_from={target}", f"--small_from={level}"]
  r = subprocess.run(args + [f"--handover_jump_from={run}"], cwd=ROOT, env=env, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  with open(tmp_path / "j" / "plan.json") as f:
    j = json.load(f)
  assert j["plan"]["handover_jump"] == pytest.approx(0.2) and j["handover_jumps"][0]["after"] == 5.2
  assert j["plan"]["predicted_saving"] < p["predicted_saving"] and "0.2000 nats" in r.stdout
  r = subprocess.run(args + [f"--handover_jump_from={tmp_path / 'nothing'}"], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode != 0 and "no metrics.jsonl there" in r.stderr


def test_a_candidate_wholly_below_the_targets_measured_losses_gives_scratch_and_says_what_to_measure():
  # The target's pilots reach 6.0 down to 4.0; the small model's shortest run already ends at 3.9: nothing to
  # compare a hand-over against, so the plan is scratch, and it says which pilots to lengthen.
  low = Candidate("halve", loglinear("low", 3.9, 3.5, 25 * STEP, 2.0), STEP / 4, 4.0, {}, 0.0, {"model.num_layers": 1})
  p = planner.plan_vcycle(TARGET, STEP, 20000, [low])
  assert p["method"] == "scratch" and p["no_overlap"] == ["halve"]
  text = planner.describe(p)
  assert "lies wholly below the losses the target's frontier reaches" in text and "--target_pilots" in text
  # A candidate that overlaps but is dearer says only that no hand-over pays.
  dear = Candidate("width", loglinear("w", 6.0, 5.0, 300 * STEP, 2.0), 2 * STEP, 4.0, {"cycle.depth_factor": 1})
  assert planner.plan_vcycle(TARGET, STEP, 3000, [dear])["no_overlap"] == []


def test_a_smaller_model_that_reaches_the_loss_alone_is_named_and_the_target_still_trains():
  # The small model reaches every loss of the target for a quarter of the FLOPs: the bound hands over at the
  # budget's loss itself; the plan still trains the target for 5% of the steps and names the small model alone.
  small = Candidate("halve", loglinear("small", 6.0, 3.8, 25 * STEP, 2.0), STEP / 4, 4.0, {}, 0.0,
                    {"model.num_layers": 1})
  p = planner.plan_vcycle(TARGET, STEP, 2000, [small])
  assert p["switch_loss"] == pytest.approx(TARGET.loss_at(2000 * STEP), abs=0.01)
  assert p["big_steps"] == 100
  a = p["smaller_model_alone"]
  assert a["candidate"] == "halve" and a["saving"] == pytest.approx(0.75, rel=1e-6) and not a["at_most"]
  assert a["overrides"] == {"model.num_layers": 1, "cycle.levels": 1, "train.steps": 2000} and a["lr_scale"] == 4.0
  assert "trained alone reaches the same loss" in planner.describe(p)


def test_a_hand_over_that_loses_loss_is_priced_in_and_one_that_loses_too_much_gives_scratch():
  # Handing over at L' with a jump d costs F_s(L') + F_T(L*) - F_T(L' + d); with F_s = F_T / 4 on these log-linear
  # frontiers (F_T(L) = 100 e^{2 (6 - L)} steps) it saves F_T(L') (e^{-2d} - 1/4): most at the small model's lowest
  # loss (5.0), nothing once e^{-2d} <= 1/4 (d >= ln 2).
  small = Candidate("halve", loglinear("small", 6.0, 5.0, 25 * STEP, 2.0), STEP / 4, 4.0, {}, 0.0)
  steps = 2000
  target_loss = TARGET.loss_at(steps * STEP)
  for d in (0.0, 0.1, 0.3):
    ideal = planner.ideal_cost([small.frontier, TARGET], target_loss, grid=2000, jump=d)
    assert ideal["switch_losses"][0] == pytest.approx(5.0, abs=2e-3)
    expect = steps * STEP - TARGET.cost(5.0) * (math.exp(-2 * d) - 0.25)
    assert ideal["flops"] == pytest.approx(expect, rel=2e-3)
  p0 = planner.plan_vcycle(TARGET, STEP, steps, [small])
  p = planner.plan_vcycle(TARGET, STEP, steps, [small], jump=0.3)
  assert p["handover_jump"] == 0.3 and p0["handover_jump"] == 0.0
  assert p["predicted_saving"] < p0["predicted_saving"]
  # The target trains from where it lands: F_T(5.0 + 0.3) is already paid, the rest is its own.
  assert p["switch_loss"] == pytest.approx(5.0, abs=0.01)
  assert p["big_steps"] == pytest.approx(steps - TARGET.cost(p["switch_loss"] + 0.3) / STEP, abs=1)
  # The schedule the plan wrote, predicted from the frontiers, gives the plan's own numbers back.
  for plan, d in ((p0, 0.0), (p, 0.3)):
    pred = planner.predict_vcycle(TARGET, STEP, small.frontier, small.step_flops, plan["small_steps"],
                                  plan["big_steps"], jump=d)
    assert pred["landing_loss"] == pytest.approx(pred["small_loss"] + d)
    assert pred["saving"] == pytest.approx(plan["predicted_saving"], abs=2e-3)
  assert planner.plan_vcycle(TARGET, STEP, steps, [small], jump=0.75)["method"] == "scratch"
  with pytest.raises(ValueError, match="jump must be a finite"):
    planner.ideal_cost([small.frontier, TARGET], target_loss, jump=-0.1)


def test_the_jumps_at_growth_are_read_from_a_runs_metrics():
  recs = [
      {"step": 1, "stage": 0, "level": 0, "event": "end_of_stage", "eval_loss": 7.0},
      {"step": 1, "stage": 1, "level": 1, "event": "after_coalesce", "eval_loss": 7.1},  # Coarsening: not a growth.
      {"step": 50, "stage": 1, "level": 1, "train_loss": 5.6, "eval_loss": 5.7},
      {"step": 90, "stage": 1, "level": 1, "event": "end_of_stage", "eval_loss": 5.5},
      {"step": 90, "stage": 2, "level": 0, "event": "after_decoalesce", "eval_loss": 5.8},
      {"step": 90, "stage": 2, "level": 0, "event": "after_interpolate", "eval_loss": 5.6},  # The model it trains.
      {"step": 120, "stage": 2, "level": 0, "event": "end_of_stage", "eval_loss": 5.3},
  ]
  (j,) = planner.handover_jumps(recs)
  assert (j["step"], j["before"], j["after"]) == (90, 5.5, 5.6) and j["jump"] == pytest.approx(0.1)
  assert planner.handover_jumps(recs[:4]) == []


def test_the_plan_check_reads_a_runs_jump_and_predicts_the_executed_schedule_with_it():
  from benchmarks import plan_check
  small = Candidate("halve", loglinear("small", 6.0, 5.0, 25 * STEP, 2.0), STEP / 4, 4.0, {}, 0.0)
  steps = 2000
  plan = planner.plan_vcycle(TARGET, STEP, steps, [small])
  n = plan["small_steps"]
  recs = [{"step": 1, "stage": 0, "level": 0, "event": "end_of_stage", "eval_loss": 7.0, "flops": STEP},
          {"step": n + 1, "stage": 1, "level": 1, "event": "end_of_stage", "eval_loss": 5.0, "flops": 2 * STEP},
          {"step": n + 1, "stage": 2, "level": 0, "event": "after_decoalesce", "eval_loss": 5.2},
          {"step": n + 1 + plan["big_steps"], "stage": 2, "level": 0, "event": "end_of_stage", "eval_loss": 4.6,
           "flops": plan["predicted_flops"]}]
  c = plan_check.check({"steps": steps, "plan": plan}, recs, TARGET, STEP, small)
  assert c["jump"] == pytest.approx(0.2)
  assert c["predicted_lossless"]["saving"] == pytest.approx(plan["predicted_saving"], abs=2e-3)
  assert c["predicted_with_jump"] == planner.predict_vcycle(TARGET, STEP, small.frontier, small.step_flops, n,
                                                            plan["big_steps"], jump=c["jump"])
  assert c["measured"]["final_loss"] == 4.6
  assert c["measured"]["saving"] == pytest.approx(1 - plan["predicted_flops"] / TARGET.cost(4.6))
  assert c["replanned"]["predicted_saving"] < plan["predicted_saving"]
  with pytest.raises(ValueError, match="no growth"):
    plan_check.check({"steps": steps, "plan": plan}, recs[:2], TARGET, STEP, small)


def test_a_chain_through_a_one_axis_model_is_planned_as_three_levels_when_it_saves_more():
  from engine_util import tiny_config
  from experiments.configs.common import override
  from multilevel.cycles.run_config import model_config
  halve = Candidate("halve", loglinear("h", 6.0, 5.0, 25 * STEP, 2.0), STEP / 4, 4.0, {})
  depth = Candidate("depth", loglinear("d", 6.0, 4.5, 50 * STEP, 2.0), STEP / 2, 2.0, {"cycle.width_factor": 1})
  two = planner.plan_vcycle(TARGET, STEP, 3000, [halve, depth])  # Without the target's shape: 2 levels only.
  assert two["method"] == "vcycle from depth"
  p = planner.plan_vcycle(TARGET, STEP, 3000, [halve, depth], shape=(4, 4))
  # The halved model to 5.0 (where it stops being cheaper than the depth-only one), the depth-only model on to 4.5,
  # then the target: cheaper than depth alone by F_d(5.0) - F_h(5.0) = 25 e^2 target steps.
  assert p["method"] == "3-level vcycle from halve through depth"
  assert p["switch_losses"] == [pytest.approx(5.0, abs=0.01), pytest.approx(4.5, abs=0.01)]
  assert p["small_steps"] == pytest.approx(halve.frontier.cost(5.0) / (STEP / 4), rel=0.02)
  assert p["mid_steps"] == pytest.approx((depth.frontier.cost(4.5) - depth.frontier.cost(5.0)) / (STEP / 2), rel=0.02)
  assert p["big_steps"] == pytest.approx(3000 - TARGET.cost(4.5) / STEP, rel=0.02)
  assert p["predicted_flops"] == pytest.approx(two["predicted_flops"] - 25 * math.e ** 2 * STEP + STEP, rel=0.01)
  assert "halve > depth" in planner.describe(p)
  # The overrides build that 3-level V-cycle: depth halved first (4 heads kept), then the width.
  c = override(tiny_config("gpt", levels=3, deep=True), p["overrides"])
  plan = build_plan(model_config(c, None), c.cycle, c.train)
  assert [(m.num_layers, m.num_heads) for m in plan.levels] == [(4, 4), (2, 4), (2, 2)]
  assert [s.steps for s in plan.stages] == [p["small_steps"], p["mid_steps"], p["big_steps"]]
  assert [s.lr.peak / c.train.lr for s in plan.stages] == pytest.approx([4.0, 2.0, 1.0])
  # Width first through a width-only model: the other order of the same two transitions.
  width = Candidate("width", depth.frontier, STEP / 2, 2.0, {"cycle.depth_factor": 1})
  w = override(tiny_config("gpt", levels=3, deep=True),
               planner.plan_vcycle(TARGET, STEP, 3000, [halve, width], shape=(4, 4))["overrides"])
  assert [(m.num_layers, m.num_heads) for m in build_plan(model_config(w, None), w.cycle, w.train).levels] == [
      (4, 4), (4, 2), (2, 2)]


def test_a_candidates_files_pool_and_their_rates_are_rescaled_to_the_planned_runs(tmp_path):
  import json
  # The same small model run at 8e-3 as 4x a base of 2e-3, and at 4e-3 as 1x a base of 4e-3.
  runs = {"a": (2e-3, [(4.0, 500, 1e12, 4.0), (4.0, 1000, 2e12, 3.6)]),
          "b": (4e-3, [(1.0, 500, 1e12, 3.9), (1.0, 1000, 2e12, 3.7)])}
  paths = []
  for name, (base, rs) in runs.items():
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps({"level": 1, "base_lr": base, "model": {"model.num_layers": 2},
                             "set": {"cycle.width_factor": "1"},
                             "runs": [{"lr_scale": sc, "steps": st, "total_flops": f, "final_eval_loss": l}
                                      for sc, st, f, l in rs]}))
    paths.append(str(p))
  c = planner.candidate_from_bound("+".join(paths), 4e-3)
  assert c.frontier.points == ((1e12, 3.9), (2e12, 3.6))  # The best run at each budget, across the files.
  assert c.lr_scale == 2.0 and c.name == "L1 width_factor=1"  # 8e-3 won the longest budget: 2x the planned 4e-3.
  assert planner.candidate_from_bound(paths[0]).lr_scale == 4.0  # One file alone: its own base.
  other = tmp_path / "other.json"
  other.write_text(json.dumps({"level": 1, "base_lr": 4e-3, "model": {"model.num_layers": 3}, "runs": []}))
  with pytest.raises(ValueError, match="different models"):
    planner.candidate_from_bound(f"{paths[0]}+{other}")


def test_no_smaller_model_alone_is_named_when_the_budget_is_past_the_target_pilots():
  # Past the target's pilots the search's loss is only their lowest, not scratch's at the budget: a small model
  # reaching it alone says nothing about matching scratch, so the note is left out.
  small = Candidate("halve", loglinear("small", 6.0, 3.8, 25 * STEP, 2.0), STEP / 4, 4.0, {}, 0.0,
                    {"model.num_layers": 1})
  p = planner.plan_vcycle(TARGET, STEP, 8000, [small])
  assert p["budget_beyond_pilots"] and p["smaller_model_alone"] is None
  assert "trained alone" not in planner.describe(p)
  assert "the hand-over is at the lowest loss the target's pilots reached" in planner.describe(p)


def test_the_plan_command_writes_no_config_when_no_hand_over_could_be_priced(tmp_path):
  import json
  target = tmp_path / "saving.json"
  target.write_text(json.dumps({"budgets": [
      {"steps": round(f / STEP), "scratch": {"total_flops": f, "final_eval_loss": l}} for f, l in TARGET.points]}))
  low = loglinear("low", 3.9, 3.5, 25 * STEP, 2.0)  # Every run ends below every loss the target's pilots reached.
  level = tmp_path / "L1.json"
  level.write_text(json.dumps({"level": 1, "set": {"cycle.width_factor": "1"}, "runs": [
      {"steps": round(f / (STEP / 4)), "lr_scale": 4, "total_flops": f, "final_eval_loss": l} for f, l in low.points]}))
  config = os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test"
  r = subprocess.run([sys.executable, "-m", "experiments.plan", f"--config={config}", "--steps=20000",
                      f"--workdir={tmp_path / 'w'}", f"--target_from={target}", f"--small_from={level}"],
                     cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=300)
  assert r.returncode == 1 and "why scratch:" in r.stdout, r.stderr[-3000:]
  assert r.stderr.strip().splitlines()[-1].startswith("error: no hand-over could be priced for L1 width_factor=1")
  assert (tmp_path / "w" / "plan.json").exists() and not (tmp_path / "w" / "plan_config.py").exists()
