"""The driver: runs any method's ``Plan`` in one process, with transitions, evaluation, checkpoints and resumption.

``train_and_evaluate(config, workdir)`` is the whole job. Everything that can be checked before training (the
config, the plan, the mesh against the batch) is checked before anything is written to the workdir; a workdir in
use by another run is refused. The run's own workdir is restored first (the latest complete checkpoint), else
training starts from scratch (or from ``init_from``); a workdir whose checkpoints are gone, damaged, or belong to
another config raises ``CheckpointError`` instead of silently starting over. A killed run started again with the
same command ends with the same parameters, bit for bit, as one never interrupted: data order, dropout and masking
depend only on the seed, the global step and the saved iterator position.

The method (``multilevel.cycles.METHODS``) supplies the plan and the transitions; the driver owns the loop, the
timing, the evaluations and the logs. How a stage's parameters arrive (the first stage's init, the transition into
each later one) is in ``transitions.py``; where a run starts (a fresh start or the latest checkpoint) and what a
checkpoint holds, in ``resume.py``; what a finished run records, in ``summary.py``.
"""

from __future__ import annotations

import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from multilevel import models as M
from multilevel.checkpoint import Checkpointer, CheckpointError, after_divergence, quiet_orbax_logs
from multilevel.cycles.plan import Plan, Stage, method_of
from multilevel.cycles.position import RunPosition
from multilevel.cycles.preflight import check_batch, check_dtype, default_devices
from multilevel.cycles.resume import checkpoint, fresh, replan, restore
from multilevel.cycles.run_config import (RunConfig, config_json, data_config, model_config, objective_config,
                                          resolved_config)
from multilevel.cycles.summary import keep_tokenizer, run_summary
from multilevel.cycles.transitions import check_init_from, transition
from multilevel.distributed import check_same_config
from multilevel.metrics import MetricsWriter, write_json_atomic
from multilevel.operators.finite import first_nonfinite
from multilevel.train import (Evaluator, StepConfig, TrainState, build_steps, eval_step, make_mesh, put_batch,
                              tokens_per_example)
from multilevel.train.views import FULL
from multilevel.workdir import WorkdirLock, WorkdirLockedError

# What a user's config, data, checkpoint or machine can cause: the command line reports these in one line.
EXPECTED_ERRORS = (ValueError, TypeError, OSError, CheckpointError, WorkdirLockedError, FloatingPointError)


def _fault(point: str) -> None:
  """Test hook: ``MULTILEVEL_FAULT=<point>`` kills the process there (exit 137), as a crash or SIGKILL would.

  Points: ``step:N`` (after global step N is dispatched), ``transition:K`` (after the K-th level transition, before
  it is saved), ``save:N`` (while save N is still being written in the background). ``<point>:sigint`` sends the
  process a SIGINT there instead, as Ctrl-C would.
  """
  fault = os.environ.get("MULTILEVEL_FAULT")
  if fault == point:
    logging.warning("MULTILEVEL_FAULT=%s: killing the process here.", point)
    os._exit(137)
  if fault == f"{point}:sigint":
    import signal
    os.kill(os.getpid(), signal.SIGINT)


