"""LiGO, a learned linear growth operator (Wang et al., ICLR 2023, ``VITA-Group/LiGO``) as a method.

The grown model is a linear function of the small one, factored per axis (Kronecker): every width axis of a given
role (``models.axes``: the residual stream's read side, its write side, the heads, the FFN units, ...) is expanded by
one learned matrix ``E_role`` (large x small units), and the layer axis of every parameter by its own depth matrix
``W_name`` (large x small layers; LiGO's per-module depth coefficients). A kernel ``K`` of the small model thus grows
as ``W . (E_out K E_in^T)``, LiGO's ``B W A^T`` with ``L_depth = w (x) I``. One matrix per role ties what LiGO ties:
every parameter that reads the residual stream shares one expansion, every one that writes it another.

The operator starts at the operators' own de-coalescing (``initial_operator``: each matrix is the growth map of its
axis, with the same 1/n on input sides), so the grown model at the start of operator training equals
``operators.decoalesce(small, map)`` -- the function-preserving width growth for BERT and DeiT, and copies in depth.
LiGO's released init (noisy stacking plus random convex width rows) is not function-preserving; ``init_noise`` adds
uniform noise of that relative size to every matrix (0: none).

Plan: the small model trains from scratch for ``small_frac`` of the budget (LiGO starts from a pretrained small
model and leaves its cost out of the headline; we count it), then ``operator_steps`` steps train the operator alone
on the loss (``LigoView``: the small model frozen, the big model's weights formed on the fly from it; each such step
costs a big-model training step plus the matmuls that build the weights, counted), then the big model is
materialised and trains for the rest with a fresh AdamW and a fresh warm-up and decay. The operator trains with
AdamW at ``operator_lr`` (constant, no warm-up; the released config's 10k warm-up steps for a 100-step run leave its
rate near 2e-6, which we do not copy) and no weight decay.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from multilevel import models as M
from multilevel import operators as O
from multilevel.cycles.plan import (Method, Plan, Stage, Transition, fresh_optimizer, optim_for, register_method,
                                    split_steps)
from multilevel.models import axes as A
from multilevel.train.flops import train_flops_per_step
from multilevel.train.optim import LrSchedule, schedule_for
from multilevel.train.sharding import param_shardings, replicated
from multilevel.train.views import View
from multilevel.tree import flatten, unflatten
from multilevel.typed_config import ConfigError, check_fields


@dataclasses.dataclass(frozen=True)
class LigoConfig:
  """``cycle.ligo``: LiGO's options."""

  width_factor: int = 2  # The small model has num_heads / width_factor heads (the heads keep their size) ...
  depth_factor: int = 2  # ... and num_layers / depth_factor layers.
  small_frac: float = 0.25  # Share of train.steps on the small model.
  operator_steps: int = 100  # Steps of operator training (the paper: 100).
  operator_lr: float = 1e-3  # AdamW's constant learning rate for the operator.
  init_noise: float = 0.0  # Relative uniform noise on the initial operator (0: exactly the de-coalescing).
  small_lr_scale: float = 1.0  # Peak learning rate of the small model, relative to train.lr.

  def __post_init__(self):
    check_fields(self, "cycle.ligo")
    if self.width_factor < 1 or self.depth_factor < 1 or self.width_factor * self.depth_factor < 2:
      raise ConfigError(f"cycle.ligo.width_factor and depth_factor must be >= 1 and grow the model (product >= 2), "
                        f"got {self.width_factor} and {self.depth_factor}.")
    if not 0 < self.small_frac < 1:
      raise ConfigError(f"cycle.ligo.small_frac must be in (0, 1), got {self.small_frac}.")
    if self.operator_steps < 1:
      raise ConfigError(f"cycle.ligo.operator_steps must be >= 1, got {self.operator_steps}.")
    if not self.operator_lr > 0 or self.init_noise < 0 or not self.small_lr_scale > 0:
      raise ConfigError("cycle.ligo.operator_lr and small_lr_scale must be positive and init_noise >= 0.")


# ---------------------------------------------------------------------------------------------- the operator

def _axis_matrix(gm, scale, dtype=np.float32) -> np.ndarray:
  """The de-coalescing of one axis as a (large x small) matrix: ``x_p = y_{g(p)} / s_{g(p)}``."""
  e = np.zeros((gm.n_large, gm.n_small), np.float64)
  e[np.arange(gm.n_large), gm.g] = 1.0
  if scale is not None:
    e = e / np.asarray(scale, np.float64)[None, :]
  return e.astype(dtype)


