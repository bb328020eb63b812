"""The final parameters of a saving benchmark's runs evaluated on more held-out data than the runs' own evaluations.

  python -m benchmarks.final_eval --results=benchmarks/results/deit_wsd_lr2e-3_frontier.json \
      --workroot=/tmp/mlb-deit --eval_batches=1000 --out_suffix=_full

A run evaluates on ``data.max_eval_batches`` batches (8 in ``benchmarks.saving``: 1,024 images for DeiT), the same
batches for every run, so runs compare paired; but on 1,024 images one classifier's loss still moves by a few
hundredths of a nat, as much as the gap between neighbouring budgets of the frontier. This re-reads each finished
run's final parameters (``multilevel.checkpoint.load_run``, checked against the digest its summary recorded) and
evaluates them on up to ``--eval_batches`` batches of the same held-out split (all of Fashion-MNIST's 10,000 test
images at 1000), then writes a copy of each results file (``<name><out_suffix>.json``) whose ``final_eval_loss``
values are the new ones. The runs' eval curves are of the smaller set, so the copy drops them and every figure read
off them (savings "to reach", the loss at equal FLOPs): read the copy's savings off a frontier, the fitted one
(``benchmarks.analyze_saving --fit``), which uses final losses only. Each entry keeps its run's own final loss as
``final_eval_loss_run``.

A run's workdir is found in the ``--workroot`` given for its file (``<family>-<steps>-<variant>``); a scratch run
reused from another file (``benchmarks.saving --scratch_from``) in any of the workroots, where its run ended at the
loss the file records, or else in that file's own copy (``<file><out_suffix>.json``, written by an earlier call at the
same ``--eval_batches``), which already holds its new loss: a frontier re-evaluated once serves every method run
against it later, after its workdirs are gone. Level-run files of ``benchmarks.bound`` (smaller models alone, for
``analyze_saving --envelope``) are read the same way (``<family>-L<level>-lr<scale>-<steps>``). Nothing is written
until every run has been evaluated; each copy is written atomically.
"""

from __future__ import annotations

import json
import math
import os

from absl import app, flags, logging

from benchmarks import cli

_CURVE_FIELDS = ("flops_to_reach", "seconds_to_reach", "flops_saving", "seconds_saving", "equal_flops_loss_diff")


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_list("results", [], "benchmarks.saving results files.", flag_values=fv)
  flags.DEFINE_list("workroot", [], "Each file's --workroot (one per file, in the same order).", flag_values=fv)
  flags.DEFINE_integer("eval_batches", 1000, "Held-out batches to evaluate on (at most what the split holds).",
                       flag_values=fv)
  flags.DEFINE_string("out_suffix", "_full", "The copies are written beside the files with this suffix.",
                      flag_values=fv)
  flags.DEFINE_string("out", "", "JSON of the new evaluations (the copies are written either way).", flag_values=fv)


def evaluate_run(workdir: str, eval_batches: int) -> dict:
  """``{'eval_loss', 'eval_accuracy', 'examples'}`` of the run's final target model on ``eval_batches`` batches of
  its own data config's held-out split."""
  from multilevel import checkpoint
  from multilevel import models as M
  from multilevel.cycles.run_config import RunConfig, objective_config
  from multilevel.data import make_data
  from multilevel.train import Evaluator, StepConfig, eval_step, make_mesh

  path = os.path.join(workdir, "run.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"No run.json in {workdir}: not a run's workdir (give the --workroot the benchmark ran "
                            "with).")
  with open(path) as f:
    cfg = json.load(f)["config"]
  cfg["data"]["max_eval_batches"] = eval_batches
  run = RunConfig.from_config(cfg)
  model, params = checkpoint.load_run(workdir)
  fam = M.family_of(model)
  train_iter, batches, info = make_data(
      run.data, kind=fam.modality, batch_size=run.train.batch_size, seq_len=model.max_len if fam.is_text else None,
      image_size=None if fam.is_text else model.image_size, seed=run.train.seed, model_family=model.family)
  train_iter.close()
  mesh = make_mesh(run.train.mesh, 1)
  fn = eval_step(StepConfig(model, objective_config(run, model, info), 1, run.train.seed), mesh)
  rows = []

  def counted():  # The examples evaluated, counted on the one pass the evaluation makes.
    for b in batches():
      rows.append(len(next(iter(b.values()))))
      yield b

  out = Evaluator(counted, mesh)(fn, params)
  out["examples"] = sum(rows)
  return out


def _find(name: str, roots: list[str], loss: float | None) -> str:
  """The workdir ``name`` under ``roots``; with ``loss``, the one whose run ended at that final eval loss."""
  for root in roots:
    d = os.path.join(root, name)
    if not os.path.exists(os.path.join(d, "summary.json")):
      continue
    if loss is None:
      return d
    with open(os.path.join(d, "summary.json")) as f:
      if abs(json.load(f)["final_eval_loss"] - loss) < 1e-6:
        return d
  raise FileNotFoundError(f"No finished run {name} under {', '.join(roots)}" +
                          ("" if loss is None else f" that ended at eval loss {loss:.6f}") +
                          ": give the workroot(s) its benchmark ran with.")


