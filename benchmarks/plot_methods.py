"""One figure of every method on every family: FLOPs saved on the scratch frontier against the budget.

  python -m benchmarks.plot_methods benchmarks/results/methods_gpt_summary.json \
      benchmarks/results/methods_bert_summary.json benchmarks/results/methods_deit_summary.json \
      --out=benchmarks/results/methods_all.png

The inputs are ``benchmarks.analyze_saving`` summaries (one per family). One panel per family, one line per method,
the x axis in tokens per parameter; a point is missing where the method's final loss lies outside the frontier's
range (worse than every scratch point, or better than the longest one: see the family's table).
"""

from __future__ import annotations

import json

from absl import flags

from benchmarks import cli

# The README tables' row names.
LABELS = {
    "depth_zero": "V-cycle default", "reference": "V-cycle reference", "gstack": "G_stack g=4",
    "gstack_g2": "G_stack g=2", "stackbert": "StackBERT", "mslt": "MSLT", "ligo": "LiGO", "msg": "MSG",
    "core": "CoRe", "depth_zero_w0": "V-cycle, w_pre=0 (tied copies)",
}


def define_flags(fv: flags.FlagValues) -> None:
  """Declares this script's flags on ``fv``; the summaries are its arguments."""
  flags.DEFINE_string("out", "benchmarks/results/methods_all.png", "PNG to write.", flag_values=fv)


def series(summary: dict) -> dict[str, list[tuple[float, float]]]:
  """{variant: [(tokens/param, frontier FLOPs saving), ...]} over the budgets where the saving is defined."""
  out: dict[str, list[tuple[float, float]]] = {}
  for b in summary["budgets"]:
    for name, v in b["variants"].items():
      s = v.get("frontier_flops_saving")
      if s is not None:
        out.setdefault(name, []).append((b["tokens_per_param"], s))
  return {k: sorted(v) for k, v in out.items()}


def main(argv):
  a = cli.parse(define_flags)
  if not argv[1:]:
    raise SystemExit("Pass one or more analyze_saving summaries (methods_<family>_summary.json).")
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  summaries = []
  for p in argv[1:]:
    with open(p) as f:
      summaries.append(json.load(f))
  fig, axes = plt.subplots(1, len(summaries), figsize=(5.2 * len(summaries), 4.4), squeeze=False, sharey=True)
  names = sorted({n for s in summaries for b in s["budgets"] for n in b["variants"]})
  colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
  for ax, s in zip(axes[0], summaries):
    for name, pts in series(s).items():
      ax.plot(*zip(*[(x, 100 * y) for x, y in pts]), marker="o", color=colors[name], label=LABELS.get(name, name))
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_title(s["family"])
    ax.set_xlabel("budget (tokens per parameter)")
    ax.legend(fontsize=7)
  axes[0][0].set_ylabel("FLOPs saved on the scratch frontier (%)")
  fig.tight_layout()
  fig.savefig(a.out, dpi=110)
  print(f"Wrote {a.out}")


if __name__ == "__main__":
  cli.run(main, define_flags, positional=True)
