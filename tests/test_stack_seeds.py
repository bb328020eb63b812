"""One stacking schedule priced on several seeds' own runs (multilevel/cycles/stack_seeds.py) and experiments.plan
--seed_flagfiles."""

import dataclasses
import itertools
import json
import os
import statistics
import sys

import pytest

from multilevel.cycles import planner, stack_planner
from multilevel.cycles.stack_seeds import SeedPricing, plan_stack_seeds

from engine_util import ROOT, run_cmd
from stack_curves import H_STEP, HALF, LEVELS, Q_STEP, QUARTER, write_files
from wsd_curves import DECAYED, STABLE, STEP, loglinear

WSD = planner.Wsd(STABLE, 0.2)
STEPS = 8000


def seed(name, shift=0.0, rates=(1.0, 1.0), delays=(0.0, 0.0)):
  """A seed whose shallower models end ``shift`` nats off the shared ones and whose doublings run at ``rates``."""
  levels = [dataclasses.replace(LEVELS[0], stable=loglinear("quarter", 6.0 + shift, 3.6 + shift, 20 * STEP, 3.0)),
            dataclasses.replace(LEVELS[1], stable=loglinear("half", 6.0 + shift, 3.3 + shift, 45 * STEP, 2.4))]
  return SeedPricing(name, DECAYED, WSD, levels, STEP, list(rates), list(delays))


def lower_of(plan):
  """A plan's steps per shallower model (0 where it skips one) and its target's steps."""
  by = dict(zip(plan["levels"], plan["stage_steps"]))
  return [by.get(c.name, 0) for c in LEVELS], plan["stage_steps"][-1]


def test_seeds_that_agree_get_the_one_seed_plan():
  one = stack_planner.plan_stack(DECAYED, WSD, LEVELS, STEP, STEPS, [1.0, 0.9])
  twin = [SeedPricing(s, DECAYED, WSD, LEVELS, STEP, [1.0, 0.9]) for s in (42, 7)]
  p = plan_stack_seeds(twin, STEPS)
  # The search starts at the one-seed plan and only moves where the prediction (priced step by step, where the
  # one-seed plan is priced on a grid of losses) says it saves more; the two agree to a tenth of a point.
  assert p["predicted_saving"] >= stack_planner.predict_stack(DECAYED, WSD, LEVELS, STEP, STEPS, [1.0, 0.9],
                                                              *lower_of(one))["saving"]
  assert p["predicted_saving"] == pytest.approx(one["predicted_saving"], abs=1e-3)
  assert p["levels"] == one["levels"] and [s["saving"] for s in p["seed_predictions"]] == [p["predicted_saving"]] * 2
  assert p["spread"] == [p["predicted_saving"]] * 2 and p["own_plans"][0]["stage_steps"] == one["stage_steps"]


def fewest_big(seeds, lower, goal):
  """By bisection: the fewest target steps after ``lower`` at which the seeds' mean predicted loss reaches ``goal``."""
  mean_loss = lambda big: statistics.mean(stack_planner.predict_stack(
      DECAYED, WSD, s.levels, STEP, STEPS, s.rates, lower, big, delays=s.delays)["final_loss"] for s in seeds)
  lo, hi = 1600, 3 * STEPS
  while lo < hi:
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if mean_loss(mid) <= goal else (mid + 1, hi)
  return hi


def test_the_plan_is_the_schedule_with_the_best_mean_over_the_seeds():
  seeds = [seed(42, -0.05, (1.6, 1.4)), seed(1, 0.0, (1.4, 1.25)), seed(2, 0.05, (1.3, 1.1), (0.0, 200.0))]
  p = plan_stack_seeds(seeds, STEPS)
  lower, big = lower_of(p)
  # Each seed's prediction is the schedule priced on its own curves and rates; the plan's is their mean.
  for s, got in zip(seeds, p["seed_predictions"]):
    want = stack_planner.predict_stack(DECAYED, WSD, s.levels, STEP, STEPS, s.rates, lower, big, delays=s.delays)
    assert got["seed"] == s.seed and got["saving"] == want["saving"] and got["handover_losses"] == [
        x for x in want["handover_losses"] if x is not None]
  savings = [r["saving"] for r in p["seed_predictions"]]
  assert p["predicted_saving"] == pytest.approx(statistics.mean(savings), abs=1e-15)
  assert p["spread"] == [min(savings), max(savings)] and savings[0] > savings[1] > savings[2] > 0
  assert not p["at_least"]  # Every seed ends within its frontier.
  # The target's stage is the fewest steps at which the seeds' mean loss reaches scratch's at the budget: the seeds
  # share one frontier here, so its loss at 8000 steps.
  goal = DECAYED.loss_at(STEPS * STEP)
  assert big == fewest_big(seeds, lower, goal)
  # No seed's own best schedule does better on the mean, and no schedule around the plan does either (each
  # shallower stage moved by up to 240 steps in 40s, the floors kept, the target's stage set as above).
  own = p["own_plans"]
  assert [o["seed"] for o in own] == [42, 1, 2] and all(o["mean_saving"] <= p["predicted_saving"] for o in own)
  assert max(o["own_saving"] for o in own) > p["predicted_saving"] > min(o["own_saving"] for o in own)
  used = [i for i, n in enumerate(lower) if n]
  grid = range(-240, 241, 40)
  for moves in itertools.product(grid, repeat=len(used)):
    lo = list(lower)
    for i, d in zip(used, moves):
      lo[i] += d
    if min(lo[i] for i in used) < 400:
      continue
    b = fewest_big(seeds, lo, goal)
    ps = [stack_planner.predict_stack(DECAYED, WSD, s.levels, STEP, STEPS, s.rates, lo, b, delays=s.delays)
          for s in seeds]
    assert statistics.mean(x["saving"] for x in ps) <= p["predicted_saving"] + 1e-12, (lo, b)
  # The driver's schedule is the one priced, and the printed plan shows every seed and each one's own best.
  o = p["overrides"]
  assert o["train.steps"] == sum(p["stage_steps"]) and o["cycle.stackbert.stages"] == len(p["stage_steps"])
  text = planner.describe({**p, "pilot_flops": 0.0, "net_saving": p["predicted_saving"]})
  assert "the mean over seeds [42, 1, 2]" in text and f"seed 2 {p['seed_predictions'][2]['handover_loss']:.3f}" in text
  assert f"seed 42 {100 * own[0]['own_saving']:+.1f}%" in text


