"""Plots eval loss against FLOPs and against training seconds for several runs into one PNG.

  python -m experiments.plot runs/gpt-scratch runs/gpt-vcycle --out=runs/curves.png
"""

import os

from absl import app, flags

_OUT = flags.DEFINE_string("out", "curves.png", "Where to write the PNG.")
_LABELS = flags.DEFINE_list("labels", [], "Legend labels, one per run (default: the directory names).")


def eval_curve(records):
  """(flops, seconds, eval_loss) of every record with an eval loss, in order; transition events included."""
  out, flops, secs = [], 0.0, 0.0
  for r in records:
    flops = r.get("flops", flops)
    secs = r.get("train_seconds", secs)
    if "eval_loss" in r:
      out.append((flops, secs, r["eval_loss"]))
  return out


def plot_runs(workdirs, out, labels=None):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from multilevel.metrics import read_metrics
  labels = labels or [os.path.basename(os.path.normpath(w)) for w in workdirs]
  if len(labels) != len(workdirs):
    raise ValueError(f"--labels has {len(labels)} entries for {len(workdirs)} runs.")
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  for w, label in zip(workdirs, labels):
    curve = eval_curve(read_metrics(w))
    if not curve:
      raise ValueError(f"{w} has no evaluations in metrics.jsonl yet.")
    f, s, l = zip(*curve)
    axes[0].plot(f, l, label=label)
    axes[1].plot(s, l, label=label)
  axes[0].set_xlabel("training FLOPs")
  axes[1].set_xlabel("training seconds")
  for ax in axes:
    ax.set_ylabel("eval loss")
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=120)
  plt.close(fig)
  return out


def main(argv):
  if len(argv) < 2:
    raise app.UsageError("Give one or more run directories.")
  print(plot_runs(argv[1:], _OUT.value, _LABELS.value or None))


if __name__ == "__main__":
  from experiments.errors import one_line
  app.run(one_line(main, (app.UsageError, FileNotFoundError, ValueError)))
