"""Savings of further seeds (``benchmarks.seeds_shifted``): read on the reference seed's frontier shifted by each
seed's scratch loss, on the measured frontier, or on a seed's own frontier, with the mean's 95% interval; on results
written by hand (no training)."""

import json
import math
import re

import pytest


def _reference_seed(tmp_path):
  """The reference seed's summary at ``tmp_path / 'ref.json'``: a fitted frontier of five fully decayed points, and a
  variant at 1000 steps that reaches the 1e10 point's loss with half its FLOPs. Returns the fit's law."""
  fit = {"E": 2.5, "A": 40.0, "a": 0.3}
  law = lambda c: fit["E"] + fit["A"] * c ** -fit["a"]
  costs = (1e9, 3e9, 1e10, 3e10, 1e11)
  summary = {"seed": 42, "frontier_fit": {"flops": fit},
             "frontier_from": {"points": [{"steps": round(c / 1e7), "total_flops": c, "final_eval_loss": law(c)}
                                          for c in costs]},
             "budgets": [{"steps": 1000, "variants": {"planned": {"final_eval_loss": law(1e10), "total_flops": 5e9}}}]}
  (tmp_path / "ref.json").write_text(json.dumps(summary))
  return law


def test_another_seed_is_read_on_the_reference_fit_shifted_by_its_scratch_loss(tmp_path):
  import types
  from benchmarks import seeds_shifted
  law = _reference_seed(tmp_path)
  # Seed 1 ends 0.1 nats lower at both of its learning rates' best, and its variant 0.1 lower too: the same +50%.
  entry = lambda scratch, run: {"budgets": [{"steps": 1000, "scratch": {"final_eval_loss": scratch},
                                             "variants": {} if run is None else {"planned": run}}]}
  (tmp_path / "a.json").write_text(json.dumps(entry(law(1e10) - 0.05, {"final_eval_loss": law(1e10) - 0.1,
                                                                        "total_flops": 5e9})))
  (tmp_path / "b.json").write_text(json.dumps(entry(law(1e10) - 0.1, None)))
  a = types.SimpleNamespace(summary=str(tmp_path / "ref.json"), budget=1000, variant="planned",
                            seed=[f"1:{tmp_path / 'a.json'}+{tmp_path / 'b.json'}"], read="fit", out="")
  d = seeds_shifted.measure(a)
  assert [r["seed"] for r in d["rows"]] == [42, 1]
  assert d["rows"][1]["shift"] == pytest.approx(-0.1)
  assert [r["saving"] for r in d["rows"]] == [pytest.approx(0.5, abs=1e-6)] * 2
  assert d["mean"] == pytest.approx(0.5, abs=1e-6) and "| 1 |" in seeds_shifted.table(d)
  assert "seconds_saving" not in d["rows"][1]  # Seed 1's scratch is b.json's, not beside its variant: no seconds.
  # A run ending where the fit puts scratch at 1e12 FLOPs, past twice the longest run: unread, at least 1 - F / 2e11.
  (tmp_path / "far.json").write_text(json.dumps(entry(law(1e10), {"final_eval_loss": law(1e12), "total_flops": 5e9})))
  a.seed = [f"3:{tmp_path / 'far.json'}"]
  far = seeds_shifted.measure(a)["rows"][1]
  assert far["saving"] is None and far["saving_at_least"] == pytest.approx(1 - 5e9 / 2e11)
  # The reference seed given again with a scratch run under another setting ending 0.1 lower: its row is read with
  # it (shifted), in its place, not beside it.
  (tmp_path / "ref42.json").write_text(json.dumps(entry(law(1e10), {"final_eval_loss": law(1e10) - 0.1,
                                                                     "total_flops": 5e9})))
  a.seed = [f"42:{tmp_path / 'ref42.json'}+{tmp_path / 'b.json'}"]
  d = seeds_shifted.measure(a)
  assert [r["seed"] for r in d["rows"]] == [42] and d["rows"][0]["shift"] == pytest.approx(-0.1)
  assert d["rows"][0]["saving"] == pytest.approx(0.5, abs=1e-6)  # Read at law(1e10): half of 1e10.
  a.seed = [f"42:{tmp_path / 'ref42.json'}"]  # Its scratch ends at the point: no shift, read where it ended.
  row = seeds_shifted.measure(a)["rows"][0]
  assert row["shift"] == 0.0 and row["saving"] is None and "saving_at_least" in row  # Under the fit's floor.
  a.seed = [f"1:{tmp_path / 'a.json'}+{tmp_path / 'b.json'}"]
  # A re-run in another session: scratch trained beside the variant, so their seconds compare. Scratch reaches the
  # variant's loss (the 1e10 point, shifted) with all its 1e10 FLOPs in 100 s; the variant took 60 s: 40% saved.
  (tmp_path / "c.json").write_text(json.dumps({"budgets": [{"steps": 1000, "scratch": {
      "final_eval_loss": law(1e10) - 0.1, "total_flops": 1e10, "train_seconds": 100.0}, "variants": {"planned": {
          "final_eval_loss": law(1e10) - 0.1, "total_flops": 5e9, "train_seconds": 59.0, "transition_seconds": 1.0}}}]}))
  a.seed = [f"42-again:{tmp_path / 'c.json'}"]
  row = seeds_shifted.measure(a)["rows"][1]
  assert row["seed"] == "42-again" and row["saving"] == pytest.approx(0.5, abs=1e-6)
  assert row["seconds_saving"] == pytest.approx(0.4, abs=1e-6)
  assert "+40% (60.0 s; scratch 100.0 s)" in seeds_shifted.table(seeds_shifted.measure(a))
  # The same file, but its scratch run was reused from an earlier command's workroot: no seconds.
  for mark in ({"scratch_reused": "/w/gpt-1000-scratch"}, {"command": "python -m benchmarks.saving --reuse_scratch"}):
    d = json.loads((tmp_path / "c.json").read_text())
    d["budgets"][0].update({k: v for k, v in mark.items() if k != "command"})
    d.update({k: v for k, v in mark.items() if k == "command"})
    (tmp_path / "d.json").write_text(json.dumps(d))
    a.seed = [f"42-again:{tmp_path / 'd.json'}"]
    assert "seconds_saving" not in seeds_shifted.measure(a)["rows"][1], mark


