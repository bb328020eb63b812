"""Growth measured from runs and the V-cycle priced under one WSD schedule (multilevel/cycles/growth.py), and the
planner's WSD plans (planner.Wsd, experiments.plan --pricing)."""

import json
import math
import os
import sys

import pytest

from multilevel.cycles import growth, planner
from multilevel.cycles.frontier import Frontier, bound_at, ideal_cost
from multilevel.cycles.planner import Candidate

from engine_util import ROOT, run_cmd
from wsd_curves import DECAYED, SMALL, STABLE, STEP, candidate, loglinear, records_of_a_grown_run


def brute_force(steps, rate, jump=0.0, cool_frac=0.2, min_big=1, grid=4000):
  """The cheapest 2-level WSD schedule by enumerating hand-over losses, written out independently of wsd_cost."""
  cool = round(cool_frac * steps)
  knee = (steps - cool) * STEP
  best = None
  hi, lo = SMALL.loss_range[1], SMALL.loss_range[0]
  edge = STABLE.loss_at(knee) - jump  # Lands exactly at scratch's cool-down.
  for loss in [hi - (hi - lo) * i / (grid - 1) for i in range(grid)] + [edge]:
    land = STABLE.cost(loss + jump)
    if land is None or land > knee * (1 + 1e-9):
      continue
    big = max(min_big, math.ceil(cool + max(0.0, knee - land) / (rate * STEP) - 1e-9))
    flops = round(SMALL.cost(loss) / (STEP / 4)) * STEP / 4 + (1 + big) * STEP
    if best is None or flops < best[0]:
      best = (flops, loss, big)
  return best


@pytest.mark.parametrize("rate,jump", [(1.0, 0.0), (0.5, 0.0), (1.0, 0.1)])
def test_the_wsd_price_is_the_cheapest_hand_over_on_the_stable_curves(rate, jump):
  steps = 8000
  r = growth.wsd_cost([SMALL], [STEP / 4], [1.0], STABLE, STEP, steps, 0.2, target_rate=rate, jump=jump)
  flops, loss, big = brute_force(steps, rate, jump)
  assert r["flops"] == pytest.approx(flops, rel=2e-3)
  assert r["switch_losses"][0] == pytest.approx(loss, abs=0.01)
  assert r["saving"] == pytest.approx(1 - flops / (steps * STEP), abs=2e-3)
  assert r["big_steps"] >= round(0.2 * steps)  # The whole cool-down is the target's.


def test_a_slower_grown_model_or_a_lossy_hand_over_saves_less():
  price = lambda rate, jump=0.0: growth.wsd_cost([SMALL], [STEP / 4], [1.0], STABLE, STEP, 8000, 0.2,
                                                 target_rate=rate, jump=jump)["saving"]
  assert price(1.0) > price(0.8) >= price(0.5) and price(1.0) > price(1.0, 0.2)
  # Slow enough, the target best grows where scratch's cool-down starts and only cools down.
  slow = growth.wsd_cost([SMALL], [STEP / 4], [1.0], STABLE, STEP, 8000, 0.2, target_rate=0.5)
  assert slow["switch_losses"][0] == pytest.approx(STABLE.loss_at(6400 * STEP)) and slow["big_steps"] == 1600
  # At rate 1 the saving is the FLOPs the small model saves on the way to the hand-over loss, less its step.
  r = growth.wsd_cost([SMALL], [STEP / 4], [1.0], STABLE, STEP, 8000, 0.2)
  s = r["switch_losses"][0]
  assert r["saving"] == pytest.approx((STABLE.cost(s) - SMALL.cost(s) - STEP) / (8000 * STEP), abs=2e-3)
  assert s == pytest.approx(6.0 - math.log(4 * 2.0 / 2.6) / 0.6, abs=0.01)  # Where the curves' slopes cross.


