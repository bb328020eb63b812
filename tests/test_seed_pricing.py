"""benchmarks.seed_pricing: per-seed re-pricings of the same plans combined into the seeds' mean, plan by plan."""

import pytest
from absl import app

from benchmarks import seed_pricing


def _check(rows):
  return {"rows": [{"plan": p, "steps": 100, "stages": [10, 20, 70], "predicted": 0.30, "measured_seed": m,
                    "curve_left_out": lo, "curve_in_sample": ins} for p, m, lo, ins in rows]}


def test_each_plan_is_priced_as_the_mean_of_its_seeds_prices():
  a = _check([("p1", 0.20, 0.22, 0.21), ("p2", 0.10, None, 0.12), ("only_a", 0.5, 0.5, 0.5)])
  b = _check([("p1", 0.30, 0.26, 0.27), ("p2", 0.20, 0.15, 0.16)])
  d = seed_pricing.combine([a, b])
  assert [r["plan"] for r in d["rows"]] == ["p1", "p2"]  # Only plans every seed priced.
  p1, p2 = d["rows"]
  assert p1["measured"] == pytest.approx(0.25) and p1["left_out"] == pytest.approx(0.24)
  assert p1["error_left_out"] == pytest.approx(1.0) and p1["error_recorded"] == pytest.approx(-5.0)
  assert p2["left_out"] is None and p2["error_left_out"] is None and p2["in_sample"] == pytest.approx(0.14)
  s = d["summary"]
  assert s["left_out"] == {"mean_abs": pytest.approx(1.0), "mean": pytest.approx(1.0), "within_5": 1, "n": 1}
  assert s["recorded"]["within_5"] == 1 and s["recorded"]["n"] == 2  # p1 -5.0 is within; p2 -15.0 is not.
  assert "| p1 | 100 | 10 / 20 / 70 | +25.0% |" in seed_pricing.table({"seeds": 2, **d})


def test_checks_that_cannot_be_combined_are_refused():
  with pytest.raises(app.UsageError, match="two seeds or more"):
    seed_pricing.combine([_check([("p", 0.1, 0.1, 0.1)])])
  with pytest.raises(app.UsageError, match="share no plan"):
    seed_pricing.combine([_check([("p", 0.1, 0.1, 0.1)]), _check([("q", 0.1, 0.1, 0.1)])])


def test_a_results_file_that_cannot_be_read_is_named_in_a_usage_error(tmp_path):
  broken = tmp_path / "broken.json"
  broken.write_text("{not json")
  for path in (tmp_path / "missing.json", broken):
    with pytest.raises(app.UsageError, match=rf"{path.name}: cannot read it"):
      seed_pricing._load(str(path))
  wrong = tmp_path / "wrong.json"
  wrong.write_text('{"rows": [{"plan": "p"}]}')
  with pytest.raises(app.UsageError, match="measured_seed"):
    seed_pricing._load(str(wrong))
