"""Plans a V-cycle or a stacking schedule for a config and a budget from pilot runs, and writes a config file the
driver runs as it is.

  python -m experiments.plan --config=experiments/configs/gpt.py:tiny --steps=1400 --workdir=runs/plan-gpt
  python -m experiments.train --config=runs/plan-gpt/plan_config.py --workdir=runs/gpt-planned

Pilots (cached under WORKDIR/pilots: a finished pilot is read back, not rerun): fully decayed scratch runs of the
target at --target_pilots steps, and of each candidate small model (the V-cycle's level 1 when the target halves in
width and depth, in depth only, in width only: --candidates) at --small_pilots steps and each of --lr_scales (the
best learning rate per budget is kept, so no candidate is handicapped). Their final losses are each model's frontier;
``multilevel.cycles.planner.plan_vcycle`` picks the candidate (or, with --max_levels=3, a chain of two: the halved
model, then a depth- or width-only one) and the hand-overs that the lossless bound says save most, and the stage
lengths that realise them. The pilots' FLOPs are reported beside the predicted saving: for one run
they are a real cost; reused across runs of the same model and data they are paid once.

Under ``train.decay='wsd'`` (one warm-up-stable-decay schedule across the levels) the smaller stages hand over at
their peak rate, not decayed, and a grown model may learn slower than its scratch run: the plan is then priced on the
pilots' stable curves (their evals before the cool-down) with the growth rates of --growth_rates or
--growth_rates_from (``multilevel.cycles.growth``); --pricing=bound keeps the lossless bound on decayed frontiers.

Under WSD pricing it also prices stacking (--methods; ``multilevel.cycles.stack_planner``): StackBERT's depth
doublings with halved copies, from pilots of the target at half, a quarter, ... of its depth at train.lr
(``experiments/plan_stacking.py``), each doubling priced from the loss before it with the rate and delay of
--stack_rates / --stack_delays (``benchmarks/stack_rates.py`` measures them) or --stack_rates_from. A rate holds near
the hand-over it was measured after, so the plan says where it hands over far from those losses (--stack_rates_at);
--stack_rate_curves prices each doubling off a curve of rates measured at several hand-overs instead.
The plan is whichever schedule is predicted to save most; plan.json keeps the other as ``alternatives``.
--seed_flagfiles prices one stacking schedule on several seeds, each on its own files (one flagfile per further
seed), and picks the one whose mean predicted saving is highest (``multilevel.cycles.stack_seeds``).

Writes WORKDIR/plan.json (the plan, every candidate's row, the pilots) and WORKDIR/plan_config.py.
"""

from __future__ import annotations

import math
import os
import pprint
import sys
import time

from absl import app, flags, logging

from experiments import plan_stacking

_CONFIG = flags.DEFINE_string("config", None, "The target's config file, path[:size] (experiments/configs/<family>.py).")
_SET = flags.DEFINE_multi_string("set", [], "Override KEY=VALUE on the config (e.g. train.batch_size=32).")
_STEPS = flags.DEFINE_integer("steps", None, "The budget: train.steps of the scratch run the plan is measured against.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the pilots, plan.json and plan_config.py go.")
_TARGET_PILOTS = flags.DEFINE_list("target_pilots", [], "Steps of the target's pilots (default: 1/16, 1/8 and 1/4 "
                                   "of --steps; they must reach the losses where a hand-over pays).")
_SMALL_PILOTS = flags.DEFINE_list("small_pilots", [], "Steps of each candidate's pilots (default: 1/4, 1/2 and 1 "
                                  "times --steps).")
_PILOT_SEEDS = flags.DEFINE_list("pilot_seeds", [], "Further train.seed values at which each candidate's longest "
                                 "pilot also runs (at each of --lr_scales): the plan then prices the seeds' mean, "
                                 "since a small model's curve can vary between seeds far more than the target's.")
_LR_SCALES = flags.DEFINE_list("lr_scales", ["2", "4"], "Peak LRs of the candidates' pilots, as multiples of "
                               "train.lr.")
