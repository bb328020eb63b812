"""experiments.plot: the curve it draws and the table it prints read a run as the savings are read (the target
model's evaluations only), on records written by hand (no training)."""

import json
import os

import pytest

from experiments import plot
from multilevel.metrics import eval_curve


def _run(folder, records, method="vcycle", levels=2, family="gpt"):
  os.makedirs(folder)
  with open(os.path.join(folder, "metrics.jsonl"), "w", encoding="utf-8") as f:
    f.write("".join(json.dumps(r) + "\n" for r in records))
  with open(os.path.join(folder, "summary.json"), "w", encoding="utf-8") as f:
    json.dump({"method": method, "levels": levels, "model": {"family": family}}, f)
  return str(folder)


def _rec(step, level, flops, seconds, loss, **kw):
  return {"step": step, "level": level, "flops": flops, "train_seconds": seconds, "eval_loss": loss, **kw}


SCRATCH = [_rec(10, 0, 10.0, 1.0, 5.0), _rec(20, 0, 20.0, 2.0, 4.0), _rec(40, 0, 40.0, 4.0, 3.0)]
VCYCLE = [_rec(2, 0, 2.0, 0.2, 6.0, event="end_of_stage"),
          {"step": 2, "level": 1, "event": "after_coalesce", "eval_loss": 6.1},
          _rec(10, 1, 4.0, 0.6, 3.5),  # The small model: a loss the target has not reached, at few FLOPs.
          _rec(20, 1, 6.0, 1.0, 3.2, event="end_of_stage"),
          {"step": 20, "level": 0, "event": "after_decoalesce", "eval_loss": 3.3},
          _rec(30, 0, 16.0, 2.0, 3.4, transition_seconds=0.5),
          _rec(40, 0, 26.0, 3.0, 2.8, transition_seconds=0.5)]


def test_the_curve_is_the_target_models_and_the_table_reads_it(tmp_path, capsys):
  scratch, vcycle = _run(tmp_path / "scratch", SCRATCH, levels=1), _run(tmp_path / "vc", VCYCLE)
  out, curves = plot.plot_runs([scratch, vcycle], str(tmp_path / "c.png"))
  assert os.path.getsize(out) > 0
  assert [c[0] for c in curves] == ["scratch (scratch)", "vc (vcycle, 2 levels)"]
  assert curves[1][1] == [(2.0, 0.2, 6.0), (16.0, 2.5, 3.4), (26.0, 3.5, 2.8)]  # No small model, no after_* event.
  lines = plot.table(curves).splitlines()
  assert lines[0].startswith("to reach eval_loss 3.0000, the final value of scratch (scratch)")
  # The V-cycle reaches 3.0 between (16, 3.4) and (26, 2.8): at 16 + 10 * 0.4 / 0.6 = 22.67 FLOPs, 0.57x scratch's;
  # it ends at 2.8 with 26 FLOPs, where scratch stood at 4 - (26 - 20) / 20 = 3.7.
  assert lines[3].split()[-6:] == ["22.7", "0.57", "3.2", "0.79", "2.8000", "3.7000"], lines
  assert lines[2].split()[-6:] == ["40", "1.00", "4.0", "1.00", "3.0000", "3.0000"], lines
  # Read on every evaluation, the small model's 3.5 would "reach" a 3.5 at 4 FLOPs; the target gets there at 15.5.
  reach_35 = plot.table([("s", eval_curve([_rec(1, 0, 1.0, 0.1, 3.5)])), curves[1]]).splitlines()[3].split()
  assert reach_35[-6] == "15.5", reach_35


def test_a_run_with_one_evaluation_or_without_the_metric(tmp_path):
  one = _run(tmp_path / "one", [_rec(40, 0, 40.0, 4.0, 3.0)], levels=1)
  plot.plot_runs([one], str(tmp_path / "one.png"))  # A single point is drawn (with a marker), not refused.
  with pytest.raises(ValueError, match="has no evaluations \\(eval_accuracy\\) in metrics.jsonl yet"):
    plot.plot_runs([one], str(tmp_path / "acc.png"), metric="eval_accuracy")
  small_only = _run(tmp_path / "small", [_rec(10, 1, 4.0, 0.6, 3.5)])
  with pytest.raises(ValueError, match="has no evaluations of its target model"):
    plot.plot_runs([small_only], str(tmp_path / "s.png"))


def test_a_run_in_progress_is_labelled_and_values_off_the_first_curve_are_a_dash(tmp_path):
  scratch = _run(tmp_path / "scratch", SCRATCH, levels=1)
  running = str(tmp_path / "running")
  os.makedirs(running)
  with open(os.path.join(running, "metrics.jsonl"), "w", encoding="utf-8") as f:
    f.write(json.dumps(_rec(50, 0, 50.0, 5.0, 2.9)) + "\n")  # No summary.json yet; past scratch's 40 FLOPs.
  _, curves = plot.plot_runs([scratch, running], str(tmp_path / "c.png"))
  assert curves[1][0] == "running (in progress)"
  row = plot.table(curves).splitlines()[3].split()
  assert row[-2:] == ["2.9000", "-"], row