def test_the_seeds_mean_comes_with_its_95_percent_interval(tmp_path):
  """Savings of 0.5 / 0.6 / 0.4 over three seeds: mean 0.5, standard error 0.1 / sqrt(3), and Student's t at 2
  degrees of freedom (4.303) gives the half-width; a single value has no interval."""
  import types
  from benchmarks import seeds_shifted
  law = _reference_seed(tmp_path)
  for seed, flops in ((1, 4e9), (2, 6e9)):
    (tmp_path / f"s{seed}.json").write_text(json.dumps({"budgets": [{
        "steps": 1000, "scratch": {"final_eval_loss": law(1e10)},
        "variants": {"planned": {"final_eval_loss": law(1e10), "total_flops": flops}}}]}))
  a = types.SimpleNamespace(summary=str(tmp_path / "ref.json"), budget=1000, variant="planned", read="fit", out="",
                            seed=[f"{k}:{tmp_path / f's{k}.json'}" for k in (1, 2)])
  d = seeds_shifted.measure(a)
  assert [r["saving"] for r in d["rows"]] == [pytest.approx(x, abs=1e-6) for x in (0.5, 0.6, 0.4)]
  assert d["n"] == 3 and d["ci95"] == pytest.approx(4.3027 * 0.1 / math.sqrt(3), rel=1e-4)
  assert "mean +50% [+40%, +60%]; the mean's 95% interval +25% to +75% (Student's t, 3 seeds)" in seeds_shifted.table(d)
  a.seed = [f"1:{tmp_path / 's1.json'}"]  # Two seeds (0.5, 0.6): standard error 0.05, t at 1 degree of freedom 12.706.
  assert seeds_shifted.measure(a)["ci95"] == pytest.approx(12.706 * 0.05, rel=1e-4)
  assert seeds_shifted.interval95([0.5]) is None


