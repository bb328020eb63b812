"""The saving benchmark's analysis (``benchmarks.analyze_saving``, ``frontiers``, ``report``, ``seeds_shifted``,
``plot_methods``): frontier fits, merging results files, several seeds, the envelope and the figures, on results
written by hand (no training)."""

import json
import math
import subprocess
import sys

import pytest


def test_the_frontier_fit_recovers_a_power_law_and_reads_costs_off_it():
  from benchmarks.frontiers import fit_frontier, fitted_cost
  true = {"E": 2.5, "A": 40.0, "a": 0.3}
  pts = [(c, true["E"] + true["A"] * c ** -true["a"]) for c in (1e9, 3e9, 1e10, 3e10, 1e11)]
  fit = fit_frontier(pts)
  assert fit["a"] == pytest.approx(0.3, rel=0.02) and fit["E"] == pytest.approx(2.5, abs=0.01)
  # The cost of reaching the 3e10 point's loss, read off the fit.
  assert fitted_cost(fit, pts[3][1], pts) == pytest.approx(3e10, rel=0.02)
  assert fitted_cost(fit, 2.4, pts) is None  # Below the asymptote: never reached.
  with pytest.raises(ValueError, match="at least four"):
    fit_frontier(pts[:3])


def test_merging_results_joins_variants_of_one_budget_and_refuses_mismatched_scratch(tmp_path):
  from benchmarks.analyze_saving import merge

  def write(name, budgets, family="gpt"):
    p = tmp_path / name
    p.write_text(json.dumps({"command": name, "family": family, "budgets": budgets}))
    return str(p)

  def budget(steps, loss, flops, variants):
    return {"steps": steps, "tokens_per_param": steps / 100,
            "scratch": {"final_eval_loss": loss, "total_flops": flops, "train_seconds": flops / 1e9},
            "variants": {n: {"final_eval_loss": l, "total_flops": f, "train_seconds": f / 1e9,
                             "flops_ratio_total": f / flops, "reached": l <= loss, "flops_saving": 1 - f / flops}
                         for n, (l, f) in variants.items()}}

  a = write("a.json", [budget(200, 5.0, 2e9, {"x": (4.9, 1e9)}), budget(100, 5.5, 1e9, {})])
  b = write("b.json", [budget(200, 5.0004, 2e9, {"y": (5.2, 1.2e9)}), budget(400, 4.5, 4e9, {"z": (4.4, 3e9)})])
  d = merge([a, b])
  assert [x["steps"] for x in d["budgets"]] == [100, 200, 400]
  mid = d["budgets"][1]
  assert sorted(mid["variants"]) == ["x", "y"] and mid["scratch"]["final_eval_loss"] == 5.0
  assert mid["merged_scratch_losses"] == [5.0, 5.0004]
  # Frontier: 1e9 -> 5.5, 2e9 -> 5.0 (the first file's scratch, once), 4e9 -> 4.5. y at 5.2 sits 60% of the way
  # from 2e9 down to 1e9 in loss, i.e. at 2^0.6 * 1e9 FLOPs on the log-FLOPs chord.
  assert mid["variants"]["y"]["frontier_flops_saving"] == pytest.approx(1 - 1.2 / 2 ** 0.6)
  from benchmarks.report import methods_table
  table = methods_table(d).splitlines()
  assert len(table) == 5
  assert table[0] == "| method | T=200 (2.0 tok/param; scratch 5.000) | T=400 (4.0 tok/param; scratch 4.500) |"
  assert table[2] == "| x | 4.900 / 0.50x / **+56%** / +56% |  |"  # 1 - 0.5 / 2^0.2 on the chord.
  assert table[3].startswith("| y | 5.200 / 0.60x / **+")
  assert table[4] == "| z |  | 4.400 / 0.75x / below the frontier (to reach scratch: +25%) |"
  with pytest.raises(ValueError, match="not the same config"):
    merge([a, write("c.json", [budget(200, 5.003, 2e9, {})])])
  assert merge([a, write("c2.json", [budget(200, 5.003, 2e9, {})])], tol=5e-3)["budgets"][1]["merged_scratch_losses"]
  again = write("d.json", [budget(200, 5.0002, 2.2e9, {"x": (4.95, 1.1e9)})])
  with pytest.raises(ValueError, match="also in another file"):
    merge([a, again])
  # Run again (e.g. alone on the machine, for clean seconds): with replace the later file's runs win.
  mid = merge([a, again], replace=True)["budgets"][1]
  assert mid["variants"]["x"]["final_eval_loss"] == 4.95 and mid["scratch"]["total_flops"] == 2.2e9
  assert mid["replaced"] == [f"x (by {again})"] and mid["merged_scratch_losses"] == [5.0, 5.0002]
  with pytest.raises(ValueError, match="one family at a time"):
    merge([a, write("e.json", [budget(300, 5.0, 3e9, {})], family="bert")])


