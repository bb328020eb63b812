"""The real training loop on tiny configs: scratch, 2-level and 3-level V-cycles for each family."""

import json
import math
import os

import pytest

from multilevel.cycles import build_plan
from multilevel.cycles.driver import train_and_evaluate
from multilevel.models import ModelConfig
from multilevel.train import train_flops_per_step
from tests.engine_util import read_jsonl, tiny_config

pytestmark = pytest.mark.slow

CASES = [(f, lv) for f in ("gpt", "bert", "deit") for lv in (1, 2, 3)]


@pytest.mark.parametrize("family, levels", CASES)
def test_vcycle_end_to_end(tmp_path, family, levels):
  c = tiny_config(family, levels=levels, deep=True)
  s = train_and_evaluate(c, str(tmp_path))
  recs = read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))
  events = [r.get("event") for r in recs if r.get("event")]
  assert events.count("after_coalesce") == levels - 1
  assert events.count("after_decoalesce") == levels - 1 and events.count("after_interpolate") == levels - 1
  assert events.count("end_of_stage") == 2 * levels - 1
  assert len(s["per_stage"]) == 2 * levels - 1
  assert s["steps"] == sum(p["steps"] for p in s["per_stage"])
  # FLOPs are the analytic per-step cost of each stage's model, summed.
  with open(os.path.join(tmp_path, "run.json")) as f:
    model = ModelConfig.from_dict(json.load(f)["config"]["model"])
  plan = build_plan(model, c.cycle, c.train)
  for p, stage in zip(s["per_stage"], plan.stages):
    assert p["steps"] == stage.steps and p["train_seconds"] > 0
    assert p["flops"] == pytest.approx(stage.steps * train_flops_per_step(plan.levels[stage.level],
                                                                          c.train.batch_size))
  assert s["total_flops"] == pytest.approx(sum(p["flops"] for p in s["per_stage"]))
  # Level changes cost wall-clock too: timed separately, and none for plain training.
  assert (s["transition_seconds"] > 0) == (levels > 1) and s["transition_seconds"] >= 0
  assert math.isfinite(s["final_eval_loss"])
  first_eval = next(r["eval_loss"] for r in recs if "eval_loss" in r)
  assert s["final_eval_loss"] < first_eval + 0.05  # It learned (or at least did not diverge) on 40-odd steps.
  assert len(s["params_sha256"]) == 64
  with open(os.path.join(tmp_path, "summary.json")) as f:
    assert json.load(f)["params_sha256"] == s["params_sha256"]
  for r in recs:  # Every logged step carries the accounting the plots need.
    if "train_loss" in r:
      assert {"step", "level", "lr", "flops", "train_seconds", "examples"} <= set(r)
  if family == "deit":
    assert 0.0 <= s["final_eval_accuracy"] <= 1.0


def test_vcycle_costs_less_than_scratch_at_equal_budget(tmp_path):
  s1 = train_and_evaluate(tiny_config("gpt", levels=1, deep=True), str(tmp_path / "a"))
  s2 = train_and_evaluate(tiny_config("gpt", levels=2, deep=True), str(tmp_path / "b"))
  # 5% big + 50% small + 50% big: the small model's steps cost far less than the big model's.
  assert s2["total_flops"] < 0.8 * s1["total_flops"]


@pytest.mark.parametrize("override", [
    {"cycle.optimizer_policy": "carry"},
    {"cycle.preln_exact": True, "cycle.depth_factor": 1},
    {"cycle.restart_control": True},
    {"train.grad_accum": 2, "cycle.transition_warmup_frac": 0.2, "cycle.final_schedule": "baseline_tail"},
    {"train.decay": "wsd", "cycle.lr_rule": "mup", "cycle.lr_scales": (1.0, 1.0)},
])
def test_vcycle_options_run(tmp_path, override):
  s = train_and_evaluate(tiny_config("gpt", levels=2, deep=True, **override), str(tmp_path))
  assert math.isfinite(s["final_eval_loss"])


def test_preln_exact_growth_keeps_the_loss_at_the_transition(tmp_path):
  """Width-only growth with the pre-LN option: the grown GPT evaluates like the small one (up to LN epsilon), also
  with the copies' symmetry broken by split noise (applied before this evaluation), which changes the run. Without
  the noise (and no interpolation) the copies stay copies to the end of the run: every column of the embedding has a
  duplicate (up to rounding); with it none has."""
  import numpy as np

  from multilevel.checkpoint import load_params
  digests = []
  for split_noise in (0.0, 0.2):
    c = tiny_config("gpt", levels=2, deep=True, **{"cycle.preln_exact": True, "cycle.depth_factor": 1,
                                                    "model.ln_eps": 1e-12, "cycle.split_noise": split_noise,
                                                    "cycle.w_pre": 0.0, "cycle.allow_tied_copies": True})
    s = train_and_evaluate(c, str(tmp_path / str(split_noise)))
    recs = read_jsonl(os.path.join(tmp_path, str(split_noise), "metrics.jsonl"))
    small_end = [r for r in recs if r.get("event") == "end_of_stage" and r["level"] == 1][-1]["eval_loss"]
    grown = next(r for r in recs if r.get("event") == "after_decoalesce")["eval_loss"]
    assert grown == pytest.approx(small_end, abs=1e-4)
    digests.append(s["params_sha256"])
    cols = np.asarray(load_params(str(tmp_path / str(split_noise)))["word"]["embedding"]).T  # (width, vocab)
    gap = np.abs(cols[:, None] - cols[None]).max(-1) + np.diag(np.full(len(cols), np.inf))
    # A column with a copy: its nearest other column equal up to rounding (XLA may sum copies in another order).
    with_copy = int((gap.min(1) < 1e-6 * np.abs(cols).mean()).sum())
    assert with_copy == (len(cols) if split_noise == 0.0 else 0), np.sort(gap.min(1))
  assert digests[0] != digests[1]



