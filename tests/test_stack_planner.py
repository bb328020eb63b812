"""Stacking priced from pilots (multilevel/cycles/stack_planner.py), the chains of doublings it prices
(growth.wsd_cost(adjacent=True), growth.predict_chain_wsd) and experiments.plan --methods=stackbert."""

import json
import math
import os
import subprocess
import sys

import pytest

from multilevel.cycles import growth, planner, stack_planner
from multilevel.cycles.pilots import Candidate

from engine_util import ROOT
from stack_curves import H_STEP, HALF, LEVELS, Q_STEP, QUARTER, level
from wsd_curves import DECAYED, STABLE, STEP, loglinear


def brute_force(steps, rates, grid=160, cool_frac=0.2, floor=0):
  """The cheapest chain of doublings (quarter -> half -> target, or half -> target) by enumerating both hand-over
  losses, written out independently of the dynamic programme; with ``floor``, only chains whose every smaller
  model trains at least that many steps."""
  cool = round(cool_frac * steps)
  knee = (steps - cool) * STEP
  losses = [6.0 - 2.7 * i / (grid - 1) for i in range(grid)]
  best = None

  def target_part(s1):
    land = STABLE.cost(s1)
    if land is None or land > knee * (1 + 1e-9):
      return None
    return STEP * (1 + max(1, math.ceil(cool + max(0.0, knee - land) / (rates[1] * STEP) - 1e-9)))

  for s1 in losses:
    t = target_part(s1)
    if t is None or HALF.cost(s1) is None:
      continue
    options = [round(HALF.cost(s1) / H_STEP) * H_STEP] if HALF.cost(s1) >= floor * H_STEP else []  # From half depth.
    for s0 in losses:
      if s0 <= s1 or QUARTER.cost(s0) is None or QUARTER.cost(s0) < floor * Q_STEP:
        continue
      n1 = (HALF.cost(s1) - HALF.cost(s0)) / rates[0] / H_STEP
      if n1 >= floor:
        options.append(round(QUARTER.cost(s0) / Q_STEP) * Q_STEP + round(n1) * H_STEP + H_STEP)
    if options:
      total = min(options) + t
      best = total if best is None else min(best, total)
  return best


@pytest.mark.parametrize("rates", [(1.0, 1.0), (0.8, 0.7)])
def test_a_chain_of_doublings_is_priced_at_the_cheapest_pair_of_hand_overs(rates):
  r = growth.wsd_cost([QUARTER, HALF], [Q_STEP, H_STEP], [1.0, rates[0]], STABLE, STEP, 8000, 0.2, rates[1],
                      adjacent=True)
  assert r["flops"] == pytest.approx(brute_force(8000, rates), rel=3e-3)
  assert r["steps"][1] > 0  # The target grows from the half-depth model, never straight from the quarter.


@pytest.mark.parametrize("floor", [1600, 2400, 3600])
def test_a_floor_on_every_stage_prices_the_cheapest_chain_that_keeps_it(floor):
  # Without a floor the quarter trains 949 steps; with one, each smaller model trains at least ``floor`` steps or
  # none (at 3600 the quarter is left out).
  r = growth.wsd_cost([QUARTER, HALF], [Q_STEP, H_STEP], [1.0, 1.0], STABLE, STEP, 8000, 0.2, 1.0, adjacent=True,
                      min_steps=floor)
  assert all(n == 0 or n >= floor for n in r["steps"]) and r["steps"][1] > 0
  assert (r["steps"][0] == 0) == (floor == 3600)
  assert r["flops"] == pytest.approx(brute_force(8000, (1.0, 1.0), floor=floor), rel=3e-3)


def test_adjacent_chains_never_skip_a_doubling():
  # Growing into the half-depth model is slow: a free chain jumps from the quarter straight to the target, a chain
  # of doublings cannot.
  args = ([QUARTER, HALF], [Q_STEP, H_STEP], [1.0, 0.05], STABLE, STEP, 8000, 0.2)
  free = growth.wsd_cost(*args)
  assert free["switch_losses"][1] is None and free["steps"][0] > 0
  doubling = growth.wsd_cost(*args, adjacent=True)
  assert doubling["switch_losses"][1] is not None and doubling["steps"][1] > 0
  assert doubling["saving"] <= free["saving"]


