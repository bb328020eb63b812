"""Does a growth method save compute? Scratch, V-cycle variants and the other methods (G_stack, StackBERT, MSLT, LiGO,
MSG, CoRe; the models and named variants are in ``benchmarks/variants.py``) on the same data, seed and budget, in one
invocation.

  python -m benchmarks.saving --family=gpt --budgets=160,320,640,1280 --variants=reference,warmup \
      --out=benchmarks/results/saving_gpt.json

For each budget (train.steps of the scratch run) it trains scratch (levels=1) and every variant, then reads off the
eval curves: the FLOPs and training seconds each variant needed to reach scratch's final eval loss (linear
interpolation between evaluations of the target model), the savings in percent, and the equal-FLOPs view (variant's
final loss minus scratch's loss at the same FLOPs; negative = better).

Seeds: run the command once per seed with ``--set=train.seed=S`` (the seed of the initialisation and the data order),
each with its own --workroot and --out; ``benchmarks.analyze_saving`` merges the files per seed and reports the mean
over seeds with each seed's values.
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Callable

from absl import app, flags, logging

from benchmarks import cli
from benchmarks.variants import MODELS, VARIANTS  # noqa: F401  (also read as saving.VARIANTS)
from multilevel.metrics import eval_curve, reach, value_at, wall_seconds  # noqa: F401  (saving.reach, ...)


def define_flags(fv: flags.FlagValues) -> None:
  """Declares this script's flags on ``fv``."""
  flags.DEFINE_enum("family", "gpt", ["gpt", "bert", "deit", "llama"], "Model family.", flag_values=fv)
  flags.DEFINE_list("budgets", ["160", "320", "640", "1280"], "Scratch step budgets (train.steps).", flag_values=fv)
  flags.DEFINE_list("variants", ["reference", "warmup"], f"V-cycle variants: {sorted(VARIANTS)}.", flag_values=fv)
  flags.DEFINE_multi_string("set", [], "Extra override KEY=VALUE for every run (e.g. model.num_layers=8).",
                            flag_values=fv)
  flags.DEFINE_integer("evals", 20, "Evaluations per run (eval_every = steps / evals).", flag_values=fv)
  flags.DEFINE_string("workroot", "/tmp/multilevel-bench", "Where the runs' workdirs go (wiped first).",
                      flag_values=fv)
  flags.DEFINE_bool("reuse_scratch", False, "Reuse a finished scratch run found in --workroot.", flag_values=fv)
  flags.DEFINE_list("scratch_from", [], "Earlier results files of this benchmark whose scratch run at a budget is "
                    "reused instead of training it again (same family and overrides, refused otherwise; the entry "
                    "records the file).", flag_values=fv)
  flags.DEFINE_list("plan", [], "plan.json files of experiments.plan: each adds a variant 'planned' (its overrides) at "
                    "the budget it was planned for.", flag_values=fv)
  flags.DEFINE_multi_string("plan_set", [], "Override KEY=VALUE applied over a --plan's own overrides (e.g. "
                            "cycle.lr_scales=(1,1) runs the plan with its small stage at the target's rate): the "
                            "plan as a hand-set variant; recorded with the run.", flag_values=fv)
  flags.DEFINE_list("frontier_from", [], "Results files whose scratch runs are the target's frontier that adaptive "
                    "variants (cycle.small_stop='frontier') read: the benchmark's own frontier, an oracle a user would "
                    "measure with pilots.", flag_values=fv)
  flags.DEFINE_enum("frontier_curve", "final", ["final", "stable"], "What the adaptive variants read of "
                    "--frontier_from: 'final' the fully decayed runs' final losses, 'stable' the un-decayed part of "
                    "the longest WSD run (the target's cost per nat at its peak rate).", flag_values=fv)
  flags.DEFINE_string("out", "", "JSON results file (default benchmarks/results/saving_<family>.json).",
                      flag_values=fv)


