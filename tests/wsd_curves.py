"""Synthetic curves for the WSD pricing and planner tests: log-linear stable curves of a target and a small model, the
target's decayed frontier, and the metrics of a grown run whose target learns at a given rate."""

import math

from multilevel.cycles.frontier import Frontier
from multilevel.cycles.planner import Candidate


def loglinear(name, l_hi, l_lo, f_at_hi, per_nat, n=9):
  pts = [(f_at_hi * math.exp(per_nat * i * (l_hi - l_lo) / (n - 1)), l_hi - (l_hi - l_lo) * i / (n - 1))
         for i in range(n)]
  return Frontier(name, tuple(pts))


STEP = 1e9
# The target's stable curve: 100 steps reach 6.0, ~40000 steps reach 3.0 (log-linear, 2 nats^-1).
STABLE = loglinear("target stable", 6.0, 3.0, 100 * STEP, 2.0)
# Its decayed frontier: the cool-down takes 0.3 nats off wherever it starts.
DECAYED = Frontier("target", tuple((f, l - 0.3) for f, l in STABLE.points))
# The small model at peak rate: a quarter of the target's cost at 6.0, its step a quarter; its cost grows faster as the
# loss falls (2.6 per nat), so it stops paying below about 4.1 (where the target's curve falls 2.6/2 as fast per FLOP).
SMALL = loglinear("small stable", 6.0, 3.5, 25 * STEP, 2.6)


def records_of_a_grown_run(rate):
  """Metrics of a 2-level V-cycle whose target, grown at 5.0 with 1e12 FLOPs spent, moves ``rate`` times as fast on
  STABLE as scratch, then cools down (lower rate, lower loss: not part of the rate)."""
  start = 1e12
  recs = [{"step": 400, "stage": 1, "level": 1, "event": "end_of_stage", "eval_loss": 5.0, "flops": start},
          {"step": 400, "stage": 2, "level": 0, "event": "after_decoalesce", "eval_loss": 5.0}]
  for k in range(1, 9):
    f = start + k * 100 * STEP
    lr = 1e-3 if k <= 6 else 1e-4 * (9 - k)
    loss = STABLE.loss_at(STABLE.cost(5.0) + rate * k * 100 * STEP) - (0.2 if k > 6 else 0.0)
    recs.append({"step": 400 + 100 * k, "stage": 2, "level": 0, "lr": lr, "flops": f, "eval_loss": loss})
  return recs


def candidate(name, stable, step, cycle):
  return Candidate(name, Frontier(name, tuple((f, l - 0.3) for f, l in stable.points)), step, 2.0, cycle,
                   stable=stable)