def test_the_predicted_run_of_a_priced_chain_ends_at_scratchs_loss():
  steps = 8000
  for rates in ((1.0, 1.0), (0.8, 0.7)):
    r = growth.wsd_cost([QUARTER, HALF], [Q_STEP, H_STEP], [1.0, rates[0]], STABLE, STEP, steps, 0.2, rates[1],
                        adjacent=True)
    p = growth.predict_chain_wsd([QUARTER, HALF], [Q_STEP, H_STEP], r["steps"], [1.0, rates[0]], STABLE, DECAYED,
                                 STEP, r["big_steps"], steps, 0.2, rates[1])
    assert p["final_loss"] == pytest.approx(DECAYED.loss_at(steps * STEP), abs=3e-3)
    assert p["flops"] == pytest.approx(r["flops"], rel=1e-9)
    assert [x is not None for x in p["handover_losses"]] == [n > 0 for n in r["steps"]]
  # A longer quarter stage hands a lower loss on; a slower half-depth model ends higher.
  base = lambda r0, n0=2000: growth.predict_chain_wsd([QUARTER, HALF], [Q_STEP, H_STEP], [n0, 1500], [1.0, r0],
                                                      STABLE, DECAYED, STEP, 3000, steps, 0.2)
  assert base(1.0, 3000)["handover_losses"][0] < base(1.0)["handover_losses"][0]
  assert base(0.5)["final_loss"] > base(1.0)["final_loss"]
  with pytest.raises(ValueError, match="some of them positive"):
    growth.predict_chain_wsd([QUARTER, HALF], [Q_STEP, H_STEP], [0, 0], [1.0, 1.0], STABLE, DECAYED, STEP, 10,
                             steps, 0.2)


def test_a_stacking_plan_writes_the_stackbert_run_it_priced():
  from experiments.configs import gpt
  from experiments.configs.common import override
  from multilevel.cycles import build_plan
  from multilevel.cycles.run_config import model_config
  steps, wsd = 8000, planner.Wsd(STABLE, 0.2)
  p = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, steps, [1.0, 1.0], warmup_steps=200)
  want = growth.wsd_cost([QUARTER, HALF], [Q_STEP, H_STEP], [1.0, 1.0], STABLE, STEP, steps, 0.2, 1.0,
                         min_big=max(round(0.05 * steps), 1600), adjacent=True)
  assert p["predicted_saving"] == pytest.approx(want["saving"], abs=1e-12) and p["predicted_saving"] > 0
  o = p["overrides"]
  assert p["stage_steps"] == [n for n in want["steps"] if n] + [want["big_steps"]]
  assert o["train.steps"] == sum(p["stage_steps"]) and o["cycle.method"] == "stackbert"
  assert o["cycle.stackbert.stages"] == len(p["stage_steps"]) and o["cycle.stackbert.growth"] == "scaled"
  c = gpt.get_config("test")
  c.unlock()
  override(c, {"model.num_layers": 4, "train.decay": "wsd", **o})
  built = build_plan(model_config(c, None), c.cycle, c.train)
  assert [s.steps for s in built.stages] == p["stage_steps"]
  assert [lv.num_layers for lv in built.levels] == [4, 2, 1][:len(p["stage_steps"])]
  # The cool-down is scratch's at the budget (in steps) and the warm-up the pilots'.
  assert round(c.train.cooldown_frac * c.train.steps) == round(0.2 * steps)
  assert round(c.train.warmup_frac * c.train.steps) == 200
  text = planner.describe({**p, "pilot_flops": 1.0, "net_saving": 0.0, "alternatives": [
      {"method": "vcycle from depth", "predicted_saving": 0.01, "overrides": {}}]})
  assert f"{p['stage_steps'][-1]} steps of the target" in text and "preferred to vcycle from depth: predicted " \
      "saving +1.0%" in text
  # Each predicted margin is a schedule that gets less done, so it saves less.
  assert all(m["saving"] < p["predicted_saving"] for m in p["margins"])
  # A model that learns slowly after stacking into the target: the plan hands over later and saves less.
  slow = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, steps, [1.0, 0.9])
  assert slow["predicted_saving"] < p["predicted_saving"]
  assert slow["switch_losses"][-1] < p["switch_losses"][-1]


