"""How far a grown model gets as a function of where it grew (growth_curves): the curves themselves, the chains
priced with them (frontier.best_table, growth.wsd_cost and predict_chain_wsd), the stacking plan
(stack_planner.plan_stack), the plan command's --stack_rate_curves and benchmarks.rate_curve_check."""

import json
import math
import os
import sys

import pytest

from multilevel.cycles import growth, planner, stack_planner
from multilevel.cycles.growth_curves import RateCurve, Stage, TrajectoryCurve

from engine_util import ROOT, run_cmd
from stack_curves import H_STEP, HALF, LEVELS, Q_STEP, QUARTER, grown_curve, write_files
from wsd_curves import DECAYED, STABLE, STEP


def test_a_rate_curve_merges_a_schedules_seeds_and_interpolates_in_log_position():
  at = lambda steps: QUARTER.loss_at(steps * Q_STEP)  # The quarter's loss after that many of its steps.
  c = RateCurve.from_measurements("q -> h", QUARTER, [(at(1000), 0.8, 10), (at(1050), 1.0, 30), (at(4000), 2.0, 50)])
  # The two hand-overs within 10% of each other are one point, their mean; the points ascend in position.
  assert c.counts == (2, 1) and [round(x / Q_STEP) for x in c.positions] == [1025, 4000]
  assert c.at(at(1025)) == pytest.approx((0.9, 20))
  # Halfway in log position, halfway in rate and delay; the end values beyond the points (a loss off the curve too).
  mid = at(math.sqrt(1025 * 4000))
  assert c.at(mid) == pytest.approx((1.45, 35), rel=1e-6)
  assert c.at(at(300)) == pytest.approx((0.9, 20)) and c.at(at(9000)) == (2.0, 50)
  assert c.at(9.0) == pytest.approx((0.9, 20)) and c.at(0.5) == (2.0, 50)
  # Rates measured after later hand-overs are read later: monotone between the points.
  rates = [c.at(at(n))[0] for n in (1025, 1500, 2500, 4000)]
  assert rates == sorted(rates) and rates[0] == pytest.approx(0.9) and rates[-1] == pytest.approx(2.0)
  # Where a plan may hand over and stay within 2x of a measured point: one interval (1025 and 4000 steps are within
  # 4x); within 1.5x, two, with the gap between them left out.
  ((lo, hi),) = c.reach(2.0)
  assert QUARTER.cost(hi) / Q_STEP == pytest.approx(1025 / 2, rel=1e-6)
  assert QUARTER.cost(lo) / Q_STEP == pytest.approx(8000, rel=1e-6)
  assert [[round(QUARTER.cost(x) / Q_STEP, 3) for x in pair] for pair in c.reach(1.5)] == [
      [round(1025 * 1.5, 3), round(1025 / 1.5, 3)], [round(4000 * 1.5, 3), round(4000 / 1.5, 3)]]
  assert [p["steps"] for p in c.describe(Q_STEP)] == [1025, 4000] and c.describe(Q_STEP)[0]["n"] == 2
  assert c.scaled(0.5).at(mid) == pytest.approx((0.725, 35), rel=1e-6)


def test_a_stage_is_how_far_a_grown_model_gets_and_its_inverse():
  line = Stage.linear(2.0, 30)
  assert [line.progress(t) for t in (0, 20, 30, 80)] == [0.0, 0.0, 0.0, 100.0]
  assert line.steps(100) == 80 and line.steps(0) == 30  # Nothing moves before the delay is over.
  bent = Stage(((0, 0), (100, 50), (200, 250)), 3.0)
  assert [bent.progress(t) for t in (50, 150, 300)] == [25.0, 150.0, 550.0]
  assert [bent.steps(q) for q in (25, 150, 550)] == [50.0, 150.0, 300.0]
  assert bent.scaled(2).progress(150) == 300.0
  with pytest.raises(ValueError, match="never falls"):
    Stage(((0, 0), (100, 50), (200, 40)), 1.0)
  with pytest.raises(ValueError, match="positive slope"):
    Stage(((0, 0),), 0.0)


