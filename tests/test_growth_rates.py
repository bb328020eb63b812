"""Growth rates read from runs (multilevel/cycles/growth.py): the stable curve before a cool-down, a grown model's rate
from its metrics or its benchmark curve, --growth_rates_from's three-eval rule, and benchmarks.growth_rates /
benchmarks.wsd_predict on recorded runs."""

import json
import os

import pytest

from multilevel.cycles import growth
from multilevel.cycles.frontier import Frontier

from engine_util import ROOT
from wsd_curves import DECAYED, SMALL, STABLE, STEP, records_of_a_grown_run


def test_the_stable_curve_keeps_the_evals_before_the_cool_down():
  pts = [(1e9, 6.0, 0.5), (2e9, 5.0, 1.0), (3e9, 4.5, 1.0), (4e9, 4.2, 1.0), (5e9, 3.9, 0.5), (6e9, 3.7, 0.1)]
  c = growth.stable_curve("s", pts)
  assert c.points == ((1e9, 6.0), (2e9, 5.0), (3e9, 4.5), (4e9, 4.2))
  with pytest.raises(ValueError, match="before the cool-down"):
    growth.stable_curve("s", [(1e9, 6.0, 1.0), (2e9, 5.0, 0.5)])


def short_target_stage(records):
  """A grown run's records with only two of its evals at the peak rate left (the first two after growing)."""
  return [r for r in records if not 3 <= (r["step"] - 400) // 100 <= 6]


def test_the_growth_rate_is_read_from_a_runs_metrics():
  for rate in (0.4, 1.0):
    r = growth.rate_from_records(records_of_a_grown_run(rate), STABLE)
    assert r["rate"] == pytest.approx(rate, rel=1e-3) and r["landing_loss"] == 5.0 and r["evals"] == 6
  assert growth.rate_from_records(short_target_stage(records_of_a_grown_run(1.0)), STABLE)["evals"] == 2
  assert growth.rate_from_records(records_of_a_grown_run(1.0)[2:], STABLE) is None  # No growth in it.


def test_the_plan_reads_growth_rates_only_from_runs_with_enough_evals(tmp_path):
  """--growth_rates_from leaves out a run whose target had fewer than growth.MIN_EVALS evals at its peak rate (eval
  noise decides such a rate), and refuses when no run has enough."""
  from absl import app
  from experiments import plan_vcycle
  from experiments.configs.common import load_config
  target = tmp_path / "scratch.json"
  target.write_text(json.dumps({"budgets": [{"steps": 8000, "scratch": {"total_flops": 8000 * STEP,
                                                                         "final_eval_loss": 3.0},
                                             "scratch_curve": [[f, 0.0, l] for f, l in STABLE.points]}]}))
  runs = {}
  for name, recs in (("long", records_of_a_grown_run(0.5)), ("short", short_target_stage(records_of_a_grown_run(3.0)))):
    runs[name] = tmp_path / name
    runs[name].mkdir()
    runs[name].joinpath("metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
  base = load_config(os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test")
  base.train.decay = "wsd"
  record = {}
  plan_vcycle.wsd_settings(base, None, record, [str(target)], [], [f"depth={runs['long']}+{runs['short']}"])
  m = record["growth_rates_measured"]["depth"]
  assert m["rate"] == pytest.approx(0.5, rel=1e-3) and m["too_few_evals"] == [str(runs["short"])]
  assert [r["evals"] for r in m["runs"]] == [6, 2]
  with pytest.raises(app.UsageError, match=r"fewer than 3 evals between its growth and its cool-down \(\[2\]\)"):
    plan_vcycle.wsd_settings(base, None, {}, [str(target)], [], [f"depth={runs['short']}"])


def test_the_growth_rates_benchmark_reads_a_variants_rate_off_its_curve(tmp_path):
  import types
  from benchmarks import growth_rates
  steps, total = 8000, 8000 * STEP
  scratch = [[f, 0.0, l] for f, l in STABLE.points if f <= 0.8 * total] + [[total, 0.0, 3.0]]
  target = tmp_path / "scratch.json"
  target.write_text(json.dumps({"budgets": [{"steps": steps, "scratch": {"total_flops": total, "final_eval_loss": 3.0},
                                             "scratch_curve": scratch}, {"steps": 100, "scratch": {
                                                 "total_flops": 100 * STEP, "final_eval_loss": 6.0}}]}))
  # A V-cycle whose target, grown at 4.5 after 2e12 FLOPs, moves 0.6x as fast as scratch until its cool-down.
  hand, land = 2e12, STABLE.cost(4.5)
  curve = [[1e11, 0.0, 5.5, 1], [hand, 0.0, 4.5, 1]]
  curve += [[hand + k * 200 * STEP, 0.0, STABLE.loss_at(land + 0.6 * k * 200 * STEP), 0] for k in range(1, 6)]
  end = total  # The run's last 1600 steps cool down: evals there are left out.
  curve += [[end - 400 * STEP, 0.0, 3.2, 0], [end, 0.0, 3.1, 0]]
  # The same growth with a short target stage: two evals before the cool-down, at 3x, shown and left out of the mean.
  short = curve[:3] + [[hand + 2 * 200 * STEP, 0.0, STABLE.loss_at(land + 3.0 * 2 * 200 * STEP), 0]] + curve[-2:]
  runs = tmp_path / "runs.json"
  runs.write_text(json.dumps({"budgets": [{"steps": steps, "variants": {
      "depth_only_w0": {"curve": curve, "total_flops": end, "handover_jumps": [0.0]},
      "depth_short": {"curve": short, "total_flops": end, "handover_jumps": [0.0]}}}]}))
  # The same run filed under another budget (a longer cool-down, so one eval fewer before it), at half the pace.
  slower = curve[:2] + [[f, 0.0, STABLE.loss_at(land + 0.3 * (f - hand)), 0] for f, _, _, _ in curve[2:-2]] + curve[-2:]
  other = tmp_path / "other.json"
  other.write_text(json.dumps({"budgets": [{"steps": 7000, "variants": {
      "depth_only_w0": {"curve": slower, "total_flops": end, "handover_jumps": [0.0]}}}]}))
  a = types.SimpleNamespace(target=[str(target)], runs=[str(runs), str(other)],
                            kind=["depth_only_w0=depth", "depth_short=depth"], cooldown_frac=0.2)
  d = growth_rates.measure(a)
  assert d["rates"]["depth"] == {"mean": pytest.approx(0.45, rel=1e-6), "min": pytest.approx(0.3, rel=1e-6),
                                 "max": pytest.approx(0.6, rel=1e-6), "n": 2}
  assert d["rows"][0]["landing_loss"] == 4.5 and d["rows"][0]["evals"] == 5 and d["rows"][0]["used"]
  assert d["rows"][1]["evals"] == 2 and not d["rows"][1]["used"] and d["rows"][1]["rate"] > 1.5
  text = growth_rates.table(d)
  assert "| depth | 4.500 |" in text and "| 2 (too few: not in the means) |" in text
  assert d["by_budget"] == {"depth": {"7000": pytest.approx(0.3, rel=1e-6), "8000": pytest.approx(0.6, rel=1e-6)}}
  assert "by budget: T=7000 0.30, T=8000 0.60" in text


@pytest.mark.parametrize("fresh", [False, True])
def test_wsd_predict_prices_a_finished_run_from_the_steps_its_curve_shows(tmp_path, fresh):
  """benchmarks.wsd_predict reads the small and target steps a V-cycle ran off its curve, whether its small model was
  coalesced after a one-step target stage or started fresh, and prices them with growth.predict_wsd."""
  import types
  from benchmarks import wsd_predict
  steps = 8000
  target = tmp_path / "scratch.json"
  scratch = [[f, 0.0, l] for f, l in STABLE.points if f <= 0.8 * steps * STEP]
  target.write_text(json.dumps({"budgets": [
      {"steps": round(f / STEP), "scratch": {"total_flops": f, "final_eval_loss": l},
       **({"scratch_curve": scratch} if i == len(DECAYED.points) - 1 else {})}
      for i, (f, l) in enumerate(DECAYED.points)]}))
  # The small model: its decayed frontier 0.3 under its stable curve, which one long WSD run's evals give.
  small_step = STEP / 4
  runs = [{"steps": round(f / small_step), "lr_scale": 1.0, "total_flops": f, "final_eval_loss": l - 0.3}
          for f, l in SMALL.points]
  runs[-1]["curve"] = [[f, l, 1e-3] for f, l in SMALL.points]
  small = tmp_path / "small.json"
  small.write_text(json.dumps({"level": 1, "set": {"cycle.width_factor": "1"}, "base_lr": 1e-3, "runs": runs}))
  n_small, n_big = 2000, 3000
  start = [] if fresh else [[STEP, 0.0, 6.9, 0]]  # The coalescing stage: one target step.
  f0 = 0.0 if fresh else STEP
  curve = start + [[f0 + k * 500 * small_step, 0.0, SMALL.loss_at(k * 500 * small_step), 1] for k in range(1, 5)]
  end = f0 + n_small * small_step + n_big * STEP
  curve += [[end, 0.0, 3.5, 0]]
  ran = tmp_path / "runs.json"
  ran.write_text(json.dumps({"budgets": [{"steps": steps, "scratch": {"final_eval_loss": 3.2}, "variants": {
      "planned": {"curve": curve, "total_flops": end, "final_eval_loss": 3.5, "handover_jumps": [0.0]}}}]}))
  a = types.SimpleNamespace(target=[str(target)], small=str(small), runs=[f"{ran}:planned"], rate=0.8,
                            cooldown_frac=0.2)
  row = wsd_predict.measure(a)["rows"][0]
  assert (row["small_steps"], row["big_steps"]) == (n_small, n_big)
  stable = Frontier("target (stable)", tuple((f, l) for f, _, l in scratch))
  want = growth.predict_wsd(SMALL, small_step, n_small, stable, DECAYED, STEP, n_big, steps, 0.2, rate=0.8)
  assert row["predicted_handover_loss"] == pytest.approx(SMALL.loss_at(n_small * small_step))
  assert row["predicted_final_wsd"] == pytest.approx(want["final_loss"])
  assert "| 8000 | 2000 / 3000 |" in wsd_predict.table(wsd_predict.measure(a))