def test_a_stacking_plan_refuses_pilots_it_cannot_price():
  wsd = planner.Wsd(STABLE, 0.2)
  with pytest.raises(ValueError, match="at --lr_scales=1"):
    stack_planner.plan_stack(DECAYED, wsd, [LEVELS[0], level("half", HALF, H_STEP, lr_scale=2.0)], STEP, 8000,
                             [1.0, 1.0])
  with pytest.raises(ValueError, match="one finite positive growth rate per doubling"):
    stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0])
  no_curve = Candidate("half", LEVELS[1].frontier, H_STEP, 1.0)
  with pytest.raises(ValueError, match="stable curve"):
    stack_planner.plan_stack(DECAYED, wsd, [no_curve], STEP, 8000, [1.0])
  # Pilots that never get cheaper than the target: scratch, and why.
  dear = level("half", loglinear("dear", 6.0, 3.3, 200 * STEP, 2.5), 0.9 * STEP)
  p = stack_planner.plan_stack(DECAYED, wsd, [dear], STEP, 8000, [1.0])
  assert p["method"] == "scratch" and p["overrides"]["cycle.levels"] == 1 and "no chain" in p["why"]


def test_a_delay_after_each_doubling_makes_short_stages_dear():
  wsd = planner.Wsd(STABLE, 0.2)
  p = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0])
  slow = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], delays=[300, 300])
  assert slow["predicted_saving"] < p["predicted_saving"]
  # Priced and predicted the same way: the plan's schedule, run through the chain's prediction, ends at scratch's loss.
  n = [0] * (3 - len(slow["stage_steps"])) + slow["stage_steps"][:-1]
  pred = stack_planner.predict_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], n, slow["stage_steps"][-1],
                                     delays=[300, 300])
  assert pred["final_loss"] == pytest.approx(DECAYED.loss_at(8000 * STEP), abs=3e-3)
  assert pred["saving"] == pytest.approx(slow["predicted_saving"], abs=3e-3)
  with pytest.raises(ValueError, match="one delay per doubling"):
    stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], delays=[-1, 0])


def test_the_plan_command_runs_stacking_pilots_at_the_targets_rate(tmp_path):
  from experiments.configs.common import load_config
  from multilevel.cycles import build_plan
  from multilevel.cycles.run_config import model_config
  from engine_util import CACHE
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
  config = os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test"  # 2 layers: one doubling.
  r = subprocess.run([sys.executable, "-m", "experiments.plan", f"--config={config}", "--steps=16",
                      f"--workdir={tmp_path}", "--set=train.decay=wsd", f"--set=data.cache_dir={CACHE}",
                      "--set=train.batch_size=4", "--methods=stackbert", "--target_pilots=8,16", "--small_pilots=8,16",
                      f"--compilation_cache={os.path.join(ROOT, '.cache', 'jax-tests')}"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  d = json.loads((tmp_path / "plan.json").read_text())
  # The 1-layer model's pilots ran at the target's rate only, evaluated often enough for a stable curve.
  shallow = [p for p in d["pilots"] if p["model"] == "1-layer"]
  assert sorted(p["steps"] for p in shallow) == [8, 16] and {p["lr_scale"] for p in shallow} == {1.0}
  assert len(shallow[-1]["curve"]) >= 8
  p = d["plan"]
  assert p["budget"] == 16 and "plan:" in r.stdout and "pilots cost" in r.stdout
  c = load_config(str(tmp_path / "plan_config.py"))
  built = build_plan(model_config(c, None), c.cycle, c.train)
  # Stacking pays at this budget (about +20% predicted); the driver's plan has the priced stages.
  assert p["predicted_saving"] > 0.05 and c.cycle.method == "stackbert"
  assert [s.steps for s in built.stages] == p["stage_steps"] and c.train.steps == sum(p["stage_steps"])


def test_a_stage_priced_too_short_is_lengthened_or_left_out():
  wsd = planner.Wsd(STABLE, 0.2)
  full = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0])
  assert len(full["stage_steps"]) == 3 and full["dropped"] == [] and 400 < full["stage_steps"][0] < 1600
  # Every stage at least a fifth of the budget: the quarter-depth stage is lengthened to it (a chain through it
  # still pays more than one without it), for a smaller saving.
  p = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], min_stage_frac=0.2)
  assert p["levels"] == ["quarter", "half"] and min(p["stage_steps"][:2]) >= 1600 and p["dropped"] == []
  assert p["predicted_saving"] < full["predicted_saving"]
  # At 45% the quarter would take more than it saves: the chain starts at half depth.
  far = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], min_stage_frac=0.45)
  assert far["dropped"] == ["quarter"] and far["levels"] == ["half"] and far["stage_steps"][0] >= 3600
  alone = stack_planner.plan_stack(DECAYED, wsd, LEVELS[1:], STEP, 8000, [1.0], min_stage_frac=0.45)
  assert far["stage_steps"] == alone["stage_steps"] and far["predicted_saving"] == alone["predicted_saving"]
  assert far["overrides"]["cycle.stackbert.stages"] == 2 and "quarter left out" in planner.describe(
      {**far, "pilot_flops": 0.0, "net_saving": far["predicted_saving"]})


