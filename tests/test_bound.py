"""The lossless hand-over bound (benchmarks/bound.py) on frontiers whose answer is known in closed form."""

import json
import math

import pytest

from benchmarks import bound
from multilevel.cycles.planner import Frontier, bound_at, ideal_cost


def loglinear(name, l_hi, l_lo, f_at_hi, per_nat, n=5):
  """A frontier whose log FLOPs grows by ``per_nat`` per nat of loss, measured at ``n`` budgets."""
  pts = []
  for i in range(n):
    l = l_hi - (l_hi - l_lo) * i / (n - 1)
    pts.append((f_at_hi * math.exp(per_nat * (l_hi - l)), l))
  return Frontier(name, tuple(pts))


BIG = loglinear("big", 6.0, 4.0, 1e12, 2.0)


def test_frontier_reads_costs_log_linearly_and_keeps_the_lower_envelope():
  assert BIG.cost(5.0) == pytest.approx(1e12 * math.e ** 2, rel=1e-12)
  assert BIG.cost(3.9) is None and BIG.cost(6.1) is None
  # A longer run that ends higher than a shorter one is off the frontier.
  f = Frontier("x", ((1.0, 5.0), (2.0, 4.0), (4.0, 4.5), (8.0, 3.0)))
  assert f.points == ((1.0, 5.0), (2.0, 4.0), (8.0, 3.0))
  with pytest.raises(ValueError, match="at least two budgets"):
    Frontier("one", ((1.0, 5.0),))


def test_two_level_bound_hands_over_where_the_small_model_stops_being_cheaper():
  # The small model costs a quarter of the big one's FLOPs at every loss down to 5.0 and cannot go lower: the ideal
  # run trains it to 5.0, hands over, and saves 3/4 F_big(5.0), whatever the target loss below.
  small = loglinear("small", 6.0, 5.0, 0.25e12, 2.0)
  r = ideal_cost([small, BIG], 4.0, grid=401)
  assert r["switch_losses"] == [pytest.approx(5.0)]
  saved = 0.75 * BIG.cost(5.0)
  assert r["flops"] == pytest.approx(BIG.cost(4.0) - saved, rel=1e-9)
  b = bound_at([small, BIG], 4.0)
  assert b["bound_saving"] == pytest.approx(saved / BIG.cost(4.0), rel=1e-2)
  assert b["envelope_model"] == "big" and b["envelope_saving"] == 0.0  # The small model never reaches 4.0.


def test_a_small_model_that_learns_slower_is_left_before_it_stops_being_cheaper():
  # Small: cheaper at high loss, but its cost grows faster with each nat (4 vs 2): F_b - F_s peaks inside its range,
  # where the slopes match (d F_s / dL = d F_b / dL), not at the small model's last budget.
  small = loglinear("small", 6.0, 4.5, 0.1e12, 4.0)
  r = ideal_cost([small, BIG], 4.0, grid=3001)
  # F_b = e^{2(6-L)}, F_s = 0.1 e^{4(6-L)}: the gap peaks at e^{2(6-L)} = 5, L = 6 - ln(5)/2.
  assert r["switch_losses"][0] == pytest.approx(6 - math.log(5) / 2, abs=2e-3)
  gap = BIG.cost(r["switch_losses"][0]) - small.cost(r["switch_losses"][0])
  assert r["flops"] == pytest.approx(BIG.cost(4.0) - gap, rel=1e-6)


def test_a_useless_small_model_gives_no_bound_and_a_middle_level_only_adds():
  dear = loglinear("small", 6.0, 5.0, 2e12, 2.0)  # Twice the big model's cost at every loss.
  r = ideal_cost([dear, BIG], 4.0)
  assert r["switch_losses"] == [None] and r["flops"] == pytest.approx(BIG.cost(4.0))
  small = loglinear("small", 6.0, 5.0, 0.25e12, 2.0)
  mid = loglinear("mid", 6.0, 4.5, 0.5e12, 2.0)
  two = bound_at([small, BIG], 4.0)["bound_saving"]
  three = bound_at([small, mid, BIG], 4.0)
  assert three["bound_saving"] > two + 0.01
  assert three["switch_losses"][0] == pytest.approx(5.0, abs=0.01)  # Small to its end, then the middle one.
  assert three["switch_losses"][1] == pytest.approx(4.5, abs=0.01)