def test_the_predicted_run_of_a_wsd_plan_ends_at_scratchs_loss():
  steps = 8000
  for rate in (1.0, 0.6):
    r = growth.wsd_cost([SMALL], [STEP / 4], [1.0], STABLE, STEP, steps, 0.2, target_rate=rate)
    p = growth.predict_wsd(SMALL, STEP / 4, r["steps"][0], STABLE, DECAYED, STEP, r["big_steps"], steps, 0.2,
                           rate=rate)
    assert p["final_loss"] == pytest.approx(DECAYED.loss_at(steps * STEP), abs=2e-3)
    assert p["flops"] == pytest.approx(r["flops"], rel=1e-9)
  # Fewer target steps than the plan's end above scratch's loss.
  short = growth.predict_wsd(SMALL, STEP / 4, r["steps"][0], STABLE, DECAYED, STEP, r["big_steps"] - 500, steps, 0.2,
                             rate=0.6)
  assert short["final_loss"] > DECAYED.loss_at(steps * STEP) + 0.02 and not short["at_least"]
  # A target stage that runs past scratch's longest run: no loss to read, only what it saves at least.
  far = growth.predict_wsd(SMALL, STEP / 4, r["steps"][0], STABLE, DECAYED, STEP, 60000, steps, 0.2, rate=0.6)
  last = DECAYED.points[-1][0]
  assert far["at_least"] and far["final_loss"] is None
  assert far["saving"] == pytest.approx(1 - far["flops"] / last) and far["flops"] > last


def test_a_three_level_wsd_chain_prices_each_growth_with_its_rate():
  mid = loglinear("mid stable", 6.0, 3.5, 50 * STEP, 2.0)
  args = ([SMALL, mid], [STEP / 4, STEP / 2])
  fast = growth.wsd_cost(*args, [1.0, 1.0], STABLE, STEP, 8000, 0.2)
  assert None not in fast["switch_losses"] and fast["switch_losses"][0] > fast["switch_losses"][1]
  assert fast["steps"][0] > 0 and fast["steps"][1] > 0
  # A slow growth into the middle model: the chain skips it, or hands over to it later and saves less.
  slow = growth.wsd_cost(*args, [1.0, 0.3], STABLE, STEP, 8000, 0.2)
  assert slow["saving"] < fast["saving"]
  with pytest.raises(ValueError, match="finite positive"):
    growth.wsd_cost(*args, [1.0, 0.0], STABLE, STEP, 8000, 0.2)


def test_the_bound_with_rates_of_one_is_the_bound_and_slower_growth_lowers_it():
  target_loss = DECAYED.loss_at(20000 * STEP)
  small = Frontier("small", tuple((f, l - 0.3) for f, l in SMALL.points))
  assert ideal_cost([small, DECAYED], target_loss, rates=[1.0, 1.0]) == ideal_cost([small, DECAYED], target_loss)
  one = bound_at([small, DECAYED], target_loss)["bound_saving"]
  assert bound_at([small, DECAYED], target_loss, rates=[1.0, 0.5])["bound_saving"] < one


