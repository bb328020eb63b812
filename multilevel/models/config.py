"""Model configuration: one frozen dataclass for all the families, plus presets.

The multi-level method keeps the head size fixed and changes the number of heads, so the width of a model is
``num_heads * head_dim`` and the FFN width is ``ffn_ratio * width`` (or ``ffn_size`` where it is given: LLaMA's FFN
widths are not multiples of the width). A config is hashable, so it can be a static argument of a jitted function and
a cache key.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from multilevel.models.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS

RESIDUAL_INITS = ("auto", "scaled", "plain")


def _family(name: str):
  from multilevel.models.family import family_of  # Lazy: the family modules import this one.
  return family_of(name)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Size and architecture of one model. ``family`` selects a registered family (``multilevel.models.FAMILY``):
  BERT (masked LM), GPT and LLaMA (causal LM), DeiT (images). The fields a family declares as its own
  (``Family.own_fields``, e.g. LLaMA's ``num_kv_heads``) must keep their defaults in the other families."""

  family: str = "gpt"
  num_layers: int = 2
  num_heads: int = 2
  head_dim: int = 32
  ffn_ratio: int = 4
  ffn_size: int = 0  # FFN width; 0 means ffn_ratio * width.
  # Text models.
  vocab_size: int = 512
  max_len: int = 128
  type_vocab_size: int = 2  # BERT token types.
  # Vision models.
  image_size: int = 32
  patch_size: int = 4
  num_channels: int = 3
  num_classes: int = 10
  distill_token: bool = False
  # LLaMA-style decoders.
  num_kv_heads: int = 0  # Key/value heads of grouped-query attention; 0 means num_heads (multi-head attention).
  rope_base: float = 10000.0  # Base of the rotary position embedding's frequencies.
  # Rescaling of the rotary frequencies: '' (none, plain RoPE) or 'llama3' (Llama 3.1 / 3.2). The four settings
  # below are read only with 'llama3' and must keep their defaults (Llama 3.1's values) otherwise.
  rope_scaling: str = ""
  rope_factor: float = 8.0  # Long wavelengths (> rope_original_max_len / rope_low_freq_factor) are divided by this.
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0  # Short wavelengths (< rope_original_max_len / this) are kept.
  rope_original_max_len: int = 8192  # The context length the unscaled model was pretrained on.
  # The context length the model declares (Hugging Face's max_position_embeddings); 0 = max_len. RoPE has no position
  # parameters, so max_len is only the length a run trains at: an imported LLaMA may train at a shorter one and keep
  # its checkpoint's context here for export (to run it on longer rows, ``cfg.replace(max_len=...)``: no parameter
  # changes).
  context_len: int = 0
  tie_embeddings: bool = False  # The LM head is the transposed token embedding.
  # Init of each residual branch's output projection (attention out, FFN down): 'auto' = the family's own (GPT-2's
  # 'scaled' for GPT, 'plain' for BERT, DeiT and LLaMA, as Hugging Face's LLaMA), 'scaled' = std 0.02 / sqrt(2 L),
  # 'plain' = std 0.02. Only fresh models read it.
  residual_init: str = "auto"
  # Shared.
  dropout: float = 0.0
  ln_eps: float = -1.0  # -1 means the family's default (BERT 1e-12, GPT and LLaMA 1e-5, DeiT 1e-6).
  dtype: str = "float32"  # Compute dtype; parameters are always float32.
  remat: bool = False  # Rematerialise each block in the backward pass (saves memory on big models).
  # Layers per iteration of the loop over the stacked blocks (nn.scan's unroll; the parameters are stacked either
  # way): 0 = auto, every layer on the CPU backend (where XLA's autodiff through the loop cost GPT's train step about
  # a fifth of its backward pass) and 1 elsewhere (a loop: compile time that does not grow with depth).
  scan_unroll: int = 0
  # jax.nn.dot_product_attention: 'auto' = cuDNN's flash kernel on GPUs in bf16/fp16, XLA's elsewhere; 'xla';
  # 'cudnn' (fails where cuDNN cannot); 'explicit' = materialised probabilities (always used to train with dropout).
  attention: str = "auto"

  def __post_init__(self):
    from multilevel.models.family import REGISTRY
    if self.family not in REGISTRY:
      raise ValueError(f"ModelConfig.family must be one of {list(REGISTRY)}, got {self.family!r}.")
    for f in dataclasses.fields(self):  # A size given as "2" or 2.5 would fail deep inside the model's init.
      v = getattr(self, f.name)
      if f.type in ("int", int) and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
        raise ValueError(f"ModelConfig.{f.name} must be an integer, got {v!r} ({type(v).__name__}).")
      if f.type in ("float", float) and (isinstance(v, bool) or not isinstance(v, (int, float, np.number))
                                         or not math.isfinite(float(v))):
        raise ValueError(f"ModelConfig.{f.name} must be a finite number, got {v!r}.")
    for name in ("num_layers", "num_heads", "head_dim", "ffn_ratio"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"ModelConfig.{name} must be a positive integer, got {getattr(self, name)!r}.")
    if self.ln_eps < 0 and self.ln_eps != -1:
      raise ValueError(f"ModelConfig.ln_eps must be >= 0, or -1 for the family's default, got {self.ln_eps}.")
    if self.ffn_size < 0:
      raise ValueError(f"ModelConfig.ffn_size must be >= 0 (0 = ffn_ratio * width), got {self.ffn_size}.")
    family = _family(self.family)
    defaults = {f.name: f.default for f in dataclasses.fields(self)}
    for other in REGISTRY.values():
      for name in set(other.own_fields) - set(family.own_fields):
        if getattr(self, name) != defaults[name]:
          raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} is a {other.name} setting; a {self.family} "
                           f"model does not read it. Leave it at {defaults[name]!r}, or use family={other.name!r}.")
    if family.validate is not None:
      family.validate(self)
    if self.dtype not in ("float32", "bfloat16", "float16"):
      raise ValueError(f"ModelConfig.dtype must be float32, bfloat16 or float16, got {self.dtype!r}.")
    if not family.is_text:
      for name in ("image_size", "patch_size", "num_channels", "num_classes"):
        if getattr(self, name) < 1:
          raise ValueError(f"ModelConfig.{name} must be a positive integer, got {getattr(self, name)}.")
      if self.image_size % self.patch_size:
        raise ValueError(
            f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}; pick sizes that divide.")
    else:
      for name in ("vocab_size", "max_len") + (("type_vocab_size",) if self.family == "bert" else ()):
        if getattr(self, name) < 1:
          raise ValueError(f"ModelConfig.{name} must be a positive integer for a text model, got "
                           f"{getattr(self, name)}.")
    if self.attention not in ATTENTION_IMPLEMENTATIONS:
      raise ValueError(f"ModelConfig.attention must be one of {ATTENTION_IMPLEMENTATIONS}, got {self.attention!r}.")
    if self.residual_init not in RESIDUAL_INITS:
      raise ValueError(f"ModelConfig.residual_init must be one of {RESIDUAL_INITS} ('auto' = the family's own), got "
                       f"{self.residual_init!r}.")
    if self.scan_unroll < 0:
      raise ValueError(f"ModelConfig.scan_unroll must be >= 0 (0 = auto: all layers unrolled on CPUs, a loop "
                       f"elsewhere; n = n layers per loop iteration), got {self.scan_unroll}.")
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"dropout must be in [0, 1), got {self.dropout}.")

  @property
  def width(self) -> int:
    return self.num_heads * self.head_dim

  @property
  def ffn_dim(self) -> int:
    return self.ffn_size or self.ffn_ratio * self.width

  @property
  def kv_heads(self) -> int:
    """Key/value heads (``num_kv_heads``, or ``num_heads`` when it is 0)."""
    return self.num_kv_heads or self.num_heads

  @property
  def eps(self) -> float:
    if self.ln_eps >= 0:
      return float(self.ln_eps)
    return _family(self.family).ln_eps

  @property
  def context(self) -> int:
    """The context length the model declares: ``context_len``, else ``max_len``."""
    return self.context_len or self.max_len

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2

  @property
  def seq_len(self) -> int:
    """Tokens the transformer stack sees per example (patches plus class/distillation tokens for images)."""
    if not _family(self.family).is_text:
      return self.num_patches + 1 + int(self.distill_token)
    return self.max_len

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
      raise ValueError(f"Unknown model config keys {unknown}; valid keys are {sorted(names)}.")
    return cls(**dict(d))