def make_config(family: str, steps: int, overrides: dict, extra: dict, evals: int):
  """The ``tiny`` config of ``family`` at MODELS' size, then ``extra`` (``--set``), the run's budget with ``evals``
  evaluations, and ``overrides`` (a variant)."""
  from experiments.configs import bert, deit, gpt, llama
  from experiments.configs.common import override
  c = {"bert": bert, "gpt": gpt, "deit": deit, "llama": llama}[family].get_config("tiny")
  c.unlock()
  override(c, MODELS[family])
  override(c, extra)
  override(c, {"train.steps": steps, "train.log_every": max(1, steps // 40), "train.eval_every": max(1, steps // evals),
               "checkpoint.every": 0, "checkpoint.async_save": True, "progress": False, "tensorboard": False,
               "data.max_eval_batches": 8})
  if family == "bert":  # Post-LN: the pre-LN width option does not apply (and is refused).
    overrides = {k: v for k, v in overrides.items() if k != "cycle.preln_exact"}
  return override(c, overrides)


# The curve readings live in the library (experiments.plot --table reads runs the same way).
curve, loss_at = eval_curve, value_at


def compare(scratch: dict, run: dict) -> dict:
  target = scratch["summary"]["final_eval_loss"]
  hit = reach(curve(run["records"]), target)
  sf, ss = scratch["summary"]["total_flops"], wall_seconds(scratch["summary"])
  out = {"final_eval_loss": run["summary"]["final_eval_loss"], "total_flops": run["summary"]["total_flops"],
         "train_seconds": run["summary"]["train_seconds"],
         "transition_seconds": run["summary"].get("transition_seconds", 0.0),
         "seconds": wall_seconds(run["summary"]),
         "flops_ratio_total": run["summary"]["total_flops"] / sf,
         "seconds_ratio_total": wall_seconds(run["summary"]) / ss,
         "equal_flops_loss_diff": run["summary"]["final_eval_loss"] - loss_at(curve(scratch["records"]),
                                                                              run["summary"]["total_flops"])}
  if hit is None:
    out.update(reached=False, flops_saving=None, seconds_saving=None)
  else:
    out.update(reached=True, flops_to_reach=hit[0], seconds_to_reach=hit[1], flops_saving=1 - hit[0] / sf,
               seconds_saving=1 - hit[1] / ss)
  events = {}
  for r in run["records"]:
    if r.get("event"):
      events.setdefault(r["event"], []).append(round(r["eval_loss"], 4))
  out["transition_losses"] = events
  from multilevel.cycles.planner import handover_jumps
  # The loss each growth cost (eval right before and right after it): what experiments.plan --handover_jump takes.
  out["handover_jumps"] = [round(j["jump"], 5) for j in handover_jumps(run["records"])]
  out["curve"] = [[r["flops"], r["train_seconds"] + r.get("transition_seconds", 0.0), r["eval_loss"], r["level"]]
                  for r in run["records"] if "eval_loss" in r and "flops" in r]
  return out


def require_data(config) -> None:
  """Refuses a DeiT run of the benchmark without Fashion-MNIST: its default data would fall back to MNIST digits, and
  the figures would be another benchmark's. Checked where a run starts, not where its config is built, so plans and
  level sizes can be read on a machine without the data."""
  if config.model.family == "deit" and config.data.name in ("", "default") and not config.data.folder:
    from multilevel.data.images import FASHION_MNIST_DIRS, find_fashion_mnist
    if find_fashion_mnist() is None:
      raise app.UsageError(f"The DeiT benchmark trains on Fashion-MNIST, which is not installed (looked in "
                           f"{', '.join(FASHION_MNIST_DIRS)}): apt-get install dataset-fashion-mnist, or name other "
                           f"data with --set=data.name=... / --set=data.folder=....")


def train(config, workdir):
  import shutil

  from multilevel.cycles.driver import train_and_evaluate
  from multilevel.metrics import read_metrics
  require_data(config)
  shutil.rmtree(workdir, ignore_errors=True)
  summary = train_and_evaluate(config, workdir)
  return {"summary": summary, "records": read_metrics(workdir)}


def _values(overrides: dict) -> dict:
  """Override values that can change a scratch run, compared by what they mean: "4e-3" (from --set) equals 0.004
  (from a results file); ``cycle.*`` keys are left out (scratch is the one-level plan whatever they say)."""
  import ast

  def value(v):
    if isinstance(v, str):
      try:
        v = ast.literal_eval(v.strip())
      except (ValueError, SyntaxError):
        return v
    return tuple(v) if isinstance(v, list) else v
  return {k: value(v) for k, v in overrides.items() if not k.startswith("cycle.")}


def earlier_scratch(paths: list[str], family: str, overrides: dict, steps: int) -> dict | None:
  """The scratch run at ``steps`` from earlier results files (``--scratch_from``), in the form ``train`` returns
  (its evaluation curve as records of the target level), or None when no file has that budget. A file of another
  family or other model/data overrides is refused: its scratch run would be another baseline."""
  for path in paths:
    with open(path) as f:
      d = json.load(f)
    theirs, ours = _values(d.get("model_overrides", {})), _values(overrides)
    if d.get("family") != family or theirs != ours:
      raise app.UsageError(f"--scratch_from {path}: its runs are family {d.get('family')!r} with overrides {theirs}, "
                           f"this benchmark's are {family!r} with {ours}; reuse scratch runs of the same settings "
                           f"only (or leave --scratch_from out to train them).")
    for b in d["budgets"]:
      if b["steps"] == steps:
        records = [{"flops": f, "train_seconds": s, "eval_loss": l, "level": 0} for f, s, l in b["scratch_curve"]]
        return {"summary": dict(b["scratch"]), "records": records, "file": path}
  return None


def target_frontier(paths: list[str], family: str, overrides: dict, kind: str = "final") -> tuple:
  """The target's (FLOPs, eval loss) points that the adaptive variants' stop rule reads, from the scratch runs in
  ``paths`` (``--frontier_from``; a learning-rate sweep: the files may differ in ``train.lr`` and ``train.seed``, in
  nothing else: a run at another seed reads the frontier a user measured once).

  ``kind='final'``: each budget's final loss, the lowest where several files ran it (the fully decayed frontier).
  ``kind='stable'``: the evaluations before the cool-down of the longest WSD run (the lowest-ending one among equally
  long runs): what the target pays per nat at its peak rate, which is how a grown model trains under one WSD schedule
  until the last cool-down (``multilevel/cycles/switch.py``)."""
  if kind not in ("final", "stable"):
    raise app.UsageError(f"--frontier_curve={kind!r}: choose 'final' or 'stable'.")
  if not paths:
    raise app.UsageError("An adaptive variant (cycle.small_stop='frontier') needs the target's frontier: give "
                         "--frontier_from=RESULTS.json,... whose scratch runs measured it.")
  points, runs = {}, []  # runs: (steps, -final loss, budget entry, its file's overrides) for kind='stable'.
  for path in paths:
    with open(path) as f:
      d = json.load(f)
    theirs = d.get("model_overrides", {})
    # Checks the settings match but for the rate and the seed (no budget has -1 steps, so nothing is read).
    mine = {k: v for k, v in overrides.items() if k not in ("train.lr", "train.seed")}
    mine.update({k: theirs[k] for k in ("train.lr", "train.seed") if k in theirs})
    earlier_scratch([path], family, mine, -1)
    for b in d["budgets"]:
      point = (b["scratch"]["total_flops"], b["scratch"]["final_eval_loss"])
      if b["steps"] not in points or point[1] < points[b["steps"]][1]:
        points[b["steps"]] = point
      runs.append((b["steps"], -point[1], b, theirs))
  if kind == "final":
    return tuple(points[k] for k in sorted(points))
  _, _, b, theirs = max(runs, key=lambda r: r[:2])  # The longest run; among equally long ones the lowest-ending.
  if theirs.get("train.decay", overrides.get("train.decay")) != "wsd":
    raise app.UsageError("--frontier_curve=stable reads the un-decayed part of a WSD scratch run; the runs in "
                         "--frontier_from are not WSD (set train.decay=wsd).")
  from multilevel.cycles.growth import stable_from_scratch_curve
  cooldown = float(theirs.get("train.cooldown_frac", overrides.get("train.cooldown_frac", 0.2)))
  return stable_from_scratch_curve(f"scratch at T={b['steps']}", b["scratch_curve"], b["scratch"]["total_flops"],
                                   cooldown).points


def plan_variant(paths: list[str], steps: int, plan_set: dict) -> tuple[dict, dict | None]:
  """The variant ``{"planned": overrides}`` of the plan among ``paths`` made for ``steps`` (``{}`` if none), its
  overrides changed by ``plan_set`` (``--plan_set``), and what the results file records of the plan: its file, the
  saving it predicted and, when ``plan_set`` changed it, those changes (the prediction priced the plan as written)."""
  planned, predicted = {}, None
  for path in paths:
    with open(path) as f:
      p = json.load(f)["plan"]
    # A stacking plan's run has its own train.steps (its stages' sum); the budget it was planned for is its own key.
    if p.get("budget", p["overrides"].get("train.steps")) == steps:
      planned["planned"] = {**{k: tuple(v) if isinstance(v, list) else v for k, v in p["overrides"].items()
                               if k != "train.steps" or v != steps}, **plan_set}
      predicted = {"plan_file": path, "predicted_saving": p["predicted_saving"], "method": p["method"]}
      if plan_set:
        predicted["plan_set"] = {k: str(v) for k, v in plan_set.items()}
  return planned, predicted


def main(argv):
  del argv
  import jax

  from multilevel import models as M
  from experiments.configs.common import key_values
  a = cli.parse(define_flags)
  family = a.family
  extra = key_values(a.set)
  plan_extra = key_values(a.plan_set, "--plan_set")
  if plan_extra and not a.plan:
    raise app.UsageError("--plan_set changes a plan's overrides; pass the plan with --plan.")
  try:  # Before any run trains: an unknown key or a bad value would otherwise stop the benchmark after scratch.
    make_config(family, 1, plan_extra, extra, 1)
  except (KeyError, ValueError, SyntaxError) as e:
    raise app.UsageError(f"--plan_set {a.plan_set}: {e}") from None
  unknown = [v for v in a.variants if v not in VARIANTS]
  if unknown:
    raise app.UsageError(f"Unknown variants {unknown}; choose from {sorted(VARIANTS)}.")
  out_path = a.out or os.path.join(os.path.dirname(__file__), "results", f"saving_{family}.json")
  results = {"command": cli.command("benchmarks.saving"), "family": family,
             "model_overrides": {**MODELS[family], **extra}, "jax": jax.__version__, "cpus": os.cpu_count(),
             "machine": platform.processor() or platform.machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
             "budgets": []}
  for steps in [int(b) for b in a.budgets]:
    cfg = make_config(family, steps, {"cycle.levels": 1}, extra, a.evals)
    scratch_dir = os.path.join(a.workroot, f"{family}-{steps}-scratch")
    earlier = earlier_scratch(a.scratch_from, family, results["model_overrides"], steps)
    reused = earlier is None and a.reuse_scratch and os.path.exists(os.path.join(scratch_dir, "summary.json"))
    if earlier is not None:
      scratch = earlier
    elif reused:
      from multilevel.metrics import read_metrics
      with open(os.path.join(scratch_dir, "summary.json")) as f:
        scratch = {"summary": json.load(f), "records": read_metrics(scratch_dir)}
    else:
      scratch = train(cfg, scratch_dir)
    from multilevel.cycles.run_config import model_config
    n_params = M.num_params(M.abstract_params(model_config(cfg, None).replace(
        vocab_size=int(cfg.data.vocab_size))))
    per_example = cfg.model.max_len if family != "deit" else (cfg.model.image_size // cfg.model.patch_size) ** 2 + 1
    entry = {"steps": steps, "params": n_params,  # Tokens: text positions, or patches + CLS for DeiT.
             "tokens_per_param": steps * cfg.train.batch_size * per_example / n_params,
             "scratch": {k: scratch["summary"].get(k) for k in ("final_eval_loss", "total_flops", "train_seconds",
                                                                  "epochs")},
             "scratch_curve": [[f, s, l] for f, s, l in curve(scratch["records"])],
             "variants": {}}
    if earlier is not None:
      entry["scratch_from"] = earlier["file"]
    elif reused:  # Trained by an earlier command, perhaps in another session: its seconds are not this one's.
      entry["scratch_reused"] = scratch_dir
    planned, predicted = plan_variant(a.plan, steps, plan_extra)
    for name in list(a.variants) + list(planned):
      overrides = planned.get(name) or VARIANTS[name]
      if overrides.get("cycle.small_stop") == "frontier":
        overrides = {**overrides, "cycle.target_frontier": target_frontier(a.frontier_from, family,
                                                                           results["model_overrides"],
                                                                           a.frontier_curve)}
      run = train(make_config(family, steps, overrides, extra, a.evals),
                  os.path.join(a.workroot, f"{family}-{steps}-{name}"))
      entry["variants"][name] = compare(scratch, run)
      v = entry["variants"][name]
      if name == "planned":
        v["plan"] = predicted
      logging.info("budget %d %s: loss %.4f vs scratch %.4f | FLOPs saving %s | seconds saving %s", steps, name,
                   v["final_eval_loss"], entry["scratch"]["final_eval_loss"], v["flops_saving"], v["seconds_saving"])
    results["budgets"].append(entry)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path + ".tmp", "w") as f:
      json.dump(results, f, indent=1)
    os.replace(out_path + ".tmp", out_path)
  print(table(results))


def fmt(x, pct=False):
  if x is None:
    return "not reached"
  return f"{100 * x:+.1f}%" if pct else f"{x:.3f}"


Cell = Callable[[dict, str, dict], str]  # (budget entry, variant name, variant result) -> the cell's text.

# This script's results table, header -> cell; analyze_saving takes its shared columns from here.
COLUMNS: dict[str, Cell] = {
    "steps": lambda b, name, v: str(b["steps"]),
    "tokens/param": lambda b, name, v: f"{b['tokens_per_param']:.1f}" if b["tokens_per_param"] else "-",
    "variant": lambda b, name, v: name,
    "final loss (scratch)": lambda b, name, v: f"{v['final_eval_loss']:.3f} ({b['scratch']['final_eval_loss']:.3f})",
    "FLOPs saved": lambda b, name, v: fmt(v["flops_saving"], True),
    "seconds saved": lambda b, name, v: fmt(v["seconds_saving"], True),
    # None where the curves were dropped (benchmarks.final_eval: final losses of another evaluation set).
    "loss diff at equal FLOPs": lambda b, name, v: ("n/a" if v.get("equal_flops_loss_diff") is None
                                                    else f"{v['equal_flops_loss_diff']:+.3f}"),
}


def table(results: dict, columns: dict[str, Cell] | None = None) -> str:
  """Markdown table with one row per budget and variant of ``results``; ``columns`` (default COLUMNS) maps each
  header to its cell."""
  columns = columns or COLUMNS
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for b in results["budgets"]:
    for name, v in b["variants"].items():
      lines.append("| " + " | ".join(cell(b, name, v) for cell in columns.values()) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run(main, define_flags)
