"""How each stage's parameters come to be: the first stage's initial parameters, and the transition into every later
stage, as the driver runs them.

The method says *what* a transition computes (``plan.Transition``: pure, jitted parts built from the operators); this
module is the driver's side of it: every part compiled ahead of time with its outputs placed where the next stage
(or the level it belongs to) keeps them, its run time counted as transition seconds and its compilation as compile
seconds, the snapshots it leaves checked against the plan, and its probes and result evaluated and logged as
events. The first stage starts from a random init, or from a Hugging Face checkpoint (``init_from``) checked
against the config, including the settings no parameter's shape would reveal.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

import jax
from absl import logging

from multilevel import models as M
from multilevel.checkpoint import Checkpointer, after_divergence
from multilevel.operators.finite import first_nonfinite
from multilevel.cycles.plan import Method, Plan, Stage, Transition
from multilevel.cycles.position import RunPosition
from multilevel.cycles.run_config import RunConfig
from multilevel.train import TrainState, init_params, param_shardings
from multilevel.typed_config import ConfigError


class Host(Protocol):
  """What a transition needs from the run that hosts it (``driver.Runner``): the plan and where the run stands, the
  mesh, the method, the checkpointer (to wait for a pending save), each stage's compiled steps, and the timed
  compilation and logged evaluation of the driver. Declared here so that this module does not import the driver."""

  plan: Plan
  pos: RunPosition
  mesh: Any
  method: Method
  ckpt: Checkpointer

  def steps_for(self, stage: Stage) -> Any: ...

  def compile(self, build: Callable[[], Any]) -> Any: ...

  def eval_fn(self, level: int, view: Any = ...) -> Callable: ...

  def log_eval(self, eval_fn: Callable, params: Any, stage: Stage, g: int, event: str) -> dict: ...

# Settings that change the function but no parameter's shape: an imported checkpoint's must equal the config's.

def checkpoint_differs(imported: M.ModelConfig, target: M.ModelConfig) -> dict[str, tuple]:
  """``{model key: (the checkpoint's value, the config's)}`` for each setting of the family that differs, the FFN
  width, kv heads and epsilon compared as the model uses them (0 and -1 mean defaults)."""
  if imported.family != target.family:
    return {"family": (imported.family, target.family)}
  fam = M.family_of(target)
  keys = ["num_layers", "num_heads", "head_dim"]
  keys += (["vocab_size", "max_len"] + (["type_vocab_size"] if target.family == "bert" else [])) if fam.is_text else \
      ["image_size", "patch_size", "num_channels", "num_classes", "distill_token"]
  rotary = "context_len" in fam.own_fields
  if rotary:  # No position parameters: the run may train at another max_len; the declared contexts must agree.
    keys.remove("max_len")
  if target.family == "llama":
    keys += ["tie_embeddings", "rope_base", "rope_scaling"] + (
        ["rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_len"]
        if imported.rope_scaling or target.rope_scaling else [])
  out = {k: (getattr(imported, k), getattr(target, k)) for k in keys if getattr(imported, k) != getattr(target, k)}
  if rotary and imported.context != target.context:
    out["context_len"] = (imported.context, target.context)
  # The derived ones, on the config as corrected so far (the FFN width follows the heads' width unless set).
  fixed = target.replace(**{k: a for k, (a, _) in out.items()})
  derived = (("ffn_size", "ffn_dim"), ("ln_eps", "eps")) + ((("num_kv_heads", "kv_heads"),)
                                                            if target.family == "llama" else ())
  for key, prop in derived:
    a, b = getattr(imported, prop), getattr(fixed, prop)
    if a != b:
      out[key] = (a, b)
  return out


def check_init_from(run: RunConfig, plan: Plan, level: int = 0) -> None:
  """Refuses ``init_from`` (the target model's weights) for a plan whose first stage trains a smaller model."""
  if run.init_from and level != 0:
    raise ConfigError(f"init_from={run.init_from!r} gives the target model's weights, but method {plan.method!r} "
                      f"starts by training a smaller model (level {level}); use cycle.method='vcycle' (or scratch) "
                      f"with init_from, or leave init_from empty.")


def initial_params(run: RunConfig, plan: Plan, mesh, level: int = 0):
  """Random init of the first stage's model (``level``), or the weights of a Hugging Face checkpoint
  (``run.init_from``) for the target model, placed with the target's shardings on ``mesh``."""
  source = run.init_from
  if not source:
    return init_params(plan.levels[level], run.train.seed, mesh)
  check_init_from(run, plan, level)
  from multilevel.interop import load_hf  # Imported here: only a run that starts from a checkpoint needs it.
  imported, params = load_hf(source)
  target = plan.levels[0]
  differ = checkpoint_differs(imported, target)
  if differ:  # Every setting at once, as flags to paste (a shape check alone names one parameter at a time).
    said = ", ".join(f"{k} {a!r} (the config has {b!r})" for k, (a, b) in differ.items())
    flags = " ".join(f"--config.model.{k}={a}" for k, (a, b) in differ.items())
    context = (f" The run trains at max_len={target.max_len} tokens per row either way (RoPE has no position "
               f"parameters); context_len keeps the checkpoint's context for export." if "context_len" in differ
               else "")
    raise ValueError(f"The checkpoint {source} is a {imported.family} model with other settings than the model "
                     f"config: {said}. Run with {flags}" + (" (and data.tokenizer set to the checkpoint's tokenizer)"
                                                          if "vocab_size" in differ else "") + "." + context)
  try:
    M.check_params(params, target, f"the checkpoint {source}")
  except ValueError as e:
    raise ValueError(f"{e}\nThe model config must match the imported checkpoint; set --config.model.* to the "
                     f"checkpoint's.") from e
  logging.info("Initialised the target model from %s.", source)
  return jax.device_put(params, param_shardings(target, mesh))


def transition(runner: Host, state: TrainState, held: dict, src: Stage, dst: Stage) -> tuple[TrainState, dict]:
  """Runs the method's transition from ``src`` into ``dst`` on the runner's state and held snapshots (compiled
  ahead; its run time counted as transition seconds), then evaluates its probes and the resulting parameters, logged
  as events and not timed. Returns the next stage's state and the snapshots held from then on."""
  plan = runner.plan
  t = runner.method.transition(plan, src, dst)
  # The operators run under jit, where they cannot look at values: one eager check of what they receive.
  bad = first_nonfinite(state.params)
  if bad is not None:
    raise FloatingPointError(f"Parameter {bad!r} of stage {src.name} holds a NaN or an infinity at global step "
                             f"{runner.pos.global_step}, before the transition into stage {dst.name}. "
                             f"{after_divergence(runner.ckpt.directory)}")

  def compile_part(fn, carry):  # Compiled ahead (compile seconds); the clock then runs over the part's execution.
    outs = _part_shardings(jax.eval_shape(fn, carry), t, plan, runner.mesh, lambda: runner.steps_for(dst).shardings)
    compiled = runner.compile(lambda: jax.jit(fn, out_shardings=outs).lower(carry).compile())

    def timed(c):
      t0 = time.perf_counter()
      out = jax.block_until_ready(compiled(c))
      runner.pos.transition_seconds += time.perf_counter() - t0
      return out
    return timed

  out = t.run({"params": state.params, "opt_state": state.opt_state, "taken": {k: held[k] for k in t.takes}},
              compile_part)
  params, opt_state, probes = out["params"], out["opt_state"], {k: out[k] for k in t.probe_levels}
  _check_fits(t, src, dst, plan, params, opt_state)
  held = {k: v for k, v in held.items() if k not in t.takes}
  held.update(out["put"])
  if tuple(sorted(held)) != plan.snapshots_before(dst.index):
    raise AssertionError(f"Transition {t.name} into stage {dst.name} leaves snapshots {sorted(held)}, but the plan "
                         f"holds {plan.snapshots_before(dst.index)}: the method's plan and transition disagree.")
  g = runner.pos.global_step
  for event, tree in probes.items():
    runner.log_eval(runner.eval_fn(t.probe_levels[event]), tree, dst, g, event)
  runner.log_eval(runner.eval_fn(dst.level, dst.view), params, dst, g, t.final_event)
  return TrainState(params, opt_state), held


def _check_fits(t: Transition, src: Stage, dst: Stage, plan: Plan, params, opt_state) -> None:
  """Refuses a transition whose parameters or optimizer state do not fit the next stage (a method's mistake, e.g.
  the previous stage's optimizer state carried into a grown model), before anything is evaluated or saved: otherwise
  it surfaces as a broadcasting error inside the first optimizer update, after a checkpoint that holds it."""
  cfg = plan.levels[dst.level]
  want_params = dst.view.abstract(cfg)
  want_opt = jax.eval_shape(dst.optim.build().init, dst.view.split(want_params)[0])
  for what, got, want in (("parameters", params, want_params), ("optimizer state", opt_state, want_opt)):
    got_leaves, got_def = jax.tree_util.tree_flatten_with_path(got)
    want_leaves, want_def = jax.tree_util.tree_flatten_with_path(want)
    if got_def != want_def:
      wrong = f"its tree is {got_def}, where the stage's is {want_def}"
    else:
      wrong = next((f"{jax.tree_util.keystr(path)} is {tuple(a.shape)} {a.dtype} where the stage's is "
                    f"{tuple(b.shape)} {b.dtype}" for (path, a), (_, b) in zip(got_leaves, want_leaves)
                    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype), None)
      if wrong is None:
        continue
    raise ValueError(f"Transition {t.name!r} into stage {dst.name} returns {what} that do not fit that stage's model "
                     f"(L{cfg.num_layers}/d{cfg.width}/h{cfg.num_heads}): {wrong[:600]}. A transition returns the next "
                     f"stage's parameters as its view holds them and an optimizer state made for them "
                     f"(plan.fresh_optimizer(dst) makes a fresh one). Nothing was saved after stage {src.name}.")


def _part_shardings(out: dict, t: Transition, plan: Plan, mesh, next_state) -> dict:
  """Where a transition part's outputs live: each tree of a level with that level's shardings (a coalesced tree is
  written straight into the small model's shards, never gathered whole). ``next_state()`` gives the shardings of the
  next stage's state (``TrainState`` of shardings), asked for only by a part that returns it."""
  level_of = dict(t.probe_levels)
  shardings = {}
  for key in out:
    if key in ("params", "opt_state"):  # The next stage's state, as its view holds it.
      shardings[key] = getattr(next_state(), key)
    elif key == "put":
      shardings[key] = {lvl: param_shardings(plan.levels[lvl], mesh) for lvl in out[key]}
    elif key in level_of:
      shardings[key] = param_shardings(plan.levels[level_of[key]], mesh)
    else:
      raise KeyError(f"Transition {t.name} returned {key!r}, which is no level's tree (params, opt_state, put, or a "
                     f"probe named in probe_levels).")
  return shardings
