"""Every plan the planner wrote into benchmarks/results still builds under today's config checks (a check that
refused every small share above 1 once made the README's own DeiT plan impossible to run, unnoticed)."""

import glob
import json
import os

import pytest

from tests.engine_util import ROOT

PLANS = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "plan_*.json")))
# Written before the planner added split noise: width growth by exact copies that nothing tells apart, which the
# V-cycle refuses since (cycles/vcycle.py, _check_symmetry_broken).
TIED = {"plan_gpt_500.json", "plan_bert_1400.json"}


def _family(name: str) -> str:
  return next((f for f in ("deit", "bert", "llama") if f"_{f}_" in name), "gpt")


@pytest.mark.parametrize("path", PLANS, ids=os.path.basename)
def test_a_recorded_plan_still_builds(path):
  from benchmarks.saving import make_config, plan_variant
  from multilevel.cycles.plan import method_of
  from multilevel.cycles.run_config import RunConfig, model_config
  with open(path) as f:
    plan = json.load(f).get("plan") or {}
  steps = plan.get("budget") or (plan.get("overrides") or {}).get("train.steps")  # (A stacking plan's run has its own.)
  if not steps:
    pytest.skip("no config written (the planner found nothing to price)")
  family = _family(os.path.basename(path))
  extra = {"data.folder": ROOT} if family == "deit" else {}  # (The DeiT benchmark's data check; nothing is read.)
  run = RunConfig.from_config(make_config(family, steps, plan_variant([path], steps, {})[0]["planned"], extra, 4))
  build = lambda: method_of(run.cycle.method).build_plan(model_config(run, None), run.cycle, run.train)
  if os.path.basename(path) in TIED:
    with pytest.raises(ValueError, match="stay copies for ever"):
      build()
  else:
    assert build().stages
