"""The shallower models of the stacking tests (tests/test_stack_planner.py, tests/test_stack_rates.py): their stable
curves and candidates, a stacked run's eval curve, and the result files the plan command reads."""

import json

from multilevel.cycles import planner
from multilevel.cycles.pilots import Candidate

from wsd_curves import DECAYED, STABLE, STEP, loglinear

# A quarter-depth and a half-depth model at the target's rate: each cheaper per step, each stops paying at a higher
# loss than the next deeper one.
QUARTER = loglinear("quarter stable", 6.0, 3.6, 20 * STEP, 3.0)
HALF = loglinear("half stable", 6.0, 3.3, 45 * STEP, 2.4)
Q_STEP, H_STEP = 0.4 * STEP, 0.6 * STEP


def level(name, stable, step, lr_scale=1.0, steps=4000):
  return Candidate(name, planner.Frontier(name, tuple((f, l - 0.3) for f, l in stable.points)), step, lr_scale,
                   stable=stable, stable_steps=steps, model={"model.num_layers": 1 if name == "quarter" else 2})


LEVELS = [level("quarter", QUARTER, Q_STEP), level("half", HALF, H_STEP)]


def grown_curve(rate, start_loss=5.0, hand_flops=1e12, level=1, stable=HALF, step=H_STEP, n=6, delay=0.0):
  """Eval rows (FLOPs, seconds, loss, level) of a run that hands over at ``start_loss`` into a model that, ``delay``
  steps after the growth, has got as far as from that loss as its scratch run had, then moves ``rate`` times as fast
  as it (every 100 of its steps an eval)."""
  rows = [[hand_flops, 0.0, start_loss, level + 1]]
  for k in range(1, n + 1):
    rows.append([hand_flops + k * 100 * step, 0.0,
                 stable.loss_at(stable.cost(start_loss) + rate * (k * 100 - delay) * step), level])
  return rows


def write_files(tmp_path):
  """The target's scratch results and the two shallower models' level runs (each at rates 1 and 2, in two files
  pooled as 'a.json+b.json'), as benchmarks.saving and benchmarks.bound write them."""
  target = tmp_path / "target.json"
  curve = [[f, 0.0, l] for f, l in STABLE.points]
  target.write_text(json.dumps({"family": "gpt", "budgets": [
      {"steps": round(f / STEP), "scratch": {"total_flops": f, "final_eval_loss": l},
       **({"scratch_curve": [c for c in curve if c[0] <= 0.8 * f] + [[f, 0.0, l]]} if i == len(DECAYED.points) - 1
          else {})} for i, (f, l) in enumerate(DECAYED.points)]}))
  files = []
  for lv, (name, stable, step, layers) in enumerate((("q", QUARTER, Q_STEP, 1), ("h", HALF, H_STEP, 2))):
    pooled = []  # Each model's runs at the two rates in two files, pooled as 'a.json+b.json'.
    for s in (1, 2):
      path = tmp_path / f"{name}{s}.json"
      path.write_text(json.dumps({"level": 2 - lv, "model": {"model.num_layers": layers},
                                  "set": {"cycle.width_factor": "1", "train.warmup_frac": "0.025"}, "runs": [
          {"steps": round(f / step), "lr_scale": s, "total_flops": f, "final_eval_loss": l - 0.3 + (s - 1) * 0.01,
           **({"curve": [[g, m, 1e-3] for g, m in stable.points]} if i == 8 else {})}
          for i, (f, l) in enumerate(stable.points)]}))
      pooled.append(str(path))
    files.append("+".join(pooled))
  return target, files
