"""Jitted train and eval steps over a device mesh: data parallel, with parameters sharded over ``fsdp``.

The batch is split over every mesh axis; parameters and optimizer moments are replicated on ``data`` and split over
``fsdp`` as the family's axis-role table says (``sharding.py``); XLA inserts the all-gathers and the gradient
reductions. The same code runs on one CPU, a GPU node, or many hosts after ``jax.distributed.initialize()``: each
host feeds its own rows and ``make_array_from_process_local_data`` assembles the global batch. A step is compiled once
per level shape and donates the state it replaces; the state is created sharded (``Steps.init_state``,
``init_params``), never whole on one device.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from multilevel import models as M
from multilevel.models import ModelConfig
from multilevel.train.objectives import ObjectiveConfig, objective_of
from multilevel.train.optim import OptimConfig
from multilevel.train.sharding import batch_spec, like_params, make_mesh, param_shardings, replicated  # noqa: F401
from multilevel.train.views import FULL, View


@flax.struct.dataclass
class TrainState:
  params: Any
  opt_state: Any


def batch_sharding(mesh) -> NamedSharding:
  return NamedSharding(mesh, batch_spec(mesh))


def put_batch(batch: dict, mesh) -> dict:
  """Host-local numpy rows -> one global array per key, its rows split over the mesh."""
  sharding = batch_sharding(mesh)
  n = mesh.devices.size // jax.process_count()
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    if v.shape[0] % max(n, 1):
      raise ValueError(f"Batch key {k!r} has {v.shape[0]} rows on this host, not divisible by its {n} devices; "
                       f"choose a batch size divisible by the device count.")
    out[k] = jax.make_array_from_process_local_data(sharding, v)
  return out


def clear_compiled() -> None:
  """Drops every compiled function this library and JAX hold in this process: the cached steps, evaluators and
  initializers (``build_steps``, ``eval_step``, ...) and JAX's own caches. Each compiled executable keeps its code in
  memory mappings, and a process that trains many different configs one after another (a notebook, a sweep, a test
  run) holds the steps of up to 32 of them: on Linux that is thousands of mappings per config, and past
  ``vm.max_map_count`` (65530 by default) a memmap or a new thread fails with 'Cannot allocate memory'. Call this
  between configs; the next run compiles its steps again."""
  import gc

  from multilevel.train import sharding
  for cached in (build_steps, eval_step, _sharded_init, sharding.param_specs, M.abstract_params, M._param_names):
    cached.cache_clear()
  jax.clear_caches()
  gc.collect()


@functools.lru_cache(maxsize=64)
def _sharded_init(cfg: ModelConfig, seed: int, mesh):
  return jax.jit(lambda: M.init_params(cfg, seed), out_shardings=param_shardings(cfg, mesh))


def init_params(cfg: ModelConfig, seed: int, mesh):
  """Fresh parameters of ``cfg``, created sharded on ``mesh`` by a jitted initializer with ``out_shardings``: no
  device ever holds the whole tree unless the mesh replicates it. The same bits on every mesh (JAX's partitionable
  random numbers), not quite those of an eager ``multilevel.models.init_params`` (XLA fuses the sampling)."""
  return _sharded_init(cfg, int(seed), mesh)()


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Everything static about a step: the model, the objective, accumulation, the seed and the stage's view of the
  model (``views.View``: what the state holds and which part of it trains); a jit cache key."""

  model: ModelConfig
  objective: ObjectiveConfig
  grad_accum: int = 1
  seed: int = 0
  view: View = FULL


def _split_micro(batch, n):
  def split(x):
    if x.shape[0] % n:
      raise ValueError(f"Batch of {x.shape[0]} rows cannot be split into {n} gradient-accumulation microbatches.")
    return x.reshape((n, x.shape[0] // n) + x.shape[1:])
  return jax.tree.map(split, batch)


def _sum_aux(a, b):
  return jax.tree.map(jnp.add, a, b)


def _schedule_count(opt_state):
  """The optimizer's learning-rate schedule position (optax's ``ScaleByScheduleState.count``), if it has one."""
  is_sched = lambda x: isinstance(x, optax.ScaleByScheduleState)
  for leaf in jax.tree.leaves(opt_state, is_leaf=is_sched):
    if is_sched(leaf):
      return leaf.count
  return None


def train_step_fn(sc: StepConfig, tx: optax.GradientTransformation, schedule: optax.Schedule | None = None):
  """``(state, batch, step) -> (state, metrics)``; ``step`` (global, int32) seeds dropout and masking.

  With ``schedule`` (the one inside ``tx``) the metrics report the learning rate this step applied. Only the view's
  trainable part is differentiated and updated (``tx`` and its state see that part alone)."""
  loss_fn = objective_of(sc.model)
  view = sc.view

  def step(state: TrainState, batch, global_step):
    trainable, frozen = view.split(state.params)
    apply = functools.partial(view.apply, step=global_step) if view.uses_step else view.apply
    vocab = functools.partial(view.vocab_layer, sc.model)

    def grads_of(t, micro, rng):
      def f(p):
        aux = loss_fn(sc.model, sc.objective, view.merge(p, frozen), micro, rng, True, apply=apply, vocab=vocab)
        return aux["loss_sum"] / jnp.maximum(aux["count"], 1.0), aux
      (_, aux), g = jax.value_and_grad(f, has_aux=True)(t)
      return g, aux

    rng = jax.random.fold_in(jax.random.key(sc.seed), global_step)
    if sc.grad_accum == 1:
      grads, aux = grads_of(trainable, batch, rng)
    else:
      micro = _split_micro(batch, sc.grad_accum)

      def body(carry, xs):
        g_acc, aux_acc = carry
        mb, i = xs
        g, aux = grads_of(trainable, mb, jax.random.fold_in(rng, i))
        return (jax.tree.map(jnp.add, g_acc, g), _sum_aux(aux_acc, aux)), None

      zeros_g = jax.tree.map(jnp.zeros_like, trainable)
      zeros_aux = {"loss_sum": 0.0, "count": 0.0, "correct": 0.0}
      zeros_aux = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), zeros_aux)
      (grads, aux), _ = jax.lax.scan(body, (zeros_g, zeros_aux), (micro, jnp.arange(sc.grad_accum)))
      grads = jax.tree.map(lambda g: g / sc.grad_accum, grads)
    count = _schedule_count(state.opt_state)
    with jax.named_scope("optimizer"):  # Names the update's ops in profiles (benchmarks/step_profile.py).
      updates, opt_state = tx.update(grads, state.opt_state, trainable)
      params = view.merge(optax.apply_updates(trainable, updates), frozen)
    metrics = {
        "loss": aux["loss_sum"] / jnp.maximum(aux["count"], 1.0),
        "accuracy": aux["correct"] / jnp.maximum(aux["count"], 1.0),
        "grad_norm": optax.tree.norm(grads),
    }
    if schedule is not None and count is not None:
      metrics["lr"] = jnp.asarray(schedule(count), jnp.float32)
    return TrainState(params, opt_state), metrics

  return step


