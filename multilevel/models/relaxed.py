"""The relaxed transformer of CoRe (``cycles/core.py``): linear attention and a low-rank FFN on the same blocks.

The relaxed model differs from the full one inside the blocks only; the embedding and the head are the family's own
(``models.parts``). Two changes, each selectable on its own (the tests compare every combination):

- **Attention** ``'linear'``: kernelised attention with the feature map phi(x) = elu(x) + 1 (Katharopoulos et al.
  2020) on the same query/key/value/out projections as softmax attention, so every attention parameter keeps its
  name and shape and maps back unchanged. Output_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j) over the
  keys j that position i may see: all unpadded keys (a padding mask zeroes phi(k) of padded keys), or for a causal
  family the keys j <= i, computed in chunks of ``chunk`` positions: inside a chunk the masked C x C product, across
  chunks the running state sum phi(k) v^T (head_dim x head_dim per head), so the cost grows linearly with the length.
  Linear attention has no probability matrix, so the attention-probability dropout of softmax attention is not
  applied (the branch dropout is). ``'softmax'`` is the full model's ``transformer.Attention`` itself.
- **FFN** ``rank > 0``: each FFN matrix W (d x F and F x d) is the product U V of a (d x r) and an (r x F) factor
  (``mlp/fc1/u/kernel``, ``mlp/fc1/v/kernel``, the bias ``mlp/fc1/bias`` as before; weight decay applies to both
  factors, whose names end in ``kernel``). ``factor_ffn`` maps a full tree to the relaxed one (truncated SVD, the
  closest rank-r matrices), ``expand_ffn`` back (W = U V: the relaxed FFN's function, exactly up to float rounding).
  ``rank = 0`` is the full model's ``transformer.Mlp``.

With ``attention='softmax', rank=0`` the relaxed forward is the full model (a test holds it to the model's logits).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from multilevel.models import axes as A
from multilevel.models import parts
from multilevel.models import transformer as T
from multilevel.models.config import ModelConfig
from multilevel.models.family import family_of

ATTENTIONS = ("linear", "softmax")
FFN_MATRICES = ("fc1", "fc2")
# Axis roles of the factors (for sharding): U keeps W's input axis, V its output axis; the rank axis never splits.
FACTOR_ROLES = {
    "fc1": ((A.LAYERS, A.HIDDEN_IN, None), (A.LAYERS, None, A.FFN_OUT)),
    "fc2": ((A.LAYERS, A.FFN_IN, None), (A.LAYERS, None, A.RESIDUAL)),
}


def phi(x):
  """The positive feature map of linear attention: elu(x) + 1."""
  return jax.nn.elu(x) + 1.0


def _chunking(t: int, chunk: int) -> tuple[int, int]:
  """``(c, n)``: the chunk length actually used (at most the sequence) and the number of chunks."""
  c = max(1, min(int(chunk), t))
  return c, -(-t // c)


def linear_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, *, causal: bool, mask_BxT=None, chunk: int = 64):
  """phi-kernel attention of float32 q, k, v (batch, length, heads, head_dim) -> (batch, length, heads, head_dim)."""
  # A query that sees no key (a fully padded row, or the causal padding below) has 0 / 0: divide by 1 there instead,
  # so that its output is 0 and its gradient finite (a division by a tiny number would overflow in the backward).
  safe = lambda den: jnp.where(den > 0, den, 1.0)
  fq, fk, v = phi(q_BxTxHxK), phi(k_BxTxHxK), v_BxTxHxK
  if mask_BxT is not None:
    fk = fk * mask_BxT[:, :, None, None].astype(fk.dtype)
  if not causal:
    kv_BxHxKxK = jnp.einsum("bthk,bthv->bhkv", fk, v)
    z_BxHxK = jnp.sum(fk, axis=1)
    num = jnp.einsum("bqhk,bhkv->bqhv", fq, kv_BxHxKxK)
    den = jnp.einsum("bqhk,bhk->bqh", fq, z_BxHxK)
    return num / safe(den)[..., None]
  b, t, h, kd = fq.shape
  c, n = _chunking(t, chunk)
  # Padding goes after the last position: no real query ever sees it (causal), and its rows are cut off.
  cut = lambda x: jnp.pad(x, ((0, 0), (0, n * c - t), (0, 0), (0, 0))).reshape(b, n, c, h, x.shape[-1])
  fq, fk, v = cut(fq), cut(fk), cut(v)
  # Inside each chunk: the causally masked C x C product.
  s_BxNxHxCxC = jnp.einsum("bnqhk,bnshk->bnhqs", fq, fk) * jnp.tril(jnp.ones((c, c), fq.dtype))[None, None, None]
  num = jnp.einsum("bnhqs,bnshv->bnqhv", s_BxNxHxCxC, v)
  den = jnp.transpose(jnp.sum(s_BxNxHxCxC, axis=-1), (0, 1, 3, 2))
  # Across chunks: each chunk's state sum phi(k) v^T, summed over the chunks before it (a strictly lower
  # triangular n x n product: an exclusive prefix sum as one matmul).
  kv_BxNxHxKxK = jnp.einsum("bnshk,bnshv->bnhkv", fk, v)
  z_BxNxHxK = jnp.sum(fk, axis=2)
  before = jnp.tril(jnp.ones((n, n), fq.dtype), -1)
  kv_BxNxHxKxK = jnp.einsum("mn,bnhkv->bmhkv", before, kv_BxNxHxKxK)
  z_BxNxHxK = jnp.einsum("mn,bnhk->bmhk", before, z_BxNxHxK)
  num = num + jnp.einsum("bnqhk,bnhkv->bnqhv", fq, kv_BxNxHxKxK)
  den = den + jnp.einsum("bnqhk,bnhk->bnqh", fq, z_BxNxHxK)
  y = num / safe(den)[..., None]
  return y.reshape(b, n * c, h, kd)[:, :t]


def linear_attention_flops(cfg: ModelConfig, t: int, chunk: int) -> float:
  """Forward matmul FLOPs of ``linear_attention`` per example and layer for ``t`` positions (2 per multiply-add;
  the projections are counted apart). Non-causal: the state and its read, 4 t d K, and the denominators 2 t d.
  Causal: the masked chunk products 4 T' c d (T' = n c, the padded length), the states and their reads 4 T' d K,
  the exclusive prefix over chunks 2 n^2 d K, and the denominators 2 T' d + 2 n^2 d."""
  d, kd = cfg.width, cfg.head_dim
  if not family_of(cfg).causal:
    return float(4 * t * d * kd + 2 * t * d)
  c, n = _chunking(t, chunk)
  tp = n * c
  return float(4 * tp * c * d + 4 * tp * d * kd + 2 * n * n * d * kd + 2 * tp * d + 2 * n * n * d)


