"""Analytic training FLOPs: matmuls only, forward x 3 for forward + backward (the usual 6N-style estimate).

Per example, with T positions, width d, FFN width F, L layers:
- per layer: q/k/v/out projections 8 T d^2, attention scores and mixing 4 T^2 d, FFN 4 T d F;
- a family with its own block (LLaMA: grouped-query attention, SwiGLU) gives its ``block_flops`` instead;
- outside the blocks, the family's ``head_flops`` (BERT: 2 P d^2 + 2 P d V at its P = round(mlm_prob T) predicted
  positions, the only ones its head computes; GPT: 2 T d V; DeiT: the patch embedding 2 N p^2 C d and the
  classifier).
Attention is counted over the full T x T (the causal mask is applied, not skipped, as XLA's attention computes it;
cuDNN's flash kernel on a GPU skips the masked half of causal blocks, so there the count is the usual convention,
not the work done). The chunked cross-entropy (``losses.py``) does the same matmuls as the unchunked one.
"""

from __future__ import annotations

from multilevel.models import ModelConfig, family_of
from multilevel.train.objectives import ObjectiveConfig, tokens_per_example


def forward_flops_per_example(cfg: ModelConfig, objective: ObjectiveConfig | None = None) -> float:
  """Forward matmul FLOPs of one example; ``objective`` (default ``ObjectiveConfig()``) sets BERT's predictions."""
  family = family_of(cfg)
  t, d, f = tokens_per_example(cfg), cfg.width, cfg.ffn_dim
  per_layer = family.block_flops(cfg) if family.block_flops else 8 * t * d * d + 4 * t * t * d + 4 * t * d * f
  return float(cfg.num_layers * per_layer + family.head_flops(cfg, objective or ObjectiveConfig()))


def train_flops_per_step(cfg: ModelConfig, global_batch: int, objective: ObjectiveConfig | None = None) -> float:
  """Forward + backward FLOPs of one optimizer step over ``global_batch`` examples."""
  return 3.0 * forward_flops_per_example(cfg, objective) * global_batch
