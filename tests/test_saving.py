"""benchmarks/saving.py: how a run is compared with scratch, reused scratch runs and frontiers from earlier results
files, plans run as variants, and every named variant building on every family."""

import json
import os
import subprocess
import sys

import pytest

from multilevel.typed_config import ConfigError

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_variant_is_compared_on_scratchs_curve_and_its_growths_jumps_are_kept():
  from benchmarks.saving import compare
  rec = lambda step, level, loss, flops, **kw: dict(step=step, stage=kw.pop("stage", 0), level=level, eval_loss=loss,
                                                   flops=flops, train_seconds=flops / 1e9, **kw)
  scratch = {"summary": {"final_eval_loss": 5.0, "total_flops": 4e9, "train_seconds": 4.0},
             "records": [rec(1, 0, 6.0, 1e9), rec(2, 0, 5.5, 2e9), rec(4, 0, 5.0, 4e9)]}
  run = {"summary": {"final_eval_loss": 4.8, "total_flops": 3e9, "train_seconds": 3.0},
         "records": [rec(1, 1, 5.6, 0.5e9, stage=1, event="end_of_stage"),
                     {"step": 1, "stage": 2, "level": 0, "event": "after_decoalesce", "eval_loss": 5.75},
                     rec(2, 0, 5.2, 2e9, stage=2), rec(3, 0, 4.8, 3e9, stage=2, event="end_of_stage")]}
  v = compare(scratch, run)
  # Reaches 5.0 halfway between 2e9 (5.2) and 3e9 (4.8): 2.5e9 of scratch's 4e9.
  assert v["reached"] and v["flops_to_reach"] == pytest.approx(2.5e9) and v["flops_saving"] == pytest.approx(0.375)
  assert v["handover_jumps"] == [0.15] and v["flops_ratio_total"] == 0.75


def test_a_scratch_run_from_an_earlier_results_file_compares_as_the_run_itself(tmp_path):
  from absl import app

  from benchmarks.saving import compare, curve, earlier_scratch
  rec = lambda step, loss, flops: dict(step=step, stage=0, level=0, eval_loss=loss, flops=flops, train_seconds=flops / 1e9)
  scratch = {"summary": {"final_eval_loss": 5.0, "total_flops": 4e9, "train_seconds": 4.0, "epochs": 0.1},
             "records": [rec(1, 6.0, 1e9), rec(2, 5.5, 2e9), {"step": 2, "lr": 1e-3}, rec(4, 5.0, 4e9)]}
  overrides = {"train.lr": 0.002, "train.decay": "wsd"}
  path = str(tmp_path / "earlier.json")
  with open(path, "w") as f:
    json.dump({"family": "gpt", "model_overrides": overrides, "budgets": [
        {"steps": 400, "scratch": scratch["summary"], "scratch_curve": [list(p) for p in curve(scratch["records"])],
         "variants": {}}]}, f)
  run = {"summary": {"final_eval_loss": 4.9, "total_flops": 3e9, "train_seconds": 3.0},
         "records": [rec(2, 5.2, 2e9), rec(3, 4.9, 3e9)]}
  # The same budget and settings ("2e-3" as --set gives it equals the file's 0.002): compared exactly as the run.
  again = earlier_scratch([path], "gpt", {"train.lr": "2e-3", "train.decay": "wsd"}, 400)
  assert again["file"] == path
  mine, theirs = compare(scratch, run), compare(again, run)
  assert {k: v for k, v in theirs.items() if k != "curve"} == {k: v for k, v in mine.items() if k != "curve"}
  assert earlier_scratch([path], "gpt", overrides, 800) is None  # Not in the file: trained as usual.
  # cycle.* settings do not change the one-level scratch run: a V-cycle knob set for every run still reuses it.
  assert earlier_scratch([path], "gpt", {**overrides, "cycle.lr_scales": "(1,2,2)"}, 400)["file"] == path
  for family, other in (("bert", overrides), ("gpt", {**overrides, "data.name": "gcide"})):
    with pytest.raises(app.UsageError, match="same settings"):
      earlier_scratch([path], family, other, 400)
  # The adaptive variants read the same files' scratch runs as the target's frontier: (FLOPs, final loss) per budget.
  from benchmarks.saving import target_frontier
  assert target_frontier([path], "gpt", overrides) == ((4e9, 5.0),)
  # A run at another seed (or rate) reads the same frontier; other settings are still refused.
  assert target_frontier([path], "gpt", {**overrides, "train.seed": "1", "train.lr": "4e-3"}) == ((4e9, 5.0),)
  with pytest.raises(app.UsageError, match="same settings"):
    target_frontier([path], "gpt", {**overrides, "data.name": "gcide"})
  with pytest.raises(app.UsageError, match="--frontier_from"):
    target_frontier([], "gpt", overrides)
  # Or the un-decayed part of the longest WSD run: its evaluations before the last 20% of its FLOPs.
  assert target_frontier([path], "gpt", overrides, "stable") == ((1e9, 6.0), (2e9, 5.5))
  with open(path) as f:
    linear = json.load(f)
  linear["model_overrides"]["train.decay"] = "linear"
  with open(path, "w") as f:
    json.dump(linear, f)
  with pytest.raises(app.UsageError, match="not WSD"):
    target_frontier([path], "gpt", {**overrides, "train.decay": "linear"}, "stable")