def _redo(entry: dict, new: dict) -> None:
  entry["final_eval_loss_run"] = entry["final_eval_loss"]
  entry["final_eval_loss"] = new["eval_loss"]
  entry["final_eval_accuracy"] = new["eval_accuracy"]
  entry.pop("curve", None)
  for k in _CURVE_FIELDS:
    if k in entry:
      entry[k] = None
  if "reached" in entry:
    entry["reached"] = None


def measure(a) -> dict:
  if not a.results or len(a.results) != len(a.workroot):
    raise app.UsageError("Give --results and one --workroot per results file.")
  from multilevel.files import write_json_atomic
  done, copies, written = {}, [], []
  for path, root in zip(a.results, a.workroot):
    mine, examples = [], []
    with open(path) as f:
      d = json.load(f)
    for name, entry, own, budget in _entries(d):
      try:
        wd = _find(name, [root] if own else list(a.workroot), None if own else entry["final_eval_loss"])
      except FileNotFoundError:
        earlier = None if own else _from_copy(budget, entry, a.out_suffix, a.eval_batches)
        if earlier is None:
          raise
        _redo(entry, earlier)
        examples.append(earlier["examples"])
        continue
      if wd not in done:
        done[wd] = evaluate_run(wd, a.eval_batches)
        logging.info("%s: %.4f on %d examples (the run's own evaluation: %.4f)", wd, done[wd]["eval_loss"],
                     done[wd]["examples"], entry["final_eval_loss"])
      _redo(entry, done[wd])
      mine.append(wd)
      examples.append(done[wd]["examples"])
    for b in d.get("budgets", []):
      b.pop("scratch_curve", None)
    d["final_eval"] = {"command": cli.command("benchmarks.final_eval"), "eval_batches": a.eval_batches,
                       "examples": examples[0],
                       "note": "final_eval_loss re-evaluated on more held-out data; curves and the figures read off "
                               "them dropped (they are of the runs' own, smaller evaluation set)"}
    out = path[:-len(".json")] + a.out_suffix + ".json" if path.endswith(".json") else path + a.out_suffix
    copies.append((out, d))
    written.append({"file": out, "runs": [(w, done[w]) for w in mine]})
  for out, d in copies:  # Only once every run has been evaluated.
    write_json_atomic(out, d)
  return {"command": cli.command("benchmarks.final_eval"), "written": written}


def _entries(d: dict):
  """(workdir name, entry, whether the run is the file's own, its budget) of every run in a results file: a saving
  benchmark's scratch and variants per budget, or a ``benchmarks.bound`` file's level runs (budget None)."""
  if "runs" in d:
    for r in d["runs"]:
      yield f"{d['family']}-L{d['level']}-lr{r['lr_scale']:g}-{r['steps']}", r, True, None
    return
  for b in d["budgets"]:
    yield f"{d['family']}-{b['steps']}-scratch", b["scratch"], "scratch_from" not in b, b
    for v, e in b.get("variants", {}).items():
      yield f"{d['family']}-{b['steps']}-{v}", e, True, b


def _from_copy(budget: dict, entry: dict, suffix: str, eval_batches: int) -> dict | None:
  """The new evaluation of a scratch run reused from another results file, read from that file's copy: the same
  budget's scratch there, whose run ended at the loss ``entry`` records, evaluated on as many batches. None if there
  is no such copy or run."""
  src = budget.get("scratch_from")
  copy = None if not src else (src[:-len(".json")] if src.endswith(".json") else src) + suffix + ".json"
  if copy is None or not os.path.exists(copy):
    return None
  with open(copy) as f:
    d = json.load(f)
  if d.get("final_eval", {}).get("eval_batches") != eval_batches:
    return None
  for b in d.get("budgets", []):
    s = b.get("scratch", {})
    if b["steps"] == budget["steps"] and abs(s.get("final_eval_loss_run", math.inf) - entry["final_eval_loss"]) < 1e-6:
      return {"eval_loss": s["final_eval_loss"], "eval_accuracy": s.get("final_eval_accuracy"),
              "examples": d["final_eval"]["examples"]}
  return None


def table(d: dict) -> str:
  lines = ["| run | eval loss | accuracy | examples |", "|---|---|---|---|"]
  seen = set()
  for w in d["written"]:
    for name, r in w["runs"]:
      if name not in seen:
        seen.add(name)
        lines.append(f"| {name} | {r['eval_loss']:.4f} | {r['eval_accuracy']:.4f} | {r['examples']} |")
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run_report(define_flags, measure, table)