def test_a_trajectory_curve_keeps_the_way_each_growth_went():
  at = lambda steps: QUARTER.loss_at(steps * Q_STEP)
  # Each trajectory: (steps since the growth, scratch steps moved), the second with a recovery (it moves back first).
  early = [(100, 50), (200, 150), (300, 300), (400, 500)]
  late = [(100, -20), (200, 200), (300, 600), (400, 1000)]
  c = TrajectoryCurve.from_measurements("q -> h", QUARTER, [(at(1000), early), (at(4000), late)])
  s0, s1 = c.stage(at(1000)), c.stage(at(4000))
  assert [s0.progress(t) for t, _ in early] == pytest.approx([q for _, q in early])
  assert s1.progress(100) == 0.0 and s1.progress(300) == pytest.approx(600)  # Held where it fell back.
  # Past its last eval it goes on at its pace over the last half of its steps.
  assert s0.slope == pytest.approx((500 - 150) / 200) and s0.progress(500) == pytest.approx(500 + 1.75 * 100)
  # Between the two, the mean of their ways weighted in log position; the seeds of one schedule averaged.
  mid = c.stage(at(2000))
  assert mid.progress(300) == pytest.approx(0.5 * 300 + 0.5 * 600) and mid.progress(400) == pytest.approx(750)
  two = TrajectoryCurve.from_measurements("q -> h", QUARTER, [(at(1000), early), (at(1020), late)])
  assert two.counts == (2,) and two.stage(at(1010)).progress(400) == pytest.approx(750)
  assert [p["moved"] for p in c.describe(Q_STEP)] == [500, 1000]
  with pytest.raises(ValueError, match="never moved forward"):
    TrajectoryCurve.from_measurements("q -> h", QUARTER, [(at(1000), [(100, -5), (200, -3)])])


def test_a_chain_priced_off_trajectories_is_the_cheapest_pair_of_hand_overs():
  """A stacked model that speeds up over its stage: the trajectory prices a short stage slower and a long one faster
  than the straight line a fitted rate draws through the same way."""
  at = lambda steps: QUARTER.loss_at(steps * Q_STEP)
  way = lambda k: [(t, k * t * t / 2000) for t in range(100, 2001, 100)]  # Convex: 0.1x at first, 2x by the end.
  q = TrajectoryCurve.from_measurements("quarter -> half", QUARTER, [(at(500), way(0.5)), (at(3000), way(1.5))])
  h = TrajectoryCurve.from_measurements("half -> target", HALF, [(5.0, way(0.8)), (3.8, way(1.2))])
  args = ([QUARTER, HALF], [Q_STEP, H_STEP], [1.0, 1.0], STABLE, STEP, 8000, 0.2, 1.0)
  r = growth.wsd_cost(*args, adjacent=True, curves=[None, q, h])
  assert r["flops"] == pytest.approx(brute_force(8000, q.stage, h.stage), rel=3e-3)
  p = growth.predict_chain_wsd([QUARTER, HALF], [Q_STEP, H_STEP], r["steps"], [1.0, 1.0], STABLE, DECAYED, STEP,
                               r["big_steps"], 8000, 0.2, curves=[None, q, h])
  assert p["final_loss"] == pytest.approx(DECAYED.loss_at(8000 * STEP), abs=3e-3)
  # The straight line through the same way (rate over its 2000 steps, no delay) against the way itself.
  line = Stage.linear(way(1.0)[-1][1] / 2000, 0)
  assert q.stage(at(500)).scaled(2).progress(400) < line.progress(400)
  assert q.stage(at(500)).scaled(2).progress(2000) == pytest.approx(line.progress(2000))


def test_a_rate_curve_refuses_what_it_cannot_place():
  with pytest.raises(ValueError, match=r"lie off the smaller model's stable curve \(3.6000 to 6.0000\)"):
    RateCurve.from_measurements("q -> h", QUARTER, [(2.0, 1.0, 0.0)])
  with pytest.raises(ValueError, match="no measurements"):
    RateCurve.from_measurements("q -> h", QUARTER, [])
  with pytest.raises(ValueError, match="rate > 0"):
    RateCurve.of("q -> h", QUARTER, ((1e12, -1.0, 0.0),))
  with pytest.raises(ValueError, match="positions must ascend"):
    RateCurve.of("q -> h", QUARTER, ((2e12, 1.0, 0.0), (1e12, 1.0, 0.0)))


