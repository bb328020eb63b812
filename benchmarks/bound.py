"""The lossless hand-over bound: what any growth method could save if its grown model then learned as scratch does.

  # 1. Each smaller level's model trained alone from scratch, fully decayed, at several budgets (its frontier):
  python -m benchmarks.bound --family=gpt --level=1 --budgets=200,400,800,1600,3200 --lr_scales=2,4 \
      --workroot=/tmp/mlb-bound --out=benchmarks/results/bound_gpt_L1.json
  # 2. The bound at each target budget, beside the methods' measured savings (a saving-benchmark summary):
  python -m benchmarks.bound --family=gpt --levels_from=benchmarks/results/bound_gpt_L1.json \
      --target=benchmarks/results/methods_gpt.json,benchmarks/results/methods_gpt_frontier.json \
      --methods=benchmarks/results/methods_gpt_summary.json --plot=benchmarks/results/bound_gpt.png \
      --summary=benchmarks/results/bound_gpt_summary.json

With F_m(L) the FLOPs model m needs to reach eval loss L on its frontier (fully decayed scratch runs, log-linear
between budgets), an ideal chain small -> ... -> big that hands over with no loss at all and then learns exactly as
the next model's scratch run does from that loss costs, for two levels,

  F_big(L_T) - max over L >= L_T of [F_big(L) - F_small(L)],

and for more levels the same recursion on a grid of losses (``multilevel.cycles.frontier.ideal_cost``). The saving is what that maximum is of
F_big(L_T). A method that beats it has a grown model that learns faster than scratch after the hand-over; one at the
bound loses nothing at the hand-over; where every method sits at or below the bound the fade is the physics of
growth at this scale. It is a bound only under its assumption (after the hand-over the big model continues at its
frontier's rate, which a real run that resumes from a decayed small model does not quite do); read it as the target
a hand-over method is measured against, not as a theorem.

Also reported: the envelope, the best *single* model at equal FLOPs (a smaller model trained longer), which a user
who only wants the lowest loss for the compute would consider instead of the target.
"""

from __future__ import annotations

import json
import os

from absl import app, flags, logging

from benchmarks import cli, saving
from multilevel.cycles.frontier import Frontier, bound_at, ideal_cost  # noqa: F401
from multilevel.cycles.growth import eval_curve
from multilevel.cycles.planner import candidate_from_runs, model_overrides


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_enum("family", "gpt", ["gpt", "bert", "deit", "llama"], "Model family.", flag_values=fv)
  flags.DEFINE_integer("level", 1, "Run scratch for this level of the default V-cycle plan (1 = the small model).",
                       flag_values=fv)
  flags.DEFINE_integer("levels", 2, "Levels of the plan the level is taken from (3 gives levels 1 and 2).",
                       flag_values=fv)
  flags.DEFINE_list("budgets", [], "Step budgets of the level's scratch runs (empty: only analyse).", flag_values=fv)
  flags.DEFINE_list("lr_scales", ["4"], "Peak LRs of the level's runs, as multiples of the target's train.lr (the "
                    "frontier keeps the best at each budget: a small sweep so no baseline is handicapped).",
                    flag_values=fv)
  flags.DEFINE_multi_string("set", [], "Extra override KEY=VALUE for every run, as in benchmarks.saving.",
                            flag_values=fv)
  flags.DEFINE_integer("evals", 10, "Evaluations per run.", flag_values=fv)
  flags.DEFINE_string("workroot", "/tmp/multilevel-bound", "Where the runs' workdirs go.", flag_values=fv)
  flags.DEFINE_string("out", "", "JSON of the level's scratch runs (step 1).", flag_values=fv)
  flags.DEFINE_list("levels_from", [], "Level-run JSONs (step 1's --out) to analyse; files of one level pool their "
                    "runs ('a.json+b.json' or listed apart).", flag_values=fv)
  flags.DEFINE_list("target", [], "Saving-benchmark results whose scratch runs give the target's frontier.",
                    flag_values=fv)
  flags.DEFINE_list("chain", [], "Instead of --levels_from: level-run files of different small models (each from "
                    "its own --set cycle.*), smallest first, e.g. the halved model then the depth-only one: the "
                    "2-level bound of each, and the bound of the whole chain (depth, then width); 'a.json+b.json' pools one "
                    "model's files (e.g. one per learning rate).", flag_values=fv)
  flags.DEFINE_string("methods", "", "A summary of benchmarks.analyze_saving: measured frontier savings to plot.",
                      flag_values=fv)
  flags.DEFINE_string("summary", "", "JSON with the bound at each target budget.", flag_values=fv)
  flags.DEFINE_string("plot", "", "PNG: the frontiers, and bound against measured savings.", flag_values=fv)


