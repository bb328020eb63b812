"""benchmarks.final_eval: finished runs of the saving and bound benchmarks evaluated again on more held-out data."""

import json
import os

import pytest

pytestmark = pytest.mark.slow


def test_final_eval_reproduces_a_runs_own_evaluation_and_rewrites_its_results_on_more_data(tmp_path):
  """benchmarks.final_eval re-reads a finished run's parameters: on the run's own evaluation batches it gives the
  run's final eval loss back; on more batches the results copy carries the new loss, keeps the run's own, and drops
  the curves (of the smaller set) and what was read off them."""
  import types

  from benchmarks import final_eval
  from multilevel.cycles.driver import train_and_evaluate
  from tests.engine_util import tiny_config
  root = tmp_path / "root"
  wd = str(root / "deit-6-scratch")
  s = train_and_evaluate(tiny_config("deit", levels=1, **{"train.steps": 6, "data.max_eval_batches": 2}), wd)
  own = final_eval.evaluate_run(wd, 2)
  assert own["eval_loss"] == pytest.approx(s["final_eval_loss"], abs=1e-6) and own["examples"] == 2 * 16
  path = str(tmp_path / "res.json")
  with open(path, "w") as f:
    json.dump({"family": "deit", "model_overrides": {}, "budgets": [
        {"steps": 6, "scratch": {"final_eval_loss": s["final_eval_loss"], "total_flops": s["total_flops"]},
         "scratch_curve": [[1.0, 1.0, 2.0]],
         "variants": {}}]}, f)
  a = types.SimpleNamespace(results=[path], workroot=[str(root)], eval_batches=4, out_suffix="_full", out="")
  d = final_eval.measure(a)
  more = final_eval.evaluate_run(wd, 4)
  with open(str(tmp_path / "res_full.json")) as f:
    b = json.load(f)["budgets"][0]
  assert b["scratch"]["final_eval_loss"] == more["eval_loss"] != s["final_eval_loss"]
  assert b["scratch"]["final_eval_loss_run"] == s["final_eval_loss"] and "scratch_curve" not in b
  assert d["written"][0]["runs"][0][1]["examples"] == 4 * 16
  # A method's file that reused that scratch run (--scratch_from) takes its new loss from the copy above once the
  # scratch workdir is gone; its own run is evaluated as usual.
  import shutil
  other = tmp_path / "other"
  shutil.copytree(wd, str(other / "deit-6-msg"))
  methods = str(tmp_path / "methods.json")
  with open(methods, "w") as f:
    json.dump({"family": "deit", "model_overrides": {}, "budgets": [
        {"steps": 6, "scratch": {"final_eval_loss": s["final_eval_loss"], "total_flops": s["total_flops"]},
         "scratch_from": path, "variants": {"msg": {"final_eval_loss": s["final_eval_loss"]}}}]}, f)
  reuse = types.SimpleNamespace(**{**vars(a), "results": [methods], "workroot": [str(other)]})
  final_eval.measure(reuse)
  with open(str(tmp_path / "methods_full.json")) as f:
    b = json.load(f)["budgets"][0]
  assert b["scratch"]["final_eval_loss"] == more["eval_loss"] == b["variants"]["msg"]["final_eval_loss"]
  assert b["scratch"]["final_eval_loss_run"] == s["final_eval_loss"]
  with pytest.raises(FileNotFoundError, match="No finished run deit-6-scratch"):  # Not at another eval size.
    final_eval.measure(types.SimpleNamespace(**{**vars(reuse), "eval_batches": 2}))
  # A file whose run is missing stops the whole call before any copy is written, the good file's included.
  os.remove(str(tmp_path / "res_full.json"))
  with pytest.raises(FileNotFoundError, match="No finished run deit-6-scratch"):
    final_eval.measure(types.SimpleNamespace(**{**vars(a), "results": [path, path],
                                                "workroot": [str(root), str(tmp_path / "elsewhere")]}))
  assert not os.path.exists(str(tmp_path / "res_full.json"))
  # A benchmarks.bound level-run file: its runs are found by the bound's workdir names.
  shutil.copytree(wd, str(root / "deit-L1-lr4-6"))
  bound = str(tmp_path / "bound.json")
  with open(bound, "w") as f:
    json.dump({"family": "deit", "level": 1, "runs": [
        {"steps": 6, "lr_scale": 4.0, "final_eval_loss": s["final_eval_loss"], "curve": [[1.0, 2.0, 1e-3]]}]}, f)
  final_eval.measure(types.SimpleNamespace(**{**vars(a), "results": [bound]}))
  with open(str(tmp_path / "bound_full.json")) as f:
    r, = json.load(f)["runs"]
  assert r["final_eval_loss"] == more["eval_loss"] and r["final_eval_loss_run"] == s["final_eval_loss"]
  assert "curve" not in r