def test_the_wsd_plan_prices_each_candidate_with_its_growths_rate():
  depth = candidate("depth", loglinear("d", 6.0, 3.5, 50 * STEP, 2.4), STEP / 2, {"cycle.width_factor": 1})
  width = candidate("width", loglinear("w", 6.0, 3.5, 45 * STEP, 2.4), STEP / 2, {"cycle.depth_factor": 1})
  assert (depth.growth, width.growth) == ("depth", "width")
  lossless = planner.plan_vcycle(DECAYED, STEP, 8000, [depth, width], wsd=planner.Wsd(STABLE))
  assert lossless["method"] == "vcycle from width"  # Slightly cheaper curve.
  slow = planner.plan_vcycle(DECAYED, STEP, 8000, [depth, width], wsd=planner.Wsd(STABLE, rates={"width": 0.4}))
  assert slow["method"] == "vcycle from depth" and slow["pricing"].startswith("WSD")
  assert "priced under one WSD schedule" in planner.describe(slow)
  # A stacking schedule predicted less than 5 points under the V-cycle kept: the plan calls it a near tie.
  stack = lambda x: {"method": "stackbert from 1-layer, 3 stages", "predicted_saving": x, "overrides": {}}
  s = 0.3
  tie = planner.describe({**slow, "predicted_saving": s, "alternatives": [stack(s - 0.049), stack(s - 0.03)]})
  assert "note: a near tie (3.0 points, against stackbert from 1-layer, 3 stages)" in tie and "--methods=stackbert" in tie
  assert "near tie" not in planner.describe({**slow, "predicted_saving": s, "alternatives": [stack(s - 0.051)]})
  from multilevel.cycles import plan_report
  kept = {"method": "stackbert from 1-layer", "predicted_saving": s}
  v = {"method": "vcycle from depth", "predicted_saving": s - 0.01}
  assert plan_report.near_tie(kept, [v]) == v  # Either way round; never against its own method or scratch.
  assert plan_report.near_tie(kept, [stack(s - 0.01), {"method": "scratch", "predicted_saving": s - 0.01}]) is None
  best = plan_report.keep_best([{**v, "overrides": {}}, {**kept, "overrides": {}}])  # As the plan command keeps it.
  assert best["method"] == kept["method"] and best["near_tie"] == v["method"]
  assert best["alternatives"] == [{**v, "overrides": {}}] and "near_tie" not in plan_report.keep_best([kept])
  none = {"method": "scratch", "predicted_saving": 0.0}  # Nothing saves: no tie with a schedule predicted to lose.
  assert plan_report.near_tie(none, [v, stack(-0.01)]) is None
  assert plan_report.near_tie({**kept, "predicted_saving": 0.02}, [{**v, "predicted_saving": -0.01}]) is None
  o = slow["overrides"]
  assert round(o["cycle.up_fracs"][0] * 8000) == slow["big_steps"] >= math.ceil(1600 / 0.95)
  with pytest.raises(ValueError, match="have none"):
    planner.plan_vcycle(DECAYED, STEP, 8000, [Candidate("x", depth.frontier, STEP / 2, 2.0)],
                        wsd=planner.Wsd(STABLE))
  with pytest.raises(ValueError, match="Growth rates"):
    planner.Wsd(STABLE, rates={"sideways": 0.5})


