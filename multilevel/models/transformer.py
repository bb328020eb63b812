"""The transformer core shared by BERT, GPT and DeiT: attention, MLP, and a stack of blocks scanned over layers
(``scan_blocks``, which LLaMA's blocks use too).

Layers are stacked on a leading axis with ``nn.scan``, so every block parameter has shape ``(num_layers, ...)`` and
depth coalescing is one operation on that axis. Attention projections keep heads as an explicit axis
(``kernel: (width, heads, head_dim)``), so width coalescing merges heads on that axis and never reshapes.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from multilevel.models import axes as A
from multilevel.models.attention import attend
from multilevel.models.config import ModelConfig
from multilevel.models.family import family_of


def dense_init(std: float = 0.02):
  return nn.initializers.normal(stddev=std)


def residual_out_std(cfg: ModelConfig) -> float:
  """Init std of a residual branch's output projection: GPT-2 scales it by 1/sqrt(2L) ('scaled', GPT's own); BERT,
  DeiT and Hugging Face's LLaMA do not ('plain'). ``cfg.residual_init`` picks, 'auto' being the family's own."""
  rule = cfg.residual_init
  if rule == "auto":
    rule = "scaled" if family_of(cfg).scaled_residual_init else "plain"
  return 0.02 / math.sqrt(2 * cfg.num_layers) if rule == "scaled" else 0.02


def compute_dtype(cfg: ModelConfig):
  return jnp.dtype(cfg.dtype)


def check_tokens(cfg: ModelConfig, tokens_BxT):
  """The ids to embed: refuses token inputs the model cannot embed (wrong rank or dtype, longer than ``max_len``, ids
  outside the vocabulary). Shapes are checked at trace time; the id range only on concrete arrays. Under ``jit`` an
  id out of range reads NaN from the embedding, which the training loop reports as a NaN loss: the returned ids have
  every negative id moved past the vocabulary too (an embedding lookup would otherwise wrap -1 to the last row).
  Nested lists of ids are taken as an array."""
  tokens_BxT = jnp.asarray(tokens_BxT) if not hasattr(tokens_BxT, "ndim") else tokens_BxT
  if tokens_BxT.ndim != 2 or not jnp.issubdtype(tokens_BxT.dtype, jnp.integer):
    raise ValueError(f"Token inputs must be integer ids of shape (batch, length), got {tokens_BxT.dtype} "
                     f"{tuple(tokens_BxT.shape)}.")
  if tokens_BxT.shape[1] > cfg.max_len:
    raise ValueError(f"A sequence of {tokens_BxT.shape[1]} tokens is longer than the model's max_len={cfg.max_len} "
                     f"(the longest sequence it is built for); cut the sequences or build the model with a larger "
                     f"max_len.")
  return _ids_in_range(tokens_BxT, cfg.vocab_size, "Token ids", "vocab_size", " The tokenizer and the model "
                       "disagree: set model.vocab_size to the tokenizer's size.")


def check_token_types(cfg: ModelConfig, types_BxT, tokens_BxT):
  """BERT's segment ids to look up, checked as ``check_tokens`` checks the tokens: integers of the tokens' shape,
  each in [0, type_vocab_size) (on concrete arrays; negative ones read NaN under ``jit``)."""
  types_BxT = jnp.asarray(types_BxT) if not hasattr(types_BxT, "ndim") else types_BxT
  if tuple(types_BxT.shape) != tuple(tokens_BxT.shape) or not jnp.issubdtype(types_BxT.dtype, jnp.integer):
    raise ValueError(f"Token type ids must be integers of the tokens' shape {tuple(tokens_BxT.shape)}, got "
                     f"{types_BxT.dtype} {tuple(types_BxT.shape)}.")
  return _ids_in_range(types_BxT, cfg.type_vocab_size, "Token type ids", "type_vocab_size")


def _ids_in_range(ids_BxT, size: int, what: str, field: str, remedy: str = ""):
  """Refuses concrete ids outside [0, size) (a traced array cannot be read at trace time); returns the ids with every
  negative one replaced by ``size``, out of range too, so that a lookup under ``jit`` reads NaN instead of wrapping."""
  if not isinstance(ids_BxT, jax.core.Tracer) and ids_BxT.size:
    ids = np.asarray(ids_BxT)  # On the host: a concrete array closed over by a traced function stays concrete.
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= size:
      raise ValueError(f"{what} must lie in [0, {field}={size}); these range over [{lo}, {hi}].{remedy}")
  return jnp.where(ids_BxT < 0, size, ids_BxT)


def check_images(cfg: ModelConfig, images_BxHxWxC, model: str = "The model") -> None:
  """Refuses images of another size or channel count than the model was built for (checked at trace time)."""
  want = (cfg.image_size, cfg.image_size, cfg.num_channels)
  if images_BxHxWxC.ndim != 4 or tuple(images_BxHxWxC.shape[1:]) != want:
    raise ValueError(f"{model} expects images of shape (batch, {want[0]}, {want[1]}, {want[2]}) "
                     f"(image_size={cfg.image_size}, num_channels={cfg.num_channels}), got "
                     f"{tuple(images_BxHxWxC.shape)}; resize the images or build the model for their size (in a "
                     f"run, model.num_channels=0 takes the channels from the data).")


def vocab_logits(h_BxNxD, embedding_VxD, bias_V=None, dtype=jnp.float32):
  """Logits of a tied vocabulary layer: ``h @ embedding.T (+ bias)``, inputs in ``dtype``, accumulated and returned
  in float32. The one definition shared by the models' full logits and the losses (chunked or not), so both compute
  the same numbers."""
  logits_BxNxV = jnp.einsum("...d,vd->...v", h_BxNxD.astype(dtype), embedding_VxD.astype(dtype),
                            preferred_element_type=jnp.float32)
  if bias_V is None:
    return logits_BxNxV
  return logits_BxNxV + bias_V.astype(jnp.float32).reshape((1,) * (logits_BxNxV.ndim - 1) + (-1,))


def over_rows(layer, x, feature_axes: int = 1):
  """``layer`` (a dense layer) applied to ``x`` with all axes but the last ``feature_axes`` flattened into one axis of
  rows, and the result shaped back: the same parameters and the same function. On rows the layer is one plain matmul
  whose autodiff is plain matmuls too; on a (batch, length, ...) input XLA's CPU backend formed the weight gradient
  from a transposed copy of the output gradient in an unfused dot and computed the activation's derivative twice
  (measured on GPT's MLP at the throughput benchmark's shape: forward and backward 1.8x slower)."""
  lead = x.shape[:x.ndim - feature_axes]
  y = layer(x.reshape((-1,) + x.shape[x.ndim - feature_axes:]))
  return y.reshape(lead + y.shape[1:])


def layer_norm_axes(name: str) -> dict:
  """Axis roles of a LayerNorm named ``name`` on the hidden width (for a family's table)."""
  return {f"{name}/scale": (A.HIDDEN_OUT,), f"{name}/bias": (A.HIDDEN_OUT,)}


class Attention(nn.Module):
  cfg: ModelConfig
  causal: bool
  out_std: float
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxT=None):
    cfg = self.cfg
    dt = compute_dtype(cfg)
    proj = lambda name: over_rows(nn.DenseGeneral((cfg.num_heads, cfg.head_dim), dtype=dt, kernel_init=dense_init(),
                                                  name=name), x_BxTxD)
    q_BxTxHxK = proj("query")
    k_BxTxHxK = proj("key")
    v_BxTxHxK = proj("value")
    # Attention-probability dropout needs the materialised probabilities (the explicit path); otherwise the fused
    # jax.nn.dot_product_attention (cuDNN's flash kernel on GPUs).
    drop = None
    if cfg.dropout > 0 and not self.deterministic:
      drop = lambda probs: nn.Dropout(cfg.dropout)(probs, deterministic=False)
    y_BxTxHxK = attend(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, causal=self.causal, mask_BxS=mask_BxT,
                       implementation=cfg.attention, dropout=drop)
    out = nn.DenseGeneral(cfg.width, axis=(-2, -1), dtype=dt, kernel_init=dense_init(self.out_std), name="out")
    return over_rows(out, y_BxTxHxK, feature_axes=2)


