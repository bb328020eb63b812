"""How fast stacked models learn, read from runs (stack_planner.stack_rates and rates_from_records,
benchmarks.stack_rates, experiments.plan --stack_rates_from), and the plan priced from them."""

import json
import os
import sys

import pytest

from multilevel.cycles import planner, stack_planner

from engine_util import ROOT, run_cmd
from stack_curves import H_STEP, HALF, LEVELS, Q_STEP, QUARTER, grown_curve, write_files
from wsd_curves import DECAYED, STABLE, STEP


def test_a_stacked_models_rate_and_delay_are_read_from_the_loss_before_the_growth():
  rows = grown_curve(0.7, delay=60)
  rs = stack_planner.stack_rates(rows, [STABLE, HALF], [STEP, H_STEP], knee=1e15)
  assert len(rs) == 1 and rs[0]["level"] == 1 and rs[0]["handover_loss"] == 5.0
  assert rs[0]["rate"] == pytest.approx(0.7, rel=1e-4) and rs[0]["delay"] == pytest.approx(60, abs=0.05)
  assert rs[0]["overall"] == pytest.approx(0.7 * (600 - 60) / 600, rel=1e-4)  # The plain ratio over the stage.
  # The way it went, eval by eval: steps since the growth, loss, scratch steps moved from the loss it took over.
  assert [t for t, _, _ in rs[0]["trajectory"]] == pytest.approx([100, 200, 300, 400, 500, 600])
  assert [q for _, _, q in rs[0]["trajectory"]] == pytest.approx([0.7 * (t - 60) for t in range(100, 601, 100)],
                                                                 rel=1e-4)
  assert [l for _, l, _ in rs[0]["trajectory"]] == [r[2] for r in rows[1:]]
  # Evals past the knee (the cool-down) are not read; a level with no stable curve gives None.
  cut = stack_planner.stack_rates(rows, [STABLE, HALF], [STEP, H_STEP], knee=rows[3][0])
  assert cut[0]["rate"] == pytest.approx(0.7, rel=1e-4) and cut[0]["last_loss"] == rows[3][2]
  assert rs[0]["evals"] == 6 and cut[0]["evals"] == 3
  assert stack_planner.stack_rates(rows, [STABLE, None], [STEP, H_STEP], knee=1e15) == [None]
  # No delay: none is fitted.
  plain = stack_planner.stack_rates(grown_curve(1.2), [STABLE, HALF], [STEP, H_STEP], knee=1e15)[0]
  assert plain["rate"] == pytest.approx(1.2, rel=1e-4) and plain["delay"] == pytest.approx(0, abs=0.05)


def test_a_runs_records_give_the_rates_its_benchmark_curve_gives():
  """``--stack_rates_from`` reads a run's metrics as ``benchmarks.stack_rates`` reads its curve: the eval at a stage's
  end is the loss the model hands over at (a short stage may have no other eval near it), the eval right after a
  growth (no FLOPs of its own) is not a point."""
  half = grown_curve(1.3, 5.5, 1e12, 1, HALF, H_STEP, 4, delay=30)
  top = grown_curve(0.9, half[-1][2], half[-1][0], 0, STABLE, STEP, 4, delay=20)[1:]
  recs, step = [{"step": 0, "level": 2, "flops": 2e11, "eval_loss": 6.5, "lr": 1e-3}], 0
  for i, (f, _, loss, level) in enumerate(half + top):
    step += 10
    rec = {"step": step, "level": int(level), "flops": f, "eval_loss": loss, "lr": 1e-3}
    if i == 0 or f == half[-1][0]:  # The hand-overs: the stage's last eval, then the grown model's untrained one.
      recs += [{**rec, "event": "end_of_stage"}, {"step": step, "level": int(level) - 1, "eval_loss": loss + 0.3,
                                                  "event": "after_stack"}]
    else:
      recs.append(rec)
  curve = [[r["flops"], 0.0, r["eval_loss"], r["level"]] for r in recs if "flops" in r]  # As benchmarks.saving keeps.
  stables, steps_of = [STABLE, HALF, QUARTER], [STEP, H_STEP, Q_STEP]
  from_records = stack_planner.rates_from_records(recs, stables, steps_of)
  assert from_records == stack_planner.stack_rates(curve, stables, steps_of, knee=top[-1][0])
  assert [r["handover_loss"] for r in from_records] == [5.5, half[-1][2]]
  assert [r["rate"] for r in from_records] == [pytest.approx(1.3, rel=1e-3), pytest.approx(0.9, rel=1e-3)]


