"""A plan of ``multilevel.cycles.planner`` as a few lines for a terminal: every candidate's row, the prediction and
what the pilots cost, how much of the saving survives the errors its runs have shown, each pilot seed's own
prediction, and what to measure when no hand-over could be priced. Kept apart from the pricing so that a plan read
back from its ``plan.json`` prints the same without the curves."""

from __future__ import annotations


def _fragile(plan: dict) -> bool:
  """Whether less than half the predicted saving survives both margins: the target's stage has real work to do, and
  the plans that looked so here measured well below their prediction (GPT at 42, LLaMA at 21 and 37 tokens/param).
  A margin priced only as 'at least' (past the target's longest pilot) says nothing either way."""
  m = plan["margins"][2]
  return not m.get("at_least") and (m["saving"] is None or m["saving"] < plan["predicted_saving"] / 2)


_PAST_PILOTS = ("the target's longest pilot ends before such a run would, so these are unknown (a target pilot at the "
                "budget, --target_pilots=...,STEPS, or --target_from prices them)")


def _saving(p: dict) -> str:
  """A priced row's saving ('?' where its curves do not reach; 'at least' past the target's longest run)."""
  return "?" if p["saving"] is None else ("at least " if p["at_least"] else "") + f"{100 * p['saving']:+.1f}%"


# How close two methods' predictions may come before the plan calls them a near tie: closer than their errors on the
# plans measured so far (benchmarks/results/plan_validation.json: 56 plans, the V-cycle's off by 9.2 points on
# average, stacking's by 7.3). On BERT at 7.3 tokens/param the planner kept its V-cycle at +44.0% against stacking's
# +43.7%, and they measured +38% [37, 39] and +46% [41, 53] (+34% and +46% on the fit to 2800 steps).
NEAR_TIE = 0.05


def method_kind(method: str | None) -> str:
  """The schedule a plan's ``method`` names: 'vcycle', 'stackbert' or 'scratch'."""
  return (method or "scratch").split()[0]


def near_tie(plan: dict, alternatives) -> dict | None:
  """The schedule of another method that ``plan`` was preferred to by less than ``NEAR_TIE`` of predicted saving (the
  closest, and predicted to save something), or None; never when the plan is scratch."""
  kind = lambda p: method_kind(p["method"])
  if kind(plan) == "scratch":
    return None
  close = [a for a in alternatives if kind(a) not in (kind(plan), "scratch") and a["predicted_saving"] > 0
           and plan["predicted_saving"] - a["predicted_saving"] < NEAR_TIE]
  return max(close, key=lambda a: a["predicted_saving"]) if close else None


def keep_best(plans: list[dict]) -> dict:
  """The plan predicted to save most (the first of equal savings: the V-cycle's), the others as its
  ``alternatives`` and, where one of another method comes within ``NEAR_TIE``, its method as ``near_tie``."""
  plan = max(plans, key=lambda p: p["predicted_saving"])
  if len(plans) == 1:
    return plan
  plan = {**plan, "alternatives": [{k: p[k] for k in ("method", "predicted_saving", "overrides")}
                                   for p in plans if p is not plan]}
  tie = near_tie(plan, plan["alternatives"])
  return plan if tie is None else {**plan, "near_tie": tie["method"]}


def describe(plan: dict) -> str:
  """The plan as a few lines for a terminal, then the schedules it was preferred to."""
  text = _describe_stack(plan) if "stage_steps" in plan else _describe_vcycle(plan)
  for a in plan.get("alternatives", ()):
    text += f"\n  preferred to {a['method']}: predicted saving {100 * a['predicted_saving']:+.1f}%"
  tie = near_tie(plan, plan.get("alternatives", ()))
  if tie is not None:
    gap = 100 * (plan["predicted_saving"] - tie["predicted_saving"])
    other = method_kind(tie["method"])
    text += (f"\nnote: a near tie ({gap:.1f} points, against {tie['method']}): closer than the predictions' errors "
             f"on the plans measured so far (benchmarks/results/plan_validation.json; the V-cycle's ran high on "
             f"average, most at long budgets), and on BERT at 7.3 tokens/param a tie like this one measured 8 points "
             f"in stacking's favour; run the other schedule too (--methods={other} writes its config)")
  return text