def test_a_seed_with_a_frontier_of_its_own_is_read_there_unshifted(tmp_path):
  """--own=SEED:SUMMARY: a seed whose scratch runs make a frontier of their own is read on it, not on the reference
  seed's shifted by one point. Seed 1's frontier drops 0.2 nats where seed 42's drops 0.1 (same budget point): the
  shifted reading and the own one differ, and the own one is the plain read on seed 1's points."""
  import types
  from absl import app
  from benchmarks import seeds_shifted
  def summary(seed, pts, run):
    return {"seed": seed, "frontier_from": {"points": [{"steps": round(c / 1e7), "total_flops": c,
                                                        "final_eval_loss": l} for c, l in pts]},
            "budgets": [{"steps": 800, "scratch": {"final_eval_loss": pts[-1][1], "total_flops": pts[-1][0],
                                                   "train_seconds": 100.0},
                         "variants": {"planned": run}}]}
  run = {"final_eval_loss": 5.0, "total_flops": 3e9, "train_seconds": 30.0}
  (tmp_path / "ref.json").write_text(json.dumps(summary(42, [(2e9, 5.2), (4e9, 5.1), (8e9, 4.9)], run)))
  (tmp_path / "own1.json").write_text(json.dumps(summary(1, [(2e9, 5.3), (4e9, 5.1), (8e9, 4.9)], run)))
  (tmp_path / "s1.json").write_text(json.dumps({"budgets": [{"steps": 800, "scratch": {"final_eval_loss": 4.9},
                                                              "variants": {"planned": run}}]}))
  a = types.SimpleNamespace(summary=str(tmp_path / "ref.json"), budget=800, variant="planned", read="measured",
                            seed=[f"1:{tmp_path / 's1.json'}"], own=[], out="")
  half_way = math.exp((math.log(4e9) + math.log(8e9)) / 2)  # 5.0 lies half way from 5.1 to 4.9 on both frontiers.
  shifted = seeds_shifted.measure(a)
  assert shifted["rows"][1]["saving"] == pytest.approx(1 - 3e9 / half_way)
  a.seed, a.own = [], [f"1:{tmp_path / 'own1.json'}"]
  d = seeds_shifted.measure(a)
  row = d["rows"][1]
  assert row["seed"] == 1 and row["shift"] == 0.0 and row["frontier"] == str(tmp_path / "own1.json")
  assert row["saving"] == pytest.approx(1 - 3e9 / half_way)
  # Scratch ran beside the variant there: the seconds compare (scratch's 100 s for 8e9 FLOPs, scaled to what it needs).
  assert row["seconds_saving"] == pytest.approx(1 - 30.0 / (100.0 * half_way / 8e9))
  assert "| 1 | 4.9000 | own | 5.0000 |" in seeds_shifted.table(d) and "'own'" in seeds_shifted.table(d)
  # The variant at 5.2: on seed 42's frontier (shift 0) it is under its shortest point, on seed 1's half way between
  # 5.3 and 5.1: only the own reading sees that seed 1's scratch is slower early.
  run2 = {"final_eval_loss": 5.2, "total_flops": 1e9}
  (tmp_path / "own1.json").write_text(json.dumps(summary(1, [(2e9, 5.3), (4e9, 5.1), (8e9, 4.9)], run2)))
  (tmp_path / "s1.json").write_text(json.dumps({"budgets": [{"steps": 800, "scratch": {"final_eval_loss": 4.9},
                                                              "variants": {"planned": run2}}]}))
  assert seeds_shifted.measure(a)["rows"][1]["saving"] == pytest.approx(1 - 1e9 / math.sqrt(2e9 * 4e9))
  a.seed, a.own = [f"1:{tmp_path / 's1.json'}"], []
  assert seeds_shifted.measure(a)["rows"][1]["saving"] == pytest.approx(1 - 1e9 / 2e9)
  # A summary without the variant, or without a fit when the fit is asked for: a clear error.
  a.seed, a.own, a.variant = [], [f"1:{tmp_path / 'own1.json'}"], "other"
  with pytest.raises(app.UsageError, match="no frontier point or no 'other' run at 800"):
    seeds_shifted.measure(a)
  ref = json.loads((tmp_path / "ref.json").read_text())
  (tmp_path / "ref.json").write_text(json.dumps({**ref, "frontier_fit": {"flops": {"E": 4.0, "A": 40.0, "a": 0.1}}}))
  a.variant, a.read = "planned", "fit"
  with pytest.raises(app.UsageError, match=r"--own: .*own1.json has no fitted frontier"):
    seeds_shifted.measure(a)
  # A summary that is not there, or a flag without its seed: said, with the form expected.
  a.read, a.own = "measured", [f"1:{tmp_path / 'missing.json'}"]
  with pytest.raises(app.UsageError, match=r"--own: .*missing.json: cannot read it"):
    seeds_shifted.measure(a)
  a.own = [str(tmp_path / "own1.json")]
  with pytest.raises(app.UsageError, match="expected SEED:SUMMARY"):
    seeds_shifted.measure(a)