CANDIDATES = {"halve": {}, "depth": {"cycle.width_factor": 1}, "width": {"cycle.depth_factor": 1}}
_CANDIDATES = flags.DEFINE_list("candidates", list(CANDIDATES), f"Small models to consider: {list(CANDIDATES)}.")
_TARGET_FROM = flags.DEFINE_list("target_from", [], "Instead of the target's pilots: results of benchmarks.saving (their "
                                 "scratch runs are the target's frontier).")
_SMALL_FROM = flags.DEFINE_list("small_from", [], "Instead of the candidates' pilots: level runs of benchmarks.bound "
                                "(one candidate per level file, or 'a.json+b.json' for one model's files; its --set "
                                "cycle.* overrides name the candidate; rates are rescaled to this config's train.lr).")
_JUMP = flags.DEFINE_float("handover_jump", 0.0, "The loss (nats) the target starts above the small model when it "
                           "grows; 0 plans for a lossless hand-over (the bound).")
_JUMP_FROM = flags.DEFINE_list("handover_jump_from", [], "Instead of --handover_jump: workdirs of earlier V-cycle runs "
                               "of this config; the mean of the jumps measured around their growths is used.")
_MAX_LEVELS = flags.DEFINE_integer("max_levels", 3, "Most levels a plan may have: 3 also prices chains through a "
                                   "one-axis candidate (the halved model, then depth or width only, then the target); "
                                   "2 keeps to one hand-over.")
_PRICING = flags.DEFINE_enum("pricing", "auto", ["auto", "bound", "wsd"], "How hand-overs are priced: 'bound' on "
                             "the decayed frontiers (lossless, a bound), 'wsd' on the stable curves with growth "
                             "rates (for train.decay='wsd'), 'auto' = wsd when train.decay is 'wsd'.")
_RATES = flags.DEFINE_list("growth_rates", [], "GROWTH=RATE for depth, width, both: how fast the target learns after "
                           "growing in that way, as a fraction of its scratch run's pace (default 1, the bound's "
                           "assumption). benchmarks/results/growth_rates_*.json has measured ones.")
_RATES_FROM = flags.DEFINE_list("growth_rates_from", [], "GROWTH=WORKDIR[+WORKDIR...]: measure the rate from earlier "
                                "V-cycle runs of this config that grew that way (their target's progress on the "
                                "target's stable curve per FLOP, from its growth to its cool-down; several runs, e.g. "
                                "a planned run at each seed: their mean). Re-planning with a plan's own runs this way "
                                "prices what its growth measured.")
_ONLINE_STOP = flags.DEFINE_bool("online_stop", False, "Let the planned run end its small stage itself, by the online "
                                  "stop rule (cycle.small_stop='frontier', multilevel/cycles/switch.py) against the "
                                  "target's stable curve (WSD pricing) or decayed frontier: each seed's small model "
                                  "decides its switch, the planned length is the most it runs. The printed prediction "
                                  "is the fixed plan's.")
_MARGINS = flags.DEFINE_list("margins", ["0.02", "0.75"], "LANDING,SLOWER: under WSD pricing the plan is also priced "
                             "with the target landing LANDING nats higher and learning at SLOWER times the priced "
                             "rate (the errors its runs have shown), and says how much of the saving survives.")
METHODS = ("vcycle", "stackbert")
_METHODS = flags.DEFINE_list("methods", [], "Schedules to price; the plan is the one predicted to save most. "
                             "'vcycle': the candidates above; 'stackbert': depth doublings (StackBERT with halved "
                             "copies, multilevel/cycles/stack_planner.py), priced under WSD only, from pilots of the "
                             "target at half, a quarter, ... of its depth at train.lr (--stack_doublings). Default: "
                             "both under WSD pricing (stackbert not when --small_from replaces the V-cycle's pilots "
                             "and --stack_from does not replace stacking's), else vcycle.")
_STACK = plan_stacking.define_flags(flags.FLAGS)
_SEED_FLAGFILES = flags.DEFINE_list("seed_flagfiles", [], "Price one stacking plan on several seeds, each on its own "
                                    "runs: one absl flagfile per further seed with its --seed, --target_from, "
                                    "--stack_from and --stack_rate_curves (this command's own files are "
                                    "train.seed's). The plan is the schedule whose mean predicted saving over the "
                                    "seeds is highest (multilevel/cycles/stack_seeds.py); it shows each seed's.")