def _depth_matrix(m, name: str, roles) -> np.ndarray:
  """The layer axis of parameter ``name`` as a (large x small) matrix, with the residual-branch rule of
  ``m.depth_growth`` ('zero' keeps the first copy and zeroes the others, 'scaled' divides by the group size)."""
  gm, _ = m.rule(A.LAYERS)
  e = _axis_matrix(gm, None)
  if A.RESIDUAL in roles and m.changes_depth and m.depth_growth != "copy":
    e = e * gm.first_mask[:, None] if m.depth_growth == "zero" else e / gm.counts[gm.g][:, None]
  return e.astype(np.float32)


def _expanded_axes(m, name: str, ndim: int):
  """``(axis, role)`` of each axis of ``name`` that growth changes, the layer axis first (as de-coalescing orders)."""
  roles = m.roles(name, ndim)
  out = [(i, r) for i, r in enumerate(roles) if r is not None and not m.rule(r)[0].is_identity]
  return sorted(out, key=lambda ar: ar[1] != A.LAYERS), roles


def _key(name: str) -> str:
  """A parameter path as one key of the operator's ``depth`` dict (paths elsewhere are nested dicts)."""
  return name.replace("/", ".")


def initial_operator(m, small_params, noise: float = 0.0, seed: int = 0) -> dict:
  """The operator whose materialisation is ``operators.decoalesce(small_params, m)``: ``{'width': {role: E},
  'depth': {name: W}}``, plus ``noise`` x U(0, max|entry|) on every entry when ``noise > 0``."""
  width, depth = {}, {}
  for name, x in flatten(small_params).items():
    axes, roles = _expanded_axes(m, name, x.ndim)
    for _, role in axes:
      if role == A.LAYERS:
        depth[_key(name)] = _depth_matrix(m, name, roles)
      elif role not in width:
        width[role] = _axis_matrix(*m.rule(role))
  op = {k: v for k, v in (("width", width), ("depth", depth)) if v}  # No empty sections (trees drop them).
  if noise > 0:
    rng = np.random.default_rng(seed)
    op = jax.tree.map(lambda e: (e + noise * np.abs(e).max() * rng.uniform(size=e.shape)).astype(np.float32), op)
  return jax.tree.map(jnp.asarray, op)


def materialise(op: dict, small_params, m) -> dict:
  """The grown parameters: every expanded axis of every leaf multiplied by its matrix (differentiable in ``op``).

  At ``initial_operator`` (no noise) this equals ``operators.decoalesce(small_params, m)`` up to float rounding of
  the 1/n factors (each product has a single nonzero term)."""
  out = {}
  for name, x in flatten(small_params).items():
    axes, _ = _expanded_axes(m, name, x.ndim)
    for axis, role in axes:
      e = op["depth"][_key(name)] if role == A.LAYERS else op["width"][role]
      y = jnp.tensordot(e.astype(x.dtype), x, axes=([1], [axis]), precision=jax.lax.Precision.HIGHEST)
      x = jnp.moveaxis(y, 0, axis)
    out[name] = x
  return unflatten(out)


def materialise_flops(m, small_cfg) -> float:
  """Forward FLOPs of one materialisation (2 per multiply-add, each axis's product on the shape it meets)."""
  total = 0.0
  for name, x in flatten(M.abstract_params(small_cfg)).items():
    axes, _ = _expanded_axes(m, name, len(x.shape))
    shape = list(x.shape)
    for axis, role in axes:
      gm = m.rule(role)[0]
      total += 2.0 * float(np.prod(shape)) * gm.n_large
      shape[axis] = gm.n_large
  return total


