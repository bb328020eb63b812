"""Losses per family: masked LM (BERT), causal LM (GPT), image classification (DeiT).

Each objective is ``loss_fn(cfg, obj, params, batch, rng, train, apply=models.apply) -> {'loss_sum', 'count',
'correct'}``: the sums needed to average exactly over devices and microbatches. ``apply(cfg, params, *inputs, **kw)``
is the forward pass (a stage's view of the model supplies its own, ``train.views``). A family names its objective (``Family.objective``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from multilevel import models as M
from multilevel.models import ModelConfig


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
  """Static settings of the objective (hashable, part of the jit cache key)."""

  mask_id: int = 0  # BERT: the '<mask>' token id.
  pad_id: int = -1  # Tokens equal to pad_id are never predicted; -1 = no padding in packed data.
  mlm_prob: float = 0.15
  label_smoothing: float = 0.1  # DeiT.
  mixup_alpha: float = 0.0  # DeiT; 0 disables mixup.


def mlm_corrupt(tokens_BxT, rng, obj: ObjectiveConfig, vocab_size: int):
  """BERT masking: pick mlm_prob of the tokens; replace 80% by <mask>, 10% by a random token, keep 10%.

  Returns the corrupted inputs and a float mask of the positions to predict.
  """
  r_pick, r_kind, r_tok = jax.random.split(rng, 3)
  valid = tokens_BxT != obj.pad_id
  picked = (jax.random.uniform(r_pick, tokens_BxT.shape) < obj.mlm_prob) & valid
  kind = jax.random.uniform(r_kind, tokens_BxT.shape)
  random_tok = jax.random.randint(r_tok, tokens_BxT.shape, 0, vocab_size, dtype=tokens_BxT.dtype)
  inputs = jnp.where(picked & (kind < 0.8), obj.mask_id, tokens_BxT)
  inputs = jnp.where(picked & (kind >= 0.8) & (kind < 0.9), random_tok, inputs)
  return inputs, picked.astype(jnp.float32)


def _ce_sums(logits, labels, weights):
  ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  return {"loss_sum": jnp.sum(ce * weights), "count": jnp.sum(weights), "correct": jnp.sum(correct * weights)}


def mlm_loss(cfg: ModelConfig, obj: ObjectiveConfig, params, batch, rng, train: bool, apply=M.apply):
  r_mask, r_drop = jax.random.split(rng)
  tokens = batch["tokens"]
  inputs, weights = mlm_corrupt(tokens, r_mask, obj, cfg.vocab_size)
  mask = None if obj.pad_id < 0 else (tokens != obj.pad_id)
  logits = apply(cfg, params, inputs, mask_BxT=mask, train=train, rngs={"dropout": r_drop})
  return _ce_sums(logits, tokens, weights)


def clm_loss(cfg: ModelConfig, obj: ObjectiveConfig, params, batch, rng, train: bool, apply=M.apply):
  tokens = batch["tokens"]
  logits = apply(cfg, params, tokens[:, :-1], train=train, rngs={"dropout": rng})
  targets = tokens[:, 1:]
  weights = jnp.ones(targets.shape, jnp.float32) if obj.pad_id < 0 else (targets != obj.pad_id).astype(jnp.float32)
  return _ce_sums(logits, targets, weights)


def classification_loss(cfg: ModelConfig, obj: ObjectiveConfig, params, batch, rng, train: bool, apply=M.apply):
  r_mix, r_drop = jax.random.split(rng)
  images, labels = batch["image"], batch["label"]
  onehot = jax.nn.one_hot(labels, cfg.num_classes)
  if train and obj.mixup_alpha > 0:
    lam = jax.random.beta(r_mix, obj.mixup_alpha, obj.mixup_alpha)
    perm = jax.random.permutation(r_mix, images.shape[0])
    images = lam * images + (1 - lam) * images[perm]
    onehot = lam * onehot + (1 - lam) * onehot[perm]
  logits = apply(cfg, params, images, train=train, rngs={"dropout": r_drop})
  smoothing = obj.label_smoothing if train else 0.0
  targets = optax.smooth_labels(onehot, smoothing) if smoothing > 0 else onehot
  ce = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  n = jnp.asarray(labels.shape[0], jnp.float32)
  return {"loss_sum": jnp.sum(ce), "count": n, "correct": jnp.sum(correct)}


OBJECTIVES = {"mlm": mlm_loss, "clm": clm_loss, "classification": classification_loss}


def objective_of(cfg: ModelConfig):
  """The loss function of ``cfg``'s family."""
  return OBJECTIVES[M.family_of(cfg).objective]


def tokens_per_example(cfg: ModelConfig) -> int:
  """Positions the transformer processes per example (for throughput and FLOPs)."""
  return int(M.family_of(cfg).positions(cfg))