class Mlp(nn.Module):
  cfg: ModelConfig
  out_std: float
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg = self.cfg
    dt = compute_dtype(cfg)
    h_BxTxF = over_rows(nn.Dense(cfg.ffn_dim, dtype=dt, kernel_init=dense_init(), name="fc1"), x_BxTxD)
    # GPT-2 uses the tanh approximation ("gelu_new"); BERT and ViT/DeiT use the exact erf form.
    h_BxTxF = nn.gelu(h_BxTxF, approximate=family_of(cfg).gelu_tanh)
    return over_rows(nn.Dense(cfg.width, dtype=dt, kernel_init=dense_init(self.out_std), name="fc2"), h_BxTxF)


class Block(nn.Module):
  """One block; ``pre_ln`` selects GPT/DeiT (pre-LN) or BERT (post-LN) ordering. Used as a scan body.

  The residual stream stays float32; the projections compute in ``cfg.dtype`` (bf16 on GPUs). Dropout sits where
  Hugging Face's BERT, GPT-2 and ViT put it: on attention probabilities and on each branch output."""

  cfg: ModelConfig
  pre_ln: bool
  causal: bool
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxT):
    cfg = self.cfg
    out_std = residual_out_std(cfg)
    ln = lambda name: nn.LayerNorm(epsilon=cfg.eps, dtype=jnp.float32, name=name)
    drop = lambda y: nn.Dropout(cfg.dropout)(y, deterministic=self.deterministic)
    attn = Attention(cfg, self.causal, out_std, self.deterministic, name="attn")
    mlp = Mlp(cfg, out_std, self.deterministic, name="mlp")
    if self.pre_ln:
      x_BxTxD = x_BxTxD + drop(attn(ln("ln_attn")(x_BxTxD), mask_BxT))
      x_BxTxD = x_BxTxD + drop(mlp(ln("ln_mlp")(x_BxTxD)))
    else:
      x_BxTxD = ln("ln_attn")(x_BxTxD + drop(attn(x_BxTxD, mask_BxT)))
      x_BxTxD = ln("ln_mlp")(x_BxTxD + drop(mlp(x_BxTxD)))
    return x_BxTxD.astype(jnp.float32), None