# Rates that depend on where the growth happens: the half-depth model learns at 0.6x after an early hand-over from
# the quarter and 1.6x after a late one; the target 0.8x after an early one from the half and 1.2x after a late one.
Q_CURVE = RateCurve.of("quarter -> half", QUARTER, ((QUARTER.cost(5.5), 0.6, 0.0), (QUARTER.cost(4.2), 1.6, 0.0)))
H_CURVE = RateCurve.of("half -> target", HALF, ((HALF.cost(5.0), 0.8, 0.0), (HALF.cost(3.8), 1.2, 0.0)))


def brute_force(steps, stage_q, stage_h, grid=160, cool_frac=0.2):
  """The cheapest chain quarter -> half -> target (or half -> target) when the half moves as ``stage_q(s0)`` says
  after the quarter hands over at s0 and the target as ``stage_h(s1)`` after the half hands over at s1 (each a
  growth_curves.Stage): both hand-over losses enumerated, written out independently of the dynamic programme."""
  cool = round(cool_frac * steps)
  knee = (steps - cool) * STEP
  # With the loss that lands exactly where scratch's cool-down starts (as the dynamic programme has it).
  losses = sorted({6.0 - 2.7 * i / (grid - 1) for i in range(grid)} | {STABLE.loss_at(knee)}, reverse=True)
  best = None
  for s1 in losses:
    land = STABLE.cost(s1)
    if land is None or land > knee * (1 + 1e-9) or HALF.cost(s1) is None:
      continue
    t = STEP * (1 + max(1, math.ceil(cool + stage_h(s1).steps(max(0.0, knee - land) / STEP) - 1e-9)))
    options = [round(HALF.cost(s1) / H_STEP) * H_STEP]
    for s0 in losses:
      if s0 <= s1 or QUARTER.cost(s0) is None:
        continue
      n1 = stage_q(s0).steps((HALF.cost(s1) - HALF.cost(s0)) / H_STEP)
      options.append(round(QUARTER.cost(s0) / Q_STEP) * Q_STEP + round(n1) * H_STEP + H_STEP)
    total = min(options) + t
    best = total if best is None else min(best, total)
  return best


def test_a_chain_priced_off_rate_curves_is_the_cheapest_pair_of_hand_overs():
  args = ([QUARTER, HALF], [Q_STEP, H_STEP], [1.0, 1.0], STABLE, STEP, 8000, 0.2, 1.0)
  r = growth.wsd_cost(*args, adjacent=True, curves=[None, Q_CURVE, H_CURVE])
  assert r["flops"] == pytest.approx(brute_force(8000, Q_CURVE.stage, H_CURVE.stage), rel=3e-3)
  # Priced at the rates measured after late hand-overs, held constant, the chain hands the quarter over after 90
  # steps, where the curve says the half learns at 0.6x: it promises far more than the curve does (LLaMA's plans
  # missed so). Priced at the early rates, the quarter is not worth training at all.
  const = lambda rq, rh: growth.wsd_cost([QUARTER, HALF], [Q_STEP, H_STEP], [1.0, rq], STABLE, STEP, 8000, 0.2, rh,
                                         adjacent=True)
  late, early = const(1.6, 1.2), const(0.6, 0.8)
  assert late["steps"][0] < 100 < 3000 < r["steps"][0] and r["switch_losses"][0] < late["switch_losses"][0]
  assert late["saving"] > r["saving"] > early["saving"] and early["steps"][0] == 0
  # The priced schedule, run through the chain's prediction with the same curves, ends at scratch's loss.
  p = growth.predict_chain_wsd([QUARTER, HALF], [Q_STEP, H_STEP], r["steps"], [1.0, 1.0], STABLE, DECAYED, STEP,
                               r["big_steps"], 8000, 0.2, curves=[None, Q_CURVE, H_CURVE])
  assert p["final_loss"] == pytest.approx(DECAYED.loss_at(8000 * STEP), abs=3e-3)
  assert p["flops"] == pytest.approx(r["flops"], rel=1e-9)
  with pytest.raises(ValueError, match="Give 3 rate curves"):
    growth.wsd_cost(*args, adjacent=True, curves=[Q_CURVE, H_CURVE])


