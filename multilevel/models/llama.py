"""LLaMA-style decoders: pre-RMSNorm blocks, SwiGLU MLP, rotary positions, grouped-query attention, no biases.

The input embedding and the LM head are separate tensors unless ``tie_embeddings`` (SmolLM, Llama 3.2 1B). Query
head ``n`` reads key/value head ``n // (num_heads / kv_heads)``, as in Hugging Face's ``LlamaForCausalLM`` and
``jax.nn.dot_product_attention``. Rotary embeddings rotate the two halves of each head (HF's ``rotate_half``), so
HF weights load without a permutation.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from multilevel.models import axes as A
from multilevel.models.config import ModelConfig
from multilevel.models.family import Family, register
from multilevel.models.gpt import lm_head_flops, positions
from multilevel.models.transformer import (check_tokens, compute_dtype, dense_init, over_rows, residual_out_std,
                                          scan_blocks)


def rope_inverse_frequencies(head_dim: int, base: float, llama3: tuple[float, float, float, int] | None = None):
  """The ``head_dim / 2`` rotary frequencies (float32): ``base ** (-2i / head_dim)``, or with ``llama3 = (factor,
  low_freq_factor, high_freq_factor, original_max_len)`` Llama 3's rescaling of them.

  Llama 3 sorts the frequencies by wavelength ``2 pi / f`` against the pretraining context ``original_max_len``:
  wavelengths below ``original_max_len / high_freq_factor`` keep their frequency, those above
  ``original_max_len / low_freq_factor`` have it divided by ``factor``, and those in between blend the two,
  ``(1 - s) f / factor + s f`` with ``s = (original_max_len / wavelength - low) / (high - low)``. Computed in float32
  in that order, as ``transformers`` does."""
  inv_freq = 1.0 / (base ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  if llama3 is None:
    return inv_freq
  factor, low, high, original = llama3
  wavelength = 2 * math.pi / inv_freq
  s = (original / wavelength - low) / (high - low)
  blended = (1 - s) * inv_freq / factor + s * inv_freq
  kept_or_blended = jnp.where(wavelength < original / high, inv_freq, blended)
  return jnp.where(wavelength > original / low, inv_freq / factor, kept_or_blended)


def llama3_scaling(cfg: ModelConfig) -> tuple[float, float, float, int] | None:
  """``(factor, low_freq_factor, high_freq_factor, original_max_len)`` of ``cfg``'s Llama 3 rotary rescaling, or
  None for plain RoPE."""
  if cfg.rope_scaling != "llama3":
    return None
  return cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor, cfg.rope_original_max_len


def rope_tables(length: int, head_dim: int, base: float, llama3: tuple[float, float, float, int] | None = None):
  """``(cos_TxK, sin_TxK)`` for positions ``0 .. length - 1`` (float32): frequency ``base ** (-2i / head_dim)``
  (rescaled as Llama 3 does with ``llama3``, see ``rope_inverse_frequencies``) on channels ``i`` and
  ``i + head_dim / 2``."""
  inv_freq = rope_inverse_frequencies(head_dim, base, llama3)
  angles_TxK = jnp.arange(length, dtype=jnp.float32)[:, None] * jnp.concatenate([inv_freq, inv_freq])[None, :]
  return jnp.cos(angles_TxK), jnp.sin(angles_TxK)


def apply_rope(x_BxTxNxK, cos_TxK, sin_TxK):
  """Rotates each channel pair ``(i, i + K/2)`` of every head by its position's angle."""
  half = x_BxTxNxK.shape[-1] // 2
  rotated = jnp.concatenate([-x_BxTxNxK[..., half:], x_BxTxNxK[..., :half]], axis=-1)
  cos, sin = (t.astype(x_BxTxNxK.dtype)[None, :, None, :] for t in (cos_TxK, sin_TxK))
  return x_BxTxNxK * cos + rotated * sin


class Attention(nn.Module):
  """Causal grouped-query attention with rotary positions; no biases."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD, cos_TxK, sin_TxK):
    cfg = self.cfg
    dt = compute_dtype(cfg)
    proj = lambda heads, name: over_rows(nn.DenseGeneral((heads, cfg.head_dim), use_bias=False, dtype=dt,
                                                         kernel_init=dense_init(), name=name), x_BxTxD)
    q_BxTxHxK = apply_rope(proj(cfg.num_heads, "query"), cos_TxK, sin_TxK)
    k_BxTxGxK = apply_rope(proj(cfg.kv_heads, "key"), cos_TxK, sin_TxK)
    v_BxTxGxK = proj(cfg.kv_heads, "value")
    y_BxTxHxK = jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxGxK, v_BxTxGxK, is_causal=True)
    out = nn.DenseGeneral(cfg.width, axis=(-2, -1), use_bias=False, dtype=dt,
                          kernel_init=dense_init(residual_out_std(cfg)), name="out")
    return over_rows(out, y_BxTxHxK, feature_axes=2)


class SwiGlu(nn.Module):
  """``down(silu(gate(x)) * up(x))``."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg = self.cfg
    dense = lambda n, name, x, std=0.02: over_rows(nn.Dense(n, use_bias=False, dtype=compute_dtype(cfg),
                                                            kernel_init=dense_init(std), name=name), x)
    h_BxTxF = nn.silu(dense(cfg.ffn_dim, "gate", x_BxTxD)) * dense(cfg.ffn_dim, "up", x_BxTxD)
    return dense(cfg.width, "down", h_BxTxF, residual_out_std(cfg))


