"""Where a run starts: its workdir's latest checkpoint, else a fresh start; and what a checkpoint holds.

A checkpoint is a tree (the stage's parameters and optimizer state, the snapshots held for later transitions) and a
meta record (``RunPosition``, the resolved config, the data iterator's position, the number of metrics records), so
a resumed run continues exactly where it stopped: the plan is rebuilt with the cuts the run had made, the data and
the metrics file are rewound to the save. A fresh start saves at once and then marks the workdir as started
(``run.json``); a started workdir without a complete checkpoint, a checkpoint of another config, or one written by
another version is refused with what to do, never silently started over.
"""

from __future__ import annotations

import json
import os
from typing import Any, Protocol

import jax
from absl import logging

from multilevel import models as M
from multilevel.checkpoint import Checkpointer, CheckpointError, abstract_like, config_diff
from multilevel.cycles.plan import Method, Plan, Stage
from multilevel.cycles.position import RunPosition
from multilevel.cycles.run_config import RunConfig, default_resolved_config
from multilevel.cycles.transitions import initial_params
from multilevel.metrics import MetricsWriter, write_json_atomic
from multilevel.models import ModelConfig
from multilevel.train import TrainState, param_shardings
from multilevel.train.views import FULL


class Host(Protocol):
  """What starting, restoring and saving a run need from the run (``driver.Runner``): its config (as given and as
  resolved to JSON), method, model, mesh and workdir, its checkpointer, data iterator and metrics writer, where it
  stands (``pos``, set here) and its plan (rebuilt here with the run's cuts), each stage's compiled steps, and its
  save. Declared here so that this module does not import the driver."""

  config: RunConfig
  cfg_json: dict
  method: Method
  model: ModelConfig
  mesh: Any
  workdir: str
  is_main: bool
  ckpt: Checkpointer
  train_iter: Any
  writer: MetricsWriter
  pos: RunPosition
  plan: Plan

  def steps_for(self, stage: Stage) -> Any: ...

  def save(self, state: TrainState, held: dict) -> None: ...

  def eval_fn(self, level: int, view=FULL) -> Any: ...

  def log_eval(self, eval_fn, params, stage: Stage, g: int, event: str) -> dict: ...


def checkpoint(runner: Host, state: TrainState, held: dict) -> tuple[dict, dict]:
  """The tree and the meta record that save the run where it stands (``restore`` reads them back)."""
  tree = {"params": state.params, "opt_state": state.opt_state, "snapshots": {str(k): v for k, v in held.items()}}
  meta = dict(runner.pos.to_meta(), config=runner.cfg_json, data=runner.train_iter.get_state(),
              metrics_count=runner.writer.count)
  return tree, meta


def compared(saved: dict, now: dict) -> tuple[dict, dict]:
  """The parts of a saved and a current config that must agree for a resume: not the options the run's method (or
  its V-cycle's shape: ``cycles.config.unread_keys``) does not read, nor a setting that does not change what is
  trained (``run_config.NOT_RECORDED``: how often and on how many batches a run evaluates, unless an adaptive stage
  ends at an evaluation) where either side left it out (checkpoints of older versions recorded some of them)."""
  from multilevel.cycles.config import METHOD_OPTIONS, unread_keys
  from multilevel.cycles.run_config import NOT_RECORDED, has_key, pop_key
  cycle = now.get("cycle", {})
  method = cycle.get("method", "vcycle")
  unread = {name for name in METHOD_OPTIONS if name != method}
  unread |= set(unread_keys(cycle))
  saved, now = json.loads(json.dumps(saved)), json.loads(json.dumps(now))
  for d in (saved, now):
    for key in unread:
      d.get("cycle", {}).pop(key, None)
  for key in NOT_RECORDED:
    if not (has_key(saved, key) and has_key(now, key)):
      pop_key(saved, key)
      pop_key(now, key)
  return saved, now