@pytest.mark.parametrize("floor", [0, 1600])
def test_a_curve_of_one_point_prices_as_its_constant_rate_and_delay(floor):
  """The quadratic search over hand-overs that a curve needs finds what the running minimum of a constant rate finds."""
  args = ([QUARTER, HALF], [Q_STEP, H_STEP], [1.0, 1.3], STABLE, STEP, 8000, 0.2, 0.9)
  const = growth.wsd_cost(*args, adjacent=True, delays=[0.0, 120.0], target_delay=80.0, min_steps=floor)
  one = lambda stable, r, d: RateCurve.of("one", stable, ((stable.cost(4.5), r, d),))
  curved = growth.wsd_cost(*args, adjacent=True, min_steps=floor,
                           curves=[None, one(QUARTER, 1.3, 120.0), one(HALF, 0.9, 80.0)])
  assert curved["flops"] == pytest.approx(const["flops"], rel=1e-12)
  assert curved["steps"] == const["steps"] and curved["big_steps"] == const["big_steps"]
  assert curved["switch_losses"] == const["switch_losses"]


def test_a_stacking_plan_reads_each_doublings_rate_where_it_hands_over():
  wsd = planner.Wsd(STABLE, 0.2)
  p = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], rate_curves=[Q_CURVE, H_CURVE])
  want = growth.wsd_cost([QUARTER, HALF], [Q_STEP, H_STEP], [1.0, 1.0], STABLE, STEP, 8000, 0.2, 1.0,
                         min_big=1600, adjacent=True, min_steps=400, curves=[None, Q_CURVE, H_CURVE])
  assert p["predicted_saving"] == pytest.approx(want["saving"], abs=1e-12)
  assert [x["rate"] for x in p["rates_at_plan"]] == [pytest.approx(Q_CURVE.at(p["switch_losses"][0])[0]),
                                                      pytest.approx(H_CURVE.at(p["switch_losses"][1])[0])]
  assert len(p["rate_curves"]) == 2 and "curve over 2 points" in p["pricing"]
  # Each hand-over is held against the curve's nearest measured point.
  near = p["rates_near"]
  assert [x["doubling"] for x in near] == ["quarter -> half", "half -> the target"]
  assert near[0]["measured_at"] == pytest.approx(min((5.5, 4.2), key=lambda l: abs(
      math.log(QUARTER.cost(l) / QUARTER.cost(p["switch_losses"][0])))), abs=1e-9)
  # The margins price the same curves, slowed.
  assert all(m["saving"] < p["predicted_saving"] for m in p["margins"])
  # It hands the quarter over in the gap between the curve's points, more than 2x from either: far. Held within
  # 1.5x of a measured hand-over, it hands over near one, and nothing is far.
  assert near[0]["far"] and not any(lo <= p["switch_losses"][0] <= hi for lo, hi in Q_CURVE.reach(1.1))
  held = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], rate_curves=[Q_CURVE, H_CURVE],
                                  rates_span=1.5)
  assert any(lo <= held["switch_losses"][0] <= hi for lo, hi in Q_CURVE.reach(1.5))
  assert not any(x["far"] for x in held["rates_near"]) and held["predicted_saving"] < p["predicted_saving"]
  # The printed plan gives the rates it read off the curves, and says where a hand-over sits in a gap of its curve.
  text = lambda plan: planner.describe({**plan, "pilot_flops": 1.0, "net_saving": 0.0})
  rq = Q_CURVE.at(p["switch_losses"][0])[0]
  assert f"rates read off the rate curves at these hand-overs: quarter -> half {rq:.3g}x after 0 steps" in text(p)
  assert "the rate curve of quarter -> half has no point within 2x of this plan's hand-over" in text(p)
  assert "has no point within 2x" not in text(held)
  with pytest.raises(ValueError, match="not placed on those models' stable curves"):
    stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], rate_curves=[H_CURVE, H_CURVE])
  with pytest.raises(ValueError, match="one rate curve"):
    stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], rate_curves=[Q_CURVE])