# --------------------------------------------------------------------------------------------- the level's runs


def level_overrides(family: str, level: int, levels: int, extra: dict) -> dict:
  """``model.*`` overrides that make the benchmark's target config train level ``level`` of the default
  ``levels``-level V-cycle plan, as its own model."""
  from multilevel.cycles import build_plan
  from multilevel.cycles.run_config import model_config
  c = saving.make_config(family, 100, {"cycle.levels": levels}, extra, 10)
  target = model_config(c, None)
  plan = build_plan(target, c.cycle, c.train)
  if not 0 < level < len(plan.levels):
    raise app.UsageError(f"--level={level}: the {levels}-level plan has levels 1..{len(plan.levels) - 1} below the "
                         f"target; raise --levels.")
  return model_overrides(target, plan.levels[level])


def run_level(a) -> dict:
  from experiments.configs.common import key_values
  extra = key_values(a.set)
  model = level_overrides(a.family, a.level, a.levels, extra)
  base_lr = float(saving.make_config(a.family, 100, {}, extra, 10).train.lr)
  out = {"command": cli.command("benchmarks.bound"), "family": a.family, "level": a.level, "levels": a.levels,
         "model": model, "set": extra, "base_lr": base_lr, "runs": []}
  for scale in [float(s) for s in a.lr_scales]:
    for steps in [int(b) for b in a.budgets]:
      cfg = saving.make_config(a.family, steps, {**model, "cycle.levels": 1, "train.lr": base_lr * scale}, extra,
                               a.evals)
      workdir = os.path.join(a.workroot, f"{a.family}-L{a.level}-lr{scale:g}-{steps}")
      result = saving.train(cfg, workdir)
      s = result["summary"]
      out["runs"].append({"steps": steps, "lr_scale": scale, "total_flops": s["total_flops"],
                          "final_eval_loss": s["final_eval_loss"], "train_seconds": s["train_seconds"],
                          "epochs": s.get("epochs"),
                          "curve": eval_curve(result["records"])})  # Its stable part prices WSD plans.
      logging.info("level %d lr x%g T=%d: loss %.4f, %.3g FLOPs", a.level, scale, steps, s["final_eval_loss"],
                   s["total_flops"])
      if a.out:
        _write(a.out, out)
  return out


def level_frontier(d: dict, name: str = "") -> Frontier:
  """The level's frontier: at each budget the best of its learning rates."""
  return candidate_from_runs(name or f"L{d['level']}", d["runs"]).frontier


def chain_name(d: dict) -> str:
  """A level-run file's model, named by its ``cycle.*`` settings (``L1 width_factor=1``)."""
  cycle = {k.split(".", 1)[1]: v for k, v in d.get("set", {}).items() if k.startswith("cycle.")}
  return f"L{d['level']}" + "".join(f" {k}={v}" for k, v in sorted(cycle.items()))


def _level_file(path: str, flag: str) -> dict:
  """A level-run JSON (step 1's --out) named by ``flag``, refused with what to give when unreadable or another file."""
  try:
    with open(path) as f:
      d = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise app.UsageError(f"{flag}: cannot read {path} ({e}); give the level-run JSONs that step 1 wrote "
                         f"(--out).") from None
  if not isinstance(d, dict) or not {"level", "model", "runs"} <= set(d):
    raise app.UsageError(f"{flag}: {path} is not a level-run JSON (step 1's --out, with 'level', 'model' and "
                         f"'runs'); a benchmarks.saving result goes to --target.")
  return d


