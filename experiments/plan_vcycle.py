"""The plan command's V-cycle inputs read from earlier runs: the WSD settings (the target's stable curve and the
growth rates, given or measured) and the loss jump at a hand-over."""

from __future__ import annotations

import os

from absl import app


def wsd_settings(base, target_curve, record: dict, target_from: list[str], rates_given: list[str],
                 rates_from: list[str]):
  """The ``planner.Wsd`` of this config: the target's stable curve (its longest pilot's, or the longest scratch run
  of ``target_from``: --target_from) and the growth rates (``rates_given``: --growth_rates, then ``rates_from``:
  --growth_rates_from), kept in ``record``."""
  from multilevel.cycles import growth, planner
  from multilevel.metrics import read_metrics
  cool = float(base.train.cooldown_frac)
  try:
    if target_curve is None:
      stable = planner.target_stable_from_saving(target_from, cool)
    else:
      stable = growth.stable_curve("target (stable)", target_curve)
  except (ValueError, OSError) as e:
    raise app.UsageError(f"the target's stable curve: {e}") from None
  rates = {}
  for kind, value in _pairs(rates_given, "--growth_rates"):
    try:
      rates[kind] = float(value)
    except ValueError:
      raise app.UsageError(f"--growth_rates: {kind}={value} is not a number.") from None
  for kind, workdirs in _pairs(rates_from, "--growth_rates_from"):
    measured = []
    for w in workdirs.split("+"):
      if not os.path.exists(os.path.join(w, "metrics.jsonl")):
        raise app.UsageError(f"--growth_rates_from={kind}={w}: no metrics.jsonl there (a run's workdir is expected).")
      r = growth.rate_from_records(read_metrics(w), stable)
      if r is None:
        raise app.UsageError(f"--growth_rates_from={kind}={w}: no growth followed by evals at the target's peak "
                             f"rate on the target's stable curve; is it a V-cycle run of this config?")
      measured.append(dict(r, workdir=w))
    used = [r for r in measured if growth.enough_evals(r)]
    if not used:
      raise app.UsageError(
          f"--growth_rates_from={kind}={workdirs}: the target of each run has fewer than {growth.MIN_EVALS} evals "
          f"between its growth and its cool-down ({[r['evals'] for r in measured]}), too few for eval noise not to "
          f"decide the rate; read it off runs with a longer target stage or more evals (train.eval_every), or give "
          f"--growth_rates={kind}=RATE.")
    rates[kind] = sum(r["rate"] for r in used) / len(used)  # The runs' mean (seeds, or plan and V-cycle).
    record.setdefault("growth_rates_measured", {})[kind] = {
        "rate": rates[kind], "runs": measured, "too_few_evals": [r["workdir"] for r in measured if r not in used]}
  try:
    settings = planner.Wsd(stable, cool, rates, float(base.cycle.transition_warmup_frac),
                           float(base.train.warmup_frac))
  except ValueError as e:
    raise app.UsageError(f"--growth_rates: {e}") from None
  record["wsd"] = {"target_stable": stable.points, "cooldown_frac": cool, "growth_rates": rates}
  return settings


def _pairs(items: list[str], flag: str) -> list[tuple[str, str]]:
  from multilevel.cycles.planner import GROWTHS
  out = []
  for kv in items:
    kind, eq, value = kv.partition("=")
    if not eq or kind not in GROWTHS:
      raise app.UsageError(f"{flag} takes GROWTH=VALUE with GROWTH one of {list(GROWTHS)}, got {kv!r}.")
    out.append((kind, value))
  return out


def measured_jump(workdirs: list[str], record: dict) -> float:
  """The mean loss jump at the growths of earlier runs (``planner.handover_jumps``; at least 0), kept in
  ``record``."""
  from multilevel.cycles import planner
  from multilevel.metrics import read_metrics
  jumps = []
  for w in workdirs:
    if not os.path.exists(os.path.join(w, "metrics.jsonl")):
      raise app.UsageError(f"--handover_jump_from={w}: no metrics.jsonl there (a run's workdir is expected).")
    found = planner.handover_jumps(read_metrics(w))
    if not found:
      raise app.UsageError(f"--handover_jump_from={w}: the run has no growth with an eval on both sides of it.")
    jumps += [dict(j, workdir=w) for j in found]
  record["handover_jumps"] = jumps
  return max(0.0, planner.mean_jump(jumps))