def _rates_file(tmp_path, target, files, name, rates, losses):
  """A benchmarks.stack_rates result of one stacking run per (rate into the half, rate into the target) pair, the
  quarter handing over at each of ``losses``."""
  from benchmarks import cli, stack_rates
  runs = []
  for i, ((rq, rh), l0) in enumerate(zip(rates, losses)):
    half = grown_curve(rq, l0, 1e12, 1, HALF, H_STEP, 4)
    top = grown_curve(rh, half[-1][2], half[-1][0], 0, STABLE, STEP, 4)[1:]
    run = tmp_path / f"{name}{i}.json"
    run.write_text(json.dumps({"budgets": [{"steps": 1000, "variants": {"planned": {
        "total_flops": top[-1][0] + 0.25 * 1000 * STEP, "curve": [[5e11, 0.0, 5.9, 2]] + half + top}}}]}))
    runs.append(str(run))
  out = tmp_path / f"{name}.json"
  a = cli.parse(stack_rates.define_flags, [f"--target={target}", f"--levels={','.join(files)}",
                                           f"--runs={','.join(runs)}", f"--out={out}"])
  cli.write_report(str(out), stack_rates.measure(a))
  return out


def test_the_plan_command_prices_stacking_off_rate_curves_from_stack_rates_files(tmp_path):
  target, files = write_files(tmp_path)
  # Two schedules' runs: after the quarter hands over at 5.5 the half learns at 0.7x, at 4.4 at 1.5x; a third whose
  # quarter handed over at 3.5, below what the quarter's pilot measures, cannot be placed: left out, and said.
  rates = _rates_file(tmp_path, target, files, "r", [(0.7, 0.9), (1.5, 1.1), (1.0, 1.0)], [5.5, 4.4, 3.5])
  config = os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test"
  args = [sys.executable, "-m", "experiments.plan", f"--config={config}", "--steps=8000", "--set=train.decay=wsd",
          "--set=model.num_layers=4", f"--target_from={target}", "--methods=stackbert",
          f"--stack_from={','.join(files)}"]
  r = run_cmd(args + [f"--workdir={tmp_path / 'w'}", f"--stack_rate_curves={rates}"])
  assert r.returncode == 0, r.stderr[-3000:]
  d = json.loads((tmp_path / "w" / "plan.json").read_text())
  rec = d["stack_rate_curves"]
  assert rec["files"] == [str(rates)] and rec["without_curve"] == []
  assert [round(p["rate"], 3) for p in rec["curves"][0]] == [0.7, 1.5]
  assert [(o["doubling"], o["handover_loss"]) for o in rec["off_curve"]] == [("1-layer -> 2-layer", 3.5)]
  assert "left out" in r.stderr
  # What the command planned is plan_stack priced off the curves the files give.
  from experiments import plan_stacking
  levels = plan_stacking.levels_from_files(files, None, 4)
  curves, _, _ = plan_stacking.rate_curves(plan_stacking.curve_rows([str(rates)]), levels)
  want = stack_planner.plan_stack(DECAYED, planner.Wsd(STABLE, 0.2), levels, STEP, 8000, [1.0, 1.0],
                                  rate_curves=curves)
  assert d["plan"]["stage_steps"] == want["stage_steps"]
  assert d["plan"]["predicted_saving"] == pytest.approx(want["predicted_saving"])
  # The same files as trajectories: the way each stacked model went, eval by eval.
  t = run_cmd(args + [f"--workdir={tmp_path / 't'}", f"--stack_rate_curves={rates}", "--stack_curve_kind=trajectory"])
  assert t.returncode == 0, t.stderr[-3000:]
  dt = json.loads((tmp_path / "t" / "plan.json").read_text())
  assert dt["stack_rate_curves"]["kind"] == "trajectory"
  traj, _, _ = plan_stacking.rate_curves(plan_stacking.curve_rows([str(rates)]), levels, "trajectory")
  want = stack_planner.plan_stack(DECAYED, planner.Wsd(STABLE, 0.2), levels, STEP, 8000, [1.0, 1.0],
                                  rate_curves=traj)
  assert dt["plan"]["stage_steps"] == want["stage_steps"]
  assert "scratch steps in its" in t.stdout
  # Bad input, refused before anything is priced.
  gone = run_cmd(args + [f"--workdir={tmp_path / 'g'}", f"--stack_rate_curves={tmp_path / 'none.json'}"])
  assert gone.returncode != 0 and "--stack_rate_curves=" in gone.stderr and "cannot read it" in gone.stderr
  other = run_cmd(args + [f"--workdir={tmp_path / 'o'}", f"--stack_rate_curves={target}"])
  assert other.returncode != 0 and "not a benchmarks.stack_rates result" in other.stderr