def test_seeds_that_cannot_share_a_schedule_are_refused():
  with pytest.raises(ValueError, match="two seeds or more"):
    plan_stack_seeds([seed(1)], STEPS)
  with pytest.raises(ValueError, match="repeat one"):
    plan_stack_seeds([seed(1), seed(1, 0.02)], STEPS)
  renamed = dataclasses.replace(seed(2), levels=[dataclasses.replace(LEVELS[0], name="1-layer"), LEVELS[1]])
  with pytest.raises(ValueError, match="the same chain of models"):
    plan_stack_seeds([seed(1), renamed], STEPS)
  dearer = dataclasses.replace(seed(2), target_step_flops=2 * STEP)
  with pytest.raises(ValueError, match="other FLOPs per step"):
    plan_stack_seeds([seed(1), dearer], STEPS)


def test_the_plan_command_prices_each_seed_on_its_flagfile(tmp_path):
  """Seed 42's files on the command line, seed 7's (the same curves, written again) in a flagfile: the plan is the
  one-seed plan, priced on both; bad flagfiles are refused before anything is priced."""
  target, files = write_files(tmp_path)
  other = tmp_path / "seed7"
  other.mkdir()
  target7, files7 = write_files(other)
  flagfile = tmp_path / "s7.flags"
  flagfile.write_text(f"--seed=7\n--target_from={target7}\n--stack_from={','.join(files7)}\n")
  config = os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test"
  args = [sys.executable, "-m", "experiments.plan", f"--config={config}", "--steps=8000", "--set=train.decay=wsd",
          "--set=model.num_layers=4", "--set=train.seed=42", f"--target_from={target}", "--methods=stackbert",
          f"--stack_from={','.join(files)}", "--stack_rates=1.0,0.9"]
  one = run_cmd(args + [f"--workdir={tmp_path / 'one'}"])
  both = run_cmd(args + [f"--workdir={tmp_path / 'both'}", f"--seed_flagfiles={flagfile}"])
  assert one.returncode == 0 and both.returncode == 0, (one.stderr[-2000:], both.stderr[-2000:])
  p1 = json.loads((tmp_path / "one" / "plan.json").read_text())["plan"]
  d = json.loads((tmp_path / "both" / "plan.json").read_text())
  p2 = d["plan"]
  assert p2["seeds"] == [42, 7] and d["seed_flagfiles"][0]["target_from"] == [str(target7)]
  assert p2["predicted_saving"] == pytest.approx(p1["predicted_saving"], abs=1e-3)
  assert [r["saving"] for r in p2["seed_predictions"]] == [p2["predicted_saving"]] * 2
  assert "each seed's own best schedule: seed 42" in both.stdout
  # Both seeds' scratch runs and shallower models count as pilots.
  assert p2["pilot_flops"] == pytest.approx(2 * p1["pilot_flops"])
  # Bad flagfiles are refused before anything is priced.
  repeat = tmp_path / "repeat.flags"
  repeat.write_text(f"--seed=42\n--target_from={target7}\n--stack_from={','.join(files7)}\n")
  r = run_cmd(args + [f"--workdir={tmp_path / 'bad'}", f"--seed_flagfiles={repeat}"])
  assert r.returncode != 0 and "repeat one" in r.stderr, r.stderr[-1500:]
  vc = run_cmd([a for a in args if a != "--methods=stackbert"] + [f"--workdir={tmp_path / 'v'}",
                                                                   f"--seed_flagfiles={flagfile}"])
  assert vc.returncode != 0 and "--seed_flagfiles prices a stacking plan" in vc.stderr


def test_a_seeds_flagfile_gives_its_seed_and_files_and_nothing_else(tmp_path):
  from absl import app
  from experiments.plan_stacking import read_seed_flagfile
  target, files = write_files(tmp_path)
  bad = tmp_path / "bad.flags"
  for text, said in ((f"--seed=7\n--target_from={target}\n--steps=10\n", "Unknown command line flag 'steps'"),
                     (f"--target_from={target}\n--stack_from={files[0]}\n", "give --seed, --target_from"),
                     (f"--seed=7\n--target_from={tmp_path / 'none.json'}\n--stack_from={files[0]}\n", "no file")):
    bad.write_text(text)
    with pytest.raises(app.UsageError, match=said):
      read_seed_flagfile(str(bad))
  with pytest.raises(app.UsageError, match="no file"):
    read_seed_flagfile(str(tmp_path / "absent.flags"))
  bad.write_text(f"--seed=7\n--target_from={target}\n--stack_from={','.join(files)}\n")
  got = read_seed_flagfile(str(bad))
  assert got["seed"] == 7 and got["target_from"] == [str(target)] and got["stack_from"] == files