def test_a_plan_says_where_it_hands_over_far_from_where_its_rates_were_measured():
  wsd = planner.Wsd(STABLE, 0.2)
  p = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0])
  report = lambda plan: planner.describe({**plan, "pilot_flops": 0.0, "net_saving": plan["predicted_saving"]})
  assert p["rates_near"] is None and "--stack_rates_at" in report(p) and "nothing checks" in report(p)
  # Rates measured from the plan's own hand-overs: near, and the plan (priced on the same rates) is the same.
  own = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], rates_at=p["switch_losses"])
  assert own["stage_steps"] == p["stage_steps"] and own["predicted_saving"] == p["predicted_saving"]
  assert [r["ratio"] for r in own["rates_near"]] == [pytest.approx(1.0), pytest.approx(1.0)]
  assert not any(r["far"] for r in own["rates_near"]) and "note: the rate of" not in report(own)
  # The quarter-depth rate measured after a stage 4x as long as the plan's (LLaMA's case): that doubling is far.
  quarter_at = QUARTER.cost(p["switch_losses"][0])
  longer = QUARTER.loss_at(4 * quarter_at)
  r = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], rates_at=[longer, p["switch_losses"][1]])
  first, second = r["rates_near"]
  assert first["doubling"] == "quarter -> half" and first["far"] and first["ratio"] == pytest.approx(0.25, rel=1e-3)
  assert first["measured_steps"] == pytest.approx(4 * quarter_at / Q_STEP, rel=1e-3) and not second["far"]
  assert "note: the rate of quarter -> half was measured from loss" in report(r) and "0.25x" in report(r)
  assert "--stack_rate_curves), or keep the hand-overs near (--stack_rates_span=2)" in report(r)  # The ways out.
  assert "half -> the target" not in report(r)
  # A loss off the shallower model's curve cannot be placed: far, said so.
  off = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], rates_at=[9.0, p["switch_losses"][1]])
  assert off["rates_near"][0]["far"] and off["rates_near"][0]["ratio"] is None and "off its curve" in report(off)
  # Only the doublings the chain makes are checked (a chain from half depth makes one).
  alone = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], min_stage_frac=0.45,
                                   rates_at=[longer, p["switch_losses"][1]])
  assert [x["doubling"] for x in alone["rates_near"]] == ["half -> the target"]
  # A doubling whose loss is unknown (None) is not checked; the others are.
  part = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], rates_at=[longer, None])
  assert [x["doubling"] for x in part["rates_near"]] == ["quarter -> half"] and part["rates_near"][0]["far"]
  for bad in ([5.0], [5.0, math.nan]):
    with pytest.raises(ValueError, match=r"one finite loss \(or None: unknown\) per doubling"):
      stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], rates_at=bad)