def _chains(a, big: Frontier) -> tuple[dict, list[dict]]:
  """{name: chain of frontiers, smallest first, the target last} and the level files they come from."""
  if a.chain:
    files = []
    for entry in a.chain:  # 'a.json+b.json': one model's runs in several files (e.g. one per learning rate), pooled.
      parts = [_level_file(p, "--chain") for p in entry.split("+")]
      if any(d["model"] != parts[0]["model"] for d in parts):
        raise app.UsageError(f"--chain entry {entry}: its files ran different models; join one model's files only.")
      files.append(dict(parts[0], runs=[r for d in parts for r in d["runs"]]))
    fronts = [level_frontier(d, chain_name(d)) for d in files]
    chains = {f"2-level from {f.name}": [f, big] for f in fronts}
    if len(fronts) > 1:
      chains[f"{len(fronts) + 1}-level chain"] = fronts + [big]
    return chains, files


def target_frontier(paths: list[str]) -> tuple[Frontier, list[dict]]:
  """The target's frontier from saving-benchmark results: at each budget the lowest-loss scratch run (files of a
  learning-rate sweep give the tuned baseline)."""
  best = {}
  for p in paths:
    with open(p) as f:
      for b in json.load(f)["budgets"]:
        if b["steps"] not in best or b["scratch"]["final_eval_loss"] < best[b["steps"]]["scratch"]["final_eval_loss"]:
          best[b["steps"]] = b
  budgets = [best[k] for k in sorted(best)]
  pts = tuple((b["scratch"]["total_flops"], b["scratch"]["final_eval_loss"]) for b in budgets)
  return Frontier("L0 (target)", pts), budgets


def analyse(a) -> dict:
  if not a.target:
    raise app.UsageError("--target: give the saving-benchmark results whose scratch runs are the target's frontier.")
  big, budgets = target_frontier(a.target)
  if a.chain:
    chains, levels = _chains(a, big)
  else:
    chains, levels = _level_chains(a, big)
  rows = []
  for b in budgets:
    row = {"steps": b["steps"], "tokens_per_param": b["tokens_per_param"], "scratch_loss":
           b["scratch"]["final_eval_loss"]}
    for name, chain in chains.items():
      row[name] = bound_at(chain, b["scratch"]["final_eval_loss"])
    rows.append(row)
  measured = {}
  if a.methods:
    with open(a.methods) as f:
      for b in json.load(f)["budgets"]:
        for name, v in b["variants"].items():
          if v.get("frontier_flops_saving") is not None:
            measured.setdefault(name, []).append((b["tokens_per_param"], v["frontier_flops_saving"]))
  fronts = {f.name: f.points for chain in chains.values() for f in chain[:-1]}
  out = {"family": a.family, "target_frontier": big.points, "level_frontiers": fronts, "chains": list(chains),
         "levels": [{k: d[k] for k in ("command", "level", "model", "base_lr")} for d in levels],
         "budgets": rows, "measured": measured}
  return out


def _level_chains(a, big: Frontier) -> tuple[dict, list[dict]]:
  """The default plan's levels (``--levels_from``, files of one level pooled): the 2-level chain from level 1 and,
  given more levels, the whole chain."""
  by_level: dict[int, dict] = {}
  # Files of the same level (e.g. one per learning rate or budget range) pool their runs, listed apart or joined by +.
  for p in [q for entry in a.levels_from for q in entry.split("+")]:
    d = _level_file(p, "--levels_from")
    if d["level"] in by_level:
      if d["model"] != by_level[d["level"]]["model"]:
        raise app.UsageError(f"{p}: level {d['level']} was run with model {d['model']}, another file with "
                             f"{by_level[d['level']]['model']}; give one model per level.")
      by_level[d["level"]]["runs"] += d["runs"]
    else:
      by_level[d["level"]] = d
  if not by_level:
    raise app.UsageError("--levels_from: give at least one level-run JSON (step 1's --out).")
  levels = [by_level[k] for k in sorted(by_level, reverse=True)]  # Smallest model first.
  two = [level_frontier(d) for d in levels if d["level"] == 1] + [big]
  chains = {"2-level": two}
  if len(levels) > 1:
    chains[f"{len(levels) + 1}-level"] = [level_frontier(d) for d in levels] + [big]
  return chains, levels


def chain_names(d: dict) -> list[str]:
  """The chains a summary holds bounds of (older summaries: the keys ending in '-level')."""
  return d.get("chains") or [k for k in d["budgets"][0] if k.endswith("-level")]


