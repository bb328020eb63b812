"""The Hugging Face architectures we support, how each maps onto one of our families, and resolving a checkpoint's
architecture (``supported_architectures``, ``config_from_hf``), for ``multilevel.interop.hf``."""

from __future__ import annotations

import re
from typing import Mapping

from multilevel.interop.hf_config import _bert_config, _config_dict, _gpt_config, _vision_config
from multilevel.interop.hf_errors import UnsupportedArchitectureError
from multilevel.models.config import ModelConfig


# -------------------------------------------------------------------------------------------- architecture tables


class _Arch:
  """How one HF architecture maps onto one of our families."""

  def __init__(self, name, model_types, family, config_fn, prefix, heads, ignored, aliases):
    self.name, self.model_types, self.family, self.config_fn = name, model_types, family, config_fn
    self.prefix = prefix  # The base model's attribute name ("bert", "transformer", "vit", "deit").
    self.heads = heads  # Top-level names that are not under the base model.
    self.ignored = [re.compile(x) for x in ignored]
    self.aliases = aliases  # Tied copies: alias name -> canonical name; must be equal when both are present.


_BERT_IGNORED = (r"^bert\.pooler\.", r"^cls\.seq_relationship\.", r"^bert\.embeddings\.(position_ids|token_type_ids)$")
_BERT_ALIASES = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
                 "cls.predictions.decoder.bias": "cls.predictions.bias"}


_GPT_IGNORED = (r"^transformer\.h\.\d+\.attn\.(bias|masked_bias)$",)
_GPT_ALIASES = {"lm_head.weight": "transformer.wte.weight"}

_ARCHS = {a.name: a for a in [
    _Arch("BertForMaskedLM", ("bert",), "bert", _bert_config, "bert", ("cls",), _BERT_IGNORED, _BERT_ALIASES),
    _Arch("BertForPreTraining", ("bert",), "bert", _bert_config, "bert", ("cls",), _BERT_IGNORED, _BERT_ALIASES),
    _Arch("GPT2LMHeadModel", ("gpt2",), "gpt", _gpt_config, "transformer", ("lm_head",), _GPT_IGNORED, _GPT_ALIASES),
    _Arch("GPT2Model", ("gpt2",), "gpt", _gpt_config, "transformer", ("lm_head",), _GPT_IGNORED, _GPT_ALIASES),
    _Arch("ViTForImageClassification", ("vit",), "deit", _vision_config, "vit", ("classifier",),
          (r"^vit\.pooler\.",), {}),
    _Arch("DeiTForImageClassificationWithTeacher", ("deit",), "deit", _vision_config, "deit",
          ("cls_classifier", "distillation_classifier"), (r"^deit\.pooler\.",), {}),
    _Arch("DeiTForImageClassification", ("deit",), "deit", _vision_config, "deit", ("classifier",),
          (r"^deit\.pooler\.",), {}),
]}

_DEFAULT_ARCH = {"bert": "BertForMaskedLM", "gpt2": "GPT2LMHeadModel", "vit": "ViTForImageClassification"}

# transformers >= 5 names the ViT/DeiT block tensors of an in-memory model differently from the files it writes
# (save_pretrained converts back). Map those names to the file names.
_V5_VISION_NAMES = [
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\.attention\.q_proj\."), r"\1.encoder.layer.\2.attention.attention.query."),
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\.attention\.k_proj\."), r"\1.encoder.layer.\2.attention.attention.key."),
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\.attention\.v_proj\."), r"\1.encoder.layer.\2.attention.attention.value."),
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\.attention\.o_proj\."), r"\1.encoder.layer.\2.attention.output.dense."),
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\.mlp\.fc1\."), r"\1.encoder.layer.\2.intermediate.dense."),
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\.mlp\.fc2\."), r"\1.encoder.layer.\2.output.dense."),
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\."), r"\1.encoder.layer.\2."),
]


def supported_architectures() -> list[str]:
  return sorted(_ARCHS)


def _resolve_arch(hf_config: Mapping, keys, arch: str | None) -> _Arch:
  model_type = hf_config.get("model_type")
  if arch is None:
    archs = hf_config.get("architectures") or []
    if len(archs) > 1:
      raise UnsupportedArchitectureError(f"The config lists several architectures {archs}; pass one explicitly.")
    arch = archs[0] if archs else None
  if arch is None:  # No recorded architecture: decide from the model type (and the heads, for DeiT).
    if model_type == "deit":
      arch = ("DeiTForImageClassificationWithTeacher" if any(k.startswith("cls_classifier.") for k in keys)
              else "DeiTForImageClassification")
    else:
      arch = _DEFAULT_ARCH.get(model_type)
  if arch not in _ARCHS:
    raise UnsupportedArchitectureError(
        f"Unsupported Hugging Face architecture {arch!r} (model_type {model_type!r}); supported: "
        f"{supported_architectures()}.")
  a = _ARCHS[arch]
  if model_type is not None and model_type not in a.model_types:
    raise UnsupportedArchitectureError(
        f"Architecture {arch!r} does not match model_type {model_type!r} (expected {list(a.model_types)}).")
  return a


def config_from_hf(config, architecture: str | None = None) -> ModelConfig:
  """Our ``ModelConfig`` for a Hugging Face config (object, dict or ``config.json`` path). Raises if unsupported."""
  d = _config_dict(config)
  a = _resolve_arch(d, (), architecture)
  return a.config_fn(d, a.name)

