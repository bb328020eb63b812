"""DeiT / ViT: patch embedding, CLS (and optional distillation) token, learned positions, pre-LN blocks, a head."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from multilevel.models import axes as A
from multilevel.models.config import ModelConfig
from multilevel.models.family import Family, register
from multilevel.models.transformer import check_images, compute_dtype, dense_init, layer_norm_axes, stack


class Deit(nn.Module):
  """``__call__(images_BxHxWxC, train=False) -> logits_BxC`` (float32).

  With a distillation token the logits are the mean of the class head and the distillation head, as DeiT does at
  inference.
  """

  cfg: ModelConfig
  part: str = "all"  # "embed" | "head" | "all", as for the text families.

  @nn.compact
  def __call__(self, x, train: bool = False):
    cfg = self.cfg
    if self.part != "head":
      images_BxHxWxC = x
      check_images(cfg, images_BxHxWxC, "DeiT")
      p = cfg.patch_size
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
      if self.part == "embed":
        return x_BxTxD
      x = stack(cfg, pre_ln=True, causal=False, deterministic=not train)(x_BxTxD)
    x_BxTxD = nn.LayerNorm(epsilon=cfg.eps, name="ln_final")(x).astype(jnp.float32)
    logits_BxC = nn.Dense(cfg.num_classes, kernel_init=nn.initializers.zeros, name="head")(x_BxTxD[:, 0])
    if cfg.distill_token:
      dist_BxC = nn.Dense(cfg.num_classes, kernel_init=nn.initializers.zeros, name="head_dist")(x_BxTxD[:, 1])
      logits_BxC = (logits_BxC + dist_BxC) / 2
    return logits_BxC


DEIT_AXES = A.with_blocks({
    "patch/kernel": (None, None, None, A.EMBED),
    "patch/bias": (A.EMBED,),
    "cls": (None, None, A.EMBED),
    "dist": (None, None, A.EMBED),
    "pos": (None, None, A.EMBED),
    **layer_norm_axes("ln_final"),
    "head/kernel": (A.HIDDEN_IN, None),
    "head/bias": (None,),
    "head_dist/kernel": (A.HIDDEN_IN, None),
    "head_dist/bias": (None,),
})


def _patch_flops(cfg: ModelConfig) -> float:
  return 2 * cfg.num_patches * cfg.patch_size ** 2 * cfg.num_channels * cfg.width


def _head_flops(cfg: ModelConfig, objective) -> float:
  return _patch_flops(cfg) + 2 * cfg.width * cfg.num_classes * (2 if cfg.distill_token else 1)


DEIT = register(Family(
    "deit", Deit, DEIT_AXES, modality="images", objective="classification", pre_ln=True, tied_embedding=False,
    ln_eps=1e-6, positions=lambda cfg: cfg.seq_len, head_flops=_head_flops, embedding_params=("pos",),
    embed_flops=_patch_flops))