def test_the_rate_curve_check_reprices_each_plan_as_priced_with_its_own_runs_and_without(tmp_path):
  from benchmarks import cli, rate_curve_check
  target, files = write_files(tmp_path)
  wsd = planner.Wsd(STABLE, 0.2)
  from experiments import plan_stacking
  levels = plan_stacking.levels_from_files(files, None, 4)
  plans, rate_files, seeds = [], [], []
  # Two plans priced at constant rates; each ran (its runs measured rates that depend on where it handed over).
  for i, (rq, rh, measured) in enumerate(((1.0, 1.0, 0.20), (1.2, 0.9, 0.25))):
    p = stack_planner.plan_stack(DECAYED, wsd, levels, STEP, 8000, [rq, rh])
    path = tmp_path / f"plan{i}.json"
    path.write_text(json.dumps({"steps": 8000, "plan": p}))
    plans.append(str(path))
    rf = _rates_file(tmp_path, target, files, f"rates{i}", [(0.7 + 0.6 * i, 0.9 + 0.1 * i)], [p["switch_losses"][0]])
    data = json.loads(rf.read_text())
    for row in data["rows"]:
      row["T"] = 8000
    rf.write_text(json.dumps(data))
    rate_files.append(str(rf))
    s = tmp_path / f"seeds{i}.json"
    s.write_text(json.dumps({"mean": measured, "min": measured - 0.05, "max": measured + 0.05,
                             "rows": [{"seed": 42, "saving": measured + 0.03},
                                      {"seed": 1, "saving": measured - 0.03}]}))
    seeds.append(str(s))
  a = cli.parse(rate_curve_check.define_flags, [f"--target={target}", f"--levels={','.join(files)}",
                                                f"--plans={','.join(plans)}", f"--rates={','.join(rate_files)}",
                                                f"--seeds={','.join(seeds)}", "--seed=42"])
  d = rate_curve_check.check(a)
  rows = d["rows"]
  # Priced with the rates each plan was priced with, its schedule gives its prediction back.
  assert [r["as_priced"] for r in rows] == [pytest.approx(json.loads(open(p).read())["plan"]["predicted_saving"],
                                                          abs=3e-3) for p in plans]
  # Left out, each plan is priced from the other's runs alone (one measured point: a constant curve).
  for i, r in enumerate(rows):
    other = json.loads(open(rate_files[1 - i]).read())["rows"]
    plan = json.loads(open(plans[i]).read())["plan"]
    lower = [0] * (3 - len(plan["stage_steps"])) + plan["stage_steps"][:-1]
    want = stack_planner.predict_stack(DECAYED, wsd, levels, STEP, 8000, [other[0]["rate"], other[1]["rate"]],
                                       lower, plan["stage_steps"][-1], delays=[other[0]["delay"], other[1]["delay"]])
    assert r["curve_left_out"] == pytest.approx(want["saving"], abs=1e-9)
    assert r["error_curve_left_out"] == pytest.approx(100 * (r["measured"] - r["curve_left_out"]))
  assert d["summary"]["curve_left_out"]["n"] == 2 and "curve, its runs left out" in rate_curve_check.table(d)
  # Against the pilots' seed alone (here 3 points above the mean).
  assert [r["seed_error_curve_left_out"] - r["error_curve_left_out"] for r in rows] == [pytest.approx(3)] * 2
  assert "curve_left_out against seed 42" in d["summary"]
  with pytest.raises(Exception, match="one per plan"):
    rate_curve_check.check(cli.parse(rate_curve_check.define_flags, [
        f"--target={target}", f"--levels={','.join(files)}", f"--plans={plans[0]}", f"--rates={','.join(rate_files)}",
        f"--seeds={seeds[0]}"]))