def eval_sums_fn(sc: StepConfig):
  """``(params, batch, index) -> {'loss_sum', 'count', 'correct'}`` with a fixed rng per eval batch; a view that
  uses the step (``View.uses_step``) takes the global step as a fourth argument."""
  loss_fn = objective_of(sc.model)

  def ev(params, batch, index, step=None):
    rng = jax.random.fold_in(jax.random.key(sc.seed + 1_000_003), index)
    apply = sc.view.apply if step is None else functools.partial(sc.view.apply, step=step)
    return loss_fn(sc.model, sc.objective, params, batch, rng, False, apply=apply,
                   vocab=functools.partial(sc.view.vocab_layer, sc.model))

  return ev


@dataclasses.dataclass(eq=False)
class Steps:
  """The compiled pieces of one (model shape, objective, optimizer) on a mesh: build them with ``build_steps``.

  ``tx`` is the optimizer, ``train(state, batch, step) -> (state, metrics)`` the jitted train step (donating its
  state; ``metrics`` hold ``loss``, ``accuracy``, ``grad_norm`` and the ``lr`` the step used), ``eval(params, batch,
  index) -> sums`` the jitted evaluation, ``lr`` the learning-rate schedule. ``compile_train`` returns the train
  step compiled ahead of time for given inputs, cached here, so that compilation stays out of timed regions.
  """

  tx: optax.GradientTransformation
  train: Any
  eval: Any
  lr: optax.Schedule
  mesh: Any
  shardings: TrainState  # Of the parameters and the optimizer state.
  _init_opt: Any = None
  _compiled: dict = dataclasses.field(default_factory=dict)

  def init_state(self, params) -> TrainState:
    """The state with a fresh optimizer state (of the view's trainable part), created sharded like the parameters."""
    return TrainState(params, self._init_opt(params))

  def compile_train(self, state: TrainState, batch: dict, global_step):
    key = tuple((k, v.shape, str(v.dtype)) for k, v in sorted(batch.items()))
    if key not in self._compiled:
      self._compiled[key] = self.train.lower(state, batch, global_step).compile()
    return self._compiled[key]


@functools.lru_cache(maxsize=32)
def eval_step(sc: StepConfig, mesh):
  """The jitted ``(params, batch, index) -> sums`` of one model and objective (shared by every optimizer); with
  ``(params, batch, index, step)`` for a view that uses the global step."""
  rep, bat = replicated(mesh), batch_sharding(mesh)
  ins = (sc.view.shardings(sc.model, mesh), bat, rep) + ((rep,) if sc.view.uses_step else ())
  return jax.jit(eval_sums_fn(sc), in_shardings=ins, out_shardings=rep)


def state_shardings(model: ModelConfig, tx: optax.GradientTransformation, mesh, view: View = FULL) -> TrainState:
  """Shardings of a train state: the parameters' from the axis-role table, Adam's moments alike, counts replicated."""
  params = view.shardings(model, mesh)
  trainable = view.split(view.abstract(model))[0]
  return TrainState(params, like_params(jax.eval_shape(tx.init, trainable), trainable, view.split(params)[0], mesh))


@functools.lru_cache(maxsize=32)
def build_steps(sc: StepConfig, oc: OptimConfig, mesh) -> Steps:
  """The ``Steps`` of one model shape, objective and optimizer on ``mesh``: jitted once per process and cached; the
  one way the driver, the tests and the benchmarks build a train step."""
  tx = oc.build()
  rep, bat = replicated(mesh), batch_sharding(mesh)
  st = state_shardings(sc.model, tx, mesh, sc.view)
  train = jax.jit(train_step_fn(sc, tx, oc.schedule.build()), in_shardings=(st, bat, rep), out_shardings=(st, rep),
                  donate_argnums=(0,))
  init_opt = jax.jit(lambda p: tx.init(sc.view.split(p)[0]), in_shardings=(st.params,), out_shardings=st.opt_state)
  return Steps(tx, train, eval_step(sc, mesh), oc.schedule.build(), mesh, st, init_opt)