def rms_norm(cfg: ModelConfig, name: str) -> nn.Module:
  return nn.RMSNorm(epsilon=cfg.eps, dtype=jnp.float32, name=name)


class Block(nn.Module):
  """One pre-RMSNorm block (a scan body). The residual stream stays float32; the projections compute in
  ``cfg.dtype``. ``cfg.dropout`` drops branch outputs, as the other families do (HF's Llama has none)."""

  cfg: ModelConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxTxD, cos_TxK, sin_TxK):
    cfg = self.cfg
    drop = lambda y: nn.Dropout(cfg.dropout)(y, deterministic=self.deterministic)
    x_BxTxD = x_BxTxD + drop(Attention(cfg, name="attn")(rms_norm(cfg, "norm_attn")(x_BxTxD), cos_TxK, sin_TxK))
    x_BxTxD = x_BxTxD + drop(SwiGlu(cfg, name="mlp")(rms_norm(cfg, "norm_mlp")(x_BxTxD)))
    return x_BxTxD.astype(jnp.float32), None


def llama_stack(cfg: ModelConfig, deterministic: bool):
  """``cfg.num_layers`` LLaMA blocks scanned over a leading parameter axis, named ``layers`` in the parent's tree,
  with the rotary tables of the sequence's length. Call it inside a parent's ``@nn.compact`` method:
  ``x = llama_stack(cfg, deterministic)(x)``. Padding masks are not taken (packed causal-LM data has none)."""
  blocks = scan_blocks(Block, cfg, deterministic)

  def run(x_BxTxD, mask_BxT=None):
    if mask_BxT is not None:
      raise ValueError("LLaMA blocks take no padding mask: the causal mask is the only one (packed data).")
    cos_TxK, sin_TxK = rope_tables(x_BxTxD.shape[1], cfg.head_dim, cfg.rope_base, llama3_scaling(cfg))
    return blocks(x_BxTxD, cos_TxK, sin_TxK)

  return run


class LlamaBlocks(nn.Module):
  """The blocks of ``cfg`` alone, for running a slice of a model's stacked layers (``models.parts``):
  ``LlamaBlocks(cfg.replace(num_layers=k), deterministic).apply({"params": {"layers": slice}}, x)``."""

  cfg: ModelConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxT=None):
    return llama_stack(self.cfg, self.deterministic)(x_BxTxD, mask_BxT)


class Llama(nn.Module):
  """``__call__(tokens_BxT, train=False) -> logits_BxTxV`` (float32).

  ``part`` runs a piece of the model: ``"embed"`` (tokens -> the residual stream entering the blocks) or ``"head"``
  (the stream leaving the blocks -> logits); ``"all"`` is the whole model (``models.parts`` composes them)."""

  cfg: ModelConfig
  part: str = "all"

  @nn.compact
  def __call__(self, x, train: bool = False, features: bool = False):
    cfg = self.cfg
    embed = nn.Embed(cfg.vocab_size, cfg.width, embedding_init=dense_init(), name="embed")
    if self.part != "head":
      x_BxTxD = nn.Dropout(cfg.dropout)(embed(check_tokens(cfg, x)), deterministic=not train)
      if self.part == "embed":
        return x_BxTxD
      x = llama_stack(cfg, not train)(x_BxTxD)
    x_BxTxD = rms_norm(cfg, "norm_final")(x).astype(jnp.float32)
    if features:  # What the vocabulary layer reads (the losses apply it themselves: ``_output_embedding``).
      if not cfg.tie_embeddings and self.is_initializing():
        nn.Dense(cfg.vocab_size, use_bias=False, dtype=jnp.float32, kernel_init=dense_init(), name="lm_head")(x_BxTxD)
      return x_BxTxD
    if cfg.tie_embeddings:
      return embed.attend(x_BxTxD)
    return nn.Dense(cfg.vocab_size, use_bias=False, dtype=jnp.float32, kernel_init=dense_init(), name="lm_head")(
        x_BxTxD)