@dataclasses.dataclass(frozen=True)
class LigoView(View):
  """The operator-training stage: holds ``{'frozen': small model, 'train': operator}``; the loss runs the big
  model on the materialised weights, and only the operator trains."""

  mapping: O.LevelMap
  init_noise: float = 0.0

  @property
  def name(self) -> str:
    return "ligo_operator"

  def abstract(self, cfg):
    small = M.abstract_params(self.mapping.small)
    return {"frozen": small, "train": jax.eval_shape(lambda p: initial_operator(self.mapping, p), small)}

  def shardings(self, cfg, mesh):
    op = self.abstract(cfg)["train"]
    return {"frozen": param_shardings(self.mapping.small, mesh), "train": jax.tree.map(lambda _: replicated(mesh), op)}

  def from_model(self, cfg, params):
    raise ValueError("LiGO's operator stage starts from the small model (its transition builds the state), not from "
                     "the big model's parameters.")

  def to_model(self, cfg, vparams):
    return materialise(vparams["train"], vparams["frozen"], self.mapping)

  def split(self, vparams):
    return vparams["train"], vparams["frozen"]

  def merge(self, trainable, frozen):
    return {"frozen": frozen, "train": trainable}

  def apply(self, cfg, vparams, *inputs, **kw):
    return M.apply(cfg, self.to_model(cfg, vparams), *inputs, **kw)

  def train_flops_per_step(self, cfg, global_batch: int, objective=None) -> float:
    """A big-model training step, plus building the weights forward and backward (3x the materialisation)."""
    return train_flops_per_step(cfg, global_batch, objective) + 3.0 * materialise_flops(self.mapping, self.mapping.small)


# ---------------------------------------------------------------------------------------------- the method

def ligo_plan(model, cycle, train) -> Plan:
  opts: LigoConfig = cycle.ligo
  try:
    m = O.make_mapping(model, width_factor=opts.width_factor, depth_factor=opts.depth_factor, depth_mode="stride",
                       depth_growth="copy")
  except ValueError as e:
    reason = str(e).split(" Pass an explicit")[0]  # (LiGO takes factors, not schemes.)
    raise ConfigError(f"cycle.ligo: {reason} Set cycle.ligo.width_factor to a divisor of num_heads={model.num_heads} "
                      f"and cycle.ligo.depth_factor to a divisor of num_layers={model.num_layers}.") from None
  n_small = round(opts.small_frac * train.steps)
  rest = train.steps - n_small - opts.operator_steps
  if n_small < 1 or rest < 1:
    raise ConfigError(f"cycle.ligo: {n_small} small-model steps (small_frac={opts.small_frac}) and "
                      f"{opts.operator_steps} operator steps leave {rest} steps of train.steps={train.steps} for the "
                      f"big model; lower cycle.ligo.operator_steps or small_frac, or raise train.steps.")
  n_small, n_op, n_big = split_steps(train.steps, (n_small / train.steps, opts.operator_steps / train.steps,
                                                   rest / train.steps), ("small_frac", "operator_steps", "the rest"))
  warm = lambda n: round(train.warmup_frac * n)
  op_optim = dataclasses.replace(optim_for(LrSchedule(opts.operator_lr, n_op, 0, "constant"), train),
                                 weight_decay=0.0)
  stages = (
      Stage(0, 1, "small", "init", n_small, optim_for(
          schedule_for(train, train.lr * opts.small_lr_scale, n_small, warm(n_small)), train)),
      Stage(1, 0, "operator", "operator", n_op, op_optim, view=LigoView(m, opts.init_noise)),
      Stage(2, 0, "grown", "materialise", n_big, optim_for(schedule_for(train, train.lr, n_big, warm(n_big)),
                                                           train)),
  )
  return Plan("ligo", (model, m.small), stages, opts, (m,), train.seed)


def ligo_transition(plan: Plan, src: Stage, dst: Stage) -> Transition:
  """Into the operator stage: the small model (frozen) and the initial operator; into the big model: the
  operator materialised. A fresh optimizer for each."""
  cfg = plan.levels[dst.level]
  if dst.enter == "operator":
    op0 = initial_operator(plan.maps[0], M.abstract_params(plan.levels[1]), dst.view.init_noise, plan.seed + 7)
    return Transition("operator", (("operator", lambda c: {"params": {"frozen": c["params"], "train": op0}}),
                                   fresh_optimizer(dst)), "after_operator_init")
  if dst.enter == "materialise":
    return Transition("materialise", (("materialise", lambda c: {"params": src.view.to_model(cfg, c["params"])}),
                                      fresh_optimizer(dst)), "after_materialise")
  raise ValueError(f"Stage {dst.name} cannot be entered by {dst.enter!r} from {src.name}.")


LIGO = register_method(Method("ligo", ligo_plan, ligo_transition,
                              "LiGO: small model, then a learned linear growth operator (~100 steps), then the big one."))
