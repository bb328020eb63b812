"""The saving benchmark's reports: the results table, the methods-by-budget table and the plot of a merge made by
``analyze_saving``."""

from __future__ import annotations

import os

from benchmarks import saving
from benchmarks.frontiers import frontier_points


def spread(v: dict, key: str) -> str:
  """' [lo, hi]' over the seeds when ``v`` is a mean over several (as percentages for savings), else ''."""
  vals = v.get("per_seed", {}).get(key)
  if not vals or any(x is None for x in vals):
    return ""
  lo, hi = min(vals), max(vals)
  return f" [{pct(lo)}, {pct(hi)}]" if "saving" in key else f" [{lo:.3f}, {hi:.3f}]"


def pct(x):
  return "n/a" if x is None else f"{100 * x:+.0f}%"


# Savings read off the curve and on the scratch frontier; the other columns are the saving script's.
COLUMNS: dict[str, saving.Cell] = {
    "T (steps)": saving.COLUMNS["steps"],
    "tokens/param": saving.COLUMNS["tokens/param"],
    "variant": saving.COLUMNS["variant"],
    "final loss (scratch)": saving.COLUMNS["final loss (scratch)"],
    "FLOPs used": lambda b, name, v: f"{v['flops_ratio_total']:.2f}x",
    "to reach scratch: FLOPs / s saved": lambda b, name, v: (f"{pct(v['flops_saving'])} / {pct(v['seconds_saving'])}"
                                                             if v["reached"] else
                                                             "n/a" if v["reached"] is None else "not reached"),
    "frontier: FLOPs / s saved":
        lambda b, name, v: (f"{pct(v['frontier_flops_saving'])}{spread(v, 'frontier_flops_saving')} / "
                            f"{pct(v['frontier_seconds_saving'])}{spread(v, 'frontier_seconds_saving')}"),
    "Δloss at equal FLOPs": saving.COLUMNS["loss diff at equal FLOPs"],
}


# Row names of the README's methods tables.
METHOD_NAMES = {"depth_zero": "V-cycle default (`depth_zero`)", "reference": "V-cycle, reference protocol",
                "gstack": "G_stack, g=4 (a 1-layer small model)", "gstack_g2": "G_stack, g=2",
                "stackbert": "StackBERT (1 -> 2 -> 4 layers)", "mslt": "MSLT (4 growth stages + a full stage)",
                "ligo": "LiGO (20 operator steps)", "msg": "MSG (FFN, layers, heads ramps)",
                "core": "CoRe (relaxed, then full)"}


def methods_table(d: dict) -> str:
  """Markdown: one row per variant, one column per budget that ran variants. A cell is final eval loss / FLOPs
  used relative to scratch at that T / FLOPs saved on the scratch frontier / seconds saved on it; outside the
  frontier's range it says which side (and, below it, the FLOPs saved to reach scratch's loss on the curve)."""
  bs = [b for b in d["budgets"] if b["variants"]]
  front = [p["final_eval_loss"] for p in frontier_points(d)]
  lowest, highest = min(front), max(front)
  head = f"method (mean of seeds {', '.join(map(str, d['seeds']))}; [min, max])" if d.get("seeds") else "method"
  rows = [f"| {head} | " + " | ".join(f"T={b['steps']} ({b['tokens_per_param']:.1f} tok/param; scratch "
                                      f"{b['scratch']['final_eval_loss']:.3f})" for b in bs) + " |",
          "|---" * (1 + len(bs)) + "|"]
  names = [n for n in METHOD_NAMES if any(n in b["variants"] for b in bs)]
  names += sorted({n for b in bs for n in b["variants"]} - set(names))
  for n in names:
    cells = []
    for b in bs:
      v = b["variants"].get(n)
      if v is None:
        cells.append("")
        continue
      head = f"{v['final_eval_loss']:.3f} / {v['flops_ratio_total']:.2f}x"
      fs, ss = v["frontier_flops_saving"], v["frontier_seconds_saving"]
      env = ""
      if "envelope_flops_saving" in v:
        es = v["envelope_flops_saving"]
        env = " / envelope: " + ("n/a" if es is None else f"{'<= ' if v['envelope_at_most'] else ''}{pct(es)}"
                                 f"{'' if v['envelope_model'] == 'target' else ' (' + v['envelope_model'] + ')'}")
      if fs is not None:
        bold = "**" if fs > 0 else ""
        cells.append(f"{head} / {bold}{pct(fs)}{bold}{spread(v, 'frontier_flops_saving')} / {pct(ss)}"
                     f"{spread(v, 'frontier_seconds_saving')}{env}")
      elif v["final_eval_loss"] > highest:
        cells.append(f"{head} / worse than every scratch point")
      elif v["final_eval_loss"] < lowest:
        reach = f" (to reach scratch: {pct(v['flops_saving'])})" if v.get("reached") else ""
        cells.append(f"{head} / below the frontier{reach}")
      else:
        cells.append(f"{head} / n/a")
    rows.append(f"| {METHOD_NAMES.get(n, n)} | " + " | ".join(cells) + " |")
  return "\n".join(rows)


