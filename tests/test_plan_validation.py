"""benchmarks.plan_validation: each measured plan's predicted saving against its seeds, and the errors summed up."""

import json
import os
import types

import pytest
from absl import app

from benchmarks import plan_validation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(path, obj):
  path.write_text(json.dumps(obj))
  return path.name


def seeds(budget, savings):
  return {"budget": budget, "rows": [{"seed": s, "saving": x} for s, x in savings]}


def checks(tmp_path, lines):
  f = tmp_path / "checks.txt"
  f.write_text("# a comment line\n\n" + "\n".join(lines) + "\n")
  return types.SimpleNamespace(checks=str(f), out="")


def test_each_plan_is_held_against_its_seeds_and_the_errors_are_summed(tmp_path):
  a = write(tmp_path / "plan_a.json", {"steps": 1400, "plan": {"method": "vcycle from L1", "predicted_saving": 0.30}})
  b = write(tmp_path / "plan_b.json", {"steps": 500, "plan": {"method": "stackbert from 1-layer, 3 stages",
                                                              "predicted_saving": 0.40}})
  sa = write(tmp_path / "seeds_a.json", seeds(1400, [(42, 0.25), (1, 0.27), (2, 0.29)]))
  sb = seeds(500, [(42, 0.50), (1, None), (2, 0.52)])
  sb["rows"][1]["saving_at_least"] = 0.6  # Seed 1 ended below what the frontier reaches: it saved at least 60%.
  sb = write(tmp_path / "seeds_b.json", sb)
  d = plan_validation.measure(checks(tmp_path, [f"gpt gcide 20.9 {a} {sa}  # the V-cycle",
                                                f"bert gcide 7.3 {b} {sb}"]))
  r, q = d["rows"]
  assert (r["plan"], r["n"], r["unread"]) == ("plan_a.json", 3, [])
  assert r["mean"] == pytest.approx(0.27) and r["error"] == pytest.approx(-0.03) and r["within_bar"]
  # Student's t over three seeds: 4.303 standard errors (stdev 0.02 / sqrt(3)) either way.
  assert r["se"] == pytest.approx(0.02 / 3 ** 0.5) and r["ci95"] == pytest.approx(4.3027 * 0.02 / 3 ** 0.5, rel=1e-4)
  assert r["within_ci"]
  assert (q["n"], q["unread"], q["mean"]) == (2, [1], pytest.approx(0.51))  # The seed past the fit is left out,
  assert q["unread_at_least"] == [0.6]  # its bound kept beside the mean.
  assert q["error"] == pytest.approx(0.11) and not q["within_bar"]
  assert q["ci95"] == pytest.approx(12.706 * 0.01, rel=1e-4) and q["within_ci"]
  assert d["all"] == {"plans": 2, "mean_abs_error": pytest.approx(0.07), "mean_error": pytest.approx(0.04),
                      "within_bar": 1, "within_ci": 2, "with_ci": 2}
  assert set(d["by_family"]) == {"bert", "gpt"} and d["by_method"]["stackbert"]["mean_error"] == pytest.approx(0.11)
  assert d["by_method"]["vcycle"]["plans"] == 1
  text = plan_validation.table(d)
  assert "| +30.0% | +27.0% [+25.0, +29.0] (3) | -3.0 | 5.0 | yes | yes |" in text
  assert "(2, 1 past the frontier: at least +60.0) | +11.0 | 12.7 | **no** | yes |" in text
  assert "| all | 2 | 7.0 | +4.0 | 1 of 2 | 2 of 2 |" in text


def test_stacking_plans_are_grouped_by_whether_they_hand_over_near_where_their_rates_were_measured(tmp_path):
  near = lambda far: [{"doubling": "1-layer -> 2-layer", "far": False},
                      {"doubling": "2-layer -> the target", "far": far}]
  stack = lambda name, saving, rn: write(tmp_path / name, {"steps": 500, "plan": {
      "method": "stackbert from 1-layer, 3 stages", "predicted_saving": saving, "rates_near": rn}})
  s = write(tmp_path / "seeds.json", seeds(500, [(42, 0.40), (1, 0.42)]))
  vcycle = {"method": "vcycle from L1", "predicted_saving": 0.3}
  d = plan_validation.measure(checks(tmp_path, [
      f"llama gcide 6.5 {stack('near.json', 0.40, near(False))} {s}",
      f"llama gcide 6.5 {stack('far.json', 0.30, near(True))} {s}",
      f"llama gcide 6.5 {stack('unchecked.json', 0.35, None)} {s}",  # Planned without the rates' losses.
      f"gpt gcide 7.5 {write(tmp_path / 'v.json', {'steps': 500, 'plan': vcycle})} {s}"]))
  assert [r["rates_near"] for r in d["rows"]] == ["near", "far", None, None]
  assert d["by_rates_near"]["near"]["plans"] == 1 and d["by_rates_near"]["near"]["mean_error"] == pytest.approx(0.01)
  assert d["by_rates_near"]["far"]["plans"] == 1 and d["by_rates_near"]["far"]["mean_error"] == pytest.approx(0.11)
  text = plan_validation.table(d)
  assert "| stacking, hand-overs near where the rates were measured | 1 | 1.0 | +1.0 | 1 of 1 |" in text
  assert "| stacking, hand-overs far where the rates were measured | 1 | 11.0 | +11.0 | 0 of 1 |" in text
  # A rates_near that experiments.plan could not have written: refused, naming the file.
  bad = stack("bad.json", 0.40, [{"doubling": "1-layer -> 2-layer"}])
  with pytest.raises(app.UsageError, match="plan .*bad.json: plan.rates_near is not a list .*'far'"):
    plan_validation.measure(checks(tmp_path, [f"llama gcide 6.5 {bad} {s}"]))
  # None of the kind: no group.
  d = plan_validation.measure(checks(tmp_path, [f"llama gcide 6.5 near.json {s}"]))
  assert list(d["by_rates_near"]) == ["near"]