class Runner:
  """State of one run; ``run()`` executes the plan from wherever the workdir says it stopped. ``close()`` (or
  leaving a ``with`` block) waits for pending saves and frees the data threads and the workdir lock."""

  def __init__(self, config, workdir: str):
    self._closers = []
    self._failed = False  # Set by _abandon: the workdir lock then discards what the run wrote (a lone process).
    try:
      self._setup(config, workdir)
    except BaseException:
      self._abandon()  # A half-built run gives back the lock and the data threads at once.
      raise

  def _setup(self, config, workdir: str) -> None:
    self.config = RunConfig.from_config(config)
    run, tc = self.config, self.config.train
    self.workdir = os.path.abspath(os.path.expanduser(workdir))
    self.is_main = jax.process_index() == 0
    self.method = method_of(run.cycle.method)
    check_same_config(config_json(run))  # Several processes: all with the same config, or all refuse.
    # Checks that need no data come first: nothing is written before the config, the plan and the mesh are valid.
    probe = model_config(run, None)
    probe_plan = self.method.build_plan(probe, run.cycle, tc)
    check_init_from(run, probe_plan, probe_plan.stages[0].level)
    self.mesh = make_mesh(tc.mesh, tc.num_devices or default_devices(tc.mesh))
    check_batch(tc, self.mesh)
    check_dtype(probe)
    from multilevel.data import DataConfig, check_sources
    check_sources(DataConfig.from_config(run.data, "data"), M.family_of(probe).modality)
    if run.init_from and not os.path.exists(os.path.expanduser(run.init_from)):
      raise ValueError(f"init_from={run.init_from} does not exist: give a Hugging Face model folder (what "
                       f"save_pretrained or experiments.export writes) or its weights file; hub names are not "
                       f"downloaded.")
    # On CPU, XLA's all-reduce over several devices can deadlock when steps are dispatched without waiting
    # (../shared/docs/environment.md): there the loop waits for each step's loss.
    self._sync_each_step = jax.default_backend() == "cpu" and self.mesh.devices.size > 1
    lock = WorkdirLock(self.workdir, jax.process_index())  # (Refused by another run's lock: nothing discarded.)
    alone = jax.process_count() == 1
    self._closers.append(lambda: lock.release(discard_unless="run.json" if self._failed and alone else None))
    from multilevel.data import make_data  # Imported here: the data stack is heavy and only a run needs it.

    fam = M.family_of(probe)
    self.data = data_config(run, fam)
    self.train_iter, self.eval_batches, self.info = make_data(
        self.data, kind=fam.modality, batch_size=tc.batch_size,
        seq_len=probe.max_len if fam.is_text else None,
        image_size=None if fam.is_text else probe.image_size, seed=tc.seed, model_family=probe.family)
    self._closers.append(self.train_iter.close)
    self.model = model_config(run, self.info)
    self.plan: Plan = self.method.build_plan(self.model, run.cycle, tc)
    self.objective = objective_config(run, self.model, self.info)
    self.evaluate = Evaluator(self.eval_batches, self.mesh)
    self.cfg_json = resolved_config(run, self.model, adaptive=any(s.stop is not None for s in self.plan.stages))
    quiet_orbax_logs()
    self.ckpt = Checkpointer(os.path.join(self.workdir, "checkpoints"), keep=run.checkpoint.keep,
                             async_save=run.checkpoint.async_save, verify=run.checkpoint.verify)
    self._closers.append(self.ckpt.close)
    self.writer = MetricsWriter(self.workdir, enabled=self.is_main, tensorboard=run.tensorboard)
    self._closers.append(self.writer.close)
    self.pos = RunPosition()
    self.last_eval: tuple[int, dict] | None = None  # (global step, metrics) of the latest end-of-stage evaluation.
    logging.info("Data: %s", self.info.description)
    logging.info("%s", self.plan.describe())

  def __enter__(self):
    return self

  def __exit__(self, exc_type, *exc):
    if exc_type is None:
      self.close()
    else:
      self._abandon()

  def close(self) -> None:
    """Frees what the run holds, last opened first; safe to call twice."""
    while self._closers:
      self._closers.pop()()

  def _abandon(self) -> None:
    """``close()`` after a failure. A run that stops before the workdir is marked as started (``run.json``: a data
    refusal, a refused ``init_from``, Ctrl-C while compiling) leaves nothing behind in a workdir it created: no lock,
    no empty ``checkpoints/`` or ``metrics.jsonl``, no checkpoint 0 without its mark (nothing is half-written)."""
    self._failed = True
    self.close()

  # ---- compiled pieces ---------------------------------------------------------------------------------------

  def step_config(self, level: int, view=FULL) -> StepConfig:
    tc = self.config.train
    return StepConfig(self.plan.levels[level], self.objective, tc.grad_accum, tc.seed, view)

  def steps_for(self, stage: Stage):
    """The stage's ``Steps`` (optimizer, train and eval steps), jitted once per shape, view and optimizer."""
    return build_steps(self.step_config(stage.level, stage.view), stage.optim, self.mesh)

  def eval_fn(self, level: int, view=FULL):
    """The evaluation of level ``level``'s model, held as ``view`` holds it (a stage's tree, or a plain one); a view
    that uses the step is evaluated at the run's current global step."""
    fn = eval_step(self.step_config(level, view), self.mesh)
    if not view.uses_step:
      return fn
    g = jnp.int32(self.pos.global_step)
    return lambda params, batch, index: fn(params, batch, index, g)

  def compile(self, build):
    """``build()`` (an ahead-of-time compilation), timed as compile seconds: kept out of the training wall-clock."""
    t0 = time.perf_counter()
    out = build()
    self.pos.compile_seconds += time.perf_counter() - t0
    return out

  # ---- checkpoints -------------------------------------------------------------------------------------------

  def save(self, state: TrainState, held: dict) -> None:
    """Saves the run where it stands (``resume.checkpoint``) as checkpoint ``pos.save_id``; ``resume.restore``
    reads the latest one back."""
    bad = first_nonfinite(state.params)  # A last update can diverge with a finite loss (computed before it).
    if bad is not None:
      stage = self.plan.stages[self.pos.stage]
      where = f"Parameter {bad!r} holds a NaN or an infinity at global step {self.pos.global_step} (stage " \
              f"{stage.name}, level {stage.level})"
      if self.pos.save_id == 0:  # Checkpoint 0: the initial parameters.
        raise FloatingPointError(f"{where} before any training: it came with the initial parameters (init_from's "
                                 f"checkpoint, or the first stage's form of them). Nothing was saved.")
      cause = ("though the training loss was finite: an update diverged (an infinite gradient, an overflow)"
               if self.pos.stage_step else f"right after the transition into stage {stage.name}")
      raise FloatingPointError(f"{where}, {cause}. {after_divergence(self.ckpt.directory)}")
    self.writer.flush()
    tree, meta = checkpoint(self, state, held)
    self.ckpt.save(self.pos.save_id, tree, meta)  # Device arrays: Orbax writes each process's shards itself.
    _fault(f"save:{self.pos.save_id}")
    self.pos.save_id += 1

  # ---- evaluations -------------------------------------------------------------------------------------------

  def log_eval(self, eval_fn, params, stage: Stage, g: int, event: str) -> dict:
    ev = self.evaluate(eval_fn, params)
    rec = {"step": g, "stage": stage.index, "level": stage.level, "event": event, **self._eval_fields(ev)}
    self.writer.write(rec)
    logging.info("step %d %s (stage %s): eval loss %.4f", g, event, stage.name, ev["eval_loss"])
    return ev

  def _eval_fields(self, ev: dict) -> dict:
    return ev if M.family_of(self.model).reports_accuracy else {"eval_loss": ev["eval_loss"]}

  # ---- the loop ----------------------------------------------------------------------------------------------

  def run(self) -> dict:
    restored = restore(self)
    state, held = restored if restored is not None else fresh(self)
    progress = self._progress(self.pos.global_step)
    try:
      while True:
        stage = self.plan.stages[self.pos.stage]
        if self.pos.stage_step < stage.steps:
          state = self.train_stage(state, held, stage, progress)
        if self.pos.stage + 1 == len(self.plan.stages):
          break
        nxt = self.plan.stages[self.pos.stage + 1]
        state, held = transition(self, state, held, stage, nxt)
        self.pos.enter(nxt.index)
        _fault(f"transition:{nxt.index}")
        self.save(state, held)
    finally:
      if progress is not None:
        progress.close()
    return self.finish(state)

  def train_stage(self, state: TrainState, held: dict, stage: Stage, progress) -> TrainState:
    """Dispatches the stage's steps; step t's metrics are fetched after step t + 1 is dispatched, and the
    boundaries (log, evaluation, checkpoint) are handled by ``_at_boundary``."""
    tc, pos = self.config.train, self.pos
    cfg = self.plan.levels[stage.level]
    steps = self.steps_for(stage)
    step_flops = stage.view.train_flops_per_step(cfg, tc.batch_size, self.objective)
    window: list[float] = []
    pending, compiled = None, None
    timer = _StageTimer(pos, stage.index)
    while pos.stage_step < self.plan.stages[stage.index].steps:  # (An adaptive stage's plan may cut it short.)
      g = pos.global_step
      batch = put_batch(next(self.train_iter), self.mesh)
      if compiled is None:  # Compile outside the timed region: train seconds are steps, not compilation.
        timer.pause(state)
        compiled = self.compile(lambda: steps.compile_train(state, batch, jnp.int32(g)))
        timer.start()
      state, metrics = compiled(state, batch, jnp.int32(g))
      _fault(f"step:{g + 1}")
      if pending is not None:
        window.append(self._fetch_loss(pending, stage, cfg))
      pending, last = (g + 1, metrics), metrics
      if self._sync_each_step:
        window.append(self._fetch_loss(pending, stage, cfg))
        pending = None
      pos.count_step(stage.index, step_flops, tc.batch_size)
      if progress is not None:
        progress.update(1)
      g1, done = pos.global_step, pos.stage_step == stage.steps
      due_eval = (tc.eval_every > 0 and g1 % tc.eval_every == 0) or done
      due_ckpt = (self.config.checkpoint.every > 0 and g1 % self.config.checkpoint.every == 0) or done
      if g1 % tc.log_every == 0 or due_eval or due_ckpt:
        if pending is not None:
          window.append(self._fetch_loss(pending, stage, cfg))
          pending = None
        lr = float(jax.device_get(last["lr"]))
        timer.pause(state)
        self._at_boundary(state, held, stage, float(np.mean(window)), lr, done, due_eval, due_ckpt, progress)
        window.clear()
        timer.start()
    if pending is not None:
      self._fetch_loss(pending, stage, cfg)
    return state

  def _fetch_loss(self, pending, stage: Stage, cfg) -> float:
    g, metrics = pending
    loss = float(jax.device_get(metrics["loss"]))
    if not math.isfinite(loss):
      raise FloatingPointError(
          f"Training loss is {loss} at global step {g} (stage {stage.name}, level {stage.level}, "
          f"L{cfg.num_layers}/d{cfg.width}). {after_divergence(self.ckpt.directory)}")
    return loss

  def _at_boundary(self, state, held, stage: Stage, train_loss: float, lr: float, done: bool, due_eval: bool,
                   due_ckpt: bool, progress) -> None:
    """Logs the window's record, evaluates and saves as due; called with the stage timer paused."""
    pos, cfg = self.pos, self.plan.levels[stage.level]
    tokens_per = tokens_per_example(cfg) if M.family_of(cfg).is_text else 0
    rec = {"step": pos.global_step, "stage": stage.index, "level": stage.level, "lr": lr, "train_loss": train_loss,
           "flops": pos.flops, "train_seconds": pos.train_seconds, "transition_seconds": pos.transition_seconds,
           "examples": pos.examples, "tokens": pos.examples * tokens_per or None}
    if due_eval:
      ev = self.evaluate(self.eval_fn(stage.level, stage.view), state.params)
      self.last_eval = (pos.global_step, ev)
      rec.update(self._eval_fields(ev))
      if not done and stage.stop is not None and self._maybe_stop(stage, ev["eval_loss"]):
        done = due_ckpt = True  # The stage ends here: its end-of-stage record and checkpoint.
      if done:
        rec["event"] = "end_of_stage"
    self.writer.write(rec)
    if progress is not None:
      progress.set_postfix(loss=f"{train_loss:.3f}", level=stage.level)
    if due_ckpt:
      self.save(state, held)

  def _maybe_stop(self, stage: Stage, loss: float) -> bool:
    """Feeds an adaptive stage's stop rule its evaluation; when the rule fires, cuts the plan here (the unused
    steps' FLOPs go to the target's last stage as target steps) and returns True."""
    pos = self.pos
    pos.stage_evals.append([pos.stage_step, pos.stats(stage.index).flops, loss])
    why = stage.stop.decide([tuple(e) for e in pos.stage_evals])
    if why is None:
      return False
    tc, last = self.config.train, self.plan.stages[-1]
    flops = lambda st: st.view.train_flops_per_step(self.plan.levels[st.level], tc.batch_size, self.objective)
    extra = int((stage.steps - pos.stage_step) * flops(stage) // flops(last))
    pos.cuts.append([stage.index, pos.stage_step, extra])
    self.plan = replan(self.method, self.model, self.config, pos.cuts)
    logging.info("Stage %s stops after %d of %d steps (%s at eval loss %.4f: small model %.3g FLOPs/nat, target "
                 "%.3g); the target's last stage gets %d more steps.", stage.name, pos.stage_step, stage.steps,
                 why["reason"], why["loss"], why["small_cost"], why["target_cost"], extra)
    self.writer.write({"step": pos.global_step, "stage": stage.index, "level": stage.level,
                       "stop": dict(why, steps=pos.stage_step, planned=stage.steps, extra_target_steps=extra)})
    return True

  def finish(self, state: TrainState) -> dict:
    self.ckpt.wait()
    pos, last = self.pos, self.plan.stages[-1]
    step, ev = self.last_eval or (None, None)
    if step != pos.global_step:  # Not evaluated at the end of training in this process (e.g. a finished run).
      ev = self.evaluate(self.eval_fn(last.level, last.view), state.params)
    summary = run_summary(self.plan, pos, self.model, self.info, self.data, ev, state.params, self.eval_batches)
    summary.update(keep_tokenizer(self.info, self.workdir, self.is_main))
    if self.is_main:
      write_json_atomic(os.path.join(self.workdir, "summary.json"), summary)
    self.state = state  # The final state, for a caller that inspects it (e.g. its shardings).
    self.close()
    logging.info("Done: eval loss %.4f, %.3g FLOPs, %.1f s of training. Summary: %s", summary["final_eval_loss"],
                 summary["total_flops"], summary["train_seconds"], os.path.join(self.workdir, "summary.json"))
    return summary

  def _progress(self, initial: int):
    if not (self.is_main and self.config.progress):
      return None
    from tqdm import tqdm
    return tqdm(total=self.plan.total_steps, initial=initial, unit="step", dynamic_ncols=True)


class _StageTimer:
  """Training seconds of one stage: ``start()`` and ``pause(state)`` (which first waits for the dispatched steps)."""

  def __init__(self, pos: RunPosition, stage: int):
    self._pos, self._stage = pos, stage
    self._t0 = time.perf_counter()

  def start(self) -> None:
    self._t0 = time.perf_counter()

  def pause(self, state: TrainState) -> None:
    jax.block_until_ready(state.params)
    self._pos.add_train_seconds(self._stage, time.perf_counter() - self._t0)


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs (or resumes) the whole plan of ``config`` in ``workdir``; returns the summary dict."""
  with Runner(config, workdir) as runner:
    return runner.run()