def table(d: dict) -> str:
  names = chain_names(d)
  head = "| T | tokens/param | scratch loss | " + " | ".join(
      f"{n} bound (switch at loss; small's FLOPs)" for n in names) + " | best single model at equal loss |"
  lines = [head, "|" + "---|" * (4 + len(names))]
  for r in d["budgets"]:
    cells = [str(r["steps"]), f"{r['tokens_per_param']:.1f}", f"{r['scratch_loss']:.3f}"]
    env = "n/a"
    for n in names:
      b = r[n]
      if b is None:
        cells.append("outside the frontiers")
        continue
      sw = ", ".join("skip" if l is None else f"{l:.2f}" for l in b["switch_losses"])
      fl = ", ".join("-" if f is None else f"{f:.2g}" for f in b["switch_flops"])
      cells.append(f"{100 * b['bound_saving']:+.0f}% ({sw}; {fl})")
      env = f"{b['envelope_model']}: {100 * b['envelope_saving']:+.0f}%"
      if b.get("envelope_at_least"):
        n, x = max(b["envelope_at_least"].items(), key=lambda kv: kv[1])
        cells[-1] = f"unmeasured: {n}'s shortest run ends below this loss"
        env = f"{n}: at least {100 * x:+.0f}%"
    cells.append(env)
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot(d: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker  # noqa: F401  (matplotlib.ticker below)
  fig, ax = plt.subplots(1, 2, figsize=(13.5, 4.6))
  for name, pts in [("L0 (target)", d["target_frontier"])] + list(d["level_frontiers"].items()):
    ax[0].plot(*zip(*pts), marker="o", label=name)
  ax[0].set_xscale("log")
  ax[0].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # Decades only: minor labels overlap.
  ax[0].set_xlabel("training FLOPs")
  ax[0].set_ylabel("final eval loss (fully decayed scratch)")
  ax[0].legend()
  names = chain_names(d)
  styles = ["k-", "k--", "k-.", "k:"]
  for i, n in enumerate(names):
    ok = [r for r in d["budgets"] if r[n] is not None and not r[n].get("envelope_at_least")]
    if ok:
      ax[1].plot([r["tokens_per_param"] for r in ok], [r[n]["bound_saving"] for r in ok],
                 styles[i % len(styles)], lw=2 if i == 0 else 1.5, label=f"bound, {n}")
      if n == names[-1]:  # The longest chain holds every model: its envelope is the best single model.
        ax[1].plot([r["tokens_per_param"] for r in ok], [r[n]["envelope_saving"] for r in ok], "c:", lw=1.5,
                   label="best single model (envelope)")
  colors, markers = plt.get_cmap("tab20").colors, "osD^vP*Xh<>p"
  for i, (name, xs) in enumerate(sorted(d["measured"].items())):  # A color and a marker of its own per method.
    ax[1].plot(*zip(*sorted(xs)), marker=markers[i % len(markers)], color=colors[(2 * i) % 20 + (i // 10) % 2],
               lw=0.8, label=name)
  ax[1].axhline(0, color="gray", lw=0.8)
  ax[1].set_xscale("log")
  ax[1].xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())  # 3, 10, 20, 40: not 3x10^0 over 4x10^0.
  ax[1].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  ax[1].set_xticks(sorted({round(r["tokens_per_param"]) for r in d["budgets"]}))
  ax[1].set_xlabel("budget (tokens per parameter)")
  ax[1].set_ylabel("FLOPs saved vs the target's scratch frontier")
  ax[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def _write(path: str, obj: dict) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(obj, f, indent=1)
  os.replace(path + ".tmp", path)


def main(argv):
  del argv
  a = cli.parse(define_flags)
  if a.budgets:
    run_level(a)
  if a.levels_from or a.target or a.chain:
    d = analyse(a)
    print(table(d))
    if a.summary:
      _write(a.summary, d)
    if a.plot:
      plot(d, a.plot)
  elif not a.budgets:
    raise app.UsageError("Nothing to do: give --budgets (run a level's scratch frontier) and/or --levels_from with "
                         "--target (analyse).")


if __name__ == "__main__":
  cli.run(main, define_flags)