# Untied, the embedding is averaged on coalescing like an output and copied on growth, and the head's input side is
# summed / divided: width growth keeps the function exactly (duplicated units keep the RMS). Tied, the embedding is
# summed / halved like the head it is, and ``preln_exact`` halves the branch outputs too (exact up to RMSNorm's eps).
LLAMA_AXES = {
    "embed/embedding": (None, A.EMBED),
    "lm_head/kernel": (A.HIDDEN_IN, None),
    "norm_final/scale": (A.HIDDEN_OUT,),
    "layers/norm_attn/scale": (A.LAYERS, A.HIDDEN_OUT),
    "layers/norm_mlp/scale": (A.LAYERS, A.HIDDEN_OUT),
    "layers/attn/query/kernel": (A.LAYERS, A.HIDDEN_IN, A.HEADS_OUT, None),
    "layers/attn/key/kernel": (A.LAYERS, A.HIDDEN_IN, A.KV_HEADS_OUT, None),
    "layers/attn/value/kernel": (A.LAYERS, A.HIDDEN_IN, A.KV_HEADS_OUT, None),
    "layers/attn/out/kernel": (A.LAYERS, A.HEADS_IN, None, A.RESIDUAL),
    # Gate and up units share the FFN map, so unit u of both merges with the same partners (SwiGLU pairs).
    "layers/mlp/gate/kernel": (A.LAYERS, A.HIDDEN_IN, A.FFN_OUT),
    "layers/mlp/up/kernel": (A.LAYERS, A.HIDDEN_IN, A.FFN_OUT),
    "layers/mlp/down/kernel": (A.LAYERS, A.FFN_IN, A.RESIDUAL),
}


def _output_embedding(params):
  """The vocabulary layer as ``(embedding_VxD, None)``: the tied embedding, or the untied head's kernel transposed."""
  if "lm_head" in params:
    return params["lm_head"]["kernel"].T, None
  return params["embed"]["embedding"], None


def _validate(cfg: ModelConfig) -> None:
  if cfg.head_dim % 2:
    raise ValueError(f"LLaMA's rotary embedding rotates pairs of channels: head_dim must be even, got {cfg.head_dim}.")
  if cfg.num_kv_heads < 0 or cfg.num_heads % cfg.kv_heads:
    raise ValueError(f"num_kv_heads={cfg.num_kv_heads} must divide num_heads={cfg.num_heads}: each key/value head "
                     f"serves an equal group of query heads (0 means num_heads, plain multi-head attention).")
  if not cfg.rope_base > 1.0:
    raise ValueError(f"rope_base must be > 1 (LLaMA uses 10000, Llama 3 500000), got {cfg.rope_base}.")
  if cfg.context_len < 0:
    raise ValueError(f"context_len must be >= 0 (the context the model declares; 0 = max_len), got "
                     f"{cfg.context_len}.")
  _validate_rope_scaling(cfg)


ROPE_SCALINGS = ("", "llama3")
_LLAMA3_FIELDS = ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_len")


def _validate_rope_scaling(cfg: ModelConfig) -> None:
  if cfg.rope_scaling not in ROPE_SCALINGS:
    raise ValueError(f"rope_scaling must be '' (plain RoPE) or 'llama3' (Llama 3's rescaled frequencies), got "
                     f"{cfg.rope_scaling!r}; the other variants (linear, dynamic, yarn, longrope, ...) are not "
                     f"implemented.")
  if not cfg.rope_scaling:
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    changed = [f"{n}={getattr(cfg, n)!r}" for n in _LLAMA3_FIELDS if getattr(cfg, n) != defaults[n]]
    if changed:
      raise ValueError(f"{', '.join(changed)}: read only with rope_scaling='llama3'. Set rope_scaling='llama3', or "
                       f"leave {', '.join(_LLAMA3_FIELDS)} at their defaults "
                       f"({', '.join(repr(defaults[n]) for n in _LLAMA3_FIELDS)}).")
    return
  factor, low, high, original = llama3_scaling(cfg)
  if not (math.isfinite(factor) and factor >= 1.0):
    raise ValueError(f"rope_factor must be a finite number >= 1 (Llama 3.1 uses 8, Llama 3.2 32), got {factor}.")
  if not (math.isfinite(low) and low > 0.0):
    raise ValueError(f"rope_low_freq_factor must be a finite number > 0 (Llama 3 uses 1), got {low}.")
  if not (math.isfinite(high) and high > low):
    raise ValueError(f"rope_high_freq_factor={high} must be greater than rope_low_freq_factor={low} (Llama 3 uses 4 "
                     f"and 1): the wavelengths between original_max_len / high and original_max_len / low are "
                     f"blended.")
  if isinstance(original, bool) or not isinstance(original, int) or original < 1:
    raise ValueError(f"rope_original_max_len must be a positive integer (the pretraining context; Llama 3 uses "
                     f"8192), got {original!r}.")


def _block_flops(cfg: ModelConfig) -> float:
  """q and out 4 T d^2, key and value 4 T d (kv_heads * head_dim), attention 4 T^2 d, SwiGLU's three 6 T d F."""
  t, d, f = positions(cfg), cfg.width, cfg.ffn_dim
  return 4 * t * d * d + 4 * t * d * cfg.kv_heads * cfg.head_dim + 4 * t * t * d + 6 * t * d * f


LLAMA = register(Family(
    "llama", Llama, LLAMA_AXES, modality="text", objective="clm", pre_ln=True,
    tied_embedding=lambda cfg: cfg.tie_embeddings, ln_eps=1e-5, positions=positions,
    head_flops=lambda cfg, objective: lm_head_flops(cfg), block_flops=_block_flops, embedding_params=("embed",),
    own_fields=("num_kv_heads", "rope_base", "rope_scaling", *_LLAMA3_FIELDS, "tie_embeddings", "context_len"),
    validate=_validate, causal=True, blocks=LlamaBlocks, output_embedding=_output_embedding))