def scan_unroll(cfg: ModelConfig, backend: str | None = None) -> int:
  """Layers per iteration of the layer loop: ``cfg.scan_unroll``, or with 0 (auto) all of them on the CPU backend
  and 1 on the others (``backend`` defaults to JAX's default backend)."""
  if cfg.scan_unroll:
    return min(cfg.scan_unroll, cfg.num_layers)
  return cfg.num_layers if (backend or jax.default_backend()) == "cpu" else 1


def scan_blocks(block: type[nn.Module], cfg: ModelConfig, *args, name: str = "layers"):
  """``cfg.num_layers`` copies of ``block(cfg, *args)`` scanned over a leading parameter axis named ``name``
  (rematerialised with ``cfg.remat``, ``scan_unroll(cfg)`` layers per loop iteration). The block is called as
  ``block(x, *broadcast) -> (x, None)``; every call argument after ``x`` is the same for all layers.

  Call it inside a parent's ``@nn.compact`` method: ``x = scan_blocks(MyBlock, cfg, ...)(x, *broadcast)``.
  """
  body = nn.remat(block) if cfg.remat else block
  scanned = nn.scan(
      body,
      variable_axes={"params": 0},
      split_rngs={"params": True, "dropout": True},
      in_axes=nn.broadcast,
      length=cfg.num_layers,
      unroll=scan_unroll(cfg),
  )
  module = scanned(cfg, *args, name=name)
  return lambda x, *broadcast: module(x, *broadcast)[0]


def stack(cfg: ModelConfig, *, pre_ln: bool, causal: bool, deterministic: bool) -> nn.Module:
  """``num_layers`` shared-core blocks scanned over a leading parameter axis, named ``layers`` in the parent's tree.

  Call it inside a parent's ``@nn.compact`` method: ``x = stack(cfg, ...)(x, mask)``.
  """
  blocks = scan_blocks(Block, cfg, pre_ln, causal, deterministic)
  return lambda x_BxTxD, mask_BxT=None: blocks(x_BxTxD, mask_BxT)


class Blocks(nn.Module):
  """The blocks of ``cfg`` alone (``cfg.num_layers`` of them), for running a slice of a model's stacked layers:
  ``Blocks(cfg.replace(num_layers=k), ...).apply({"params": {"layers": slice}}, x, mask)``."""

  cfg: ModelConfig
  pre_ln: bool
  causal: bool
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxT=None):
    return stack(self.cfg, pre_ln=self.pre_ln, causal=self.causal, deterministic=self.deterministic)(x_BxTxD,
                                                                                                      mask_BxT)
