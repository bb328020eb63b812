"""CoRe, coarse-refined training (Yang et al. 2020, arXiv 2011.13633) as a method.

Phase one trains a *relaxed* model: a fast attention and the FFN's large matrices factored to low rank
(``models/relaxed.py``); phase two transforms it into the full model and trains that. The paper's text beyond its
abstract is not public and it has no code, so every detail below is our choice (README, "Growth methods"):

- **Fast attention**: linear attention with phi(x) = elu(x) + 1 on the full model's own query/key/value/out
  projections (causal by chunked prefix sums for GPT, a padding mask for BERT, bidirectional for DeiT). The
  attention parameters therefore map back unchanged; phase two switches to softmax attention on the same weights.
  That switch does not preserve the function; its effect on the loss is the ``after_transform`` evaluation against
  the relaxed stage's ``end_of_stage`` one (the FFN transform itself is exact).
- **FFN**: both matrices of every block factored, W = U V at rank ``rank`` (default width / 4). The transform
  multiplies the factors out, so the full FFN computes what the relaxed one did (exact up to float rounding; the
  test compares logits with linear attention on both sides). Phase one starts from the closest rank-r matrices to
  the full model's random init (truncated SVD; every other parameter is the full init itself).
- **Schedule**: ``relaxed_frac`` of the steps (default 0.5) on the relaxed model with the run's warm-up and decay
  (peak ``relaxed_lr_scale`` x train.lr), then the full model with a fresh AdamW (the factors' moments do not map to
  the product's) and a short re-warm-up, ``rewarmup_frac`` of its steps (default 2%), up to train.lr, then the run's
  decay to zero.
- **FLOPs**: a relaxed step is counted as it computes (``RelaxedView.train_flops_per_step``): low-rank FFN
  2 * 2 (d r + r F) per token and layer forward, linear attention as ``relaxed.linear_attention_flops``; the
  transform itself (one matmul per FFN matrix) is not counted, like every other transition.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import NamedSharding

from multilevel import models as M
from multilevel.cycles.plan import (Method, Plan, Stage, Transition, fresh_optimizer, optim_for, register_method,
                                    split_steps)
from multilevel.models import relaxed as R
from multilevel.train.optim import schedule_for
from multilevel.train.sharding import param_shardings, param_spec
from multilevel.train.views import View
from multilevel.typed_config import ConfigError, check_fields


@dataclasses.dataclass(frozen=True)
class CoreConfig:
  """``cycle.core``: CoRe's options."""

  rank: int = 0  # Rank r of each factored FFN matrix; 0 = width // 4. At most min(width, ffn_dim).
  relaxed_frac: float = 0.5  # Share of train.steps on the relaxed model.
  rewarmup_frac: float = 0.02  # Linear warm-up of the full model, as a share of its steps.
  chunk: int = 64  # Causal linear attention: positions per chunk (quadratic inside a chunk, linear across).
  relaxed_lr_scale: float = 1.0  # Peak learning rate of the relaxed model, relative to train.lr.

  def __post_init__(self):
    check_fields(self, "cycle.core")
    if self.rank < 0:
      raise ConfigError(f"cycle.core.rank must be >= 1 (or 0 for width // 4), got {self.rank}.")
    if not 0 < self.relaxed_frac < 1:
      raise ConfigError(f"cycle.core.relaxed_frac (the relaxed model's share of the steps) must be in (0, 1), got "
                        f"{self.relaxed_frac}.")
    if not 0 <= self.rewarmup_frac <= 1:
      raise ConfigError(f"cycle.core.rewarmup_frac must be in [0, 1], got {self.rewarmup_frac}.")
    if self.chunk < 1:
      raise ConfigError(f"cycle.core.chunk must be >= 1, got {self.chunk}.")
    if not self.relaxed_lr_scale > 0:
      raise ConfigError(f"cycle.core.relaxed_lr_scale must be positive, got {self.relaxed_lr_scale}.")