class LinearAttention(nn.Module):
  """``transformer.Attention``'s projections (same names, shapes and init) around ``linear_attention``."""

  cfg: ModelConfig
  causal: bool
  out_std: float
  chunk: int

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxT=None):
    cfg = self.cfg
    dt = T.compute_dtype(cfg)
    proj = lambda name: T.over_rows(nn.DenseGeneral((cfg.num_heads, cfg.head_dim), dtype=dt,
                                                    kernel_init=T.dense_init(), name=name), x_BxTxD)
    q_BxTxHxK = proj("query").astype(jnp.float32)
    k_BxTxHxK = proj("key").astype(jnp.float32)
    v_BxTxHxK = proj("value").astype(jnp.float32)
    y_BxTxHxK = linear_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, causal=self.causal, mask_BxT=mask_BxT,
                                 chunk=self.chunk).astype(dt)
    out = nn.DenseGeneral(cfg.width, axis=(-2, -1), dtype=dt, kernel_init=T.dense_init(self.out_std), name="out")
    return T.over_rows(out, y_BxTxHxK, feature_axes=2)


class LowRankDense(nn.Module):
  """``x U V + b``: a Dense layer whose kernel is factored at rank ``rank``. Each factor starts at std
  sqrt(std / sqrt(rank)), so the product's entries have the full kernel's std (used for shapes; a CoRe run
  starts from ``factor_ffn`` of the full model's init)."""

  features: int
  rank: int
  std: float
  dtype: jnp.dtype

  @nn.compact
  def __call__(self, x):
    s = math.sqrt(self.std / math.sqrt(self.rank))
    h = T.over_rows(nn.Dense(self.rank, use_bias=False, dtype=self.dtype, kernel_init=T.dense_init(s), name="u"), x)
    y = T.over_rows(nn.Dense(self.features, use_bias=False, dtype=self.dtype, kernel_init=T.dense_init(s), name="v"),
                    h)
    bias = self.param("bias", nn.initializers.zeros, (self.features,))
    return y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,)).astype(y.dtype)