def test_results_of_several_seeds_are_read_each_on_its_own_frontier_and_averaged(tmp_path):
  from benchmarks.analyze_saving import merge
  from benchmarks.report import methods_table

  def write(name, seed, loss_at_200, variant_loss):
    budgets = [{"steps": steps, "tokens_per_param": steps / 100,
                "scratch": {"final_eval_loss": loss, "total_flops": steps * 1e7, "train_seconds": steps / 100},
                "variants": {} if steps != 200 else {
                    "x": {"final_eval_loss": variant_loss, "total_flops": 1e9, "train_seconds": 1.0,
                          "flops_ratio_total": 0.5, "reached": True, "flops_saving": 0.5}}}
               for steps, loss in ((100, 5.5), (200, loss_at_200), (400, 4.5))]
    p = tmp_path / name
    overrides = {} if seed is None else {"train.seed": str(seed)}
    p.write_text(json.dumps({"command": name, "family": "gpt", "model_overrides": overrides, "budgets": budgets}))
    return str(p)

  # Seed 42 (the default, no override) and seed 1: scratch at T=200 differs by far more than the merge tolerance,
  # which is fine across seeds. x ends at 5.0 and 4.9: on each seed's chord from 1e9 (5.5) to 2e9 FLOPs.
  a, b = write("a.json", None, 5.0, 5.0), write("b.json", 1, 4.9, 4.9)
  d = merge([a, b])
  assert d["seeds"] == [1, 42] and sorted(d["by_seed"]) == ["1", "42"]
  assert [b["steps"] for b in d["budgets"]] == [100, 200, 400] and isinstance(d["budgets"][0]["steps"], int)
  x = d["budgets"][1]["variants"]["x"]
  per = x["per_seed"]["frontier_flops_saving"]
  assert per == pytest.approx([1 - 1 / 2, 1 - 1 / 2])  # Each at its own scratch's T=200 point (2e9 FLOPs).
  assert x["frontier_flops_saving"] == pytest.approx(0.5) and x["final_eval_loss"] == pytest.approx(4.95)
  assert d["budgets"][1]["scratch"]["per_seed"]["final_eval_loss"] == [4.9, 5.0]
  # A third seed where x lands between the 100 and 200 points: 5.2 on 5.5 -> 5.0 is 60% of the way, 2^0.6 * 1e9.
  c = write("c.json", 7, 5.0, 5.2)
  d = merge([a, b, c])
  per = d["budgets"][1]["variants"]["x"]["per_seed"]["frontier_flops_saving"]
  assert per == pytest.approx([0.5, 1 - 1 / 2 ** 0.6, 0.5])  # Seeds 1, 7, 42.
  table = methods_table(d).splitlines()
  assert table[0].startswith("| method (mean of seeds 1, 7, 42; [min, max]) | T=200")
  assert f"[{100 * (1 - 1 / 2 ** 0.6):+.0f}%, +50%]" in table[2]
  # Seeds averaged only where all ran a budget: a seed with none in common is refused.
  e = tmp_path / "e.json"
  e.write_text(json.dumps({"command": "e", "family": "gpt", "model_overrides": {"train.seed": 3}, "budgets": [
      {"steps": 800, "tokens_per_param": 8.0, "scratch": {"final_eval_loss": 4.0, "total_flops": 8e9,
                                                           "train_seconds": 8.0}, "variants": {}}]}))
  with pytest.raises(ValueError, match="share no budget"):
    merge([a, str(e)])