def test_the_plan_command_prices_a_wsd_run_on_stable_curves_and_measured_rates(tmp_path):
  target = tmp_path / "saving.json"
  curve = [[f, 0.0, l] for f, l in STABLE.points]  # A 4000-step WSD run: stable to 3200 steps, then its cool-down.
  target.write_text(json.dumps({"budgets": [
      {"steps": round(f / STEP), "scratch": {"total_flops": f, "final_eval_loss": l},
       **({"scratch_curve": [c for c in curve if c[0] <= 0.8 * f] + [[f, 0.0, l]]} if i == len(DECAYED.points) - 1
          else {})} for i, (f, l) in enumerate(DECAYED.points)]}))
  stable = loglinear("d", 6.0, 3.5, 50 * STEP, 2.0)
  level = tmp_path / "L1.json"
  level.write_text(json.dumps({"level": 1, "set": {"cycle.width_factor": "1"}, "runs": [
      {"steps": round(f / (STEP / 2)), "lr_scale": 2, "total_flops": f, "final_eval_loss": l - 0.3,
       **({"curve": [[g, m, 1e-3] for g, m in stable.points]} if i == 8 else {})}
      for i, (f, l) in enumerate(stable.points)]}))
  run = tmp_path / "run"
  run.mkdir()
  run.joinpath("metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records_of_a_grown_run(0.5)) + "\n")
  other = tmp_path / "other"  # A second run (another seed, say): the plan prices the runs' mean rate.
  other.mkdir()
  other.joinpath("metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records_of_a_grown_run(0.3)) + "\n")
  config = os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test"
  args = [sys.executable, "-m", "experiments.plan", f"--config={config}", "--steps=4000", "--set=train.decay=wsd",
          f"--target_from={target}", f"--small_from={level}"]
  r = run_cmd(args + [f"--workdir={tmp_path / 'w'}", f"--growth_rates_from=depth={run}+{other}", "--online_stop"])
  assert r.returncode == 0, r.stderr[-3000:]
  with open(tmp_path / "w" / "plan.json") as f:
    d = json.load(f)
  assert d["wsd"]["growth_rates"]["depth"] == pytest.approx(0.4, rel=1e-3)
  runs = d["growth_rates_measured"]["depth"]["runs"]
  assert [x["workdir"] for x in runs] == [str(run), str(other)]
  assert [x["rate"] for x in runs] == [pytest.approx(0.5, rel=1e-3), pytest.approx(0.3, rel=1e-3)]
  p = d["plan"]
  assert p["pricing"].startswith("WSD") and p["method"] == "vcycle from L1 width_factor=1"
  want = growth.wsd_cost([stable], [STEP / 2], [1.0], STABLE, STEP, 4000, 0.2, target_rate=d["wsd"]["growth_rates"]["depth"],
                         min_big=math.ceil(800 / 0.95))
  assert p["predicted_saving"] == pytest.approx(want["saving"], abs=1e-9)
  assert p["small_steps"] == want["steps"][0] and p["big_steps"] == want["big_steps"]
  # The small stage warms up as the pilot whose curve priced it did: train.warmup_frac of that pilot's steps.
  pilot_steps = round(stable.points[8][0] / (STEP / 2))
  assert p["overrides"]["cycle.small_warmup_steps"] == round(0.05 * pilot_steps)
  # --online_stop: the small stage ends by the online rule against the target's stable curve, in the config it writes.
  assert p["overrides"]["cycle.small_stop"] == "frontier"
  assert p["overrides"]["cycle.target_frontier"] == d["wsd"]["target_stable"] and "online stop rule" in r.stdout
  from experiments.configs.common import load_config
  from multilevel.cycles import build_plan
  from multilevel.cycles.run_config import model_config
  from multilevel.cycles.switch import FrontierSwitch
  c = load_config(str(tmp_path / "w" / "plan_config.py"))  # The config the driver runs as is.
  stops = [s.stop for s in build_plan(model_config(c, None), c.cycle, c.train).stages if s.stop is not None]
  assert len(stops) == 1 and isinstance(stops[0], FrontierSwitch)
  assert [list(x) for x in stops[0].points] == d["wsd"]["target_stable"]
  bad = run_cmd(args + [f"--workdir={tmp_path / 'b'}", "--growth_rates=sideways=0.5"])
  assert bad.returncode != 0 and "GROWTH one of" in bad.stderr
  bad = run_cmd(args + [f"--workdir={tmp_path / 'm'}", "--margins=0.02,1.5"])
  assert bad.returncode != 0 and "--margins=0.02,1.5: give LANDING,SLOWER" in bad.stderr
  assert not (tmp_path / "m").exists()  # Refused before any pilot or file.
  assert "if the target lands 0.020 nats higher" in r.stdout and len(p["margins"]) == 3  # The defaults.


def test_a_wsd_hand_over_at_the_end_of_a_measured_curve_is_flagged():
  short = candidate("depth", loglinear("d", 6.0, 4.8, 50 * STEP, 2.4), STEP / 2, {"cycle.width_factor": 1})
  p = planner.plan_vcycle(DECAYED, STEP, 8000, [short], wsd=planner.Wsd(STABLE))
  assert p["switch_loss"] == pytest.approx(4.8) and p["candidates"][0]["curve_end"] == ["depth's"]
  assert "at the end of depth's measured stable curve" in planner.describe(p)
  full = candidate("depth", loglinear("d", 6.0, 3.5, 50 * STEP, 2.4), STEP / 2, {"cycle.width_factor": 1})
  p = planner.plan_vcycle(DECAYED, STEP, 8000, [full], wsd=planner.Wsd(STABLE))
  assert p["candidates"][0]["curve_end"] == [] and "at the end of" not in planner.describe(p)


def test_a_wsd_candidate_whose_curve_starts_past_the_cool_down_gives_scratch_and_says_to_evaluate_earlier():
  # At 8000 steps scratch's cool-down starts at step 6400, where the target's stable curve stands at 3.92. A small
  # model whose first evaluation is already at 3.8 (far cheaper than the target there) leaves no loss to hand over at.
  edge = STABLE.loss_at(6400 * STEP)
  late = candidate("depth", loglinear("d", 3.8, 3.5, 2 * STEP, 2.4), STEP / 2, {"cycle.width_factor": 1})
  p = planner.plan_vcycle(DECAYED, STEP, 8000, [late], wsd=planner.Wsd(STABLE))
  assert p["method"] == "scratch" and p["no_overlap"] == ["depth"]
  assert f"starts below {edge:.4f}" in p["why"] and "depth's at 3.8000" in p["why"] and "--evals" in p["why"]
  assert "why scratch: the stable curve of depth starts below" in planner.describe(p)
  # The same model evaluated from a higher loss on is planned.
  early = candidate("depth", loglinear("d", 4.5, 3.5, 2 * STEP, 2.4), STEP / 2, {"cycle.width_factor": 1})
  assert planner.plan_vcycle(DECAYED, STEP, 8000, [early], wsd=planner.Wsd(STABLE))["method"] == "vcycle from depth"
  # A candidate that overlaps but saves nothing is scratch for the other reason, with nothing to re-measure.
  dear = candidate("depth", loglinear("d", 6.0, 3.5, 400 * STEP, 2.4), STEP, {"cycle.width_factor": 1})
  p = planner.plan_vcycle(DECAYED, STEP, 8000, [dear], wsd=planner.Wsd(STABLE))
  assert p["method"] == "scratch" and p["no_overlap"] == [] and "no candidate hands over for less" in p["why"]


def test_a_wsd_plan_gives_the_small_stage_its_pilots_warm_up():
  import dataclasses
  from engine_util import tiny_config
  from experiments.configs.common import override
  from multilevel.cycles.config import build_plan
  from multilevel.cycles.run_config import model_config
  depth = candidate("depth", loglinear("d", 6.0, 3.5, 50 * STEP, 2.4), STEP / 2, {"cycle.width_factor": 1})
  assert "cycle.small_warmup_steps" not in planner.plan_vcycle(DECAYED, STEP, 8000, [depth],
                                                               wsd=planner.Wsd(STABLE))["overrides"]
  piloted = dataclasses.replace(depth, stable_steps=4000)
  p = planner.plan_vcycle(DECAYED, STEP, 8000, [piloted], wsd=planner.Wsd(STABLE, pilot_warmup_frac=0.1))
  assert p["overrides"]["cycle.small_warmup_steps"] == 400
  c = override(tiny_config("gpt", levels=2, deep=True), {**p["overrides"], "train.decay": "wsd"})
  stages = build_plan(model_config(c, None), c.cycle, c.train).stages
  assert stages[0].kind == "bottom" and stages[0].lr.warmup == 400
  with pytest.raises(ValueError, match="small_warmup_steps=.*no step"):
    build_plan(model_config(c, None), {**c.cycle, "small_warmup_steps": stages[0].steps}, c.train)


def test_a_candidates_seeds_pool_as_their_mean():
  """Runs of one small model at several seeds: each budget counts as the seeds' mean loss, the stable curve as the
  seeds' curves averaged evaluation by evaluation; one seed's repeats still keep their lowest loss."""
  grid = [1e11 * k for k in range(1, 6)]
  curve = lambda shift: [[f, 5.0 - 0.2 * i + shift, 1e-3] for i, f in enumerate(grid)]
  runs = [{"steps": 100, "lr_scale": 2, "total_flops": 1e11, "final_eval_loss": 5.0, "seed": 42},
          {"steps": 500, "lr_scale": 2, "total_flops": 5e11, "final_eval_loss": 4.0, "seed": 42, "curve": curve(0.0)},
          {"steps": 500, "lr_scale": 2, "total_flops": 5e11, "final_eval_loss": 4.3, "seed": 42},
          {"steps": 500, "lr_scale": 2, "total_flops": 5e11, "final_eval_loss": 4.2, "seed": 1, "curve": curve(0.2)}]
  c = planner.candidate_from_runs("s", runs, stable=True)
  assert dict(c.frontier.points)[5e11] == pytest.approx(4.1) and dict(c.frontier.points)[1e11] == 5.0
  assert c.stable.points[2] == (3e11, pytest.approx(4.7)) and c.stable_steps == 500 and "2 seeds" in c.stable.name
  # A seed named by a --set value (a string) is the same seed: its repeat keeps the lower loss, not a third seed.
  again = planner.candidate_from_runs("s", runs + [dict(runs[3], seed="1", final_eval_loss=4.1, curve=None)],
                                      stable=True)
  assert dict(again.frontier.points)[5e11] == pytest.approx(4.05) and [k for k, _ in again.seed_stables] == [42, 1]
  one = planner.candidate_from_runs("s", runs[:3], stable=True)  # One seed: as before, its best run.
  assert dict(one.frontier.points)[5e11] == 4.0 and one.stable.points[2] == (3e11, pytest.approx(4.6))
  bad = runs[:3] + [dict(runs[3], curve=curve(0.2)[:4])]
  with pytest.raises(ValueError, match="different FLOPs"):
    planner.candidate_from_runs("s", bad, stable=True)


def test_a_plan_priced_on_several_seeds_reports_each_seeds_own_prediction():
  """Pilots at two seeds: the plan is priced on their mean curve and also on each seed's, with its schedule fixed:
  the lucky seed hands over lower and saves more, the unlucky one less, and the mean's prediction lies between."""
  def runs(seed, shift):
    curve = [[f, l + shift, 1e-3] for f, l in SMALL.points]  # At peak rate throughout: all of it is stable.
    final = [{"steps": 1000 * k, "lr_scale": 2.0, "total_flops": f, "final_eval_loss": l - 0.3 + shift, "seed": seed}
             for k, (f, l) in enumerate(SMALL.points[2::3], 1)]
    return final + [dict(final[-1], curve=curve)]
  c = planner.candidate_from_runs("depth", runs(42, -0.05) + runs(1, 0.05), {"cycle.width_factor": 1}, stable=True)
  assert [s for s, _ in c.seed_stables] == [42, 1]
  wsd = planner.Wsd(STABLE, rates={"depth": 0.9})
  plan = planner.plan_vcycle(DECAYED, STEP, 8000, [c], wsd=wsd)
  seeds = plan["seed_predictions"]
  n, big = plan["small_steps"], plan["big_steps"]
  for (seed, curve), p in zip(c.seed_stables, seeds):
    want = growth.predict_wsd(curve, c.step_flops, n, STABLE, DECAYED, STEP, big, 8000, 0.2, 0.0, 0.9)
    assert p["seed"] == seed and p["saving"] == want["saving"] and p["handover_loss"] == want["small_loss"]
  lucky, unlucky = seeds
  assert lucky["handover_loss"] < unlucky["handover_loss"] and lucky["saving"] > unlucky["saving"]
  assert unlucky["saving"] < plan["predicted_saving"] < lucky["saving"]
  text = planner.describe(plan)
  assert "on the mean of 2 pilot seeds" in text and f"seed 1 {unlucky['handover_loss']:.3f}" in text
  # A schedule whose target stage would run past the target's longest scratch run: what it saves at least.
  far = planner.seed_predictions(c, n, 60000, wsd, DECAYED, STEP, 8000)
  flops = n * c.step_flops + 60001 * STEP
  assert all(p["at_least"] and p["saving"] == pytest.approx(1 - flops / DECAYED.points[-1][0]) for p in far)
  one = planner.candidate_from_runs("depth", runs(42, 0.0), {"cycle.width_factor": 1}, stable=True)
  assert one.seed_stables == () and "seed_predictions" not in planner.plan_vcycle(DECAYED, STEP, 8000, [one], wsd=wsd)


def test_a_wsd_plan_says_how_much_of_its_saving_survives_a_higher_landing_and_a_slower_target():
  """The margins are the fixed schedule priced with the landing shifted and the rate scaled (each alone, then both).
  A plan whose small model does most of the work keeps most of its saving; one whose target has real work left
  loses more than half of it under both, and its text says to expect less than predicted."""
  late = candidate("depth", loglinear("d", 6.0, 3.5, 25 * STEP, 2.4), STEP / 2, {"cycle.width_factor": 1})
  early = candidate("depth", loglinear("d", 6.0, 3.5, 25 * STEP, 2.6), STEP / 2, {"cycle.width_factor": 1})
  wsd = planner.Wsd(STABLE)
  keeps = planner.plan_vcycle(DECAYED, STEP, 8000, [late], wsd=wsd, margins=(0.05, 0.5))
  n, big, m = keeps["small_steps"], keeps["big_steps"], keeps["margins"]
  for row, (dl, f) in zip(m, [(0.05, 1.0), (0.0, 0.5), (0.05, 0.5)]):
    want = growth.predict_wsd(late.stable, late.step_flops, n, STABLE, DECAYED, STEP, big, 8000, 0.2, dl, f)
    assert (row["landing"], row["rate_factor"]) == (dl, f)
    assert row["saving"] == want["saving"] and row["final_loss"] == want["final_loss"]
  assert m[2]["saving"] < min(m[0]["saving"], m[1]["saving"]) and m[0]["saving"] < keeps["predicted_saving"]
  text = planner.describe(keeps)
  assert "if the target lands 0.050 nats higher" in text and "0.5x the priced rate" in text
  assert m[2]["saving"] > keeps["predicted_saving"] / 2 and "expect less than predicted" not in text
  loses = planner.plan_vcycle(DECAYED, STEP, 8000, [early], wsd=wsd, margins=(0.05, 0.5))
  assert loses["big_steps"] > big and loses["margins"][2]["saving"] < loses["predicted_saving"] / 2
  assert "less than half survives both, so expect less than predicted" in planner.describe(loses)
  tiny = planner.plan_vcycle(DECAYED, STEP, 8000, [early], wsd=wsd, margins=(0.001, 0.99))
  assert tiny["margins"][2]["saving"] == pytest.approx(tiny["predicted_saving"], abs=0.01)
  assert "margins" not in planner.plan_vcycle(DECAYED, STEP, 8000, [late])  # Bound pricing: no stable curves.


def test_margins_priced_past_the_target_pilots_are_said_to_be_unknown():
  """Past the target's longest pilot a margin is only 'at least' a trivial bound, the same in all three rows: the
  plan says they are unknown, and does not call the plan fragile on them."""
  early = candidate("depth", loglinear("d", 6.0, 3.5, 25 * STEP, 2.6), STEP / 2, {"cycle.width_factor": 1})
  p = planner.plan_vcycle(DECAYED, STEP, 8000, [early], wsd=planner.Wsd(STABLE), margins=(0.05, 0.5))
  past = {**p, "margins": [{**m, "at_least": True} for m in p["margins"]]}
  text = planner.describe(past)
  assert "the target's longest pilot ends before such a run would, so these are unknown" in text
  assert "expect less than predicted" not in text and "expect less than predicted" in planner.describe(p)
