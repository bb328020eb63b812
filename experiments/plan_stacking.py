"""The plan command's stacking part: the shallower models a stacking plan grows through (pilots or level-run files),
the rates and delays of its doublings, and ``multilevel.cycles.stack_planner.plan_stack`` with the pilots' cost."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable

from absl import app, flags, logging


@dataclasses.dataclass(frozen=True)
class Settings:
  """The stacking flags of ``experiments.plan``, checked and parsed (what ``define_flags``'s reader returns)."""
  doublings: int
  rates: list[float]
  delays: list[float]
  rates_at: list[float]
  span: float
  min_target: float
  min_stage: float
  rates_from: list[str]
  curve_rows: list[dict]
  curve_kind: str
  stack_from: list[str]


def define_flags(fv: flags.FlagValues) -> Callable[[], Settings]:
  """Defines the stacking flags of ``experiments.plan`` on ``fv``; returns their reader: the values as ``Settings``,
  or a usage error naming the bad flag (called before any pilot trains)."""
  d = lambda define, *args: define(*args, flag_values=fv)
  doublings = d(flags.DEFINE_integer, "stack_doublings", 2, "Most depth doublings of a stacking plan (2: the "
                "target's depth / 4, then / 2, then the target).")
  rates = d(flags.DEFINE_list, "stack_rates", [], "R,...: how fast each stacked model learns from the loss before "
            "its doubling, as a fraction of its scratch run's pace, one per doubling (the "
            "shallowest growth first, the target's last; default 1 each). GPT on gcide measured "
            "1.49,0.927 with --stack_delays=43.5,25.9; on Shakespeare 0.961,1.26 with 12.1,62.2 "
            "(benchmarks.stack_rates; benchmarks/SAVINGS.md).")
  delays = d(flags.DEFINE_list, "stack_delays", [], "D,...: steps each stacked model first spends recovering from "
             "its doubling before it learns at its rate, one per doubling (default 0 each).")
  rates_at = d(flags.DEFINE_list, "stack_rates_at", [], "L,...: the loss before each doubling that its rate was "
               "measured from (benchmarks.stack_rates prints them), one per doubling: the plan "
               "says where it hands over far from them (a rate holds near where it was measured).")
  span = d(flags.DEFINE_float, "stack_rates_span", 0.0, "With the losses the rates were measured from "
           "(--stack_rates_at or --stack_rates_from): price only chains whose every "
           "hand-over lies within this factor (> 1, either way) of the measured one on the "
           "shallower model's own curve, where the rates hold (0: anywhere, with a note "
           "past 2x).")
  min_target = d(flags.DEFINE_float, "stack_min_target_frac", 0.05, "Fewest steps a stacking plan leaves the "
                 "target, as a share of --steps (its cool-down is always inside them).")
  min_stage = d(flags.DEFINE_float, "stack_min_stage_frac", 0.05, "Fewest steps each shallower model of a stacking "
                "plan trains, as a share of --steps: only chains whose every stage is that "
                "long are priced (the rates are measured on real stages, not a step or two).")
  rates_from = d(flags.DEFINE_list, "stack_rates_from", [], "Workdirs of earlier cycle.method=stackbert runs of "
                 "this config: each doubling they measured gets its rate, delay and loss before "
                 "it from them (fitted on the pilots' stable curves, the mean over the runs) "
                 "instead of --stack_rates, --stack_delays and --stack_rates_at; one they did "
                 "not (fewer than 3 evals of it before the cool-down) keeps those flags' "
                 "values.")
  rate_curves_ = d(flags.DEFINE_list, "stack_rate_curves", [], "Files benchmarks.stack_rates wrote (--out): every "
                   "doubling they measured is priced off a rate curve through all its "
                   "measurements (rate and delay against where the shallower model handed over, "
                   "multilevel.cycles.growth_curves) instead of one rate, so a plan that hands "
                   "over earlier or later than the runs did is priced at what they measured there; "
                   "with --stack_rates_span, only within that factor of the measured hand-overs.")
  curve_kind = d(flags.DEFINE_enum, "stack_curve_kind", "rate", ["rate", "trajectory"], "What --stack_rate_curves "
                 "interpolates: each growth's fitted rate and delay ('rate'), or the way it "
                 "went, eval by eval ('trajectory': a stacked model that speeds up over its "
                 "stage is priced as it went, not as a straight line through it).")
  stack_from = d(flags.DEFINE_list, "stack_from", [], "Instead of the stacking pilots: benchmarks.bound level-run "
                 "files of the shallower models (runs at --lr_scales=1 with curves, under WSD), one per depth.")

  def read() -> Settings:
    for flag in (min_target, min_stage):
      if not 0 < flag.value < 1:
        raise app.UsageError(f"--{flag.name} is a share of the steps in (0, 1), got {flag.value}.")
    if doublings.value < 1:
      raise app.UsageError(f"--stack_doublings must be 1 or more, got {doublings.value}.")
    check_span(span.value, rates_at.value or rates_from.value or rate_curves_.value)
    return Settings(doublings.value, float_list(rates.value, "--stack_rates"),
                    float_list(delays.value, "--stack_delays", zero=True),
                    float_list(rates_at.value, "--stack_rates_at", what="finite positive losses"),
                    span.value, min_target.value, min_stage.value, rates_from.value,
                    curve_rows(rate_curves_.value), curve_kind.value, stack_from.value)
  return read


def float_list(values: list, flag: str, zero: bool = False, what: str = "") -> list[float]:
  """``values`` as floats, each finite and positive (>= 0 with ``zero``), or a usage error naming ``flag`` and
  ``what`` it takes."""
  try:
    out = [float(v) for v in values]
  except ValueError:
    out = [math.nan]
  if not all(math.isfinite(v) and (v >= 0 if zero else v > 0) for v in out):
    what = what or ("finite numbers of steps >= 0" if zero else "finite positive rates (1 = as fast as scratch)")
    raise app.UsageError(f"{flag}={','.join(values)}: give {what}.")
  return out


def check_span(span: float, losses_given) -> None:
  """--stack_rates_span: 0 (anywhere) or a factor above 1, and only with the losses the rates were measured from
  (``losses_given``: --stack_rates_at or --stack_rates_from). Refused before any pilot trains."""
  if span and not span > 1:
    raise app.UsageError(f"--stack_rates_span is a factor above 1 (2: half to twice as far along the curve as where "
                         f"the rates were measured) or 0 (anywhere), got {span}.")
  if span and not losses_given:
    raise app.UsageError("--stack_rates_span keeps each hand-over near where its rate was measured: give those "
                         "losses (--stack_rates_at, which benchmarks.stack_rates prints) or --stack_rates_from.")


def curve_rows(paths: list[str]) -> list[dict]:
  """The measured doublings of --stack_rate_curves files (``benchmarks.stack_rates --out``): their rows with enough
  evals to price with, each tagged with its file. Refused before any pilot trains: a missing or unreadable file, one
  that is not stack_rates output, or files with no usable row."""
  import json
  rows = []
  for p in paths:
    try:
      with open(p) as f:
        d = json.load(f)
    except (OSError, ValueError) as e:
      raise app.UsageError(f"--stack_rate_curves={p}: cannot read it ({e}).") from None
    if not isinstance(d, dict) or not isinstance(d.get("rows"), list) or not all(
        isinstance(r, dict) and {"level", "handover_loss", "rate", "delay", "used"} <= set(r) for r in d["rows"]):
      raise app.UsageError(f"--stack_rate_curves={p}: not a benchmarks.stack_rates result (no 'rows' of measured "
                           f"doublings); write one with python -m benchmarks.stack_rates --out=FILE.")
    rows += [{**r, "file": p} for r in d["rows"] if r["used"]]
  if paths and not rows:
    raise app.UsageError(f"--stack_rate_curves={','.join(paths)}: no doubling there was measured on enough evals "
                         f"to price with; give runs whose stacked models evaluate at least 3 times before the "
                         f"cool-down.")
  return rows


def rate_curves(rows: list[dict], levels, kind: str = "rate") -> tuple[list, list[str], list[dict]]:
  """Per doubling of the chain into the target (``levels`` shallowest first; doubling j grows into level n-1-j, 0
  the target), the ``growth_curves.RateCurve`` (``kind`` 'rate') or ``TrajectoryCurve`` ('trajectory') through
  ``rows`` (``curve_rows``) over the stable curve of the model it grows from, or None where no row measured it; the
  names of the doublings left without one; and the rows left out because they handed over at a loss that model's
  stable curve does not measure (a run that got further than the pilot cannot be placed on it; a longer pilot
  places it)."""
  from multilevel.cycles.growth_curves import RateCurve, TrajectoryCurve
  n = len(levels)
  deep = sorted({r["level"] for r in rows if not 0 <= r["level"] < n})
  if deep:
    raise app.UsageError(f"--stack_rate_curves measured growths into level(s) {deep}, and this chain of {n} "
                         f"doubling(s) has levels 0 to {n - 1}: give rates of runs of this target's chain.")
  names = [c.name for c in levels[1:]] + ["the target"]
  curves, missing, off = [], [], []
  for j, c in enumerate(levels):
    name = f"{c.name} -> {names[j]}"
    lo, hi = c.stable.loss_range
    on = lambda r: c.stable.cost(r["handover_loss"]) is not None  # (What growth_curves places on the curve.)
    mine = [r for r in rows if r["level"] == n - 1 - j and on(r)]
    off += [{"doubling": name, "run": r.get("run"), "handover_loss": r["handover_loss"], "curve": [lo, hi]}
            for r in rows if r["level"] == n - 1 - j and not on(r)]
    if not mine:
      curves.append(None)
      missing.append(names[j])
      continue
    try:
      if kind == "trajectory":
        if not all(r.get("trajectory") for r in mine):
          raise ValueError(f"{name}: a row with no trajectory (a stack_rates file written before they were kept); "
                           f"write it again with python -m benchmarks.stack_rates")
        curves.append(TrajectoryCurve.from_measurements(name, c.stable, [(r["handover_loss"], [(t, q) for t, _, q in
                                                                                              r["trajectory"]])
                                                                         for r in mine]))
      else:
        curves.append(RateCurve.from_measurements(name, c.stable, [(r["handover_loss"], r["rate"], r["delay"])
                                                                   for r in mine]))
    except ValueError as e:
      raise app.UsageError(f"--stack_rate_curves: {e}") from None
  return curves, missing, off


def levels_from_files(paths: list[str], lr: float | None, layers: int | None = None) -> list:
  """The shallower models of a chain of doublings from their level-run files (--stack_from), shallowest first, named
  by depth ('1-layer', ...), their rates rescaled to ``lr`` (None: as run); a usage error unless each is half as
  deep as the next and, with ``layers`` (the target's depth), the deepest half of it."""
  from multilevel.cycles import planner
  try:
    found = [planner.candidate_from_bound(p, lr, True, lr_scale=1.0) for p in paths]
  except (ValueError, OSError) as e:
    raise app.UsageError(f"--stack_from: {e}") from None
  depth = lambda c: int(c.model.get("model.num_layers", layers or 0))
  found = sorted((dataclasses.replace(c, name=f"{depth(c)}-layer") for c in found), key=depth)
  depths = [depth(c) for c in found]
  want = [depths[-1] // 2 ** k for k in range(len(depths) - 1, -1, -1)]
  if depths != want or (layers is not None and depths[-1] * 2 != layers):
    need = ([layers // 2 ** k for k in range(len(depths), 0, -1)] if layers is not None else
            "each half as deep as the next")
    raise app.UsageError(f"--stack_from: the files' models have {depths} layers; a chain of doublings into the "
                         f"target's {layers if layers is not None else 2 * depths[-1]} needs {need}.")
  return found


def stack_levels(stack_from: list[str], doublings_max: int, base, layers: int, small_pilots, seeds, run,
                 record) -> list:
  """The shallower models a stacking plan grows through, shallowest first, as candidates at train.lr: from
  --stack_from files (``stack_from``), or pilots run by ``run`` (the target at ``layers`` / 2, / 4, ... for up to
  ``doublings_max`` doublings, as deep as ``layers`` divides; each at ``small_pilots`` steps and its longest at
  ``seeds``). Empty when ``layers`` is odd."""
  from multilevel.cycles import planner
  if stack_from:
    return levels_from_files(stack_from, float(base.train.lr), layers)
  doublings = 0
  while doublings < doublings_max and layers % 2 ** (doublings + 1) == 0:
    doublings += 1
  out = []
  for k in range(doublings, 0, -1):
    name, model = f"{layers // 2 ** k}-layer", {"model.num_layers": layers // 2 ** k}
    for n in small_pilots:
      run(name, model, n, 1.0)
    for seed in seeds:
      run(name, model, small_pilots[-1], 1.0, seed)
    try:
      out.append(planner.candidate_from_runs(name, [p for p in record["pilots"] if p["model"] == name], {}, model,
                                             True))
    except ValueError as e:
      raise app.UsageError(f"stacking pilot {name}: {e}") from None
  return out


def stack_plan(target, wsd, levels, target_step, steps, target_cost, stack: Settings, margins, record) -> dict:
  """``stack_planner.plan_stack`` under the WSD settings ``wsd`` with the stacking flags ``stack``: the rates and
  delays of --stack_rates and --stack_delays (where the run directories of --stack_rates_from measured a doubling,
  theirs) and the losses they were measured from (--stack_rates_at, or those runs'), the target held to
  --stack_min_target_frac of the steps, each shallower stage to --stack_min_stage_frac, each hand-over within
  --stack_rates_span of where its rate was measured (0: anywhere), and the pilots' warm-up; its pilot cost and net
  saving added as ``plan_vcycle`` reports them. With --stack_rate_curves the doublings they measured are priced off
  rate curves (``rate_curves``)."""
  from multilevel.cycles import growth, stack_planner
  from multilevel.metrics import read_metrics
  n = len(levels)
  rates, delays, rates_at = _flag_rates(levels, stack)
  unmeasured = []
  if stack.rates_from:
    stables, steps_of = stack_planner.by_level(wsd.target, target_step, levels)
    measured = {}
    for w in stack.rates_from:
      if not os.path.exists(os.path.join(w, "metrics.jsonl")):
        raise app.UsageError(f"--stack_rates_from={w}: no metrics.jsonl there (a run's workdir is expected).")
      method = _method_of(w)
      if method not in (None, "stackbert"):
        raise app.UsageError(f"--stack_rates_from={w}: that run is cycle.method={method!r}; the rates of stacking "
                             f"are read from cycle.method='stackbert' runs (a V-cycle's growths are priced by "
                             f"--growth_rates_from).")
      for r in stack_planner.rates_from_records(read_metrics(w), stables, steps_of):
        if growth.enough_evals(r):
          measured.setdefault(r["level"], []).append((r["rate"], r["delay"], r["handover_loss"]))
    # Doubling j (shallowest first) grows into level n-1-j. One the runs did not measure (fewer than MIN_EVALS evals
    # of the grown model before the cool-down: a short target stage) keeps the rate, delay and loss of the flags.
    names = [c.name for c in levels[1:]] + ["the target"]
    for j in range(n):
      got = measured.get(n - 1 - j)
      if got:
        rates[j], delays[j], rates_at[j] = (sum(m[i] for m in got) / len(got) for i in range(3))
      else:
        unmeasured.append(names[j])
    record["stack_rates_measured"] = {"runs": stack.rates_from, "rates": rates, "delays": delays, "at": rates_at,
                                      "unmeasured": unmeasured, "by_level": {str(k): v for k, v in measured.items()}}
  curves = None
  if stack.curve_rows:
    curves, missing, off = rate_curves(stack.curve_rows, levels, stack.curve_kind)
    if off:
      logging.warning("--stack_rate_curves: %d measured growth(s) handed over at a loss their smaller model's pilot "
                      "does not measure and are left out (a longer pilot places them): %s", len(off), off)
    record["stack_rate_curves"] = {"files": sorted({r["file"] for r in stack.curve_rows}), "kind": stack.curve_kind,
                                   "without_curve": missing, "off_curve": off,
                                   "curves": [None if cv is None else cv.describe(c.step_flops)
                                              for c, cv in zip(levels, curves)]}
  warm = _warmups(levels, wsd)
  try:
    p = stack_planner.plan_stack(target, wsd, levels, target_step, steps, rates, delays,
                                 min_big_frac=stack.min_target, min_stage_frac=stack.min_stage, warmup_steps=warm,
                                 margins=margins, rates_at=None if all(x is None for x in rates_at) else rates_at,
                                 rates_span=stack.span, rate_curves=curves)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  return {**_with_pilots(p, target_cost + sum(c.pilot_flops for c in levels), steps, target_step),
          **({"rates_unmeasured": unmeasured} if unmeasured else {})}


def _with_pilots(plan: dict, pilots: float, steps: int, target_step: float) -> dict:
  """``plan`` with its pilots' FLOPs and the saving net of them for one run of ``steps`` target steps."""
  return {**plan, "pilot_flops": pilots, "net_saving": 1 - (plan["predicted_flops"] + pilots) / (steps * target_step)}


def _flag_rates(levels, stack: Settings) -> tuple[list, list, list]:
  """The rates, delays and losses they were measured from of --stack_rates, --stack_delays and --stack_rates_at, one
  per doubling of the chain ``levels`` (defaults: 1, 0 and unknown), or a usage error naming the flag."""
  n = len(levels)
  rates, delays = list(stack.rates or [1.0] * n), list(stack.delays or [0.0] * n)
  rates_at = list(stack.rates_at) if stack.rates_at else [None] * n
  for flag, values in (("--stack_rates", rates), ("--stack_delays", delays), ("--stack_rates_at", rates_at)):
    if len(values) != n:
      raise app.UsageError(f"{flag} gives {len(values)} values; this chain has {n} doublings "
                           f"({', '.join(c.name for c in levels)} -> target): give one per doubling.")
  return rates, delays, rates_at


def _warmups(levels, wsd) -> list[int]:
  """Each level's pilots' warm-up in steps (--stack_from's files record their own train.warmup_frac)."""
  return [round((c.pilot_warmup_frac or wsd.pilot_warmup_frac) * c.stable_steps) for c in levels]


def read_seed_flagfile(path: str) -> dict:
  """One seed's files for ``--seed_flagfiles``: an absl flagfile with ``--seed``, ``--target_from``,
  ``--stack_from`` and ``--stack_rate_curves`` (that seed's scratch runs, shallower models and measured growths, as
  ``experiments.plan`` would take them to plan that seed alone). Refused before anything is priced: a missing file,
  another flag, a missing seed or files, or a file it names that is not there."""
  if not os.path.isfile(path):
    raise app.UsageError(f"--seed_flagfiles: no file {path}.")
  fv = flags.FlagValues()
  flags.DEFINE_integer("seed", None, "The train.seed of these runs.", flag_values=fv)
  for name in ("target_from", "stack_from", "stack_rate_curves"):
    flags.DEFINE_list(name, [], f"As experiments.plan's --{name}, this seed's.", flag_values=fv)
  try:
    fv(["seed_flagfile", f"--flagfile={path}"])
  except flags.Error as e:
    raise app.UsageError(f"--seed_flagfiles={path}: {e}. A seed's flagfile gives --seed, --target_from, --stack_from "
                         f"and --stack_rate_curves (one per line), nothing else.") from None
  if fv.seed is None or not fv.target_from or not fv.stack_from:
    raise app.UsageError(f"--seed_flagfiles={path}: give --seed, --target_from and --stack_from there (and "
                         f"--stack_rate_curves where that seed's growths were measured).")
  missing = [p for f in fv.target_from + fv.stack_from + fv.stack_rate_curves for p in f.split("+")
             if not os.path.isfile(p)]
  if missing:
    raise app.UsageError(f"--seed_flagfiles={path}: no file {', '.join(missing)}.")
  return {"file": path, "seed": fv.seed, "target_from": fv.target_from, "stack_from": fv.stack_from,
          "stack_rate_curves": fv.stack_rate_curves}


def seed_pricing(seed: int, target, wsd, levels, target_step: float, stack: Settings, curve_file_rows: list[dict]):
  """``stack_seeds.SeedPricing`` of one seed: its target, WSD settings and shallower models with the rates of the
  flags, or the rate curves through ``curve_file_rows`` (``curve_rows`` of that seed's --stack_rate_curves)."""
  from multilevel.cycles.stack_seeds import SeedPricing
  rates, delays, rates_at = _flag_rates(levels, stack)
  curves = None
  if curve_file_rows:
    curves, _, off = rate_curves(curve_file_rows, levels, stack.curve_kind)
    if off:
      logging.warning("seed %s: %d measured growth(s) handed over off their smaller model's curve and are left out: "
                      "%s", seed, len(off), off)
  return SeedPricing(seed, target, wsd, levels, target_step, rates, delays, curves,
                     None if all(x is None for x in rates_at) else rates_at, _warmups(levels, wsd))


def stack_plan_seeds(base, own: tuple, seed_files: list[dict], steps: int, stack: Settings, growth_rates: list[str],
                     margins, layers: int, record: dict) -> dict:
  """``stack_seeds.plan_stack_seeds`` on every seed's own files (--seed_flagfiles): this command's (``own``: its
  target, WSD settings, shallower models, step FLOPs and cost, at train.seed) and each flagfile's
  (``read_seed_flagfile``), with the stacking flags' floors and span. Its pilot cost is every seed's files (their
  scratch runs and shallower models), and its net saving counts them as ``stack_plan`` does."""
  from experiments import plan_vcycle
  from multilevel.cycles import planner, stack_seeds
  target, wsd, levels, target_step, target_cost = own
  pricings = [seed_pricing(int(base.train.seed), target, wsd, levels, target_step, stack, stack.curve_rows)]
  costs = [target_cost]
  for f in seed_files:
    try:
      t, step, cost = planner.target_from_saving(f["target_from"], base.model.family)
    except (ValueError, OSError) as e:
      raise app.UsageError(f"--seed_flagfiles={f['file']}: --target_from: {e}") from None
    settings = plan_vcycle.wsd_settings(base, None, {}, f["target_from"], growth_rates, [])
    lv = levels_from_files(f["stack_from"], float(base.train.lr), layers)
    pricings.append(seed_pricing(f["seed"], t, settings, lv, step, stack, curve_rows(f["stack_rate_curves"])))
    costs.append(cost)
  record["seed_flagfiles"] = seed_files
  try:
    p = stack_seeds.plan_stack_seeds(pricings, steps, stack.min_target, stack.min_stage, stack.span, margins=margins)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  return _with_pilots(p, sum(costs) + sum(c.pilot_flops for s in pricings for c in s.levels), steps, target_step)


def _method_of(workdir: str) -> str | None:
  """The ``cycle.method`` a run recorded in its ``run.json`` (None when it recorded none)."""
  import json
  try:
    with open(os.path.join(workdir, "run.json")) as f:
      return (json.load(f).get("config") or {}).get("cycle", {}).get("method")
  except (OSError, ValueError, AttributeError):
    return None