def test_a_frontier_from_other_files_replaces_the_files_own_scratch(tmp_path):
  from benchmarks.analyze_saving import merge
  from benchmarks.report import methods_table

  def write(name, scratch, variants=None, seed=None):
    budgets = [{"steps": steps, "tokens_per_param": steps / 100,
                "scratch": {"final_eval_loss": loss, "total_flops": steps * 1e7, "train_seconds": steps / 100},
                "variants": (variants or {}).get(steps, {})} for steps, loss in scratch]
    p = tmp_path / name
    overrides = {} if seed is None else {"train.seed": str(seed)}
    p.write_text(json.dumps({"command": name, "family": "gpt", "model_overrides": overrides, "budgets": budgets}))
    return str(p)

  x = {"final_eval_loss": 5.0, "total_flops": 1e9, "train_seconds": 1.0, "flops_ratio_total": 0.5, "reached": True,
       "flops_saving": 0.5}
  runs = write("linear.json", [(200, 5.0)], {200: {"x": x}})  # x ties its own (weak) scratch: +50% on its chord.
  # A stronger scratch frontier: 1e9 -> 5.2, 2e9 -> 4.8, 4e9 -> 4.5. x at 5.0 sits half-way from 1e9 to 2e9 in
  # loss: sqrt(2) * 1e9 FLOPs, so it saves 1 - 1 / sqrt(2) there.
  front = write("wsd.json", [(100, 5.2), (200, 4.8), (400, 4.5)])
  d = merge([runs], frontier=[front])
  v = d["budgets"][0]["variants"]["x"]
  assert v["frontier_flops_saving"] == pytest.approx(1 - 1 / 2 ** 0.5)
  assert v["flops_saving"] == 0.5  # Read off its own scratch's curve: unchanged.
  assert d["frontier_from"]["files"] == [front]
  assert [p["final_eval_loss"] for p in d["frontier_from"]["points"]] == [5.2, 4.8, 4.5]
  assert "/ **+29%** /" in methods_table(d).splitlines()[2]
  # Worse than every point of the stronger frontier (its range, not the files' own scratch, decides).
  worse = write("worse.json", [(200, 5.0)], {200: {"x": dict(x, final_eval_loss=5.3)}})
  assert "worse than every scratch point" in methods_table(merge([worse], frontier=[front]))
  with pytest.raises(ValueError, match="No frontier file ran seed 1"):
    merge([write("s1.json", [(200, 5.0)], {200: {"x": x}}, seed=1)], frontier=[front])
  # The fit can leave out the shortest runs: four points on E + A F^-a (F = steps * 1e7) and a 100-step run off it.
  law = lambda steps: 2.0 + 1e3 * (steps * 1e7) ** -0.3
  pts = [(100, law(100) + 0.3)] + [(t, law(t)) for t in (200, 400, 800, 1600)]
  lawful = write("law.json", pts, {800: {"x": dict(x, final_eval_loss=law(400), total_flops=2e9)}})
  loose, tight = merge([lawful], fit=True), merge([lawful], fit=True, fit_min_steps=200)
  assert loose["frontier_fit"]["flops"]["rms"] > 0.01
  assert tight["frontier_fit"]["flops"]["rms"] < 1e-3 and tight["frontier_fit"]["min_steps"] == 200
  assert tight["frontier_fit"]["flops"]["a"] == pytest.approx(0.3, rel=0.02)
  # x reaches the 400-step point's loss with 2e9 FLOPs where scratch needs 4e9: half.
  assert tight["budgets"][3]["variants"]["x"]["frontier_flops_saving"] == pytest.approx(0.5, abs=0.02)
  assert tight["budgets"][3]["variants"]["x"]["frontier_read"] == "fit"
  with pytest.raises(ValueError, match="keeps 3 of the 5 scratch budgets"):
    merge([lawful], fit=True, fit_min_steps=400)
  from benchmarks.report import plot
  plot(tight, str(tmp_path / "fit.png"), [])  # The frontier's points, the fitted law and the variants' finals.
  assert (tmp_path / "fit.png").stat().st_size > 10_000
  # A loss above every fitted point is read on the chord of all points, not on the law extrapolated below them:
  # half-way in loss from the 200-step point up to the 100-step one is sqrt(2) * 1e9 FLOPs on the log chord.
  y = dict(x, final_eval_loss=(law(200) + law(100) + 0.3) / 2, total_flops=1e9)
  short = merge([write("short.json", pts, {200: {"y": y}})], fit=True, fit_min_steps=200)["budgets"][1]["variants"]
  assert short["y"]["frontier_read"] == "chord"
  assert short["y"]["frontier_flops_saving"] == pytest.approx(1 - 1 / 2 ** 0.5)