def test_the_stack_rates_benchmark_reads_each_doubling_of_a_stacking_run(tmp_path):
  from benchmarks import cli, stack_rates
  target, files = write_files(tmp_path)
  half = grown_curve(1.3, 5.5, 1e12, 1, HALF, H_STEP, 4, delay=30)
  top = grown_curve(0.9, half[-1][2], half[-1][0], 0, STABLE, STEP, 4, delay=20)[1:]
  # The run's cool-down (the last 20% of its budget's steps) starts after its last eval here.
  total = top[-1][0] + 0.25 * 1000 * STEP
  # Its final eval 0.02 nats under what scratch's frontier gives for the cool-down from its last eval before it.
  priced = DECAYED.loss_at(STABLE.cost(top[-1][2]) + total - top[-1][0])
  runs = tmp_path / "runs.json"
  runs.write_text(json.dumps({"budgets": [{"steps": 1000, "variants": {"planned": {
      "total_flops": total, "curve": [[5e11, 0.0, 5.9, 2]] + half + top + [[total, 0.0, priced - 0.02, 0]]}}}]}))
  a = cli.parse(stack_rates.define_flags, [f"--target={target}", f"--levels={','.join(files)}", f"--runs={runs}"])
  d = stack_rates.measure(a)
  assert d["rates"] == [pytest.approx(1.3, rel=1e-3), pytest.approx(0.9, rel=1e-3)]
  assert d["delays"] == [pytest.approx(30, abs=0.1), pytest.approx(20, abs=0.1)]
  assert [r["level"] for r in d["rows"]] == [1, 0] and "--stack_rates=1.3,0.9" in stack_rates.table(d)
  assert f"| runs.json | 1000 | 1 | 100: {1.3 * 70:.0f}, 200: {1.3 * 170:.0f}," in stack_rates.table(d)
  # The loss before each doubling, which the plan checks its hand-overs against.
  assert d["at"] == [5.5, half[-1][2]] and f"--stack_rates_at=5.5,{half[-1][2]:.3g}" in stack_rates.table(d)
  (c,) = d["cooldowns"]
  assert c["knee_loss"] == top[-1][2] and c["priced_final"] == pytest.approx(priced, abs=1e-3)
  assert c["excess"] == pytest.approx(0.02, abs=1e-3) and "| 0.020 |" in stack_rates.table(d)
  # A second run whose target was evaluated twice before its cool-down, far slower: shown, not in the means (two
  # evals cannot tell its delay from its rate).
  few = tmp_path / "few.json"
  slow = grown_curve(0.1, half[-1][2], half[-1][0], 0, STABLE, STEP, 2)[1:]
  few.write_text(json.dumps({"budgets": [{"steps": 1000, "variants": {"planned": {
      "total_flops": slow[-1][0] + 0.2 * 1000 * STEP, "curve": [[5e11, 0.0, 5.9, 2]] + half + slow}}}]}))
  d2 = stack_rates.measure(cli.parse(stack_rates.define_flags, [f"--target={target}", f"--levels={','.join(files)}",
                                                                 f"--runs={runs},{few}"]))
  assert [r["evals"] for r in d2["rows"]] == [4, 4, 4, 2] and not d2["rows"][-1]["used"]
  assert d2["rates"] == d["rates"] and "2 (too few: not in the means)" in stack_rates.table(d2)