def _describe_stack(plan: dict) -> str:
  """A stacking plan (``stack_planner.plan_stack``) as a few lines."""
  lines = [f"plan: {plan['method']}  ({plan['pricing']})"]
  if plan["method"] != "scratch":
    names = plan["levels"] + ["the target"]
    stages = ", ".join(f"{n} steps of {m}" + (f" to loss {l:.3f}" if l is not None else "")
                       for n, m, l in zip(plan["stage_steps"], names, plan["switch_losses"] + [None]))
    lines.append(f"  {stages}: train.steps={plan['overrides']['train.steps']}, one WSD schedule, the target's "
                 f"stage holding the whole cool-down")
    if plan.get("dropped"):
      lines.append(f"  {', '.join(plan['dropped'])} left out: every chain through them that is cheaper has a stage "
                   f"too short to be what the rates were measured on")
    if plan.get("curve_end"):
      lines.append(f"  note: a hand-over is at the end of {' and '.join(plan['curve_end'])} measured stable curve: a "
                   f"longer pilot of that model may find a later, better one")
    if plan.get("rates_at_plan"):
      said = lambda r: (f"{r['rate']:.3g}x after {r['delay']:.0f} steps" if "rate" in r else
                        f"{r['moved']:.0f} scratch steps in its {r['steps']} ({r['overall']:.3g}x)")
      read = [f"{d} {said(r)}" for d, r in zip(
          [f"{a} -> {b}" for a, b in zip(plan["levels"], plan["levels"][1:] + ["the target"])],
          [r for r in plan["rates_at_plan"] if r is not None])]
      lines.append(f"  rates read off the rate curves at these hand-overs: {'; '.join(read)}")
  else:
    lines.append(f"why scratch: {plan['why']}")
  lines += _rates_near(plan)
  lines.append(f"predicted FLOPs {plan['predicted_flops']:.3g} ({100 * plan['predicted_saving']:+.1f}% vs scratch); "
               f"pilots cost {plan['pilot_flops']:.3g} FLOPs, so {100 * plan['net_saving']:+.1f}% net for one run")
  lines += _seed_lines(plan)
  m = plan.get("margins")
  if m:
    lines.append(f"  if each stacked model lands {m[0]['landing']:.3f} nats higher: {_saving(m[0])}; if each learns at "
                 f"{m[1]['rate_factor']:g}x its rate: {_saving(m[1])}; both: {_saving(m[2])}"
                 + (": less than half survives both, so expect less than predicted" if _fragile(plan) else ""))
  return "\n".join(lines)


def _seed_lines(plan: dict) -> list[str]:
  """The plan priced on each pilot seed's own curves (``seed_predictions``), where it was priced on their mean."""
  seeds = plan.get("seed_predictions")
  name = lambda p: f"seed {p['seed'] if p['seed'] is not None else 'default'}"
  loss = lambda p: "?" if p["handover_loss"] is None else f"{p['handover_loss']:.3f}"
  into = " into the target" if "stage_steps" in plan else ""
  if plan.get("own_plans"):  # stack_seeds: each seed priced on its own runs, the plan their mean's best.
    own = ", ".join(f"{name(o)} {100 * o['own_saving']:+.1f}%" + (
        "" if o["mean_saving"] is None else f" (its schedule {100 * o['mean_saving']:+.1f}% on the seeds' mean)")
        for o in plan["own_plans"] if o["levels"])
    return [f"  on each seed's own runs (hand-over loss{into} / saving): "
            + ", ".join(f"{name(p)} {loss(p)} / {_saving(p)}" for p in seeds)
            + "; the mean is the plan's prediction" + (" (at least: a run that ends past its seed's longest "
                                                         "scratch run saves more than its frontier can say)"
                                                         if plan.get("at_least") else "")
            + ", and a new seed may land anywhere in that spread",
            f"  each seed's own best schedule: {own}"]
  if seeds and all(p.get("at_least") for p in seeds):
    return [f"  priced on the mean of {len(seeds)} pilot seeds; each seed's own hand-over loss{into}: "
            + ", ".join(f"{name(p)} {loss(p)}" for p in seeds) + f"; their savings: {_PAST_PILOTS}"]
  if seeds:
    return [f"  priced on the mean of {len(seeds)} pilot seeds; on each seed's own curve (hand-over loss{into} / "
            f"saving): " + ", ".join(f"{name(p)} {loss(p)} / {_saving(p)}" for p in seeds)
            + ": a run of this plan may land anywhere in that spread, and further where the target's own seeds part"]
  return []


def _rates_near(plan: dict) -> list[str]:
  """Where a stacking plan hands over far from where its rates were measured (``stack_planner.rates_near``), or that
  nothing checked it (a plan made without the rates' hand-over losses)."""
  out = [f"  note: the runs of --stack_rates_from measured no rate into {', '.join(plan['rates_unmeasured'])} (fewer "
         f"than 3 evals of it before the cool-down), so it is priced at the rate, delay and loss of the flags"] \
      if plan.get("rates_unmeasured") else []
  if "rates_near" not in plan:  # Scratch, or a plan written before the check.
    return out
  if plan["rates_near"] is None:
    return out + ["  note: the losses the rates were measured from are not given (--stack_rates_at, which "
                  "benchmarks.stack_rates prints), so nothing checks that this plan hands over near them"]
  steps = lambda x: "off its curve" if x is None else f"{x:.0f} steps"
  for r in plan["rates_near"]:
    if r["far"] and r.get("curve"):
      out.append(f"  note: the rate curve of {r['doubling']} has no point within 2x of this plan's hand-over "
                 f"({r['planned_at']:.3f}, {steps(r['planned_steps'])}; its nearest at {r['measured_at']:.3f}, "
                 f"{steps(r['measured_steps'])}): the rate there is interpolated across a gap or held from the "
                 "curve's end; run this plan, add its rates (benchmarks.stack_rates --out, then --stack_rate_curves) "
                 "and plan again, or keep the hand-overs near a point (--stack_rates_span=2)")
    elif r["far"]:
      src = r["doubling"].split(" -> ")[0]
      out.append(f"  note: the rate of {r['doubling']} was measured from loss {r['measured_at']:.3f} "
                 f"({steps(r['measured_steps'])} of {src}'s scratch curve) and this plan hands over at "
                 f"{r['planned_at']:.3f} ({steps(r['planned_steps'])}"
                 + ("" if r["ratio"] is None else f", {r['ratio']:.2g}x") + "): a rate holds near where it was "
                 "measured (LLaMA at β2 0.95: 3.3x after 320 steps of 1 layer, 1.2x after 160, 0.9x after 80), and "
                 "the stacking plans measured so far with a hand-over this far missed their prediction by 10 points "
                 "on average, those near it by 7.0 (benchmarks/results/plan_validation.json); run this plan, measure "
                 "its rates (--stack_rates_from=its workdir) and plan again, price it off a curve through several "
                 "runs' rates (--stack_rate_curves), or keep the hand-overs near (--stack_rates_span=2)")
  return out