def test_a_swept_frontier_keeps_the_best_run_at_each_budget(tmp_path):
  from benchmarks.analyze_saving import merge

  def write(name, lr, scratch, variants=None):
    budgets = [{"steps": steps, "tokens_per_param": steps / 100,
                "scratch": {"final_eval_loss": loss, "total_flops": steps * 1e7, "train_seconds": steps / 100},
                "variants": (variants or {}).get(steps, {})} for steps, loss in scratch]
    p = tmp_path / name
    p.write_text(json.dumps({"command": name, "family": "gpt", "model_overrides": {"train.lr": lr},
                             "budgets": budgets}))
    return str(p)

  x = {"final_eval_loss": 5.0, "total_flops": 1e9, "train_seconds": 1.0}
  runs = write("runs.json", 4e-3, [(200, 5.1)], {200: {"x": x}})
  # The sweep: the low rate wins at 100 steps, the high one at 200 and 400.
  low, high = write("lr2.json", 2e-3, [(100, 5.2), (200, 4.9), (400, 4.6)]), write("lr8.json", 8e-3,
                                                                                   [(100, 5.4), (200, 4.8), (400, 4.5)])
  with pytest.raises(ValueError, match="not the same config"):
    merge([runs], frontier=[low, high])
  d = merge([runs], frontier=[low, high], frontier_best=True)
  pts = d["frontier_from"]["points"]
  assert [(p["steps"], p["final_eval_loss"], p["lr"]) for p in pts] == [(100, 5.2, 2e-3), (200, 4.8, 8e-3),
                                                                         (400, 4.5, 8e-3)]
  # x at 5.0 lies half-way in loss between the best runs at 100 (5.2) and 200 (4.8): sqrt(2) * 1e9 FLOPs.
  assert d["budgets"][0]["variants"]["x"]["frontier_flops_saving"] == pytest.approx(1 - 1 / 2 ** 0.5)


def test_savings_are_also_read_against_the_best_single_model(tmp_path):
  from benchmarks.analyze_saving import merge
  from benchmarks.report import methods_table
  scratch = [(100, 5.2), (200, 4.8), (400, 4.5)]  # FLOPs = steps * 1e7.
  budgets = [{"steps": st, "tokens_per_param": st / 100, "variants": {},
              "scratch": {"final_eval_loss": l, "total_flops": st * 1e7, "train_seconds": st / 100}}
             for st, l in scratch]
  budgets[1]["variants"] = {"x": {"final_eval_loss": 5.0, "total_flops": 1e9, "train_seconds": 1.0,
                                  "flops_ratio_total": 0.5}}
  runs = tmp_path / "runs.json"
  runs.write_text(json.dumps({"command": "r", "family": "gpt", "model_overrides": {}, "budgets": budgets}))
  # A smaller model alone: 0.5e9 FLOPs reach 5.1, 1e9 reach 4.9 (its files split by learning rate, pooled with '+').
  for i, run in enumerate(({"steps": 100, "lr_scale": 1, "total_flops": 0.5e9, "final_eval_loss": 5.1},
                           {"steps": 200, "lr_scale": 1, "total_flops": 1e9, "final_eval_loss": 4.9})):
    (tmp_path / f"small{i}.json").write_text(json.dumps({"level": 1, "set": {"cycle.width_factor": "1"},
                                                         "model": {}, "runs": [run]}))
  d = merge([str(runs)], envelope=[f"{tmp_path / 'small0.json'}+{tmp_path / 'small1.json'}"])
  x = d["budgets"][1]["variants"]["x"]
  # On the target's frontier 5.0 costs sqrt(2) 1e9; the small model reaches it with sqrt(2) 0.5e9 (half-way).
  assert x["frontier_flops_saving"] == pytest.approx(1 - 1 / 2 ** 0.5)
  assert x["envelope_model"] == "L1 width_factor=1" and not x["envelope_at_most"]
  assert x["envelope_flops_saving"] == pytest.approx(1 - 2 / 2 ** 0.5)  # Negative: the small model alone is cheaper.
  assert "envelope: -41% (L1 width_factor=1)" in methods_table(d)
  # The same model's files given apart would have one hide the other: refused, with the way to pool them.
  with pytest.raises(ValueError, match="gives L1 width_factor=1 twice .* pool one model's files with '\\+'"):
    merge([str(runs)], envelope=[f"{tmp_path / 'small0.json'}+{tmp_path / 'small1.json'}",
                                 str(tmp_path / "small1.json")])