def restore(runner: Host) -> tuple[TrainState, dict] | None:
  """The state and held snapshots of the workdir's latest checkpoint, with the runner's plan, position, data
  iterator and metrics file set back to it; None for a workdir where no run has started."""
  ckpt, workdir = runner.ckpt, runner.workdir
  latest = ckpt.latest()
  marker = os.path.join(workdir, "run.json")
  if latest is None:
    if os.path.exists(marker):
      raise CheckpointError(f"{workdir} holds a started run (run.json) but no complete checkpoint under "
                            f"{ckpt.directory}: the checkpoints were deleted or never finished. Start a new "
                            f"--workdir, or delete {workdir} to start this run over.")
    return None
  meta = ckpt.restore_meta(latest)
  saved, now = compared(meta.get("config", {}), runner.cfg_json)
  diff = config_diff(saved, now, defaults=default_resolved_config())
  if diff:
    from_data = sorted({k for k in ("vocab_size", "num_classes", "num_channels") if any(
        line.startswith(f"model.{k}:") for line in diff)})
    hint = (f" ({', '.join('model.' + k for k in from_data)} come{'s' if len(from_data) == 1 else ''} from the data "
            f"when the config leaves {'it' if len(from_data) == 1 else 'them'} at 0: the data changed since the saved "
            f"run)" if from_data else "")
    raise CheckpointError(f"The checkpoint in {workdir} belongs to a different config: " + "; ".join(
        diff[:12]) + f"{hint}. Run with the original config and data to resume, or choose a new --workdir.")
  try:
    pos = RunPosition.from_meta(meta)
  except (KeyError, TypeError) as e:
    raise CheckpointError(f"Checkpoint {latest} in {ckpt.directory} was written by another version of "
                          f"multilevel ({e}); resume it with that version, or start a new --workdir.") from None
  if pos.cuts:
    runner.plan = replan(runner.method, runner.model, runner.config, pos.cuts)
  plan = runner.plan
  stage = plan.stages[pos.stage]
  params = stage.view.abstract(plan.levels[stage.level])
  held = plan.snapshots_before(stage.index)
  steps = runner.steps_for(stage)
  abstract = {"params": params, "opt_state": jax.eval_shape(steps.tx.init, stage.view.split(params)[0]),
              "snapshots": {str(k): M.abstract_params(plan.levels[k]) for k in held}}
  shardings = {"params": steps.shardings.params, "opt_state": steps.shardings.opt_state,
               "snapshots": {str(k): param_shardings(plan.levels[k], runner.mesh) for k in held}}
  tree = ckpt.restore_state(latest, abstract_like(abstract, shardings))
  runner.train_iter.set_state(meta["data"])
  runner.writer.truncate(int(meta["metrics_count"]))
  pos.save_id = latest + 1
  runner.pos = pos
  logging.info("Resumed from checkpoint %d: stage %d step %d (global step %d).", latest, pos.stage,
               pos.stage_step, pos.global_step)
  return TrainState(tree["params"], tree["opt_state"]), {int(k): v for k, v in tree["snapshots"].items()}


def fresh(runner: Host) -> tuple[TrainState, dict]:
  """The first stage's initial state, saved as checkpoint 0 (and waited for) before the workdir is marked as started
  (``run.json``): a marked workdir always has a checkpoint, so one without is known to be damaged."""
  plan = runner.plan
  stage = plan.stages[0]
  steps = runner.steps_for(stage)
  params = initial_params(runner.config, plan, runner.mesh, stage.level)
  if stage.view is not FULL:
    cfg = plan.levels[stage.level]
    to_view = jax.jit(lambda p: stage.view.from_model(cfg, p))
    if jax.default_backend() == "cpu" and runner.mesh.devices.size > 1 and jax.process_count() == 1:
      # On a CPU mesh of several devices this program deadlocked in XLA (CoRe's SVD start): one device computes it.
      params = jax.device_put(to_view(jax.device_get(params)), steps.shardings.params)
    else:
      params = jax.jit(to_view, out_shardings=steps.shardings.params)(params)
  state = steps.init_state(params)
  runner.pos = RunPosition()
  runner.writer.truncate(0)
  if runner.config.init_from and stage.view is not FULL:
    logging.warning("init_from=%s: the first stage (%s) trains the imported model as %s, so it starts from that form "
                    "of the checkpoint, not its own function (the 'imported' evaluation scores that form).",
                    runner.config.init_from, stage.name, stage.view.name)
  if runner.config.init_from:  # What the imported model scores before any step: its function kept, or not.
    runner.log_eval(runner.eval_fn(stage.level, stage.view), state.params, stage, 0, "imported")
  runner.save(state, {})
  runner.ckpt.wait()
  if runner.is_main:
    write_json_atomic(os.path.join(runner.workdir, "run.json"),
                      {"config": runner.cfg_json, "plan": plan.describe().splitlines()})
  return state, {}


def replan(method: Method, model: ModelConfig, run: RunConfig, cuts: list) -> Plan:
  """The plan with the adaptive stages that ended early cut where they ended (``RunPosition.cuts``)."""
  plan = method.build_plan(model, run.cycle, run.train, cuts=tuple(tuple(c) for c in cuts))
  logging.info("%s", plan.describe())
  return plan
