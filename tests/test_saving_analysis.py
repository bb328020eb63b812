"""The saving benchmark's analysis (``benchmarks.analyze_saving``, ``frontiers``, ``report``, ``plot_methods``):
frontier fits, merging results files, several seeds, the envelope and the figures, on results written by hand (no
training). Further seeds read on one seed's frontier: ``test_seeds_shifted.py``."""

import json
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
