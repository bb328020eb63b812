"""The three model families on the shared core: BERT (masked LM), GPT (causal LM), DeiT (image classification).

Each family declares ``AXES``: which space each axis of each parameter lives in (see ``axes.py``). That table is all
the operators know about a model.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from multilevel.models import axes as A
from multilevel.models.config import ModelConfig
from multilevel.models.transformer import compute_dtype, dense_init, stack


class Bert(nn.Module):
  """Post-LN encoder with word + position + token-type embeddings and a tied masked-LM head.

  ``__call__(tokens_BxT, token_types_BxT=None, mask_BxT=None, train=False) -> logits_BxTxV`` (float32).
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxT, token_types_BxT=None, mask_BxT=None, train: bool = False):
    cfg = self.cfg
    t = tokens_BxT.shape[1]
    word = nn.Embed(cfg.vocab_size, cfg.width, embedding_init=dense_init(), name="word")
    pos = self.param("position", dense_init(), (cfg.max_len, cfg.width))
    types = self.param("token_type", dense_init(), (cfg.type_vocab_size, cfg.width))
    if token_types_BxT is None:
      token_types_BxT = jnp.zeros_like(tokens_BxT)
    x_BxTxD = word(tokens_BxT) + pos[None, :t] + jnp.take(types, token_types_BxT, axis=0)
    x_BxTxD = nn.LayerNorm(epsilon=cfg.eps, name="ln_embed")(x_BxTxD)
    x_BxTxD = nn.Dropout(cfg.dropout)(x_BxTxD, deterministic=not train)
    x_BxTxD = stack(cfg, pre_ln=False, causal=False, deterministic=not train)(x_BxTxD, mask_BxT)
    h_BxTxD = nn.Dense(cfg.width, kernel_init=dense_init(), name="mlm_dense")(x_BxTxD)
    h_BxTxD = nn.gelu(h_BxTxD, approximate=False)
    h_BxTxD = nn.LayerNorm(epsilon=cfg.eps, name="mlm_ln")(h_BxTxD)
    bias_V = self.param("mlm_bias", nn.initializers.zeros, (cfg.vocab_size,))
    return word.attend(h_BxTxD.astype(jnp.float32)) + bias_V


class Gpt(nn.Module):
  """GPT-2: pre-LN causal decoder, learned positions, final LayerNorm, LM head tied to the token embeddings.

  ``__call__(tokens_BxT, train=False) -> logits_BxTxV`` (float32).
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxT, train: bool = False):
    cfg = self.cfg
    t = tokens_BxT.shape[1]
    word = nn.Embed(cfg.vocab_size, cfg.width, embedding_init=dense_init(), name="word")
    pos = self.param("position", nn.initializers.normal(0.01), (cfg.max_len, cfg.width))
    x_BxTxD = word(tokens_BxT) + pos[None, :t]
    x_BxTxD = nn.Dropout(cfg.dropout)(x_BxTxD, deterministic=not train)
    x_BxTxD = stack(cfg, pre_ln=True, causal=True, deterministic=not train)(x_BxTxD)
    x_BxTxD = nn.LayerNorm(epsilon=cfg.eps, name="ln_final")(x_BxTxD)
    return word.attend(x_BxTxD.astype(jnp.float32))


class Deit(nn.Module):
  """DeiT / ViT: patch embedding, CLS (and optional distillation) token, learned positions, pre-LN blocks, head.

  ``__call__(images_BxHxWxC, train=False) -> logits_BxC`` (float32). With a distillation token the logits are the
  mean of the class head and the distillation head, as DeiT does at inference.
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, images_BxHxWxC, train: bool = False):
    cfg = self.cfg
    p = cfg.patch_size
    if images_BxHxWxC.shape[1:] != (cfg.image_size, cfg.image_size, cfg.num_channels):
      raise ValueError(f"DeiT expects images of shape (batch, {cfg.image_size}, {cfg.image_size}, "
                       f"{cfg.num_channels}), got {images_BxHxWxC.shape}.")
    x = nn.Conv(cfg.width, (p, p), strides=(p, p), padding="VALID", kernel_init=dense_init(), name="patch")(
        images_BxHxWxC.astype(compute_dtype(cfg)))
    b = x.shape[0]
    x_BxNxD = x.reshape(b, -1, cfg.width).astype(jnp.float32)
    tokens = [jnp.broadcast_to(self.param("cls", nn.initializers.zeros, (1, 1, cfg.width)), (b, 1, cfg.width))]
    if cfg.distill_token:
      tokens.append(jnp.broadcast_to(self.param("dist", dense_init(), (1, 1, cfg.width)), (b, 1, cfg.width)))
    x_BxTxD = jnp.concatenate(tokens + [x_BxNxD], axis=1)
    x_BxTxD = x_BxTxD + self.param("pos", dense_init(), (1, cfg.seq_len, cfg.width))
    x_BxTxD = nn.Dropout(cfg.dropout)(x_BxTxD, deterministic=not train)
    x_BxTxD = stack(cfg, pre_ln=True, causal=False, deterministic=not train)(x_BxTxD)
    x_BxTxD = nn.LayerNorm(epsilon=cfg.eps, name="ln_final")(x_BxTxD).astype(jnp.float32)
    logits_BxC = nn.Dense(cfg.num_classes, kernel_init=nn.initializers.zeros, name="head")(x_BxTxD[:, 0])
    if cfg.distill_token:
      dist_BxC = nn.Dense(cfg.num_classes, kernel_init=nn.initializers.zeros, name="head_dist")(x_BxTxD[:, 1])
      logits_BxC = (logits_BxC + dist_BxC) / 2
    return logits_BxC


_LN = {"scale": (A.HIDDEN_OUT,), "bias": (A.HIDDEN_OUT,)}


def _ln(name: str) -> dict:
  return {f"{name}/{k}": v for k, v in _LN.items()}


BERT_AXES = A.with_blocks({
    "word/embedding": (None, A.EMBED),
    "position": (None, A.EMBED),
    "token_type": (None, A.EMBED),
    **_ln("ln_embed"),
    "mlm_dense/kernel": (A.HIDDEN_IN, A.HIDDEN_OUT),
    "mlm_dense/bias": (A.HIDDEN_OUT,),
    **_ln("mlm_ln"),
    "mlm_bias": (None,),  # Vocabulary bias: copied unchanged.
})

GPT_AXES = A.with_blocks({
    "word/embedding": (None, A.EMBED),
    "position": (None, A.EMBED),
    **_ln("ln_final"),
})

DEIT_AXES = A.with_blocks({
    "patch/kernel": (None, None, None, A.EMBED),
    "patch/bias": (A.EMBED,),
    "cls": (None, None, A.EMBED),
    "dist": (None, None, A.EMBED),
    "pos": (None, None, A.EMBED),
    **_ln("ln_final"),
    "head/kernel": (A.HIDDEN_IN, None),
    "head/bias": (None,),
    "head_dist/kernel": (A.HIDDEN_IN, None),
    "head_dist/bias": (None,),
})


class Family:
  """What the rest of the package needs to know about a family."""

  def __init__(self, name, module, axes, pre_ln, tied_embedding):
    self.name, self.module, self.axes = name, module, axes
    self.pre_ln, self.tied_embedding = pre_ln, tied_embedding


FAMILY = {
    "bert": Family("bert", Bert, BERT_AXES, pre_ln=False, tied_embedding=True),
    "gpt": Family("gpt", Gpt, GPT_AXES, pre_ln=True, tied_embedding=True),
    "deit": Family("deit", Deit, DEIT_AXES, pre_ln=True, tied_embedding=False),
}
