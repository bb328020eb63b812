"""Hugging Face config <-> our ``ModelConfig``, per family (BERT, GPT-2, ViT/DeiT), for ``multilevel.interop.hf``.

Import is strict: a setting our models cannot reproduce raises ``UnsupportedConfigError``. Which HF architecture a
config belongs to is decided in ``hf_archs`` (``config_from_hf``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Mapping

from multilevel.interop.hf_errors import HFInteropError, UnsupportedConfigError
from multilevel.models.config import ModelConfig


# ----------------------------------------------------------------------------------------------------- small helpers


def _get(d: Mapping, key: str, default=None):
  v = d.get(key, default)
  return default if v is None else v


def _config_int(d: Mapping, key: str, default=None) -> int:
  v = _get(d, key, default)
  if v is None:
    raise UnsupportedConfigError(f"The Hugging Face config has no {key!r}.")
  return int(v)


def _split_width(d: int, h: int, ffn: int, names: tuple[str, str, str]) -> tuple[int, int]:
  """``(head_dim, ffn_ratio)`` for hidden size ``d``, ``h`` heads and FFN width ``ffn``, or a clear error."""
  if h < 1 or d % h:
    raise UnsupportedConfigError(f"{names[0]}={d} is not divisible by {names[1]}={h}: the head size must be an "
                                 "integer.")
  if ffn % d:
    raise UnsupportedConfigError(f"{names[2]}={ffn} is not a multiple of {names[0]}={d}; our models need "
                                 "FFN width = ffn_ratio * width with an integer ffn_ratio.")
  return d // h, ffn // d


def _eps(value: float, family: str) -> float:
  """Our ``ln_eps``: -1 (the family default) when the HF value equals that default, so configs round-trip."""
  value = float(value)
  return -1.0 if value == ModelConfig(family).eps else value


def _square(v, name: str) -> int:
  if isinstance(v, (list, tuple)):
    if len(v) != 2 or int(v[0]) != int(v[1]):
      raise UnsupportedConfigError(f"{name}={list(v)}: only square images and patches are supported.")
    v = v[0]
  return int(v)


def _check_act(act: str, allowed: tuple[str, ...], family: str):
  if act not in allowed:
    raise UnsupportedConfigError(f"Activation {act!r} is not supported for {family}: our model uses "
                                 f"{allowed[0]!r} (accepted: {list(allowed)}).")


def _check_false(d: Mapping, key: str, why: str):
  if _get(d, key, False):
    raise UnsupportedConfigError(f"{key}={d[key]!r} is not supported: {why}.")


def _check_tied(d: Mapping):
  if not _get(d, "tie_word_embeddings", True):
    raise UnsupportedConfigError("tie_word_embeddings=False (an untied LM head) is not supported: our LM head is "
                                 "the transposed token embedding.")


# ------------------------------------------------------------------------------------------------------------ BERT


def _bert_config(d: Mapping, arch: str) -> ModelConfig:
  _check_act(_get(d, "hidden_act", "gelu"), ("gelu", "gelu_python"), "BERT")
  pos = _get(d, "position_embedding_type", "absolute")
  if pos != "absolute":
    raise UnsupportedConfigError(f"position_embedding_type={pos!r} (relative position embeddings) is not supported; "
                                 "our BERT has absolute learned positions only.")
  _check_false(d, "is_decoder", "our BERT is a bidirectional encoder")
  _check_false(d, "add_cross_attention", "our BERT has no cross-attention")
  _check_tied(d)
  if "embedding_size" in d and int(d["embedding_size"]) != int(d.get("hidden_size", 768)):
    raise UnsupportedConfigError("A factorised embedding (embedding_size != hidden_size) is not supported.")
  width = _config_int(d, "hidden_size", 768)
  heads = _config_int(d, "num_attention_heads", 12)
  head_dim, ratio = _split_width(width, heads, _config_int(d, "intermediate_size", 3072),
                                 ("hidden_size", "num_attention_heads", "intermediate_size"))
  return ModelConfig(
      "bert", _config_int(d, "num_hidden_layers", 12), heads, head_dim, ratio,
      vocab_size=_config_int(d, "vocab_size", 30522), max_len=_config_int(d, "max_position_embeddings", 512),
      type_vocab_size=_config_int(d, "type_vocab_size", 2), dropout=float(_get(d, "hidden_dropout_prob", 0.1)),
      ln_eps=_eps(_get(d, "layer_norm_eps", 1e-12), "bert"))


def _bert_hf_config(cfg: ModelConfig) -> dict:
  return {
      "architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.width, "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
      "intermediate_size": cfg.ffn_dim, "hidden_act": "gelu", "hidden_dropout_prob": cfg.dropout,
      "attention_probs_dropout_prob": cfg.dropout, "max_position_embeddings": cfg.max_len,
      "type_vocab_size": cfg.type_vocab_size, "initializer_range": 0.02, "layer_norm_eps": cfg.eps,
      "pad_token_id": 0, "position_embedding_type": "absolute", "is_decoder": False, "tie_word_embeddings": True,
  }


# ----------------------------------------------------------------------------------------------------------- GPT-2


def _gpt_config(d: Mapping, arch: str) -> ModelConfig:
  _check_act(_get(d, "activation_function", "gelu_new"), ("gelu_new", "gelu_pytorch_tanh"), "GPT-2")
  if not _get(d, "scale_attn_weights", True):
    raise UnsupportedConfigError("scale_attn_weights=False is not supported: our attention divides by "
                                 "sqrt(head_dim).")
  _check_false(d, "scale_attn_by_inverse_layer_idx", "our attention scale is the same in every layer")
  _check_false(d, "add_cross_attention", "our GPT has no cross-attention")
  _check_tied(d)
  width = _config_int(d, "n_embd", 768)
  heads = _config_int(d, "n_head", 12)
  head_dim, ratio = _split_width(width, heads, int(_get(d, "n_inner", 4 * width)), ("n_embd", "n_head", "n_inner"))
  max_len = _get(d, "n_positions", _get(d, "n_ctx", 1024))
  return ModelConfig(
      "gpt", _config_int(d, "n_layer", 12), heads, head_dim, ratio, vocab_size=_config_int(d, "vocab_size", 50257),
      max_len=int(max_len), dropout=float(_get(d, "resid_pdrop", 0.1)),
      ln_eps=_eps(_get(d, "layer_norm_epsilon", 1e-5), "gpt"))


def _gpt_hf_config(cfg: ModelConfig) -> dict:
  eos = 50256 if cfg.vocab_size > 50256 else None
  return {
      "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
      "n_embd": cfg.width, "n_layer": cfg.num_layers, "n_head": cfg.num_heads, "n_positions": cfg.max_len,
      "n_inner": cfg.ffn_dim, "activation_function": "gelu_new", "resid_pdrop": cfg.dropout,
      "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout, "layer_norm_epsilon": cfg.eps,
      "initializer_range": 0.02, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
      "tie_word_embeddings": True, "bos_token_id": eos, "eos_token_id": eos,
  }


# ------------------------------------------------------------------------------------------------------ ViT / DeiT


def _vision_config(d: Mapping, arch: str) -> ModelConfig:
  _check_act(_get(d, "hidden_act", "gelu"), ("gelu", "gelu_python"), "ViT/DeiT")
  width = _config_int(d, "hidden_size", 768)
  heads = _config_int(d, "num_attention_heads", 12)
  head_dim, ratio = _split_width(width, heads, _config_int(d, "intermediate_size", 3072),
                                 ("hidden_size", "num_attention_heads", "intermediate_size"))
  labels = d.get("id2label")
  num_classes = len(labels) if labels else _config_int(d, "num_labels", 2)
  if num_classes < 1:
    raise UnsupportedConfigError("num_labels=0 (a classifier replaced by the identity) is not supported.")
  image, patch = _square(_get(d, "image_size", 224), "image_size"), _square(_get(d, "patch_size", 16), "patch_size")
  if image % patch:
    raise UnsupportedConfigError(f"image_size {image} is not a multiple of patch_size {patch}.")
  return ModelConfig(
      "deit", _config_int(d, "num_hidden_layers", 12), heads, head_dim, ratio, image_size=image, patch_size=patch,
      num_channels=_config_int(d, "num_channels", 3), num_classes=num_classes,
      distill_token=arch != "ViTForImageClassification", dropout=float(_get(d, "hidden_dropout_prob", 0.0)),
      ln_eps=_eps(_get(d, "layer_norm_eps", 1e-12), "deit"))


def _vision_hf_config(cfg: ModelConfig) -> dict:
  model_type, arch = ("deit", "DeiTForImageClassificationWithTeacher") if cfg.distill_token else (
      "vit", "ViTForImageClassification")
  return {
      "architectures": [arch], "model_type": model_type, "hidden_size": cfg.width,
      "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.ffn_dim,
      "hidden_act": "gelu", "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout,
      "initializer_range": 0.02, "layer_norm_eps": cfg.eps, "image_size": cfg.image_size,
      "patch_size": cfg.patch_size, "num_channels": cfg.num_channels, "qkv_bias": True,
      "id2label": {str(i): f"LABEL_{i}" for i in range(cfg.num_classes)},
      "label2id": {f"LABEL_{i}": i for i in range(cfg.num_classes)},
  }


# --------------------------------------------------------------------------------------------------------- configs


_HF_CONFIG: dict[str, Callable] = {"bert": _bert_hf_config, "gpt": _gpt_hf_config, "deit": _vision_hf_config}


def _config_dict(config) -> dict:
  """A plain dict from a ``transformers`` config object, a dict, or a path to ``config.json`` (or its folder)."""
  if config is None:
    raise HFInteropError("No Hugging Face config: pass config= (a transformers config, a dict or a config.json "
                         "path) or a directory that holds config.json.")
  if hasattr(config, "to_dict"):
    return dict(config.to_dict())
  if isinstance(config, Mapping):
    return dict(config)
  path = Path(config)
  if path.is_dir():
    path = path / "config.json"
  if not path.is_file():
    raise HFInteropError(f"No Hugging Face config file at {path}.")
  return json.loads(path.read_text())


def to_hf_config(cfg: ModelConfig) -> dict:
  """The ``config.json`` contents (a plain dict) of the Hugging Face model equivalent to ``cfg``."""
  return _HF_CONFIG[cfg.family](cfg)