def test_a_span_keeps_every_hand_over_near_where_its_rate_was_measured():
  wsd = planner.Wsd(STABLE, 0.2)
  free = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0])
  # The quarter's rate measured after a stage 4x the one the free plan prices: the free plan is far from it.
  longer = QUARTER.loss_at(4 * QUARTER.cost(free["switch_losses"][0]))
  at = [longer, free["switch_losses"][1]]
  kept = stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], rates_at=at, rates_span=2.0)
  assert [r["far"] for r in kept["rates_near"]] == [False, False]
  assert all(0.5 - 1e-9 <= r["ratio"] <= 2.0 + 1e-9 for r in kept["rates_near"])
  assert kept["predicted_saving"] <= free["predicted_saving"] and kept["stage_steps"][0] > free["stage_steps"][0]
  lo, hi = kept["reach"][0]
  assert lo <= kept["switch_losses"][0] <= hi and "within 2x of where its rate was measured" in kept["pricing"]
  # The same constraint in the dynamic programme, against the free chain restricted by hand: the cheapest chain
  # whose quarter hands over inside the interval.
  r = growth.wsd_cost([QUARTER, HALF], [Q_STEP, H_STEP], [1.0, 1.0], STABLE, STEP, 8000, 0.2, 1.0, adjacent=True,
                      min_big=1600, handover=[(lo, hi), None])
  assert r["switch_losses"][0] is not None and lo <= r["switch_losses"][0] <= hi
  # A span needs the losses, and is a factor above 1.
  for bad in (dict(rates_span=2.0), dict(rates_span=0.5, rates_at=at)):
    with pytest.raises(ValueError, match="give a factor above 1 and the losses"):
      stack_planner.plan_stack(DECAYED, wsd, LEVELS, STEP, 8000, [1.0, 1.0], **bad)


def test_a_stacking_plan_priced_on_several_seeds_reports_each_seeds_own_prediction():
  """Shallower models piloted at two seeds: the plan is priced on their mean curves, and its schedule, held fixed, on
  each seed's own curves too: the lucky seed hands over lower and saves more, the unlucky one less, the mean in
  between; the printed plan names each seed. A model piloted at one seed gives no seed predictions."""
  import dataclasses
  shift = lambda f, d: loglinear(f"{f.name} {d:+}", 6.0 + d, 3.3 + d, 45 * STEP, 2.4) if f is HALF else \
      loglinear(f"{f.name} {d:+}", 6.0 + d, 3.6 + d, 20 * STEP, 3.0)
  seeded = [dataclasses.replace(c, seed_stables=((42, shift(c.stable, -0.04)), (1, shift(c.stable, 0.04))))
            for c in LEVELS]
  steps, wsd = 8000, planner.Wsd(STABLE, 0.2)
  p = stack_planner.plan_stack(DECAYED, wsd, seeded, STEP, steps, [1.0, 0.9])
  seeds = p["seed_predictions"]
  lower = [0, 0]
  for k, name in enumerate(p["levels"]):
    lower[[c.name for c in LEVELS].index(name)] = p["stage_steps"][k]
  for (seed, _), got in zip(seeded[0].seed_stables, seeds):
    at = [dataclasses.replace(c, stable=dict(c.seed_stables)[seed]) for c in seeded]
    want = stack_planner.predict_stack(DECAYED, wsd, at, STEP, steps, [1.0, 0.9], lower, p["stage_steps"][-1])
    assert got["seed"] == seed and got["saving"] == want["saving"] and not got["at_least"]
    assert got["handover_losses"] == [x for x in want["handover_losses"] if x is not None]
    assert got["handover_loss"] == got["handover_losses"][-1]
  lucky, unlucky = seeds
  assert lucky["handover_loss"] < unlucky["handover_loss"] and lucky["saving"] > p["predicted_saving"] > \
      unlucky["saving"]
  text = planner.describe({**p, "pilot_flops": 0.0, "net_saving": p["predicted_saving"]})
  assert "on the mean of 2 pilot seeds" in text and f"seed 1 {unlucky['handover_loss']:.3f}" in text
  one = [dataclasses.replace(seeded[0], seed_stables=()), seeded[1]]
  assert "seed_predictions" not in stack_planner.plan_stack(DECAYED, wsd, one, STEP, steps, [1.0, 0.9])