class LowRankMlp(nn.Module):
  """``transformer.Mlp`` with both matrices factored (``LowRankDense``); the same GELU."""

  cfg: ModelConfig
  rank: int
  out_std: float

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg = self.cfg
    dt = T.compute_dtype(cfg)
    h_BxTxF = LowRankDense(cfg.ffn_dim, self.rank, 0.02, dt, name="fc1")(x_BxTxD)
    h_BxTxF = nn.gelu(h_BxTxF, approximate=family_of(cfg).gelu_tanh)
    return LowRankDense(cfg.width, self.rank, self.out_std, dt, name="fc2")(h_BxTxF)


class RelaxedBlock(nn.Module):
  """``transformer.Block`` with the attention and the FFN chosen (``attention``, ``rank``); the same norms,
  residuals and branch dropout in the same order. A scan body."""

  cfg: ModelConfig
  pre_ln: bool
  causal: bool
  deterministic: bool
  rank: int
  attention: str
  chunk: int

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxT):
    cfg = self.cfg
    out_std = T.residual_out_std(cfg)
    ln = lambda name: nn.LayerNorm(epsilon=cfg.eps, dtype=jnp.float32, name=name)
    drop = lambda y: nn.Dropout(cfg.dropout)(y, deterministic=self.deterministic)
    if self.attention == "linear":
      attn = LinearAttention(cfg, self.causal, out_std, self.chunk, name="attn")
    else:
      attn = T.Attention(cfg, self.causal, out_std, self.deterministic, name="attn")
    mlp = (LowRankMlp(cfg, self.rank, out_std, name="mlp") if self.rank
           else T.Mlp(cfg, out_std, self.deterministic, name="mlp"))
    if self.pre_ln:
      x_BxTxD = x_BxTxD + drop(attn(ln("ln_attn")(x_BxTxD), mask_BxT))
      x_BxTxD = x_BxTxD + drop(mlp(ln("ln_mlp")(x_BxTxD)))
    else:
      x_BxTxD = ln("ln_attn")(x_BxTxD + drop(attn(x_BxTxD, mask_BxT)))
      x_BxTxD = ln("ln_mlp")(x_BxTxD + drop(mlp(x_BxTxD)))
    return x_BxTxD.astype(jnp.float32), None


class RelaxedBlocks(nn.Module):
  """``cfg.num_layers`` relaxed blocks scanned over the stacked ``layers`` axis, as ``transformer.stack`` does."""

  cfg: ModelConfig
  rank: int
  attention: str
  chunk: int
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxT=None):
    cfg, fam = self.cfg, family_of(self.cfg)
    return T.scan_blocks(RelaxedBlock, cfg, fam.pre_ln, fam.causal, self.deterministic, self.rank, self.attention,
                         self.chunk)(x_BxTxD, mask_BxT)