def test_the_envelope_names_a_smaller_model_that_reaches_the_loss_for_less():
  small = loglinear("small", 6.0, 3.5, 0.25e12, 2.0)
  b = bound_at([small, BIG], 4.0)
  assert b["envelope_model"] == "small" and b["envelope_saving"] == pytest.approx(0.75, rel=1e-9)
  assert b["envelope_at_least"] == {}
  # A small model whose shortest run already ends below the loss: only a lower bound on what it saves alone.
  low = loglinear("small", 5.5, 3.5, 0.25e12, 2.0)
  b = bound_at([low, BIG], 5.8)
  assert b["envelope_at_least"]["small"] == pytest.approx(1 - 0.25e12 / BIG.cost(5.8), rel=1e-9)


def test_the_level_overrides_are_the_default_plans_small_model():
  assert bound.level_overrides("gpt", 1, 2, {}) == {"model.num_layers": 2, "model.num_heads": 1}
  assert bound.level_overrides("deit", 1, 2, {}) == {"model.num_layers": 2, "model.num_heads": 1}
  with pytest.raises(bound.app.UsageError, match="raise --levels"):
    bound.level_overrides("gpt", 2, 2, {})


def test_analyse_reads_results_files_and_plots(tmp_path):
  def budget(steps, flops, loss):
    return {"steps": steps, "tokens_per_param": steps / 10, "scratch": {"total_flops": flops, "final_eval_loss": loss},
            "variants": {"vc": {"frontier_flops_saving": 0.1}}}
  target = tmp_path / "target.json"
  target.write_text(json.dumps({"budgets": [budget(100 * 2 ** i, p[0], p[1]) for i, p in enumerate(BIG.points)]}))
  level = tmp_path / "L1.json"
  small = loglinear("small", 6.0, 5.0, 0.25e12, 2.0)
  level.write_text(json.dumps({"command": "x", "level": 1, "model": {}, "base_lr": 1e-3, "runs": [
      {"steps": i + 1, "lr_scale": s, "total_flops": f, "final_eval_loss": l + (0.1 if s == 2 else 0.0)}
      for s in (2, 4) for i, (f, l) in enumerate(small.points)]}))
  methods = tmp_path / "summary.json"
  methods.write_text(target.read_text())
  a = bound.cli.parse(bound.define_flags, [f"--levels_from={level}", f"--target={target}", f"--methods={methods}"])
  d = bound.analyse(a)
  assert d["level_frontiers"]["L1"] == small.points  # The better learning rate at each budget.
  top = [r for r in d["budgets"] if r["scratch_loss"] == 4.0][0]
  assert top["2-level"]["bound_saving"] == pytest.approx(0.75 * BIG.cost(5.0) / BIG.cost(4.0), rel=1e-2)
  assert "| 1600 |" in bound.table(d) and d["measured"]["vc"]
  bound.plot(d, str(tmp_path / "b.png"))
  assert (tmp_path / "b.png").stat().st_size > 1000