def test_the_all_methods_figure_plots_each_method_where_its_saving_is_defined(tmp_path):
  from benchmarks import plot_methods
  s = {"family": "gpt", "budgets": [
      {"tokens_per_param": 7.0, "variants": {"msg": {"frontier_flops_saving": 0.2},
                                             "mslt": {"frontier_flops_saving": None}}},
      {"tokens_per_param": 3.0, "variants": {"msg": {"frontier_flops_saving": 0.4}}}]}
  assert plot_methods.series(s) == {"msg": [(3.0, 0.4), (7.0, 0.2)]}
  p = tmp_path / "s.json"
  p.write_text(json.dumps(s))
  out = tmp_path / "all.png"
  r = subprocess.run([sys.executable, "-m", "benchmarks.plot_methods", str(p), f"--out={out}"], capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert out.stat().st_size > 1000


def _reference_seed(tmp_path):
  """The reference seed's summary at ``tmp_path / 'ref.json'``: a fitted frontier of five fully decayed points, and a
  variant at 1000 steps that reaches the 1e10 point's loss with half its FLOPs. Returns the fit's law."""
  fit = {"E": 2.5, "A": 40.0, "a": 0.3}
  law = lambda c: fit["E"] + fit["A"] * c ** -fit["a"]
  costs = (1e9, 3e9, 1e10, 3e10, 1e11)
  summary = {"seed": 42, "frontier_fit": {"flops": fit},
             "frontier_from": {"points": [{"steps": round(c / 1e7), "total_flops": c, "final_eval_loss": law(c)}
                                          for c in costs]},
             "budgets": [{"steps": 1000, "variants": {"planned": {"final_eval_loss": law(1e10), "total_flops": 5e9}}}]}
  (tmp_path / "ref.json").write_text(json.dumps(summary))
  return law


def test_another_seed_is_read_on_the_reference_fit_shifted_by_its_scratch_loss(tmp_path):
  import types
  from benchmarks import seeds_shifted
  law = _reference_seed(tmp_path)
  # Seed 1 ends 0.1 nats lower at both of its learning rates' best, and its variant 0.1 lower too: the same +50%.
  entry = lambda scratch, run: {"budgets": [{"steps": 1000, "scratch": {"final_eval_loss": scratch},
                                             "variants": {} if run is None else {"planned": run}}]}
  (tmp_path / "a.json").write_text(json.dumps(entry(law(1e10) - 0.05, {"final_eval_loss": law(1e10) - 0.1,
                                                                        "total_flops": 5e9})))
  (tmp_path / "b.json").write_text(json.dumps(entry(law(1e10) - 0.1, None)))
  a = types.SimpleNamespace(summary=str(tmp_path / "ref.json"), budget=1000, variant="planned",
                            seed=[f"1:{tmp_path / 'a.json'}+{tmp_path / 'b.json'}"], read="fit", out="")
  d = seeds_shifted.measure(a)
  assert [r["seed"] for r in d["rows"]] == [42, 1]
  assert d["rows"][1]["shift"] == pytest.approx(-0.1)
  assert [r["saving"] for r in d["rows"]] == [pytest.approx(0.5, abs=1e-6)] * 2
  assert d["mean"] == pytest.approx(0.5, abs=1e-6) and "| 1 |" in seeds_shifted.table(d)
  assert "seconds_saving" not in d["rows"][1]  # Seed 1's scratch is b.json's, not beside its variant: no seconds.
  # A run ending where the fit puts scratch at 1e12 FLOPs, past twice the longest run: unread, at least 1 - F / 2e11.
  (tmp_path / "far.json").write_text(json.dumps(entry(law(1e10), {"final_eval_loss": law(1e12), "total_flops": 5e9})))
  a.seed = [f"3:{tmp_path / 'far.json'}"]
  far = seeds_shifted.measure(a)["rows"][1]
  assert far["saving"] is None and far["saving_at_least"] == pytest.approx(1 - 5e9 / 2e11)
  # The reference seed given again with a scratch run under another setting ending 0.1 lower: its row is read with
  # it (shifted), in its place, not beside it.
  (tmp_path / "ref42.json").write_text(json.dumps(entry(law(1e10), {"final_eval_loss": law(1e10) - 0.1,
                                                                     "total_flops": 5e9})))
  a.seed = [f"42:{tmp_path / 'ref42.json'}+{tmp_path / 'b.json'}"]
  d = seeds_shifted.measure(a)
  assert [r["seed"] for r in d["rows"]] == [42] and d["rows"][0]["shift"] == pytest.approx(-0.1)
  assert d["rows"][0]["saving"] == pytest.approx(0.5, abs=1e-6)  # Read at law(1e10): half of 1e10.
  a.seed = [f"42:{tmp_path / 'ref42.json'}"]  # Its scratch ends at the point: no shift, read where it ended.
  row = seeds_shifted.measure(a)["rows"][0]
  assert row["shift"] == 0.0 and row["saving"] is None and "saving_at_least" in row  # Under the fit's floor.
  a.seed = [f"1:{tmp_path / 'a.json'}+{tmp_path / 'b.json'}"]
  # A re-run in another session: scratch trained beside the variant, so their seconds compare. Scratch reaches the
  # variant's loss (the 1e10 point, shifted) with all its 1e10 FLOPs in 100 s; the variant took 60 s: 40% saved.
  (tmp_path / "c.json").write_text(json.dumps({"budgets": [{"steps": 1000, "scratch": {
      "final_eval_loss": law(1e10) - 0.1, "total_flops": 1e10, "train_seconds": 100.0}, "variants": {"planned": {
          "final_eval_loss": law(1e10) - 0.1, "total_flops": 5e9, "train_seconds": 59.0, "transition_seconds": 1.0}}}]}))
  a.seed = [f"42-again:{tmp_path / 'c.json'}"]
  row = seeds_shifted.measure(a)["rows"][1]
  assert row["seed"] == "42-again" and row["saving"] == pytest.approx(0.5, abs=1e-6)
  assert row["seconds_saving"] == pytest.approx(0.4, abs=1e-6)
  assert "+40% (60.0 s; scratch 100.0 s)" in seeds_shifted.table(seeds_shifted.measure(a))
  # The same file, but its scratch run was reused from an earlier command's workroot: no seconds.
  for mark in ({"scratch_reused": "/w/gpt-1000-scratch"}, {"command": "python -m benchmarks.saving --reuse_scratch"}):
    d = json.loads((tmp_path / "c.json").read_text())
    d["budgets"][0].update({k: v for k, v in mark.items() if k != "command"})
    d.update({k: v for k, v in mark.items() if k == "command"})
    (tmp_path / "d.json").write_text(json.dumps(d))
    a.seed = [f"42-again:{tmp_path / 'd.json'}"]
    assert "seconds_saving" not in seeds_shifted.measure(a)["rows"][1], mark


def test_the_seeds_mean_comes_with_its_95_percent_interval(tmp_path):
  """Savings of 0.5 / 0.6 / 0.4 over three seeds: mean 0.5, standard error 0.1 / sqrt(3), and Student's t at 2
  degrees of freedom (4.303) gives the half-width; a single value has no interval."""
  import types
  from benchmarks import seeds_shifted
  law = _reference_seed(tmp_path)
  for seed, flops in ((1, 4e9), (2, 6e9)):
    (tmp_path / f"s{seed}.json").write_text(json.dumps({"budgets": [{
        "steps": 1000, "scratch": {"final_eval_loss": law(1e10)},
        "variants": {"planned": {"final_eval_loss": law(1e10), "total_flops": flops}}}]}))
  a = types.SimpleNamespace(summary=str(tmp_path / "ref.json"), budget=1000, variant="planned", read="fit", out="",
                            seed=[f"{k}:{tmp_path / f's{k}.json'}" for k in (1, 2)])
  d = seeds_shifted.measure(a)
  assert [r["saving"] for r in d["rows"]] == [pytest.approx(x, abs=1e-6) for x in (0.5, 0.6, 0.4)]
  assert d["n"] == 3 and d["ci95"] == pytest.approx(4.3027 * 0.1 / math.sqrt(3), rel=1e-4)
  assert "mean +50% [+40%, +60%]; the mean's 95% interval +25% to +75% (Student's t, 3 seeds)" in seeds_shifted.table(d)
  a.seed = [f"1:{tmp_path / 's1.json'}"]  # Two seeds (0.5, 0.6): standard error 0.05, t at 1 degree of freedom 12.706.
  assert seeds_shifted.measure(a)["ci95"] == pytest.approx(12.706 * 0.05, rel=1e-4)
  assert seeds_shifted.interval95([0.5]) is None


def test_a_seed_with_a_frontier_of_its_own_is_read_there_unshifted(tmp_path):
  """--own=SEED:SUMMARY: a seed whose scratch runs make a frontier of their own is read on it, not on the reference
  seed's shifted by one point. Seed 1's frontier drops 0.2 nats where seed 42's drops 0.1 (same budget point): the
  shifted reading and the own one differ, and the own one is the plain read on seed 1's points."""
  import types
  from absl import app
  from benchmarks import seeds_shifted
  def summary(seed, pts, run):
    return {"seed": seed, "frontier_from": {"points": [{"steps": round(c / 1e7), "total_flops": c,
                                                        "final_eval_loss": l} for c, l in pts]},
            "budgets": [{"steps": 800, "scratch": {"final_eval_loss": pts[-1][1], "total_flops": pts[-1][0],
                                                   "train_seconds": 100.0},
                         "variants": {"planned": run}}]}
  run = {"final_eval_loss": 5.0, "total_flops": 3e9, "train_seconds": 30.0}
  (tmp_path / "ref.json").write_text(json.dumps(summary(42, [(2e9, 5.2), (4e9, 5.1), (8e9, 4.9)], run)))
  (tmp_path / "own1.json").write_text(json.dumps(summary(1, [(2e9, 5.3), (4e9, 5.1), (8e9, 4.9)], run)))
  (tmp_path / "s1.json").write_text(json.dumps({"budgets": [{"steps": 800, "scratch": {"final_eval_loss": 4.9},
                                                              "variants": {"planned": run}}]}))
  a = types.SimpleNamespace(summary=str(tmp_path / "ref.json"), budget=800, variant="planned", read="measured",
                            seed=[f"1:{tmp_path / 's1.json'}"], own=[], out="")
  half_way = math.exp((math.log(4e9) + math.log(8e9)) / 2)  # 5.0 lies half way from 5.1 to 4.9 on both frontiers.
  shifted = seeds_shifted.measure(a)
  assert shifted["rows"][1]["saving"] == pytest.approx(1 - 3e9 / half_way)
  a.seed, a.own = [], [f"1:{tmp_path / 'own1.json'}"]
  d = seeds_shifted.measure(a)
  row = d["rows"][1]
  assert row["seed"] == 1 and row["shift"] == 0.0 and row["frontier"] == str(tmp_path / "own1.json")
  assert row["saving"] == pytest.approx(1 - 3e9 / half_way)
  # Scratch ran beside the variant there: the seconds compare (scratch's 100 s for 8e9 FLOPs, scaled to what it needs).
  assert row["seconds_saving"] == pytest.approx(1 - 30.0 / (100.0 * half_way / 8e9))
  assert "| 1 | 4.9000 | own | 5.0000 |" in seeds_shifted.table(d) and "'own'" in seeds_shifted.table(d)
  # The variant at 5.2: on seed 42's frontier (shift 0) it is under its shortest point, on seed 1's half way between
  # 5.3 and 5.1: only the own reading sees that seed 1's scratch is slower early.
  run2 = {"final_eval_loss": 5.2, "total_flops": 1e9}
  (tmp_path / "own1.json").write_text(json.dumps(summary(1, [(2e9, 5.3), (4e9, 5.1), (8e9, 4.9)], run2)))
  (tmp_path / "s1.json").write_text(json.dumps({"budgets": [{"steps": 800, "scratch": {"final_eval_loss": 4.9},
                                                              "variants": {"planned": run2}}]}))
  assert seeds_shifted.measure(a)["rows"][1]["saving"] == pytest.approx(1 - 1e9 / math.sqrt(2e9 * 4e9))
  a.seed, a.own = [f"1:{tmp_path / 's1.json'}"], []
  assert seeds_shifted.measure(a)["rows"][1]["saving"] == pytest.approx(1 - 1e9 / 2e9)
  # A summary without the variant, or without a fit when the fit is asked for: a clear error.
  a.seed, a.own, a.variant = [], [f"1:{tmp_path / 'own1.json'}"], "other"
  with pytest.raises(app.UsageError, match="no frontier point or no 'other' run at 800"):
    seeds_shifted.measure(a)
  ref = json.loads((tmp_path / "ref.json").read_text())
  (tmp_path / "ref.json").write_text(json.dumps({**ref, "frontier_fit": {"flops": {"E": 4.0, "A": 40.0, "a": 0.1}}}))
  a.variant, a.read = "planned", "fit"
  with pytest.raises(app.UsageError, match=r"--own: .*own1.json has no fitted frontier"):
    seeds_shifted.measure(a)


def test_a_seed_is_read_on_the_measured_frontier_where_the_points_are_no_power_law(tmp_path):
  """--read=measured: log-linear between the reference seed's decayed points (as the planner prices), shifted per
  seed, None past the longest or the shortest; a plateau then a drop, which no E + A F^-a follows."""
  import types
  from absl import app
  from benchmarks import seeds_shifted
  pts = [(1e9, 5.35), (2e9, 5.25), (4e9, 5.20), (8e9, 4.90), (16e9, 4.85)]
  summary = {"seed": 42, "frontier_from": {"points": [{"steps": round(c / 1e7), "total_flops": c,
                                                       "final_eval_loss": l} for c, l in pts]},
             "budgets": [{"steps": 400, "variants": {"planned": {"final_eval_loss": 5.05, "total_flops": 2e9}}}]}
  (tmp_path / "ref.json").write_text(json.dumps(summary))
  entry = lambda scratch, loss: {"budgets": [{"steps": 400, "scratch": {"final_eval_loss": scratch},
                                              "variants": {"planned": {"final_eval_loss": loss, "total_flops": 2e9}}}]}
  (tmp_path / "s1.json").write_text(json.dumps(entry(5.10, 4.95)))  # 0.1 under seed 42's 5.20: read at 5.05.
  (tmp_path / "s2.json").write_text(json.dumps(entry(5.20, 4.80)))  # Past the longest point: not read.
  a = types.SimpleNamespace(summary=str(tmp_path / "ref.json"), budget=400, variant="planned", read="measured",
                            seed=[f"1:{tmp_path / 's1.json'}", f"2:{tmp_path / 's2.json'}"], out="")
  d = seeds_shifted.measure(a)
  half_way = math.exp((math.log(4e9) + math.log(8e9)) / 2)  # 5.05 lies half way from 5.20 to 4.90.
  assert [r["saving"] for r in d["rows"]] == [pytest.approx(1 - 2e9 / half_way)] * 2 + [None]
  assert d["rows"][2]["saving_at_least"] == pytest.approx(1 - 2e9 / 16e9)  # Scratch needs more than its longest run.
  assert "saving_at_least" not in d["rows"][1] and "| at least +88% |" in seeds_shifted.table(d)
  assert d["read"] == "measured" and "measured frontier" in seeds_shifted.table(d)
  a.read = "fit"  # The summary has no fit: said, with the other way out.
  with pytest.raises(app.UsageError, match="--read=measured"):
    seeds_shifted.measure(a)


def test_the_curve_panels_read_runs_without_workdirs_from_the_results_file(tmp_path):
  """A scratch run reused with --scratch_from (or a wiped workroot) has no workdir: its curve comes from the results
  file (it left the FLOPs and seconds panels empty before); a workdir that is there is read instead, and a variant's
  stored curve keeps the target model's (level 0) evaluations only."""
  from benchmarks.report import run_curves
  d = {"family": "gpt", "budgets": [{"steps": 200, "scratch_curve": [[1e8, 1.0, 6.0], [2e8, 2.0, 5.5]],
                                     "variants": {"x": {"curve": [[5e7, 0.4, 6.5, 1], [1.5e8, 1.3, 5.4, 0]]}}}]}
  assert run_curves(d) == {("scratch", 200): [(1e8, 1.0, 6.0), (2e8, 2.0, 5.5)], ("x", 200): [(1.5e8, 1.3, 5.4)]}
  work = tmp_path / "gpt-200-scratch"
  work.mkdir()
  (work / "metrics.jsonl").write_text(json.dumps({"step": 1, "level": 0, "flops": 3e8, "train_seconds": 3.0,
                                                  "eval_loss": 5.1}) + "\n")
  assert run_curves(d, [str(tmp_path)])[("scratch", 200)] == [(3e8, 3.0, 5.1)]
