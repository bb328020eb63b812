"""Why did a planned V-cycle miss its prediction? Holds a finished planned run against the frontiers it was planned
from.

  python -m benchmarks.plan_check --plan=runs/plan-bert/plan.json --run=/tmp/mlb/bert-1400-planned \
      --target_from=benchmarks/results/methods_bert.json,benchmarks/results/methods_bert_frontier.json \
      --small_from=benchmarks/results/bound_bert_L1.json

It reads the loss the run's growth cost (``planner.handover_jumps``: eval right before and right after it), predicts
the schedule the run executed from the frontiers with no jump (what the plan assumed) and with the measured one, and
gives the measured final loss beside both; then re-plans the same budget with the measured jump
(``experiments.plan --handover_jump_from=RUN`` does the same when planning). What the jump does not explain is the
grown model training worse after the hand-over than its own scratch run does from the same loss.
"""

from __future__ import annotations

import json

from absl import app, flags

from benchmarks import cli


def define_flags(fv: flags.FlagValues) -> None:
  """Declares this script's flags on ``fv``."""
  flags.DEFINE_string("plan", None, "plan.json written by experiments.plan.", flag_values=fv)
  flags.DEFINE_string("run", None, "Workdir of the run of that plan.", flag_values=fv)
  flags.DEFINE_list("target_from", [], "benchmarks.saving results: the target's scratch frontier.", flag_values=fv)
  flags.DEFINE_string("small_from", None, "benchmarks.bound level-run file of the plan's small model.",
                      flag_values=fv)
  flags.DEFINE_string("out", "", "JSON to write the check to.", flag_values=fv)


def check(plan: dict, records: list[dict], target, target_step: float, small) -> dict:
  """The check as a dict: the measured jump(s), the executed schedule predicted at jump 0 and at the measured jump,
  the measured final loss and saving, and the plan made with the measured jump."""
  from multilevel.cycles import planner
  jumps = planner.handover_jumps(records)
  if not jumps:
    raise ValueError("the run has no growth with an eval on both sides of it: is it a V-cycle run of the plan?")
  jump = planner.mean_jump(jumps)
  p = plan["plan"]
  if "small_steps" not in p:
    raise ValueError(f"the plan is {p['method']!r}, not a V-cycle: there is no hand-over to check.")
  evals = [r for r in records if "eval_loss" in r and r.get("level") == 0]
  final = max(evals, key=lambda r: r["step"])
  flops = max(r["flops"] for r in records if "flops" in r)
  cost = target.cost(final["eval_loss"])
  predict = lambda d: planner.predict_vcycle(target, target_step, small.frontier, small.step_flops, p["small_steps"],
                                             p["big_steps"], jump=d)
  replanned = planner.plan_vcycle(target, target_step, plan["steps"], [small], jump=max(0.0, jump))
  return {"jumps": jumps, "jump": jump, "predicted_lossless": predict(0.0), "predicted_with_jump": predict(jump),
          "measured": {"final_loss": final["eval_loss"], "flops": flops,
                       "saving": None if cost is None else 1 - flops / cost},
          "replanned": {k: replanned.get(k) for k in ("method", "predicted_saving", "switch_loss", "small_steps",
                                                      "big_steps", "overrides")}}


def _fmt(x: dict | None) -> str:
  if x is None:
    return "n/a (outside the frontiers)"
  saving = "n/a (outside the frontier)" if x["saving"] is None else f"{100 * x['saving']:+.1f}%"
  return f"final loss {x['final_loss']:.4f}, saving {saving}"


def main(argv):
  del argv
  a = cli.parse(define_flags)
  from multilevel.cycles import planner
  from multilevel.metrics import read_metrics
  for name in ("plan", "run", "small_from"):
    if not getattr(a, name):
      raise app.UsageError(f"--{name} is required.")
  if not a.target_from:
    raise app.UsageError("--target_from is required (benchmarks.saving results with the target's scratch runs).")
  with open(a.plan) as f:
    plan = json.load(f)
  target, step, _ = planner.target_from_saving(a.target_from)
  c = check(plan, read_metrics(a.run), target, step, planner.candidate_from_bound(a.small_from))
  print(f"measured jump at growth: {c['jump']:+.4f} nats ({len(c['jumps'])} growth(s))")
  print(f"executed schedule, lossless hand-over (the plan):  {_fmt(c['predicted_lossless'])}")
  print(f"executed schedule, with the measured jump:         {_fmt(c['predicted_with_jump'])}")
  print(f"measured:                                          {_fmt(c['measured'])}")
  r = c["replanned"]
  if r["method"] == "scratch":
    print("re-planned with the jump: scratch (no hand-over repays the jump)")
  else:
    print(f"re-planned with the jump: hand over at {r['switch_loss']:.3f} after {r['small_steps']} small steps, then "
          f"{r['big_steps']} target steps: predicted {100 * r['predicted_saving']:+.1f}%")
  if a.out:
    with open(a.out, "w") as f:
      json.dump(c, f, indent=1)


if __name__ == "__main__":
  cli.run(main, define_flags)