def test_the_plan_command_plans_stacking_from_files_and_measures_its_rates(tmp_path):
  target, files = write_files(tmp_path)
  # A stacking run of this config: its half-depth model moved at its scratch pace, its target at 0.95 of it after 40
  # steps of recovery.
  run = tmp_path / "run"
  run.mkdir()
  half = grown_curve(1.0, 5.5, 1e12, 1, HALF, H_STEP, 4)
  top = grown_curve(0.95, half[-1][2], half[-1][0], 0, STABLE, STEP, 4, delay=40)[1:]
  recs = [{"step": 10 * i, "level": int(r[3]), "flops": r[0], "eval_loss": r[2], "lr": 1e-3}
          for i, r in enumerate([[5e11, 0.0, 5.5, 2]] + half + top)]
  run.joinpath("metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
  config = os.path.join(ROOT, "experiments", "configs", "gpt.py") + ":test"
  args = [sys.executable, "-m", "experiments.plan", f"--config={config}", "--steps=8000", "--set=train.decay=wsd",
          "--set=model.num_layers=4", f"--target_from={target}", "--methods=stackbert", f"--stack_from={','.join(files)}"]
  r = run_cmd(args + [f"--workdir={tmp_path / 'w'}", f"--stack_rates_from={run}",
                      "--stack_min_stage_frac=0.2"])
  assert r.returncode == 0, r.stderr[-3000:]
  d = json.loads((tmp_path / "w" / "plan.json").read_text())
  m = d["stack_rates_measured"]
  assert m["rates"] == [pytest.approx(1.0, rel=1e-3), pytest.approx(0.95, rel=1e-3)]
  assert m["delays"] == [pytest.approx(0, abs=0.1), pytest.approx(40, abs=0.1)]
  p = d["plan"]
  want = stack_planner.plan_stack(DECAYED, planner.Wsd(STABLE, 0.2), LEVELS, STEP, 8000, m["rates"], m["delays"],
                                  min_stage_frac=0.2)  # Every shallower stage at least a fifth of the budget.
  assert p["stage_steps"] == want["stage_steps"] and p["predicted_saving"] == pytest.approx(want["predicted_saving"])
  assert min(p["stage_steps"][:-1]) >= 1600
  assert p["budget"] == 8000 and "plan: stackbert from" in r.stdout
  # The run's losses before its doublings are what the plan's hand-overs are checked against.
  assert m["at"] == [5.5, pytest.approx(half[-1][2])]
  assert [x["measured_at"] for x in p["rates_near"]] == m["at"][-len(p["rates_near"]):]
  from experiments.configs.common import load_config
  c = load_config(str(tmp_path / "w" / "plan_config.py"))
  assert c.cycle.method == "stackbert" and c.train.steps == sum(p["stage_steps"])
  # The first stage warms up as its pilot did: the file's train.warmup_frac of that pilot's steps.
  first = (QUARTER, Q_STEP) if len(p["stage_steps"]) == 3 else (HALF, H_STEP)
  warm = round(0.025 * round(first[0].points[8][0] / first[1]))
  assert round(c.train.warmup_frac * c.train.steps) == min(warm, p["stage_steps"][0] - 1)
  # Bad input: rates of the wrong count, stacking files out of order of depth, stacking under a decayed schedule.
  vrun = tmp_path / "vrun"  # A V-cycle's run: its growths are not stacking's.
  vrun.mkdir()
  vrun.joinpath("metrics.jsonl").write_text(run.joinpath("metrics.jsonl").read_text())
  vrun.joinpath("run.json").write_text(json.dumps({"config": {"cycle": {"method": "vcycle"}}}))
  vc = run_cmd(args + [f"--workdir={tmp_path / 'v'}", f"--stack_rates_from={vrun}"])
  assert vc.returncode != 0 and "that run is cycle.method='vcycle'" in vc.stderr
  bad = run_cmd(args + [f"--workdir={tmp_path / 'b'}", "--stack_rates=0.9"])
  assert bad.returncode != 0 and "give one per doubling" in bad.stderr
  floor = run_cmd(args + [f"--workdir={tmp_path / 'f'}", "--stack_min_stage_frac=1.5"])
  assert floor.returncode != 0 and "--stack_min_stage_frac is a share of the steps in (0, 1)" in floor.stderr
  span = run_cmd(args + [f"--workdir={tmp_path / 's'}", "--stack_rates_span=2"])
  assert span.returncode != 0 and "--stack_rates_span keeps each hand-over near" in span.stderr
  # A run whose target was evaluated only in its cool-down measures the first doubling alone: the target's keeps the
  # flags' rate, delay and loss (not a silent 1x).
  short = tmp_path / "short"
  short.mkdir()
  short.joinpath("metrics.jsonl").write_text("\n".join(json.dumps({**r, "lr": 1e-4 if r["level"] == 0 else 1e-3})
                                                       for r in recs) + "\n")
  k = run_cmd(args + [f"--workdir={tmp_path / 'k'}", f"--stack_rates_from={short}", "--stack_rates=1.2,0.8",
                      "--stack_delays=5,10", "--stack_rates_at=5.6,5.0"])
  assert k.returncode == 0, k.stderr[-3000:]
  km = json.loads((tmp_path / "k" / "plan.json").read_text())["stack_rates_measured"]
  assert km["rates"] == [pytest.approx(1.0, rel=1e-3), 0.8] and km["delays"] == [pytest.approx(0, abs=0.1), 10.0]
  assert km["at"] == [5.5, 5.0] and km["unmeasured"] == ["the target"]
  assert "measured no rate into the target" in k.stdout
  odd = run_cmd(args[:-1] + [f"--stack_from={files[0]}", f"--workdir={tmp_path / 'o'}"])
  assert odd.returncode != 0 and "a chain of doublings into the target's 4" in odd.stderr
  gone = run_cmd(args[:-1] + [f"--stack_from={files[0]},{files[1]}+{tmp_path / 'nothing.json'}",
                              f"--workdir={tmp_path / 'g'}"])
  assert gone.returncode != 0 and f"no file {tmp_path / 'nothing.json'}" in gone.stderr
  cos = run_cmd([a for a in args if a != "--set=train.decay=wsd"] + [f"--workdir={tmp_path / 'c'}"])
  assert cos.returncode != 0 and "WSD schedule only" in cos.stderr