def test_a_seed_is_read_on_the_measured_frontier_where_the_points_are_no_power_law(tmp_path):
  """--read=measured: log-linear between the reference seed's decayed points (as the planner prices), shifted per
  seed, None past the longest or the shortest; a plateau then a drop, which no E + A F^-a follows."""
  import types
  from absl import app
  from benchmarks import seeds_shifted
  pts = [(1e9, 5.35), (2e9, 5.25), (4e9, 5.20), (8e9, 4.90), (16e9, 4.85)]
  summary = {"seed": 42, "frontier_from": {"points": [{"steps": round(c / 1e7), "total_flops": c,
                                                       "final_eval_loss": l} for c, l in pts]},
             "budgets": [{"steps": 400, "variants": {"planned": {"final_eval_loss": 5.05, "total_flops": 2e9}}}]}
  (tmp_path / "ref.json").write_text(json.dumps(summary))
  entry = lambda scratch, loss: {"budgets": [{"steps": 400, "scratch": {"final_eval_loss": scratch},
                                              "variants": {"planned": {"final_eval_loss": loss, "total_flops": 2e9}}}]}
  (tmp_path / "s1.json").write_text(json.dumps(entry(5.10, 4.95)))  # 0.1 under seed 42's 5.20: read at 5.05.
  (tmp_path / "s2.json").write_text(json.dumps(entry(5.20, 4.80)))  # Past the longest point: not read.
  a = types.SimpleNamespace(summary=str(tmp_path / "ref.json"), budget=400, variant="planned", read="measured",
                            seed=[f"1:{tmp_path / 's1.json'}", f"2:{tmp_path / 's2.json'}"], out="")
  d = seeds_shifted.measure(a)
  half_way = math.exp((math.log(4e9) + math.log(8e9)) / 2)  # 5.05 lies half way from 5.20 to 4.90.
  assert [r["saving"] for r in d["rows"]] == [pytest.approx(1 - 2e9 / half_way)] * 2 + [None]
  assert d["rows"][2]["saving_at_least"] == pytest.approx(1 - 2e9 / 16e9)  # Scratch needs more than its longest run.
  assert "saving_at_least" not in d["rows"][1] and "| at least +88% |" in seeds_shifted.table(d)
  assert d["read"] == "measured" and "measured frontier" in seeds_shifted.table(d)
  a.read = "fit"  # The summary has no fit: said, with the other way out.
  with pytest.raises(app.UsageError, match="--read=measured"):
    seeds_shifted.measure(a)


def test_a_seeds_shift_can_be_its_mean_offset_over_several_budgets(tmp_path):
  """Seed 1 ends 0.01 nats under the reference point at the budget (1000 steps) but only 0.003 and 0.002 under at
  300 and 3000 steps: with --shift_from its shift is the mean, -0.005, and its run is read there, not at -0.01; a budget the
  reference frontier has no point at, or a seed without --seed, is refused."""
  import types

  from absl import app

  from benchmarks import seeds_shifted
  law = _reference_seed(tmp_path)
  entry = lambda steps, scratch, run=None: {"steps": steps, "scratch": {"final_eval_loss": scratch},
                                            "variants": {} if run is None else {"planned": run}}
  run = {"final_eval_loss": law(1e10) - 0.01, "total_flops": 5e9}
  (tmp_path / "s1.json").write_text(json.dumps({"budgets": [entry(1000, law(1e10) - 0.01, run)]}))
  (tmp_path / "s1_more.json").write_text(json.dumps({"budgets": [entry(300, law(3e9) - 0.003),
                                                                  entry(3000, law(3e10) - 0.002)]}))
  (tmp_path / "s1_300b.json").write_text(json.dumps({"budgets": [entry(300, law(3e9) - 0.001)]}))  # Not the best.
  a = types.SimpleNamespace(summary=str(tmp_path / "ref.json"), budget=1000, variant="planned", read="fit", out="",
                            seed=[f"1:{tmp_path / 's1.json'}"], shift_from=[])
  assert seeds_shifted.measure(a)["rows"][1]["shift"] == pytest.approx(-0.01)
  a.shift_from = [f"1:{tmp_path / 's1_more.json'}+{tmp_path / 's1_300b.json'}"]
  row = seeds_shifted.measure(a)["rows"][1]
  assert row["shift"] == pytest.approx((-0.01 - 0.003 - 0.002) / 3)
  assert row["shift_budgets"] == {"300": pytest.approx(-0.003), "1000": pytest.approx(-0.01),
                                  "3000": pytest.approx(-0.002)}
  loss = run["final_eval_loss"] - row["shift"]  # Read at the run's loss moved by the mean shift.
  cost = (40.0 / (loss - 2.5)) ** (1 / 0.3)
  assert row["saving"] == pytest.approx(1 - 5e9 / cost, rel=1e-6) and row["saving"] > 0.5  # Not 0.5: less of its lead is luck.
  (tmp_path / "s1_odd.json").write_text(json.dumps({"budgets": [entry(700, 3.0)]}))
  for spec, says in ((f"1:{tmp_path / 's1_odd.json'}", "no point at [700] steps"),
                     (f"2:{tmp_path / 's1_more.json'}", "seed 2 has no --seed"),
                     (f"1:{tmp_path / 's1.json'}", "no scratch run at a budget other than 1000")):
    a.shift_from = [spec]
    with pytest.raises(app.UsageError, match=re.escape(says)):
      seeds_shifted.measure(a)
