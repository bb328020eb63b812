"""Plots runs' evaluations against FLOPs and against seconds into one PNG, and compares them in a table.

  python -m experiments.plot runs/gpt-scratch runs/gpt-vcycle --out=runs/curves.png [--table] [--metric=eval_loss]

Each run's target model (level 0) is the solid line with a marker at each evaluation, read as the savings in the
README are read (``multilevel.metrics.eval_curve``); the faint dashed line is the whole run, its smaller models'
evaluations included, and a dotted vertical line on the FLOPs axis marks each change of level. Seconds are the
training steps' plus the level changes' (compiles and evaluations excluded). ``--table`` prints, for each run, the FLOPs and seconds it took
to reach the first run's final value, and its final value beside the first run's at the same FLOPs ('-' where that
lies outside the first run's curve). A run without a summary.json is labelled in progress: its "final" is its latest.
"""

import json
import os

from absl import app, flags

_OUT = flags.DEFINE_string("out", "curves.png", "Where to write the PNG.")
_LABELS = flags.DEFINE_list("labels", [], "Legend labels, one per run (default: the directory name, the method and "
                            "the number of levels).")
_METRIC = flags.DEFINE_enum("metric", "eval_loss", ["eval_loss", "eval_accuracy"], "What to plot.")
_LOGX = flags.DEFINE_bool("logx", False, "Logarithmic FLOPs and seconds axes.")
_TABLE = flags.DEFINE_bool("table", False, "Also print the FLOPs and seconds each run took to reach the first run's "
                           "final value, and each run's final value beside the first run's at the same FLOPs.")


def _run_info(workdir: str) -> dict:
  """The run's family, method and levels, from summary.json (a finished run) or run.json (one in progress)."""
  for name in ("summary.json", "run.json"):
    path = os.path.join(workdir, name)
    if os.path.exists(path):
      try:
        with open(path, encoding="utf-8") as f:
          d = json.load(f)
      except (OSError, ValueError):
        continue
      cfg = d.get("config", {})
      return {"family": d.get("model", cfg.get("model", {})).get("family"),
              "method": d.get("method", cfg.get("cycle", {}).get("method")),
              "levels": d.get("levels", cfg.get("cycle", {}).get("levels"))}
  return {}


def _label(workdir: str, info: dict) -> str:
  name = os.path.basename(os.path.normpath(workdir))
  running = "" if os.path.exists(os.path.join(workdir, "summary.json")) else ", in progress"
  if not info.get("method"):
    return name + (f" ({running[2:]})" if running else "")
  scratch = info["method"] == "vcycle" and info.get("levels") == 1
  return (f"{name} (scratch{running})" if scratch else
          f"{name} ({info['method']}, {info.get('levels')} levels{running})")


def _changes(records) -> list[float]:
  """The FLOPs at which the trained level changes."""
  out, level, flops = [], None, 0.0
  for r in records:
    if "flops" in r:
      if level is not None and r["level"] != level:
        out.append(flops)
      level, flops = r["level"], r["flops"]
  return out


def plot_runs(workdirs, out, labels=None, metric="eval_loss", logx=False):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from absl import logging

  from multilevel.metrics import eval_curve, read_metrics
  infos = [_run_info(w) for w in workdirs]
  labels = labels or [_label(w, i) for w, i in zip(workdirs, infos)]
  if len(labels) != len(workdirs):
    raise ValueError(f"--labels has {len(labels)} entries for {len(workdirs)} runs.")
  families = sorted({i["family"] for i in infos if i.get("family")})
  if len(families) > 1:
    logging.warning("The runs are of different families (%s): their losses are not on one scale.", ", ".join(families))
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  curves = []
  for k, (w, label) in enumerate(zip(workdirs, labels)):
    records = read_metrics(w)
    target = eval_curve(records, target_only=True, metric=metric)
    if not target:
      what = "evaluations of its target model" if eval_curve(records, False, metric) else "evaluations"
      raise ValueError(f"{w} has no {what} ({metric}) in metrics.jsonl yet.")
    curves.append((label, target))
    color = f"C{k}"
    whole = eval_curve(records, target_only=False, metric=metric)  # Every level's evaluations, in order.
    for ax, x in ((axes[0], 0), (axes[1], 1)):
      if len(whole) > len(target):
        ax.plot([p[x] for p in whole], [p[2] for p in whole], color=color, ls="--", alpha=0.4, marker=".")
      ax.plot([p[x] for p in target], [p[2] for p in target], color=color, marker="o", ms=3.5, label=label)
    for f in _changes(records):
      axes[0].axvline(f, color=color, ls=":", alpha=0.5)
  axes[0].set_xlabel("training FLOPs (smaller models' included)")
  axes[1].set_xlabel("seconds: training steps + level changes (no compiles, no evaluations)")
  name = metric.replace("_", " ")
  for ax in axes:
    ax.set_ylabel(f"{name} (target model; dashed: every level)")
    ax.grid(alpha=0.3)
    if logx:
      ax.set_xscale("log")
    ax.legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=120)
  plt.close(fig)
  return out, curves


def table(curves, metric="eval_loss") -> str:
  """Each run against the first: the FLOPs and seconds to reach the first run's final value (lower is better for a
  loss, higher for an accuracy), and the run's final value beside the first run's at the same FLOPs."""
  from multilevel.metrics import reach, value_at
  sign = -1.0 if metric == "eval_accuracy" else 1.0  # reach() looks for a falling curve.
  base_label, base = curves[0]
  goal, budget = base[-1][2], base[-1][0]
  lines = [f"to reach {metric} {goal:.4f}, the final value of {base_label}; each run's final value, and the first "
           f"run's at the same FLOPs:",
           f"{'run':<40} {'FLOPs':>11} {'x first':>8} {'seconds':>9} {'x first':>8} {'final':>9} {'first':>9}"]
  for label, pts in curves:
    hit = reach([(f, s, sign * v) for f, s, v in pts], sign * goal)
    first = value_at(base, pts[-1][0]) if base[0][0] <= pts[-1][0] <= budget else float("nan")
    if hit is None:
      cost = f"{'not reached':>11} {'':>8} {'':>9} {'':>8}"
    else:
      cost = f"{hit[0]:>11.3g} {hit[0] / budget:>8.2f} {hit[1]:>9.1f} {hit[1] / base[-1][1]:>8.2f}"
    first_cell = "-" if first != first else f"{first:.4f}"  # NaN: this run ends outside the first run's curve.
    lines.append(f"{label[:40]:<40} {cost} {pts[-1][2]:>9.4f} {first_cell:>9}")
  return "\n".join(lines)


def main(argv):
  if len(argv) < 2:
    raise app.UsageError("Give one or more run directories.")
  out, curves = plot_runs(argv[1:], _OUT.value, _LABELS.value or None, _METRIC.value, _LOGX.value)
  print(out)
  if _TABLE.value:
    print(table(curves, _METRIC.value))


if __name__ == "__main__":
  from experiments.errors import one_line
  app.run(one_line(main, (app.UsageError, FileNotFoundError, ValueError)))
