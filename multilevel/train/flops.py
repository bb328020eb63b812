"""Analytic training FLOPs: matmuls only, forward x 3 for forward + backward (the usual 6N-style estimate).

Per example, with T positions, width d, FFN width F, L layers:
- per layer: q/k/v/out projections 8 T d^2, attention scores and mixing 4 T^2 d, FFN 4 T d F;
- BERT head: 2 T d^2 + 2 T d V; GPT head: 2 T d V; DeiT: patch embedding 2 N p^2 C d and the classifier.
Attention is counted over the full T x T (the causal mask is applied, not skipped, as the step computes it).
"""

from __future__ import annotations

from multilevel.models import ModelConfig
from multilevel.train.objectives import tokens_per_example


def forward_flops_per_example(cfg: ModelConfig) -> float:
  t, d, f = tokens_per_example(cfg), cfg.width, cfg.ffn_dim
  per_layer = 8 * t * d * d + 4 * t * t * d + 4 * t * d * f
  total = cfg.num_layers * per_layer
  if cfg.family == "bert":
    total += 2 * t * d * d + 2 * t * d * cfg.vocab_size
  elif cfg.family == "gpt":
    total += 2 * t * d * cfg.vocab_size
  else:
    total += 2 * cfg.num_patches * cfg.patch_size ** 2 * cfg.num_channels * d
    total += 2 * d * cfg.num_classes * (2 if cfg.distill_token else 1)
  return float(total)


def train_flops_per_step(cfg: ModelConfig, global_batch: int) -> float:
  """Forward + backward FLOPs of one optimizer step over ``global_batch`` examples."""
  return 3.0 * forward_flops_per_example(cfg) * global_batch