def test_what_cannot_be_read_is_refused_with_the_line_or_file_that_is_wrong(tmp_path):
  plan = write(tmp_path / "plan.json", {"steps": 1400, "plan": {"method": "vcycle", "predicted_saving": 0.3}})
  good = write(tmp_path / "seeds.json", seeds(1400, [(42, 0.3)]))
  cases = [
      ([f"gpt gcide 20.9 {plan}"], "checks.txt:3: expected FAMILY CORPUS TOKENS_PER_PARAM PLAN SEEDS"),
      ([f"gpt gcide many {plan} {good}"], "tokens per parameter 'many' is not a number"),
      ([f"gpt gcide 20.9 missing.json {good}"], "plan .*missing.json: cannot read it .*No such file"),
      ([f"gpt gcide 20.9 {plan} {write(tmp_path / 'other.json', seeds(500, [(42, 0.3)]))}"],
       "reads budget 500, but .*plan.json plans 1400 steps"),
      ([f"gpt gcide 20.9 {plan} {write(tmp_path / 'past.json', seeds(1400, [(42, None)]))}"],
       "no seed has a saving to read"),
      ([f"gpt gcide 20.9 {write(tmp_path / 'noplan.json', {'steps': 1400})} {good}"], "no plan.predicted_saving"),
      ([], "no plan listed"),
  ]
  for lines, message in cases:
    with pytest.raises(app.UsageError, match=message):
      plan_validation.measure(checks(tmp_path, lines))
  (tmp_path / "broken.json").write_text("{")
  with pytest.raises(app.UsageError, match="seeds .*broken.json: cannot read it"):
    plan_validation.measure(checks(tmp_path, [f"gpt gcide 20.9 {plan} broken.json"]))


def test_the_recorded_validation_is_what_its_checks_give():
  """benchmarks/results/plan_validation.json is re-made from its checks file and the recorded plans and seeds."""
  results = os.path.join(ROOT, "benchmarks", "results")
  with open(os.path.join(results, "plan_validation.json")) as f:
    recorded = json.load(f)
  d = plan_validation.measure(types.SimpleNamespace(checks=os.path.join(results, "plan_validation_checks.txt")))
  assert {k: v for k, v in d.items() if k != "command"} == {k: v for k, v in recorded.items() if k != "command"}


def test_a_cool_down_excess_re_reads_the_predictions_it_names(tmp_path):
  """--excess: the plan's target ends that many nats lower, read on the seeds' fit; only the plans it names."""
  fit = {"E": 2.0, "A": 100.0, "a": 0.5}  # L(F) = 2 + 100 / sqrt(F): F(L) = (100 / (L - 2))^2.
  a = write(tmp_path / "plan_a.json", {"steps": 1400, "plan": {"method": "vcycle from L1", "predicted_saving": 0.2,
                                                              "predicted_flops": 0.8e4}})
  b = write(tmp_path / "plan_b.json", {"steps": 500, "plan": {"method": "stackbert from 1-layer",
                                                             "predicted_saving": 0.4, "predicted_flops": 600.0}})
  sa = write(tmp_path / "seeds_a.json", {**seeds(1400, [(42, 0.02), (1, 0.06)]), "fit": fit})
  sb = write(tmp_path / "seeds_b.json", {**seeds(500, [(42, 0.4)]), "fit": fit})
  ns = checks(tmp_path, [f"gpt gcide 20.9 {a} {sa}", f"gpt gcide 7.5 {b} {sb}"])
  ns.excess = ["gpt:gcide:1400:vcycle=-0.1"]
  d = plan_validation.measure(ns)
  r, q = d["rows"]
  # Budget 1e4 FLOPs: scratch ends at 3.0 on the fit; 0.1 nats higher costs (100 / 1.1)^2 FLOPs, not 1e4.
  assert r["predicted_excess"] == pytest.approx(1 - 0.8 * 1e4 / (100 / 1.1) ** 2)
  assert r["error_excess"] == pytest.approx(0.04 - r["predicted_excess"]) and "excess" not in q
  assert d["excess"] == {"plans": 1, "mean_abs_error": pytest.approx(0.16),
                         "mean_abs_error_excess": pytest.approx(abs(0.04 - r["predicted_excess"])),
                         "within_bar": 0, "within_bar_excess": 1}
  assert "with the excess; within 5 points 0, 1 with it." in plan_validation.table(d)
  for bad, message in ((["gpt:gcide:1400=0.1"], "FAMILY:CORPUS:STEPS:KIND=NATS"),
                       (["gpt:gcide:2800:vcycle=0.1"], "names no listed plan"),
                       (["gpt:gcide:1400:msg=0.1"], "KIND vcycle or stackbert")):
    ns.excess = bad
    with pytest.raises(app.UsageError, match=message):
      plan_validation.measure(ns)


def test_a_report_is_written_whole_or_not_at_all(tmp_path):
  """benchmarks.cli.write_report (every report script's --out): a value JSON cannot hold leaves the earlier file as
  it was and no partial or temporary one beside it."""
  from benchmarks import cli
  out = tmp_path / "report.json"
  cli.write_report(str(out), {"plans": 2})
  assert json.loads(out.read_text()) == {"plans": 2}
  with pytest.raises(TypeError):
    cli.write_report(str(out), {"plans": 3, "bad": object()})
  assert json.loads(out.read_text()) == {"plans": 2} and [p.name for p in tmp_path.iterdir()] == ["report.json"]
