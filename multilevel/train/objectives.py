"""Losses per family: masked LM (BERT), causal LM (GPT), image classification (DeiT).

Each objective is ``loss_fn(cfg, obj, params, batch, rng, train, apply=models.apply, vocab=None) -> {'loss_sum',
'count', 'correct'}``: the sums needed to average exactly over devices and microbatches. ``apply(cfg, params, *inputs,
**kw)`` is the forward pass and ``vocab(params) -> (embedding_VxD, bias_V or None)`` the text families' vocabulary
layer (default: the family's ``output_embedding``); a stage's view of the model supplies its own (``train.views``).
A family names its objective (``Family.objective``).

The text objectives take the features the tied vocabulary layer reads (``features=True``) and apply that layer in
``losses.cross_entropy_sums``, in chunks above ``ObjectiveConfig.max_logits`` logits. BERT picks a fixed number of
positions per row (``mlm_predictions``) and runs its head at those only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from multilevel import models as M
from multilevel.models import ModelConfig
from multilevel.models.bert import mlm_predictions
from multilevel.models.transformer import compute_dtype
from multilevel.train.losses import cross_entropy_sums


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
  """Static settings of the objective (hashable, part of the jit cache key)."""

  mask_id: int = 0  # BERT: the '<mask>' token id.
  pad_id: int = -1  # Tokens equal to pad_id are never predicted; -1 = no padding in packed data.
  mlm_prob: float = 0.15
  label_smoothing: float = 0.1  # DeiT.
  mixup_alpha: float = 0.0  # DeiT; 0 disables mixup.
  max_logits: int = -1  # Text: logits per loss chunk at most; 0 = one chunk; -1 = auto (losses.resolve_max_logits).


def mlm_mask(tokens_BxT, rng, obj: ObjectiveConfig, vocab_size: int):
  """BERT masking: pick ``P = mlm_predictions(T, mlm_prob)`` positions of each row uniformly without replacement
  (fewer in a padded row: ``round(mlm_prob * its tokens)``, at least one; padding is never picked); replace 80% of
  them by <mask>, 10% by a random token, keep 10%.

  Returns the corrupted inputs ``B x T``, the picked ``positions_BxP`` and their float ``weights_BxP`` (0 for the
  unused slots of a padded row)."""
  r_pick, r_kind, r_tok = jax.random.split(rng, 3)
  b, t = tokens_BxT.shape
  p = mlm_predictions(t, obj.mlm_prob)
  if p == 0:
    raise ValueError(f"Masked-LM training needs mlm_prob > 0 (got {obj.mlm_prob}): it would predict no position.")
  valid_BxT = tokens_BxT != obj.pad_id
  score_BxT = jnp.where(valid_BxT, jax.random.uniform(r_pick, (b, t)), -1.0)
  _, positions_BxP = jax.lax.top_k(score_BxT, p)  # A uniform random subset of the row's valid tokens, first.
  positions_BxP = positions_BxP.astype(jnp.int32)
  keep_BxP = jnp.take_along_axis(valid_BxT, positions_BxP, axis=1)
  if obj.pad_id >= 0:  # A padded row predicts round(mlm_prob * its tokens): the first ones of its random order.
    n_B = jnp.sum(valid_BxT, axis=1)
    want_B = jnp.where(n_B == t, p, jnp.clip(jnp.round(obj.mlm_prob * n_B), 1, p))
    keep_BxP = keep_BxP & (jnp.arange(p)[None, :] < want_B[:, None])
  kind_BxP = jax.random.uniform(r_kind, (b, p))
  random_BxP = jax.random.randint(r_tok, (b, p), 0, vocab_size, dtype=tokens_BxT.dtype)
  current_BxP = jnp.take_along_axis(tokens_BxT, positions_BxP, axis=1)
  new_BxP = jnp.where(kind_BxP < 0.8, obj.mask_id, jnp.where(kind_BxP < 0.9, random_BxP, current_BxP))
  new_BxP = jnp.where(keep_BxP, new_BxP, current_BxP).astype(tokens_BxT.dtype)
  rows_Bx1 = jnp.arange(b)[:, None]
  inputs_BxT = tokens_BxT.at[rows_Bx1, positions_BxP].set(new_BxP)  # Positions within a row are distinct.
  return inputs_BxT, positions_BxP, keep_BxP.astype(jnp.float32)


def mlm_corrupt(tokens_BxT, rng, obj: ObjectiveConfig, vocab_size: int):
  """``mlm_mask`` with the picked positions as a float ``B x T`` mask: ``(inputs_BxT, weights_BxT)``."""
  inputs_BxT, positions_BxP, weights_BxP = mlm_mask(tokens_BxT, rng, obj, vocab_size)
  rows_Bx1 = jnp.arange(tokens_BxT.shape[0])[:, None]
  weights_BxT = jnp.zeros(tokens_BxT.shape, jnp.float32).at[rows_Bx1, positions_BxP].set(weights_BxP)
  return inputs_BxT, weights_BxT


def _vocab_loss(cfg: ModelConfig, obj: ObjectiveConfig, params, h_BxNxD, labels_BxN, weights_BxN, vocab=None):
  embedding_VxD, bias_V = (vocab or M.family_of(cfg).output_embedding)(params)
  return cross_entropy_sums(h_BxNxD, embedding_VxD, bias_V, labels_BxN, weights_BxN, dtype=compute_dtype(cfg),
                            max_logits=obj.max_logits)


def mlm_loss(cfg: ModelConfig, obj: ObjectiveConfig, params, batch, rng, train: bool, apply=M.apply,
             vocab=None):
  r_mask, r_drop = jax.random.split(rng)
  tokens = batch["tokens"]
  inputs, positions_BxP, weights_BxP = mlm_mask(tokens, r_mask, obj, cfg.vocab_size)
  mask = None if obj.pad_id < 0 else (tokens != obj.pad_id)
  h_BxPxD = apply(cfg, params, inputs, mask_BxT=mask, train=train, rngs={"dropout": r_drop},
                  positions_BxP=positions_BxP, features=True)
  labels_BxP = jnp.take_along_axis(tokens, positions_BxP, axis=1)
  return _vocab_loss(cfg, obj, params, h_BxPxD, labels_BxP, weights_BxP, vocab)


def clm_loss(cfg: ModelConfig, obj: ObjectiveConfig, params, batch, rng, train: bool, apply=M.apply,
             vocab=None):
  tokens = batch["tokens"]
  h_BxTxD = apply(cfg, params, tokens[:, :-1], train=train, rngs={"dropout": rng}, features=True)
  targets = tokens[:, 1:]
  weights = jnp.ones(targets.shape, jnp.float32) if obj.pad_id < 0 else (targets != obj.pad_id).astype(jnp.float32)
  return _vocab_loss(cfg, obj, params, h_BxTxD, targets, weights, vocab)


def classification_loss(cfg: ModelConfig, obj: ObjectiveConfig, params, batch, rng, train: bool, apply=M.apply,
                        vocab=None):
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
