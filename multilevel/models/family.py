"""What the rest of the package needs to know about a model family, as one record per family.

A family is a Flax module plus this record: the axis-role table the operators read, and the facts that would
otherwise be string tests on ``cfg.family`` spread over the package (text or images, which objective, GELU form,
init scale, positions per example, FLOPs, the config fields only it reads). A new family is a new module file that calls
``register(Family(...))``, plus one import line in ``families.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from multilevel.registry import Registry

MODALITIES = ("text", "images")


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family.

  Attributes:
    name: the ``ModelConfig.family`` value.
    module: ``ModelConfig -> flax.linen.Module``.
    axes: parameter path -> one role per axis (``multilevel.models.axes``); all the operators know of a model.
    modality: ``"text"`` (token ids in: ``max_len``, ``vocab_size``) or ``"images"`` (``image_size``,
      ``num_channels``, ``num_classes``).
    objective: the key of ``multilevel.train.objectives.OBJECTIVES`` this family trains with.
    pre_ln: LayerNorm before each residual branch (GPT, DeiT) or after the residual sum (BERT).
    tied_embedding: the output head is the transposed token embedding (BERT, GPT); a ``ModelConfig -> bool`` where
      the config decides (LLaMA's ``tie_embeddings``). Read it through ``ties(cfg)``.
    ln_eps: the family's default normalisation epsilon (``ModelConfig.ln_eps = -1`` selects it).
    gelu_tanh: the tanh approximation of GELU (GPT-2's "gelu_new"); otherwise the exact erf form.
    scaled_residual_init: residual-branch output projections start at std 0.02 / sqrt(2 L) (GPT-2).
    causal: attention sees only earlier positions (decoders).
    embedding_params: top-level parameter names left out of non-embedding counts (the 6N convention).
    positions: ``ModelConfig -> int``, the positions the transformer stack processes per example.
    head_flops: ``(ModelConfig, objective) -> float``, forward matmul FLOPs per example outside the blocks, as the
      train step computes them (``objective``: the ``ObjectiveConfig``, e.g. how many positions BERT predicts).
    embed_flops: ``ModelConfig -> float``, the share of ``head_flops`` below the blocks (DeiT's patch projection);
      the rest is the output head, above them.
    block_flops: ``ModelConfig -> float``, forward matmul FLOPs per example of one block; None: the shared core's
      (``multilevel.train.flops``).
    own_fields: ``ModelConfig`` fields only this family reads; the other families refuse values other than the
      defaults, so a setting is never silently ignored.
    validate: ``ModelConfig -> None``, raises ValueError on a config the family cannot build (checked on creation).
    blocks: ``(ModelConfig, deterministic) -> nn.Module`` whose parameters are ``{"layers": ...}``, called as
      ``(x_BxTxD, mask_BxT=None)``: the stacked blocks alone (``models.parts``); None: the shared core's ``Blocks``.
    output_embedding: text families: ``params -> (embedding_VxD, bias_V or None)``, the vocabulary layer that the
      model's ``features=True`` output feeds (the losses apply it themselves, in chunks for large vocabularies).
  """

  name: str
  module: Callable[[Any], Any]
  axes: Mapping[str, tuple]
  modality: str
  objective: str
  pre_ln: bool
  tied_embedding: bool | Callable[[Any], bool]
  ln_eps: float
  positions: Callable[[Any], int]
  head_flops: Callable[[Any, Any], float]
  gelu_tanh: bool = False
  scaled_residual_init: bool = False
  causal: bool = False
  embedding_params: tuple[str, ...] = ()
  embed_flops: Callable[[Any], float] = lambda cfg: 0.0
  block_flops: Callable[[Any], float] | None = None
  own_fields: tuple[str, ...] = ()
  validate: Callable[[Any], None] | None = None
  blocks: Callable[[Any, bool], Any] | None = None
  output_embedding: Callable[[Any], tuple] | None = None

  def __post_init__(self):
    if self.modality not in MODALITIES:
      raise ValueError(f"Family {self.name!r}: modality must be one of {MODALITIES}, got {self.modality!r}.")

  def ties(self, cfg) -> bool:
    """Whether ``cfg``'s output head is the transposed token embedding."""
    return bool(self.tied_embedding(cfg) if callable(self.tied_embedding) else self.tied_embedding)

  @property
  def is_text(self) -> bool:
    return self.modality == "text"

  @property
  def reports_accuracy(self) -> bool:
    """Whether evaluation reports accuracy next to the loss (classification)."""
    return self.objective == "classification"


REGISTRY: Registry[Family] = Registry("model family", "model.family")
register = REGISTRY.register


def family_of(cfg_or_name) -> Family:
  """The ``Family`` of a ``ModelConfig`` (or of a family name)."""
  return REGISTRY.get(cfg_or_name if isinstance(cfg_or_name, str) else cfg_or_name.family)