def run_curves(d: dict, workroot=None) -> dict:
  """``{(run, budget steps): [(FLOPs, seconds, eval loss), ...]}``: the target model's evaluations of scratch and of
  each variant at each budget, read from the run's workdir under ``workroot`` (one folder or several) where it is
  there, else from the curves the results file keeps (a scratch run reused from another file with --scratch_from,
  or a workroot wiped since), so that both curve panels show every run."""
  from multilevel.metrics import read_metrics
  roots = [workroot] if isinstance(workroot, str) else list(workroot or [])
  out = {}
  for b in d["budgets"]:
    for name in ["scratch"] + list(b["variants"]):
      found = [os.path.join(r, f"{d['family']}-{b['steps']}-{name}") for r in roots]
      found = [w for w in found if os.path.exists(os.path.join(w, "metrics.jsonl"))]
      if found:
        pts = [tuple(p) for p in saving.curve(read_metrics(found[0]))]
      elif name == "scratch":
        pts = [tuple(p) for p in b.get("scratch_curve") or []]
      else:  # compare()'s rows: FLOPs, seconds, eval loss, level; the target model's are level 0.
        pts = [(f, s, l) for f, s, l, level in b["variants"][name].get("curve") or [] if level == 0]
      if pts:
        out[(name, b["steps"])] = pts
  return out


def plot(d, path, workroot):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(1, 3, figsize=(17, 4.8))
  variants = sorted({n for b in d["budgets"] for n in b["variants"]})
  for name in variants:
    xs = [(b["tokens_per_param"], b["variants"][name]["frontier_flops_saving"]) for b in d["budgets"]
          if name in b["variants"] and b["variants"][name]["frontier_flops_saving"] is not None]
    if xs:
      ax[0].plot(*zip(*xs), marker="o", label=name)
  ax[0].axhline(0, color="k", lw=0.8)
  ax[0].set_xscale("log")
  ax[0].set_xlabel("budget (tokens per parameter)")
  ax[0].set_ylabel("FLOPs saved vs scratch frontier")
  ax[0].legend()
  for (name, steps), pts in run_curves(d, workroot).items():
    f, s, l = zip(*pts)
    style = "-" if name == "scratch" else "--"
    ax[1].plot(f, l, style, label=f"{name} T={steps}")
    ax[2].plot(s, l, style, label=f"{name} T={steps}")
  _plot_frontier(ax[1], d)
  for a, lab in ((ax[1], "training FLOPs"), (ax[2], "training seconds")):
    a.set_xlabel(lab)
    a.set_ylabel("eval loss (target model)")
    a.set_xscale("log")
    if a.get_legend_handles_labels()[0]:
      a.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def _plot_frontier(ax, d) -> None:
  """The scratch frontier's points (final losses against FLOPs) and, with ``--fit``, the fitted E + A F^-a over the
  points it was fitted to; the variants' final losses beside them."""
  import numpy as np
  pts = frontier_points(d)
  if not pts:
    return
  ax.plot([p["total_flops"] for p in pts], [p["final_eval_loss"] for p in pts], "ko", label="scratch frontier")
  fit = d.get("frontier_fit")
  if fit:
    used = [p["total_flops"] for p in pts if p["steps"] >= fit.get("min_steps", 0)]
    f = np.geomspace(min(used), max(used), 100)
    e, a_, k = fit["flops"]["E"], fit["flops"]["A"], fit["flops"]["a"]
    ax.plot(f, e + a_ * f ** -k, "k-", lw=1.2,
            label=f"fit {e:.2f} + {a_:.3g} F^-{k:.3f} (rms {fit['flops']['rms']:.3f})")
  finals = [(v["total_flops"], v["final_eval_loss"]) for b in d["budgets"] for v in b["variants"].values()]
  if finals:
    ax.plot(*zip(*finals), "kx", ms=6, label="variants' final losses")