def test_nan_loss_stops_with_step_and_level(tmp_path):
  c = tiny_config("gpt", levels=1, **{"train.lr": 1e12, "train.grad_clip": 0.0, "train.warmup_frac": 0.0})
  with pytest.raises(FloatingPointError, match=r"global step \d+ \(stage 0:scratch@L0, level 0"):
    train_and_evaluate(c, str(tmp_path))


def test_parameters_that_diverge_at_the_last_step_are_never_saved_and_the_run_resumes_before_them(tmp_path,
                                                                                                monkeypatch):
  import jax
  import jax.numpy as jnp

  from multilevel.cycles.driver import Runner
  c = tiny_config("gpt", levels=1)
  last = c.train.steps - 1
  compile_ = Runner.compile

  def compile_with_a_bad_last_update(self, build):  # The last step's loss is finite (taken before its update) ...
    step = compile_(self, build)

    def run(*args):
      out = step(*args)
      if len(args) == 3 and int(args[2]) == last:  # ... but the update makes the parameters NaN.
        state, metrics = out
        out = state.replace(params=jax.tree.map(lambda x: x * jnp.nan, state.params)), metrics
      return out
    return run

  monkeypatch.setattr(Runner, "compile", compile_with_a_bad_last_update)
  with pytest.raises(FloatingPointError, match=rf"holds a NaN or an infinity at global step {last + 1} \(stage "
                                               r"0:scratch@L0, level 0\), though the training loss was finite.*"
                                               r"the same command resumes from there"):
    train_and_evaluate(c, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run" / "summary.json")  # It was written with a NaN loss, exit 0.
  monkeypatch.undo()
  resumed = train_and_evaluate(c, str(tmp_path / "run"))  # From the last good checkpoint: the run as if unbroken.
  assert resumed["params_sha256"] == train_and_evaluate(c, str(tmp_path / "whole"))["params_sha256"]


def test_initial_parameters_with_a_nan_are_named_as_such_and_nothing_is_saved(tmp_path, monkeypatch):
  import jax
  import jax.numpy as jnp

  from multilevel.cycles import resume
  made = resume.initial_params
  monkeypatch.setattr(resume, "initial_params", lambda *a: jax.tree.map(lambda x: x * jnp.nan, made(*a)))
  with pytest.raises(FloatingPointError, match=r"before any training: it came with the initial parameters .* "
                                               r"Nothing was saved"):  # (It blamed an update that never ran.)
    train_and_evaluate(tiny_config("gpt", levels=1), str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")


def test_a_fresh_small_start_is_the_small_model_trained_alone_then_grown_losslessly(tmp_path):
  """``cycle.small_init='fresh'``: no down stage; the bottom stage is, bit for bit, a scratch run of the small model
  with the same schedule (same init, data order and learning rates: what the planner's pilots measure), and the
  depth growth by the zero rule hands it over with its loss (no snapshot, no interpolation)."""
  shape = {"cycle.width_factor": 1, "cycle.preln_exact": True, "cycle.depth_growth": "zero", "cycle.w_pre": 0.0,
           "cycle.transition_warmup_frac": 0.1, "train.warmup_frac": 0.1}
  c = tiny_config("gpt", levels=2, deep=True, **shape, **{"cycle.small_init": "fresh"})
  s = train_and_evaluate(c, str(tmp_path / "vcycle"))
  assert [p["kind"] for p in s["per_stage"]] == ["bottom", "up"] and s["per_stage"][0]["model"].startswith("L2/")
  assert s["per_stage"][0]["model"].endswith(f"/f{4 * 32}")  # The FFN width too (MSG's stages differ only there).
  recs = read_jsonl(os.path.join(tmp_path, "vcycle", "metrics.jsonl"))
  small_end = next(r for r in recs if r.get("event") == "end_of_stage" and r["level"] == 1)
  assert [r["event"] for r in recs if r.get("event", "").startswith("after_")] == ["after_decoalesce"]
  grown = next(r for r in recs if r.get("event") == "after_decoalesce")
  assert grown["eval_loss"] == pytest.approx(small_end["eval_loss"], abs=1e-5)
  n = s["per_stage"][0]["steps"]
  alone = tiny_config("gpt", levels=1, deep=True, **shape, **{
      "model.num_layers": 2, "train.steps": n, "train.lr": c.train.lr * c.cycle.lr_scales[1]})
  a = train_and_evaluate(alone, str(tmp_path / "alone"))
  assert a["final_eval_loss"] == small_end["eval_loss"]  # The same parameters: the same bits.
  with pytest.raises(ValueError, match=r"small_init='fresh'.*w_pre=0"):
    build_plan(ModelConfig.from_dict(s["model"]), {**c.cycle, "w_pre": 0.25}, c.train)