def resolve_rank(cfg, rank: int) -> int:
  """The FFN rank of ``cycle.core.rank`` for model ``cfg`` (0: width // 4), refused outside [1, min(d, F)]."""
  r = rank or max(1, cfg.width // 4)
  top = min(cfg.width, cfg.ffn_dim)
  if not 1 <= r <= top:
    raise ConfigError(f"cycle.core.rank={rank} is impossible for width {cfg.width} and FFN width {cfg.ffn_dim}: a "
                      f"factored FFN matrix has rank between 1 and min(width, ffn_dim) = {top}; choose a rank in "
                      f"that range (0 = width // 4 = {max(1, cfg.width // 4)}).")
  return r


@dataclasses.dataclass(frozen=True)
class RelaxedView(View):
  """Phase one: the stage holds the relaxed tree (the full model's, each FFN kernel replaced by ``u``/``v``
  factors), every parameter trains, and the loss runs linear attention and the low-rank FFN."""

  rank: int
  chunk: int = 64
  attention: str = "linear"

  @property
  def name(self) -> str:
    return f"relaxed(rank={self.rank}, {self.attention} attention)"

  def abstract(self, cfg):
    return jax.eval_shape(lambda p: self.from_model(cfg, p), M.abstract_params(cfg))

  def shardings(self, cfg, mesh):
    full, shapes = param_shardings(cfg, mesh), self.abstract(cfg)["layers"]["mlp"]
    mlp = dict(full["layers"]["mlp"])
    for fc, roles in R.FACTOR_ROLES.items():
      mlp[fc] = {"bias": mlp[fc]["bias"]}
      for part, role in zip(("u", "v"), roles):
        name = f"layers/mlp/{fc}/{part}/kernel"
        shape = shapes[fc][part]["kernel"].shape
        mlp[fc][part] = {"kernel": NamedSharding(mesh, param_spec(name, shape, role, mesh))}
    return dict(full, layers=dict(full["layers"], mlp=mlp))

  def from_model(self, cfg, params):
    R.check_relaxed(cfg, self.rank, self.attention, self.chunk)
    return R.factor_ffn(params, self.rank)

  def to_model(self, cfg, vparams):
    """CoRe's FFN transform: the full model's tree with W = U V (attention parameters unchanged)."""
    return R.expand_ffn(vparams)

  def apply(self, cfg, vparams, *inputs, **kw):
    return R.relaxed_apply(cfg, vparams, *inputs, rank=self.rank, attention=self.attention, chunk=self.chunk, **kw)

  def train_flops_per_step(self, cfg, global_batch: int, objective=None) -> float:
    """Forward + backward (3x the forward) of the relaxed model, as it computes."""
    return 3.0 * R.relaxed_forward_flops(cfg, self.rank, self.attention, self.chunk, objective) * global_batch


def core_plan(model, cycle, train) -> Plan:
  opts: CoreConfig = cycle.core
  if M.family_of(model).blocks is not None:
    raise ConfigError(f"cycle.method='core': the relaxed model (models/relaxed.py) is written for the shared "
                      f"transformer's blocks (LayerNorm, a GELU FFN); family {model.family!r} has its own, which it "
                      f"cannot relax. Use another method for {model.family!r} (e.g. cycle.method='vcycle' or 'msg' "
                      f"with cycle.msg.order=('layers',)).")
  rank = resolve_rank(model, opts.rank)
  n_relaxed, n_full = split_steps(train.steps, (opts.relaxed_frac, 1 - opts.relaxed_frac),
                                  ("cycle.core.relaxed_frac", "1 - cycle.core.relaxed_frac"))
  relaxed_lr = schedule_for(train, train.lr * opts.relaxed_lr_scale, n_relaxed, round(train.warmup_frac * n_relaxed))
  full_lr = schedule_for(train, train.lr, n_full, round(opts.rewarmup_frac * n_full))
  stages = (
      Stage(0, 0, "relaxed", "init", n_relaxed, optim_for(relaxed_lr, train), view=RelaxedView(rank, opts.chunk)),
      Stage(1, 0, "full", "transform", n_full, optim_for(full_lr, train)),
  )
  return Plan("core", (model,), stages, opts, (), train.seed)


def core_transition(plan: Plan, src: Stage, dst: Stage) -> Transition:
  """The relaxed model into the full one: FFN factors multiplied out, attention weights kept (softmax from now on);
  a fresh optimizer."""
  if dst.enter != "transform" or not isinstance(src.view, RelaxedView):
    raise ValueError(f"Stage {dst.name} cannot be entered by {dst.enter!r} from {src.name}.")
  cfg = plan.levels[dst.level]
  transform = lambda c: {"params": src.view.to_model(cfg, c["params"])}
  return Transition("transform", (("transform", transform), fresh_optimizer(dst)), "after_transform")


CORE = register_method(Method("core", core_plan, core_transition,
                              "CoRe: a relaxed model (linear attention, low-rank FFN), transformed and retrained."))