_COMPILE_CACHE = flags.DEFINE_string("compilation_cache", "~/.cache/multilevel/jax",
                                     "Persistent XLA compilation cache ('' to disable).")
_DEBUG = flags.DEFINE_bool("debug", False, "Show the Python traceback of an error instead of one line.")
flags.mark_flags_as_required(["config", "steps", "workdir"])


def load_config(spec: str):
  """``experiments.configs.common.load_config``, whose home is the flag-free config module (tests and tools that
  load a written plan import it from there, not this command, whose flags would clash with another's)."""
  from experiments.configs.common import load_config as load
  return load(spec)


def configured(spec: str, sets: dict, overrides: dict):
  from experiments.configs.common import override
  c = load_config(spec)
  override(c, sets)
  return override(c, overrides)


def small_model(spec: str, sets: dict, cycle: dict) -> dict:
  """``model.*`` overrides that make the target's config train the V-cycle's level 1 under ``cycle``."""
  from multilevel.cycles import build_plan, planner
  from multilevel.cycles.run_config import model_config
  c = configured(spec, sets, {**cycle, "cycle.levels": 2, "train.steps": 100})
  target = model_config(c, None)
  return planner.model_overrides(target, build_plan(target, c.cycle, c.train).levels[1])


def pilot(spec: str, sets: dict, overrides: dict, steps: int, workdir: str, evals: int = 4) -> dict:
  """One fully decayed scratch run, evaluated ``evals`` times. A finished one in ``workdir`` is read back by the
  driver (which refuses it if its config differs), not trained again."""
  from multilevel.cycles.driver import train_and_evaluate
  c = configured(spec, sets, {**overrides, "cycle.levels": 1, "train.steps": steps,
                              "train.eval_every": max(1, steps // evals), "progress": False, "tensorboard": False})
  return train_and_evaluate(c, workdir)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import jax

  from experiments import plan_vcycle
  from experiments.configs.common import key_values
  from multilevel.cycles import plan_report, planner
  if _COMPILE_CACHE.value:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(_COMPILE_CACHE.value))
  steps, spec, work = _STEPS.value, _CONFIG.value, _WORKDIR.value
  if steps < 1:
    raise app.UsageError(f"--steps must be a positive number of train steps (the budget), got {steps}.")
  sets = key_values(_SET.value)
  margins = _margins(_MARGINS.value)  # Refused before any pilot trains.
  methods = _METHODS.value
  if any(m not in METHODS for m in methods):
    raise app.UsageError(f"--methods={','.join(methods)}: choose one or more of {list(METHODS)}.")
  stack = _STACK()  # (Refused before any pilot trains, as every flag is.)
  unknown = [c for c in _CANDIDATES.value if c not in CANDIDATES]
  if unknown:
    raise app.UsageError(f"--candidates: unknown {unknown}; choose from {list(CANDIDATES)}.")
  def ints(xs, default, flag):
    try:
      out = sorted({int(x) for x in xs} if xs else {max(1, round(f * steps)) for f in default})
    except ValueError:
      raise app.UsageError(f"--{flag} takes whole numbers of steps, got {xs}.") from None
    if out and out[0] < 1:
      raise app.UsageError(f"--{flag} takes positive numbers of steps, got {xs}.")
    return out

  target_pilots = ints(_TARGET_PILOTS.value, (0.0625, 0.125, 0.25), "target_pilots")
  small_pilots = ints(_SMALL_PILOTS.value, (0.25, 0.5, 1.0), "small_pilots")
  try:  # Every flag is checked before the first pilot trains: a pilot can take hours.
    lr_scales = [float(x) for x in _LR_SCALES.value]
  except ValueError:
    raise app.UsageError(f"--lr_scales takes multiples of the target's peak LR (e.g. 2,4), got {_LR_SCALES.value}.")\
        from None
  if not lr_scales or not all(x > 0 for x in lr_scales):
    raise app.UsageError(f"--lr_scales takes positive multiples of the target's peak LR, got {_LR_SCALES.value}.")
  if _MAX_LEVELS.value not in (2, 3):
    raise app.UsageError(f"--max_levels must be 2 or 3, got {_MAX_LEVELS.value}.")
  if not _JUMP_FROM.value and not _JUMP.value >= 0:
    raise app.UsageError(f"--handover_jump must be >= 0 nats, got {_JUMP.value}.")
  for flag, files in (("target_from", _TARGET_FROM.value), ("small_from", _SMALL_FROM.value),
                      ("stack_from", stack.stack_from)):
    missing = [p for f in files for p in f.split("+") if not os.path.isfile(p)]  # 'a.json+b.json' pools files.
    if missing:
      raise app.UsageError(f"--{flag}: no file {', '.join(missing)}.")
  if not _TARGET_FROM.value and len(target_pilots) < 2:
    raise app.UsageError(f"The target's pilots would run {target_pilots} steps: its frontier needs two budgets or "
                         f"more. Raise --steps (8 or more), or give --target_pilots two or more budgets.")
  base = configured(spec, sets, {})
  try:  # The config's own seed runs every pilot already.
    seeds = [int(x) for x in _PILOT_SEEDS.value if int(x) != int(base.train.seed)]
  except ValueError:
    raise app.UsageError(f"--pilot_seeds takes integers, got {_PILOT_SEEDS.value}.") from None
  lr = float(base.train.lr)
  wsd = _PRICING.value == "wsd" or (_PRICING.value == "auto" and base.train.decay == "wsd")
  if wsd and base.train.decay != "wsd":
    raise app.UsageError(f"--pricing=wsd prices a run under one WSD schedule; this config has train.decay="
                         f"{base.train.decay!r}. Set train.decay=wsd or use --pricing=bound.")
  if "stackbert" in methods and not wsd:
    raise app.UsageError("--methods=stackbert is priced under one WSD schedule only (train.decay=wsd); drop it or "
                         "plan a WSD run.")
  if not methods:
    methods = ["vcycle", "stackbert"] if wsd and (stack.stack_from or not _SMALL_FROM.value) else ["vcycle"]
  if stack.stack_from and "stackbert" not in methods:
    raise app.UsageError("--stack_from gives stacking's pilots; add stackbert to --methods.")
  if "vcycle" not in methods and (_CANDIDATES.present or _SMALL_FROM.value):
    raise app.UsageError("--candidates and --small_from choose the V-cycle's small models; add vcycle to --methods.")

  seed_files = [plan_stacking.read_seed_flagfile(p) for p in _SEED_FLAGFILES.value]
  if seed_files:
    if methods != ["stackbert"] or not _TARGET_FROM.value or not stack.stack_from or stack.rates_from:
      raise app.UsageError("--seed_flagfiles prices a stacking plan on each seed's own files: give --methods="
                           "stackbert, this seed's --target_from and --stack_from (and --stack_rate_curves, not "
                           "--stack_rates_from: each seed's growths go in its flagfile).")
    ids = [int(base.train.seed)] + [f["seed"] for f in seed_files]
    if len(set(ids)) != len(ids):
      raise app.UsageError(f"--seed_flagfiles: the seeds {ids} (train.seed first) repeat one: give each seed once.")

  import shlex
  record = {"command": shlex.join(["python", "-m", "experiments.plan"] + sys.argv[1:]), "config": spec, "set": sets,
            "steps": steps, "pilots": []}

  def run(name, overrides, n, lr_scale=1.0, seed=None):
    from multilevel.cycles.growth import eval_curve
    from multilevel.metrics import read_metrics
    d = os.path.join(work, "pilots", f"{name}-lr{lr_scale:g}-{n}" + ("" if seed is None else f"-seed{seed}"))
    seeded = {} if seed is None else {"train.seed": seed}
    s = pilot(spec, sets, {**overrides, **seeded, "train.lr": lr * lr_scale}, n, d, 20 if wsd else 4)
    record["pilots"].append({"model": name, "lr_scale": lr_scale, "steps": n, "total_flops": s["total_flops"],
                             "final_eval_loss": s["final_eval_loss"], "curve": eval_curve(read_metrics(d), 0),
                             **({} if seed is None else {"seed": seed})})
    logging.info("pilot %s lr x%g, %d steps%s: loss %.4f", name, lr_scale, n,
                 "" if seed is None else f", seed {seed}", s["final_eval_loss"])
    return s

  target_curve = None
  if _TARGET_FROM.value:
    try:
      target, target_step, target_cost = planner.target_from_saving(_TARGET_FROM.value, base.model.family)
    except (ValueError, OSError) as e:
      raise app.UsageError(f"--target_from: {e}") from None
  else:
    target_runs = [run("target", {}, n) for n in target_pilots]
    target_curve = record["pilots"][-1]["curve"]  # The longest pilot's.
    target = planner.Frontier("target", tuple((s["total_flops"], s["final_eval_loss"]) for s in target_runs))
    target_step = target_runs[0]["total_flops"] / target_pilots[0]
    target_cost = sum(s["total_flops"] for s in target_runs)
  try:
    candidates = [planner.candidate_from_bound(p, lr, wsd) for p in _SMALL_FROM.value]
  except (ValueError, OSError) as e:
    raise app.UsageError(f"--small_from: {e}") from None
  except (KeyError, TypeError) as e:
    raise app.UsageError(f"--small_from: {', '.join(_SMALL_FROM.value)} is not a benchmarks.bound level-run file "
                         f"(no {e})") from None
  for name in ([] if _SMALL_FROM.value or "vcycle" not in methods else _CANDIDATES.value):
    cycle = CANDIDATES[name]
    try:
      model = small_model(spec, sets, cycle)
    except ValueError as e:  # E.g. a width factor the heads cannot take.
      logging.warning("candidate %s: %s", name, e)
      continue
    for scale in lr_scales:
      for n in small_pilots:
        run(name, model, n, scale)
      for seed in seeds:
        run(name, model, small_pilots[-1], scale, seed)
    try:
      candidates.append(planner.candidate_from_runs(name, [p for p in record["pilots"] if p["model"] == name], cycle,
                                                    model, wsd))
    except ValueError as e:
      raise app.UsageError(f"candidate {name}: {e}") from None
  jump = plan_vcycle.measured_jump(_JUMP_FROM.value, record) if _JUMP_FROM.value else _JUMP.value
  if not jump >= 0:
    raise app.UsageError(f"--handover_jump must be >= 0 nats, got {jump}.")
  from multilevel.cycles.run_config import model_config
  target_model = model_config(base, None)
  shape = (target_model.num_layers, target_model.num_heads) if _MAX_LEVELS.value == 3 else None
  settings = (plan_vcycle.wsd_settings(base, target_curve, record, _TARGET_FROM.value, _RATES.value,
                                       _RATES_FROM.value) if wsd else None)
  plans = []
  if "vcycle" in methods:
    try:
      plans.append(planner.plan_vcycle(target, target_step, steps, candidates, target_cost, jump=jump, shape=shape,
                                       wsd=settings, margins=margins))
    except ValueError as e:
      raise app.UsageError(str(e)) from None
  if "stackbert" in methods:
    levels = plan_stacking.stack_levels(stack.stack_from, stack.doublings, base, target_model.num_layers,
                                        small_pilots, seeds, run, record)
    if levels and seed_files:
      plans.append(plan_stacking.stack_plan_seeds(base, (target, settings, levels, target_step, target_cost),
                                                  seed_files, steps, stack, _RATES.value, margins,
                                                  target_model.num_layers, record))
    elif levels:
      plans.append(plan_stacking.stack_plan(target, settings, levels, target_step, steps, target_cost, stack,
                                            margins, record))
  if not plans:
    raise app.UsageError(f"nothing to plan: the target's {target_model.num_layers} layers cannot be halved for "
                         f"stacking, and --methods={','.join(methods)} prices nothing else.")
  plan = {**plan_report.keep_best(plans), "budget": steps}
  if _ONLINE_STOP.value and plan["overrides"].get("cycle.method") != "vcycle":
    raise app.UsageError(f"--online_stop ends a V-cycle's small stage, and the plan is {plan['method']}; run it "
                         f"without --online_stop (or with --methods=vcycle).")
  if _ONLINE_STOP.value:
    from multilevel.cycles.switch import online_stop
    points = settings.target.points if settings is not None else target.points
    try:
      plan = {**plan, "overrides": online_stop(plan["overrides"], points)}
    except ValueError as e:
      raise app.UsageError(f"--online_stop: {e}") from None
  if (base.model.family == "bert" and int(plan["overrides"].get("cycle.levels", 1)) > 1
          and "cycle.depth_growth" not in sets and base.cycle.depth_growth != "zero"):
    # BERT's copy growth is not function-preserving after post-LN: the grown model jumped 5.19 -> 5.74 at T=2800
    # (README, "The small stage must be its pilot"); the zero rule's jump was 0.014 nats. --set keeps a choice.
    plan = {**plan, "overrides": {**plan["overrides"], "cycle.depth_growth": "zero"}}
  print(planner.describe(plan))
  if plan["overrides"].get("cycle.depth_growth") == "zero" and base.cycle.depth_growth != "zero":
    print("  BERT grows depth by the zero rule in this plan (its copy growth jumps at the hand-over after post-LN; "
          "--set=cycle.depth_growth=copy keeps copies)")
  record["plan"] = plan
  from multilevel.files import write_json_atomic, write_text_atomic  # Whole or not at all.
  write_json_atomic(os.path.join(work, "plan.json"), record)
  if plan.get("no_overlap"):  # The search could not be done: a scratch config would read as the planner's choice.
    raise app.UsageError(f"no hand-over could be priced for {', '.join(plan['no_overlap'])} (why: above), so no "
                         f"plan_config.py was written; the pilots and plan.json in {work} are kept for the next try.")
  config_path = os.path.join(work, "plan_config.py")
  write_text_atomic(config_path, config_file(spec, sets, plan, record["command"], os.path.join(work, "plan.json")))
  print(f"config: {config_path}\nrun it: python -m experiments.train --config={config_path} --workdir=WORKDIR")


def _margins(values: list) -> tuple[float, float]:
  try:
    landing, slower = (float(v) for v in values)
  except ValueError:
    landing = slower = math.nan
  if not (landing >= 0 and 0 < slower <= 1):
    raise app.UsageError(f"--margins={','.join(values)}: give LANDING,SLOWER, a landing error in nats (>= 0) and "
                         f"a factor on the growth rate in (0, 1], e.g. --margins=0.02,0.75.")
  return landing, slower


def config_file(spec: str, sets: dict, plan: dict, command: str = "", plan_json: str = "") -> str:
  """A config file: the source config, the --set overrides, then the plan's; its docstring says where it came from
  (the command, the date, plan.json) and what it predicts."""
  path, _, arg = spec.partition(":")
  overrides = {**sets, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in plan["overrides"].items()}}
  made = "".join(f"\n{line}" for line in (
      f"Made {time.strftime('%Y-%m-%d %H:%M')} by: {command}" if command else "",
      f"The plan with every candidate and pilot: {plan_json}" if plan_json else "",
      f"It reads its source config, {os.path.abspath(path)}, when it runs: an edit there changes this plan too.") if line)
  return (f'"""Written by experiments.plan: {plan["method"]}, predicted saving '
          f'{100 * plan["predicted_saving"]:+.1f}% vs scratch at '
          f'train.steps={plan.get("budget", plan["overrides"]["train.steps"])}.\n'
          f'{made}\n"""\n\n'
          "import importlib.util\n\n"
          "from experiments.configs.common import override\n\n"
          f"SOURCE = {os.path.abspath(path)!r}\nARG = {arg!r}\nOVERRIDES = {pprint.pformat(overrides)}\n\n\n"
          "def get_config(arg=None):\n"
          "  spec = importlib.util.spec_from_file_location('_planned_source', SOURCE)\n"
          "  module = importlib.util.module_from_spec(spec)\n"
          "  spec.loader.exec_module(module)\n"
          "  c = module.get_config(ARG) if ARG else module.get_config()\n"
          "  c.unlock()\n"
          "  override(c, {k: tuple(v) if isinstance(v, list) else v for k, v in OVERRIDES.items()})\n"
          "  return c\n")


if __name__ == "__main__":
  from experiments.errors import config_folder_on_path, one_line
  from multilevel.checkpoint import CheckpointError
  config_folder_on_path(sys.argv)
  sys.exit(app.run(one_line(main, (app.UsageError, ValueError, KeyError, OSError, CheckpointError),
                            lambda: _DEBUG.value, interrupted="run the same command again: the finished pilots are "
                            "read back, and the one that was training resumes from its last checkpoint.")))