def _describe_vcycle(plan: dict) -> str:
  where = ("the lowest loss the target's pilots reached (the budget is past them)" if plan["budget_beyond_pilots"]
           else "scratch's loss at this budget")
  lines = [f"plan: {plan['method']}  (hand-overs searched down to loss {plan['target_loss']:.4f}: {where})"]
  if plan.get("pricing", "").startswith("WSD"):
    lines.append(f"  priced under one WSD schedule ({plan['pricing']}): the run should end at scratch's loss")
  if plan.get("handover_jump"):
    lines.append(f"  each hand-over assumed to cost {plan['handover_jump']:.4f} nats (a measured jump), not lossless")
  for r in plan["candidates"]:
    if "mid_steps" in r:
      lines.append(f"  {r['candidate']}: {r['small_steps']} steps of {r['chain'][0]} to loss {r['switch_losses'][0]:.3f}, "
                   f"{r['mid_steps']} of {r['chain'][1]} to {r['switch_losses'][1]:.3f}, then {r['big_steps']} "
                   f"target steps: predicted saving {100 * r['saving']:+.1f}%")
    elif "chain" in r:
      lines.append(f"  {r['candidate']}: the chain's bound skips a model (a 2-level row covers it)")
    elif "saving" in r:
      lines.append(f"  {r['candidate']}: hand over at loss {r['switch_loss']:.3f} after {r['small_steps']} small "
                   f"steps, then {r['big_steps']} target steps: predicted saving {100 * r['saving']:+.1f}%")
    else:
      lines.append(f"  {r['candidate']}: no hand-over pays (its frontier is nowhere cheaper, or does not overlap)")
  ends = next((r.get("curve_end") for r in plan["candidates"] if r.get("saving") == plan["predicted_saving"]), None)
  if (not plan.get("pricing", "").startswith("WSD") and plan["budget_beyond_pilots"]
          and plan.get("switch_loss") is not None and abs(plan["switch_loss"] - plan["target_loss"]) < 1e-9):
    lines.append("  note: the hand-over is at the lowest loss the target's pilots reached, where the search stops: "
                 "longer target pilots (--target_pilots) may move it")
  if ends:
    lines.append(f"  note: the chosen hand-over is at the end of {' and '.join(ends)} measured stable curve: a longer "
                 f"pilot of that model may find a later, better one")
  lines.append(f"predicted FLOPs {plan['predicted_flops']:.3g} ({100 * plan['predicted_saving']:+.1f}% vs scratch); "
               f"pilots cost {plan['pilot_flops']:.3g} FLOPs, so {100 * plan['net_saving']:+.1f}% net for one run")
  lines += _seed_lines(plan)
  m = plan.get("margins")
  if m and all(x.get("at_least") for x in m):
    lines.append(f"  the margins (the target landing {m[0]['landing']:.3f} nats higher, learning at "
                 f"{m[1]['rate_factor']:g}x the priced rate): {_PAST_PILOTS}")
  elif m:
    lines.append(f"  if the target lands {m[0]['landing']:.3f} nats higher: {_saving(m[0])}; if it learns at "
                 f"{m[1]['rate_factor']:g}x the priced rate: {_saving(m[1])}; both: {_saving(m[2])}"
                 + (": less than half survives both, so expect less than predicted" if _fragile(plan) else ""))
  if plan["overrides"].get("cycle.small_stop") == "frontier":
    lines.append("  the small stage ends by the online stop rule (at most the steps above; the prediction is the fixed "
                 "plan's)")
  if plan.get("no_overlap"):
    lines.append(f"why scratch: {plan['why']}")
  a = plan.get("smaller_model_alone")
  if a:
    lines.append(f"note: {a['candidate']} trained alone reaches the same loss in {'at most ' if a['at_most'] else ''}"
                 f"{a['steps']} steps ({100 * a['saving']:+.1f}% of the FLOPs saved); you would end with that "
                 f"smaller model, not the target")
  return "\n".join(lines)