def check_relaxed(cfg: ModelConfig, rank: int, attention: str, chunk: int) -> None:
  """Refuses a rank outside [0, min(d, F)], an unknown attention or a chunk < 1, saying what to change."""
  if attention not in ATTENTIONS:
    raise ValueError(f"The relaxed model's attention must be one of {ATTENTIONS}, got {attention!r}.")
  top = min(cfg.width, cfg.ffn_dim)
  if not 0 <= rank <= top:
    raise ValueError(f"FFN rank {rank} is impossible for width {cfg.width} and FFN width {cfg.ffn_dim}: a factored "
                     f"FFN matrix has rank between 1 and min(width, ffn_dim) = {top} (0 = the full matrices).")
  if chunk < 1:
    raise ValueError(f"The causal linear attention's chunk length must be >= 1, got {chunk}.")


def relaxed_apply(cfg: ModelConfig, params, *inputs, rank: int, attention: str = "linear", chunk: int = 64,
                  train: bool = False, rngs=None, **kw):
  """Logits of the relaxed model (``params``: the full model's tree, with the FFN factored where ``rank > 0``);
  the head's own options in ``kw`` (BERT's ``positions_BxP``, ``features``) go to the head."""
  mask = kw.get("mask_BxT")
  outer = parts.outer(params)
  x_BxTxD = parts.embed(cfg, outer, *inputs, train=train, rngs=rngs, **kw)
  x_BxTxD = RelaxedBlocks(cfg, rank, attention, chunk, not train).apply({"params": {"layers": params["layers"]}},
                                                                        x_BxTxD, mask, rngs=rngs)
  head_kw = {k: v for k, v in kw.items() if k in parts.HEAD_OPTIONS}
  return parts.head(cfg, outer, x_BxTxD, train=train, rngs=rngs, **head_kw)


def factor_ffn(params, rank: int) -> dict:
  """The relaxed tree of a full one: each FFN kernel W (per layer) replaced by its best rank-``rank``
  approximation U V (truncated SVD, the singular values split evenly: U = P sqrt(S), V = sqrt(S) Q^T)."""
  mlp = dict(params["layers"]["mlp"])
  for fc in FFN_MATRICES:
    w = mlp[fc]["kernel"]
    p, s, qt = jnp.linalg.svd(w, full_matrices=False)
    root = jnp.sqrt(s[..., :rank])
    u = p[..., :, :rank] * root[..., None, :]
    v = root[..., :, None] * qt[..., :rank, :]
    mlp[fc] = {"u": {"kernel": u}, "v": {"kernel": v}, "bias": mlp[fc]["bias"]}
  return dict(params, layers=dict(params["layers"], mlp=mlp))


def expand_ffn(params) -> dict:
  """The full tree of a relaxed one: each factored FFN matrix multiplied out, W = U V (per layer, at the
  highest matmul precision); every other parameter unchanged."""
  mlp = dict(params["layers"]["mlp"])
  for fc in FFN_MATRICES:
    u, v = mlp[fc]["u"]["kernel"], mlp[fc]["v"]["kernel"]
    w = jnp.einsum("lir,lro->lio", u, v, precision=jax.lax.Precision.HIGHEST)
    mlp[fc] = {"kernel": w, "bias": mlp[fc]["bias"]}
  return dict(params, layers=dict(params["layers"], mlp=mlp))


def relaxed_forward_flops(cfg: ModelConfig, rank: int, attention: str = "linear", chunk: int = 64,
                          objective=None) -> float:
  """Forward matmul FLOPs per example of the relaxed model, on ``train.flops``' accounting: the full model's count
  with each block's attention (4 T^2 d) and FFN (4 T d F) replaced by what the relaxed block computes (linear
  attention: ``linear_attention_flops``; low-rank FFN: 2 * 2 (d r + r F) per position)."""
  from multilevel.train.flops import forward_flops_per_example  # Deferred: train imports the models package.
  from multilevel.train.objectives import tokens_per_example
  t, d, f = tokens_per_example(cfg), cfg.width, cfg.ffn_dim
  per_layer = 0.0
  if attention == "linear":
    per_layer += linear_attention_flops(cfg, t, chunk) - 4 * t * t * d
  if rank:
    per_layer += 4 * t * (d * rank + rank * f) - 4 * t * d * f
  return float(forward_flops_per_example(cfg, objective) + cfg.num_layers * per_layer)
