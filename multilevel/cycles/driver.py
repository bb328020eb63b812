"""The V-cycle driver: trains every stage of a ``Plan`` in one process, with transitions, evaluation and resumption.

``train_and_evaluate(config, workdir)`` is the whole job. It restores the run's own workdir first (the latest
complete checkpoint), else starts from scratch; a workdir whose checkpoints are gone, damaged, or belong to another
config raises ``CheckpointError`` instead of silently starting over. A killed run started again with the same command
ends with the same parameters, bit for bit, as one never interrupted: data order, dropout and masking depend only on
the seed, the global step and the saved iterator position.
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
from multilevel import operators as O
from multilevel.checkpoint import Checkpointer, CheckpointError, abstract_like, config_diff, quiet_orbax_logs
from multilevel.cycles.run_config import data_kind, model_config, objective_config, resolved_config
from multilevel.cycles.schedule import Plan, Stage, build_plan
from multilevel.metrics import MetricsWriter, params_digest, write_json_atomic
from multilevel.train import (OptimConfig, StepConfig, TrainState, aot_train_step, carry_moments, compiled_steps, make_mesh,
                              put_batch, replicated, tokens_per_example, train_flops_per_step)


def _fault(point: str) -> None:
  """Test hook: ``MULTILEVEL_FAULT=<point>`` kills the process there (exit 137), as a crash or SIGKILL would.

  Points: ``step:N`` (after global step N is dispatched), ``transition:K`` (after the K-th level transition, before
  it is saved), ``save:N`` (while save N is still being written in the background).
  """
  if os.environ.get("MULTILEVEL_FAULT") == point:
    logging.warning("MULTILEVEL_FAULT=%s: killing the process here.", point)
    os._exit(137)


class Evaluator:
  """Mean validation loss (and accuracy) over the fixed evaluation batches."""

  def __init__(self, eval_batches, mesh):
    self._batches = eval_batches
    self._mesh = mesh

  def __call__(self, eval_fn, params) -> dict[str, float]:
    total = None
    for i, batch in enumerate(self._batches()):
      sums = eval_fn(params, put_batch(batch, self._mesh), jnp.int32(i))
      total = sums if total is None else jax.tree.map(jnp.add, total, sums)
    if total is None:
      raise ValueError("The evaluation set is empty: give the data more validation examples (data.val_fraction).")
    total = jax.device_get(total)
    n = max(float(total["count"]), 1.0)
    return {"eval_loss": float(total["loss_sum"]) / n, "eval_accuracy": float(total["correct"]) / n}


class Runner:
  """State of one run; ``run()`` executes the plan from wherever the workdir says it stopped."""

  def __init__(self, config, workdir: str):
    self.config = config
    self.workdir = os.path.abspath(os.path.expanduser(workdir))
    os.makedirs(self.workdir, exist_ok=True)
    self.is_main = jax.process_index() == 0
    from multilevel.data import make_data  # Imported here: the data stack is heavy and only the driver needs it.

    tc = config.train
    self.model_family = config.model.family
    probe = model_config(config, None)
    self.train_iter, self.eval_batches, self.info = make_data(
        config.data, kind=data_kind(probe), batch_size=int(tc.batch_size),
        seq_len=probe.max_len if probe.family != "deit" else None,
        image_size=probe.image_size if probe.family == "deit" else None, seed=int(tc.seed),
        model_family=probe.family)
    self.model = model_config(config, self.info)
    self.plan: Plan = build_plan(self.model, config.cycle, tc)
    self.mesh = make_mesh(int(tc.num_devices) or (1 if jax.default_backend() == "cpu" else None))
    self.rep = replicated(self.mesh)
    self.objective = objective_config(config, self.info)
    self.evaluate = Evaluator(self.eval_batches, self.mesh)
    self.cfg_json = resolved_config(config, self.model)
    quiet_orbax_logs()
    self.ckpt = Checkpointer(os.path.join(self.workdir, "checkpoints"), keep=int(config.checkpoint.keep),
                             async_save=bool(config.checkpoint.async_save))
    self.writer = MetricsWriter(self.workdir, enabled=self.is_main, tensorboard=bool(config.tensorboard))
    self.batch = int(tc.batch_size)
    logging.info("Data: %s", self.info.description)
    logging.info("%s", self.plan.describe())

  # ---- compiled pieces per stage -------------------------------------------------------------------------------

  def step_configs(self, stage: Stage) -> tuple[StepConfig, OptimConfig]:
    tc = self.config.train
    sc = StepConfig(self.plan.levels[stage.level], self.objective, int(tc.grad_accum), int(tc.seed))
    oc = OptimConfig(stage.lr, float(tc.weight_decay), float(tc.b1), float(tc.b2), float(tc.eps),
                     float(tc.grad_clip))
    return sc, oc

  def steps_for(self, stage: Stage):
    """``(tx, train_step, eval_sums)`` of a stage, jitted once per shape and optimizer."""
    return compiled_steps(*self.step_configs(stage), self.mesh)

  # ---- checkpoint position -----------------------------------------------------------------------------------

  def _meta(self, pos: dict) -> dict:
    return dict(pos, config=self.cfg_json, data=self.train_iter.get_state(), metrics_count=self.writer.count)

  def save(self, state: TrainState, snaps: dict, pos: dict) -> None:
    self.writer.flush()
    tree = {"params": state.params, "opt_state": state.opt_state, "snapshots": {str(k): v for k, v in snaps.items()}}
    self.ckpt.save(pos["save_id"], jax.device_get(tree), self._meta(pos))
    _fault(f"save:{pos['save_id']}")
    pos["save_id"] += 1

  def restore(self):
    latest = self.ckpt.latest()
    marker = os.path.join(self.workdir, "run.json")
    if latest is None:
      if os.path.exists(marker):
        raise CheckpointError(f"{self.workdir} holds a started run (run.json) but no complete checkpoint under "
                              f"{self.ckpt.directory}. The checkpoints were deleted or never finished; start a new "
                              f"--workdir (or delete run.json to start this one over).")
      return None
    meta = self.ckpt.restore_meta(latest)
    diff = config_diff(meta.get("config", {}), self.cfg_json)
    if diff:
      raise CheckpointError(f"The checkpoint in {self.workdir} belongs to a different config:\n  " + "\n  ".join(
          diff[:12]) + "\nRun with the original config to resume, or choose a new --workdir.")
    stage = self.plan.stages[meta["stage"]]
    tx, _, _ = self.steps_for(stage)
    params = M.abstract_params(self.plan.levels[stage.level])
    abstract = {"params": params, "opt_state": jax.eval_shape(tx.init, params),
                "snapshots": {str(k): M.abstract_params(self.plan.levels[k]) for k in meta["snapshots"]}}
    tree = self.ckpt.restore_state(latest, abstract_like(abstract, self.rep))
    self.train_iter.set_state(meta["data"])
    self.writer.truncate(int(meta["metrics_count"]))
    snaps = {int(k): v for k, v in tree["snapshots"].items()}
    pos = {k: meta[k] for k in ("stage", "stage_step", "global_step", "flops", "train_seconds", "examples",
                                "per_stage", "snapshots", "compile_seconds", "transition_seconds") if k in meta}
    pos["save_id"] = latest + 1
    logging.info("Resumed from checkpoint %d: stage %d step %d (global step %d).", latest, pos["stage"],
                 pos["stage_step"], pos["global_step"])
    return TrainState(tree["params"], tree["opt_state"]), snaps, pos

  def fresh(self):
    stage = self.plan.stages[0]
    tx, _, _ = self.steps_for(stage)
    params = jax.device_put(self.initial_params(), self.rep)
    state = TrainState(params, tx.init(params))
    pos = {"stage": 0, "stage_step": 0, "global_step": 0, "flops": 0.0, "train_seconds": 0.0, "examples": 0,
           "per_stage": [], "snapshots": [], "save_id": 0}
    self.writer.truncate(0)
    self.save(state, {}, pos)
    self.ckpt.wait()
    if self.is_main:
      write_json_atomic(os.path.join(self.workdir, "run.json"),
                        {"config": self.cfg_json, "plan": self.plan.describe().splitlines()})
    return state, {}, pos

  def initial_params(self):
    """Random init, or the weights of a Hugging Face checkpoint (``config.init_from``) for the target model."""
    source = str(self.config.get("init_from", "") or "")
    if not source:
      return M.init_params(self.plan.levels[0], int(self.config.train.seed))
    from multilevel.interop import load_hf
    _, params = load_hf(source)
    try:
      O.check_matches_config(params, self.plan.levels[0], f"the checkpoint {source}")
    except ValueError as e:
      raise ValueError(f"{e}\nThe model config must match the imported checkpoint (layers, heads, head_dim, "
                       f"vocab_size, max_len); set --config.model.* and data.tokenizer to the checkpoint's.") from e
    logging.info("Initialised the target model from %s.", source)
    return params

  # ---- transitions -------------------------------------------------------------------------------------------

  def _run(self, pos: dict, fn, *args):
    """``fn(*args)`` compiled ahead (counted as compile seconds), then run and placed on the mesh (counted as
    transition seconds: the wall-clock a level change costs, next to the steps' train seconds)."""
    tc0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    t0 = time.perf_counter()
    pos["compile_seconds"] = pos.get("compile_seconds", 0.0) + t0 - tc0
    out = jax.block_until_ready(jax.device_put(compiled(*args), self.rep))
    pos["transition_seconds"] = pos.get("transition_seconds", 0.0) + time.perf_counter() - t0
    return out

  def transition(self, state: TrainState, snaps: dict, src: Stage, dst: Stage, pos: dict) -> TrainState:
    """Moves the state to ``dst``'s level: coalesce, or de-coalesce (+ split noise) and interpolate; a fresh or
    carried optimizer state. Evaluations in between are logged as events and not timed."""
    plan, tc = self.plan, self.config.train
    tx, _, eval_fn = self.steps_for(dst)
    g = pos["global_step"]
    if dst.enter == "coalesce":
      m = plan.maps[src.level]
      snaps[src.level] = state.params  # The interpolation partner of the way back up: this level, right now.
      params = self._run(pos, lambda t: O.coalesce(t, m), state.params)
      opt_map = lambda t: O.coalesce(t, m, check=False)
      self.log_eval(eval_fn, params, dst, g, "after_coalesce")
    elif dst.enter == "grow":
      m = plan.maps[dst.level]
      noise, seed = plan.split_noise, int(tc.seed) + 1000 + dst.index

      def grow(t):
        grown = O.decoalesce(t, m)
        return O.split_noise(grown, m, scale=noise, seed=seed) if noise else grown

      grown = self._run(pos, grow, state.params)
      self.log_eval(eval_fn, grown, dst, g, "after_decoalesce")
      params = self._run(pos, lambda a, b: O.interpolate(a, b, w_pre=plan.w_pre), grown, snaps.pop(dst.level))
      opt_map = lambda t: O.decoalesce(t, m, check=False)
      self.log_eval(eval_fn, params, dst, g, "after_interpolate")
    else:
      raise ValueError(f"Stage {dst.name} cannot be entered by {dst.enter!r} from {src.name}.")
    if plan.restart_control:  # Control run: throw the transferred weights away.
      params = jax.device_put(M.init_params(plan.levels[dst.level], int(tc.seed) + 1 + dst.index), self.rep)
      self.log_eval(eval_fn, params, dst, g, "after_restart_control")
    if plan.optimizer_policy == "carry":
      opt_state = self._run(pos, lambda old, p: carry_moments(old, tx.init(p), opt_map), state.opt_state, params)
    else:
      opt_state = self._run(pos, tx.init, params)
    return TrainState(params, opt_state)

  def log_eval(self, eval_fn, params, stage: Stage, g: int, event: str, extra: dict | None = None) -> dict:
    ev = self.evaluate(eval_fn, params)
    rec = {"step": g, "stage": stage.index, "level": stage.level, "event": event, **ev, **(extra or {})}
    if self.model_family != "deit":
      rec.pop("eval_accuracy")
    self.writer.write(rec)
    logging.info("step %d %s (stage %s): eval loss %.4f", g, event, stage.name, ev["eval_loss"])
    return ev

  # ---- the loop ----------------------------------------------------------------------------------------------

  def run(self) -> dict:
    restored = self.restore()
    state, snaps, pos = restored if restored is not None else self.fresh()
    progress = self._progress(pos["global_step"])
    try:
      while True:
        stage = self.plan.stages[pos["stage"]]
        if pos["stage_step"] < stage.steps:
          state = self.train_stage(state, snaps, stage, pos, progress)
        if pos["stage"] + 1 == len(self.plan.stages):
          break
        nxt = self.plan.stages[pos["stage"] + 1]
        state = self.transition(state, snaps, stage, nxt, pos)
        pos.update(stage=nxt.index, stage_step=0, snapshots=sorted(snaps))
        _fault(f"transition:{nxt.index}")
        self.save(state, snaps, pos)
    finally:
      if progress is not None:
        progress.close()
    return self.finish(state, pos)

  def train_stage(self, state: TrainState, snaps: dict, stage: Stage, pos: dict, progress) -> TrainState:
    tc = self.config.train
    cfg = self.plan.levels[stage.level]
    _, _, eval_fn = self.steps_for(stage)
    lr_fn = stage.lr.build()
    step_flops = train_flops_per_step(cfg, self.batch)
    tokens_per = tokens_per_example(cfg) if cfg.family != "deit" else 0
    log_every, eval_every = int(tc.log_every), int(tc.eval_every)
    ckpt_every = int(self.config.checkpoint.every)
    while len(pos["per_stage"]) <= stage.index:
      pos["per_stage"].append({"stage": len(pos["per_stage"]), "steps": 0, "flops": 0.0, "train_seconds": 0.0})
    stats = pos["per_stage"][stage.index]
    window: list[float] = []
    pending = None
    compiled = None
    t0 = time.perf_counter()

    def fetch(p):
      g, i, metrics = p
      m = jax.device_get(metrics)
      loss = float(m["loss"])
      if not math.isfinite(loss):
        raise FloatingPointError(
            f"Training loss is {loss} at global step {g} (stage {stage.name}, level {stage.level}, "
            f"L{cfg.num_layers}/d{cfg.width}). Nothing was saved after it; the last good checkpoint is in "
            f"{self.ckpt.directory}. Lower train.lr, lengthen warm-up, or check the data.")
      window.append(loss)
      return g, i, m

    def pause():
      jax.block_until_ready(state.params)
      dt = time.perf_counter() - t0
      pos["train_seconds"] += dt
      stats["train_seconds"] += dt

    def resume():
      nonlocal t0
      t0 = time.perf_counter()

    while pos["stage_step"] < stage.steps:
      i, g = pos["stage_step"], pos["global_step"]
      batch = put_batch(next(self.train_iter), self.mesh)
      if compiled is None:  # Compile outside the timed region: train seconds are steps, not compilation.
        pause()
        tc0 = time.perf_counter()
        compiled = aot_train_step(*self.step_configs(stage), self.mesh, state, batch, jnp.int32(g))
        pos["compile_seconds"] = pos.get("compile_seconds", 0.0) + time.perf_counter() - tc0
        resume()
      state, metrics = compiled(state, batch, jnp.int32(g))
      _fault(f"step:{g + 1}")
      if pending is not None:
        fetch(pending)
      pending = (g + 1, i + 1, metrics)
      pos["stage_step"], pos["global_step"] = i + 1, g + 1
      pos["flops"] += step_flops
      pos["examples"] += self.batch
      stats["steps"] += 1
      stats["flops"] += step_flops
      if progress is not None:
        progress.update(1)
      done = pos["stage_step"] == stage.steps
      g1 = pos["global_step"]
      due_log = g1 % log_every == 0 or done
      due_eval = (eval_every > 0 and g1 % eval_every == 0) or done
      due_ckpt = (ckpt_every > 0 and g1 % ckpt_every == 0) or done
      if due_log or due_eval or due_ckpt:
        fetch(pending)
        pending = None
        pause()
        rec = {"step": g1, "stage": stage.index, "level": stage.level, "lr": float(lr_fn(i)),
               "train_loss": float(np.mean(window)), "flops": pos["flops"], "train_seconds": pos["train_seconds"],
               "transition_seconds": pos.get("transition_seconds", 0.0), "examples": pos["examples"],
               "tokens": pos["examples"] * tokens_per or None}
        window.clear()
        if due_eval:
          ev = self.evaluate(eval_fn, state.params)
          self._last_eval = (pos["global_step"], ev)
          rec.update(ev if cfg.family == "deit" else {"eval_loss": ev["eval_loss"]})
          if done:
            rec["event"] = "end_of_stage"
        self.writer.write(rec)
        if progress is not None:
          progress.set_postfix(loss=f"{rec['train_loss']:.3f}", level=stage.level)
        if due_ckpt:
          self.save(state, snaps, pos)
        resume()
    if pending is not None:
      fetch(pending)
    return state

  def finish(self, state: TrainState, pos: dict) -> dict:
    self.ckpt.wait()
    last = self.plan.stages[-1]
    step, ev = getattr(self, "_last_eval", (None, None))
    if step != pos["global_step"]:  # Not evaluated at the end of training in this process (e.g. a finished run).
      _, _, eval_fn = self.steps_for(last)
      ev = self.evaluate(eval_fn, state.params)
    per_stage = []
    for st, rec in zip(self.plan.stages, pos["per_stage"]):
      c = self.plan.levels[st.level]
      per_stage.append(dict(rec, kind=st.kind, level=st.level, model=f"L{c.num_layers}/d{c.width}/h{c.num_heads}",
                            params=M.num_params(M.abstract_params(c))))
    summary = {
        "final_eval_loss": ev["eval_loss"],
        "final_eval_accuracy": ev["eval_accuracy"] if self.model_family == "deit" else None,
        "total_flops": pos["flops"],
        "train_seconds": pos["train_seconds"],
        "compile_seconds": pos.get("compile_seconds", 0.0),
        "transition_seconds": pos.get("transition_seconds", 0.0),  # Operators at level changes (not compiles).
        "steps": pos["global_step"],
        "examples": pos["examples"],
        "levels": len(self.plan.levels),
        "per_stage": per_stage,
        "params_sha256": params_digest(state.params),
        "data": self.info.description,
    }
    if self.is_main:
      write_json_atomic(os.path.join(self.workdir, "summary.json"), summary)
    self.writer.close()
    self.ckpt.close()
    self.train_iter.close()
    logging.info("Done: eval loss %.4f, %.3g FLOPs, %.1f s of training. Summary: %s", summary["final_eval_loss"],
                 summary["total_flops"], summary["train_seconds"], os.path.join(self.workdir, "summary.json"))
    return summary

  def _progress(self, initial: int):
    if not (self.is_main and bool(self.config.progress)):
      return None
    from tqdm import tqdm
    return tqdm(total=self.plan.total_steps, initial=initial, unit="step", dynamic_ncols=True)


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs (or resumes) the whole plan of ``config`` in ``workdir``; returns the summary dict."""
  return Runner(config, workdir).run()