def test_levels_from_pools_one_levels_files_joined_by_plus_and_names_a_missing_file(tmp_path):
  """--levels_from=a.json+b.json: a level's runs split over two files (e.g. longer and shorter budgets run apart)
  give the frontier of one file holding them all; a file that is not there, or is not a level-run file, is a usage
  error naming it."""
  def budget(steps, flops, loss):
    return {"steps": steps, "tokens_per_param": steps / 10, "scratch": {"total_flops": flops, "final_eval_loss": loss},
            "variants": {}}
  target = tmp_path / "target.json"
  target.write_text(json.dumps({"budgets": [budget(100 * 2 ** i, p[0], p[1]) for i, p in enumerate(BIG.points)]}))
  small = loglinear("small", 6.0, 5.0, 0.25e12, 2.0)
  runs = [{"steps": i + 1, "lr_scale": 2, "total_flops": f, "final_eval_loss": l} for i, (f, l) in
          enumerate(small.points)]
  head = {"command": "x", "level": 1, "model": {}, "base_lr": 1e-3}
  whole, long, short = tmp_path / "all.json", tmp_path / "long.json", tmp_path / "short.json"
  whole.write_text(json.dumps({**head, "runs": runs}))
  long.write_text(json.dumps({**head, "runs": runs[2:]}))
  short.write_text(json.dumps({**head, "runs": runs[:2]}))
  one = bound.analyse(bound.cli.parse(bound.define_flags, [f"--levels_from={whole}", f"--target={target}"]))
  two = bound.analyse(bound.cli.parse(bound.define_flags, [f"--levels_from={long}+{short}", f"--target={target}"]))
  assert sorted(two["level_frontiers"]["L1"]) == sorted(one["level_frontiers"]["L1"]) == sorted(small.points)
  assert [r["2-level"] for r in two["budgets"]] == [r["2-level"] for r in one["budgets"]]
  missing = tmp_path / "nope.json"
  with pytest.raises(bound.app.UsageError, match="cannot read .*nope.json"):
    bound.analyse(bound.cli.parse(bound.define_flags, [f"--levels_from={long}+{missing}", f"--target={target}"]))
  with pytest.raises(bound.app.UsageError, match="target.json is not a level-run JSON"):
    bound.analyse(bound.cli.parse(bound.define_flags, [f"--levels_from={long}+{target}", f"--target={target}"]))


def test_a_chain_of_small_models_gives_each_ones_bound_and_the_chains(tmp_path):
  """--chain: two small models of different shapes (the halved one, then a depth-only one), each file named by its
  cycle settings; the whole chain's bound is at least either 2-level bound (any model of it may be skipped)."""
  def budget(steps, flops, loss):
    return {"steps": steps, "tokens_per_param": steps / 10, "scratch": {"total_flops": flops, "final_eval_loss": loss},
            "variants": {}}
  target = tmp_path / "target.json"
  target.write_text(json.dumps({"budgets": [budget(100 * 2 ** i, p[0], p[1]) for i, p in enumerate(BIG.points)]}))
  files = []
  for name, front, cycle in (("halve", loglinear("a", 6.0, 5.0, 0.25e12, 2.0), {}),
                             ("depth", loglinear("b", 6.0, 4.5, 0.5e12, 2.0), {"cycle.width_factor": "1"})):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"command": name, "level": 1, "model": {"name": name}, "base_lr": 1e-3, "set": cycle,
                                "runs": [{"steps": i + 1, "lr_scale": 1, "total_flops": f, "final_eval_loss": l}
                                         for i, (f, l) in enumerate(front.points)]}))
    files.append(str(path))
  # The halved model's runs split over two files (say, one per learning rate), pooled with '+'.
  whole = json.loads(open(files[0]).read())
  for i, part in enumerate((whole["runs"][:2], whole["runs"][2:])):
    (tmp_path / f"halve{i}.json").write_text(json.dumps(dict(whole, runs=part)))
  files[0] = f"{tmp_path / 'halve0.json'}+{tmp_path / 'halve1.json'}"
  a = bound.cli.parse(bound.define_flags, [f"--chain={','.join(files)}", f"--target={target}"])
  d = bound.analyse(a)
  assert d["level_frontiers"]["L1"] == loglinear("a", 6.0, 5.0, 0.25e12, 2.0).points  # All its runs, pooled.
  assert d["chains"] == ["2-level from L1", "2-level from L1 width_factor=1", "3-level chain"]
  for r in d["budgets"]:
    if all(r[n] for n in d["chains"]):
      assert r["3-level chain"]["bound_saving"] >= max(r[n]["bound_saving"] for n in d["chains"][:2]) - 1e-9
  assert "3-level chain bound" in bound.table(d)
  bound.plot(d, str(tmp_path / "chain.png"))
  assert (tmp_path / "chain.png").stat().st_size > 1000
  with pytest.raises(bound.app.UsageError, match="--chain: .*target.json is not a level-run JSON"):
    bound.analyse(bound.cli.parse(bound.define_flags, [f"--chain={files[1]}+{target}", f"--target={target}"]))