def test_a_plan_runs_as_its_budgets_variant_and_plan_set_changes_it_on_record(tmp_path):
  from benchmarks.saving import make_config, plan_variant
  path = str(tmp_path / "plan.json")
  with open(path, "w") as f:
    json.dump({"plan": {"overrides": {"train.steps": 400, "cycle.levels": 2, "cycle.lr_scales": [1.0, 2.0]},
                        "predicted_saving": 0.2, "method": "vcycle from L1"}}, f)
  assert plan_variant([path], 800, {}) == ({}, None)  # Made for another budget.
  planned, predicted = plan_variant([path], 400, {})
  assert planned == {"planned": {"cycle.levels": 2, "cycle.lr_scales": (1.0, 2.0)}} and "plan_set" not in predicted
  planned, predicted = plan_variant([path], 400, {"cycle.lr_scales": "(1,1)"})
  assert predicted == {"plan_file": path, "predicted_saving": 0.2, "method": "vcycle from L1",
                       "plan_set": {"cycle.lr_scales": "(1,1)"}}
  # A stacking plan's run has its own train.steps (its stages' sum): matched on the budget it was made for, kept.
  stack = str(tmp_path / "stack.json")
  with open(stack, "w") as f:
    json.dump({"plan": {"budget": 1400, "overrides": {"train.steps": 1427, "cycle.method": "stackbert"},
                        "predicted_saving": 0.25, "method": "stackbert from 1-layer, 3 stages"}}, f)
  assert plan_variant([stack], 1427, {}) == ({}, None)
  assert plan_variant([stack], 1400, {})[0] == {"planned": {"train.steps": 1427, "cycle.method": "stackbert"}}
  assert make_config("gpt", 1400, plan_variant([stack], 1400, {})[0]["planned"], {}, 4).train.steps == 1427
  # The change wins over the plan and over --set, as the run's config shows.
  c = make_config("gpt", 400, planned["planned"], {"cycle.lr_scales": "(2,2)"}, 4)
  assert tuple(c.cycle.lr_scales) == (1.0, 1.0) and c.cycle.levels == 2
  # Bad --plan_set values are refused before anything trains, naming the flag.
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  base = [sys.executable, "-m", "benchmarks.saving", "--budgets=4", "--variants=", f"--workroot={tmp_path / 'w'}",
          f"--out={tmp_path / 'out.json'}"]
  for args, says in ((["--plan_set=cycle.small_stop"], "--plan_set takes KEY=VALUE"),
                     (["--plan_set=cycle.small_stop=frontier"], "pass the plan with --plan"),
                     ([f"--plan={path}", "--plan_set=cycle.no_such_key=1"], "unknown key 'cycle.no_such_key'")):
    r = subprocess.run(base + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and says in r.stderr, r.stderr[-2000:]
  assert not (tmp_path / "w").exists() and not (tmp_path / "out.json").exists()


# Methods that cannot run on a family say so when the plan is built: MSG's width masks and CoRe's relaxed model act on
# the shared core's blocks, and LLaMA has its own (MSG grows it in depth only: msg_layers).
REFUSED = {("llama", "msg"): "'heads' event", ("llama", "core"): "cannot relax"}


@pytest.mark.parametrize("family", ["gpt", "bert", "deit", "llama"])
def test_every_benchmark_variant_builds_a_plan_on_every_family(family):
  from benchmarks import saving
  from multilevel.cycles import build_plan
  from multilevel.cycles.run_config import model_config
  for name, overrides in saving.VARIANTS.items():
    if overrides.get("cycle.small_stop") == "frontier":
      overrides = {**overrides, "cycle.target_frontier": ((1e12, 5.0), (4e12, 4.0))}
    if (family, name) in REFUSED:
      c = saving.make_config(family, 200, overrides, {}, 10)
      with pytest.raises(ConfigError, match=REFUSED[family, name]):
        build_plan(model_config(c, None), c.cycle, c.train)
      continue
    # Halving the width twice needs 4 heads (the 2-head benchmark models are refused, saying so).
    extra = {"model.num_heads": 4, "model.head_dim": 16} if name == "depth_zero_3" else {}
    c = saving.make_config(family, 200, overrides, extra, 10)
    assert build_plan(model_config(c, None), c.cycle, c.train).total_steps > 0, name
    if extra:
      with pytest.raises(ValueError, match="heads by a width factor"):
        c = saving.make_config(family, 200, overrides, {}, 10)
        build_plan(model_config(c, None), c.cycle, c.train)
