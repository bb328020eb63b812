"""Hugging Face interoperability: import and export BERT, GPT-2, ViT and DeiT weights.

Supported ``transformers`` architectures and the family they map to:

================================================  ==========================================================
``BertForMaskedLM`` / ``BertForPreTraining``      ``bert`` (pooler and next-sentence head are dropped, as
                                                   ``BertForMaskedLM`` itself does)
``GPT2LMHeadModel`` / ``GPT2Model``               ``gpt`` (the LM head is the tied token embedding)
``ViTForImageClassification``                     ``deit`` with ``distill_token=False``
``DeiTForImageClassificationWithTeacher``         ``deit`` with ``distill_token=True`` (mean of the two heads)
``DeiTForImageClassification``                    ``deit`` with ``distill_token=True``, imported exactly as
                                                   ``head = 2 * classifier`` and a zero ``head_dist`` (import
                                                   only; it exports as ``...WithTeacher``)
================================================  ==========================================================

Import (``load_hf``) reads a ``save_pretrained`` directory (``model.safetensors``, sharded safetensors,
``pytorch_model.bin``), a single ``.safetensors`` / ``.bin`` file, an in-memory state dict, or an in-memory
``transformers`` model. It is strict: a checkpoint of another architecture, an unsupported setting, a missing
tensor, an unexpected tensor or a tensor of the wrong shape raises an ``HFInteropError`` subclass, so no parameter
is ever left at a random initial value. The only tensors dropped on purpose are those that cannot change the
logits of the model we build (``_IGNORED`` below: BERT's pooler and NSP head, GPT-2's causal-mask buffers, ViT's
pooler); tied copies of the embeddings are checked to be equal, not dropped blindly.

Export (``save_hf``) writes ``config.json`` and ``model.safetensors`` with the tensor names ``save_pretrained``
writes, so ``AutoModel...from_pretrained(dir)`` loads it with no missing or unexpected keys. Import and export
need only ``numpy`` and ``safetensors``; ``torch`` is needed for ``.bin`` files and in-memory models, and
``transformers`` only for ``to_hf_model``.

Parameter trees come back as nested dicts of float32 ``numpy`` arrays (place them on devices as you like).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from multilevel.models import abstract_params
from multilevel.models.config import ModelConfig

log = logging.getLogger(__name__)

PathLike = str | os.PathLike


# ----------------------------------------------------------------------------------------------------------- errors


class HFInteropError(ValueError):
  """Base class of every import/export error."""


class UnsupportedArchitectureError(HFInteropError):
  """The checkpoint is of an architecture we have no model for."""


class UnsupportedConfigError(HFInteropError):
  """The architecture is supported but one of its settings is not (activation, position embeddings, ...)."""


class MissingTensorError(HFInteropError):
  """A tensor our model needs is not in the checkpoint."""


class UnexpectedTensorError(HFInteropError):
  """The checkpoint holds a tensor that maps to nothing in our model."""


class TensorShapeError(HFInteropError):
  """A tensor's shape does not fit the configuration."""


def _names(keys, limit: int = 12) -> str:
  keys = sorted(keys)
  more = f" ... and {len(keys) - limit} more" if len(keys) > limit else ""
  return ", ".join(keys[:limit]) + more


# --------------------------------------------------------------------------------------------- small array helpers


def _heads_in_to_hf(k):  # ours (d, H, hd) -> nn.Linear weight (H*hd, d)
  return k.reshape(k.shape[0], -1).T


def _heads_in_from_hf(w, h: int, hd: int):  # nn.Linear weight (H*hd, d) -> (d, H, hd)
  return w.T.reshape(w.shape[1], h, hd)


def _heads_out_to_hf(k):  # ours (H, hd, d) -> nn.Linear weight (d, H*hd)
  return k.reshape(-1, k.shape[-1]).T


def _heads_out_from_hf(w, h: int, hd: int):  # nn.Linear weight (d, H*hd) -> (H, hd, d)
  return w.T.reshape(h, hd, w.shape[0])


def _stack(rows) -> np.ndarray:
  return np.stack(rows).astype(np.float32, order="C", copy=False)


def _c(x) -> np.ndarray:
  """A C-contiguous float32 copy: the tree never shares memory with the source (e.g. a live torch model)."""
  return np.array(x, dtype=np.float32, order="C")


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


_BERT_BLOCK = {  # our block path -> HF name under bert.encoder.layer.{i}.
    "ln_attn": "attention.output.LayerNorm",
    "ln_mlp": "output.LayerNorm",
    "mlp/fc1": "intermediate.dense",
    "mlp/fc2": "output.dense",
    "attn/query": "attention.self.query",
    "attn/key": "attention.self.key",
    "attn/value": "attention.self.value",
    "attn/out": "attention.output.dense",
}


def _linear_block_to_hf(cfg: ModelConfig, p: Mapping, names: Mapping[str, str], prefix: str) -> dict:
  """Our stacked block as per-layer ``nn.Linear``/``LayerNorm`` tensors (BERT, ViT, DeiT)."""
  lay, sd = p["layers"], {}
  for i in range(cfg.num_layers):
    at = lambda key: f"{prefix}{i}.{names[key]}"
    for ln in ("ln_attn", "ln_mlp"):
      sd[at(ln) + ".weight"] = lay[ln]["scale"][i]
      sd[at(ln) + ".bias"] = lay[ln]["bias"][i]
    for proj in ("query", "key", "value"):
      sd[at(f"attn/{proj}") + ".weight"] = _heads_in_to_hf(lay["attn"][proj]["kernel"][i])
      sd[at(f"attn/{proj}") + ".bias"] = lay["attn"][proj]["bias"][i].reshape(-1)
    sd[at("attn/out") + ".weight"] = _heads_out_to_hf(lay["attn"]["out"]["kernel"][i])
    sd[at("attn/out") + ".bias"] = lay["attn"]["out"]["bias"][i]
    for fc in ("fc1", "fc2"):
      sd[at(f"mlp/{fc}") + ".weight"] = lay["mlp"][fc]["kernel"][i].T
      sd[at(f"mlp/{fc}") + ".bias"] = lay["mlp"][fc]["bias"][i]
  return sd


def _linear_block_from_hf(cfg: ModelConfig, sd: Mapping, names: Mapping[str, str], prefix: str) -> dict:
  h, hd, n = cfg.num_heads, cfg.head_dim, cfg.num_layers
  at = lambda key, suffix: [sd[f"{prefix}{i}.{names[key]}.{suffix}"] for i in range(n)]
  ln = lambda key: {"scale": _stack(at(key, "weight")), "bias": _stack(at(key, "bias"))}
  proj = lambda key: {"kernel": _stack([_heads_in_from_hf(w, h, hd) for w in at(key, "weight")]),
                      "bias": _stack([b.reshape(h, hd) for b in at(key, "bias")])}
  dense = lambda key: {"kernel": _stack([w.T for w in at(key, "weight")]), "bias": _stack(at(key, "bias"))}
  return {
      "attn": {"query": proj("attn/query"), "key": proj("attn/key"), "value": proj("attn/value"),
               "out": {"kernel": _stack([_heads_out_from_hf(w, h, hd) for w in at("attn/out", "weight")]),
                       "bias": _stack(at("attn/out", "bias"))}},
      "mlp": {"fc1": dense("mlp/fc1"), "fc2": dense("mlp/fc2")},
      "ln_attn": ln("ln_attn"),
      "ln_mlp": ln("ln_mlp"),
  }


def _bert_to_hf(cfg: ModelConfig, p: Mapping) -> dict:
  e = "bert.embeddings."
  t = "cls.predictions.transform."
  sd = {
      e + "word_embeddings.weight": p["word"]["embedding"],
      e + "position_embeddings.weight": p["position"],
      e + "token_type_embeddings.weight": p["token_type"],
      e + "LayerNorm.weight": p["ln_embed"]["scale"],
      e + "LayerNorm.bias": p["ln_embed"]["bias"],
  }
  sd.update(_linear_block_to_hf(cfg, p, _BERT_BLOCK, "bert.encoder.layer."))
  sd[t + "dense.weight"] = p["mlm_dense"]["kernel"].T
  sd[t + "dense.bias"] = p["mlm_dense"]["bias"]
  sd[t + "LayerNorm.weight"] = p["mlm_ln"]["scale"]
  sd[t + "LayerNorm.bias"] = p["mlm_ln"]["bias"]
  sd["cls.predictions.bias"] = p["mlm_bias"]
  return sd


def _bert_from_hf(cfg: ModelConfig, sd: Mapping) -> dict:
  e = "bert.embeddings."
  t = "cls.predictions.transform."
  return {
      "word": {"embedding": _c(sd[e + "word_embeddings.weight"])},
      "position": _c(sd[e + "position_embeddings.weight"]),
      "token_type": _c(sd[e + "token_type_embeddings.weight"]),
      "ln_embed": {"scale": _c(sd[e + "LayerNorm.weight"]), "bias": _c(sd[e + "LayerNorm.bias"])},
      "layers": _linear_block_from_hf(cfg, sd, _BERT_BLOCK, "bert.encoder.layer."),
      "mlm_dense": {"kernel": _c(sd[t + "dense.weight"].T), "bias": _c(sd[t + "dense.bias"])},
      "mlm_ln": {"scale": _c(sd[t + "LayerNorm.weight"]), "bias": _c(sd[t + "LayerNorm.bias"])},
      "mlm_bias": _c(sd["cls.predictions.bias"]),
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


def _gpt_to_hf(cfg: ModelConfig, p: Mapping) -> dict:
  sd = {"transformer.wte.weight": p["word"]["embedding"], "transformer.wpe.weight": p["position"]}
  lay = p["layers"]
  d = cfg.width
  for i in range(cfg.num_layers):
    pre = f"transformer.h.{i}."
    sd[pre + "ln_1.weight"] = lay["ln_attn"]["scale"][i]
    sd[pre + "ln_1.bias"] = lay["ln_attn"]["bias"][i]
    sd[pre + "ln_2.weight"] = lay["ln_mlp"]["scale"][i]
    sd[pre + "ln_2.bias"] = lay["ln_mlp"]["bias"][i]
    # Conv1D weights are (in, out); c_attn is q | k | v along the output axis.
    qkv = [lay["attn"][k]["kernel"][i].reshape(d, d) for k in ("query", "key", "value")]
    sd[pre + "attn.c_attn.weight"] = jnp.concatenate(qkv, axis=1)
    sd[pre + "attn.c_attn.bias"] = jnp.concatenate([lay["attn"][k]["bias"][i].reshape(d)
                                                    for k in ("query", "key", "value")])
    sd[pre + "attn.c_proj.weight"] = lay["attn"]["out"]["kernel"][i].reshape(d, d)
    sd[pre + "attn.c_proj.bias"] = lay["attn"]["out"]["bias"][i]
    sd[pre + "mlp.c_fc.weight"] = lay["mlp"]["fc1"]["kernel"][i]
    sd[pre + "mlp.c_fc.bias"] = lay["mlp"]["fc1"]["bias"][i]
    sd[pre + "mlp.c_proj.weight"] = lay["mlp"]["fc2"]["kernel"][i]
    sd[pre + "mlp.c_proj.bias"] = lay["mlp"]["fc2"]["bias"][i]
  sd["transformer.ln_f.weight"] = p["ln_final"]["scale"]
  sd["transformer.ln_f.bias"] = p["ln_final"]["bias"]
  return sd


def _gpt_from_hf(cfg: ModelConfig, sd: Mapping) -> dict:
  h, hd, d, n = cfg.num_heads, cfg.head_dim, cfg.width, cfg.num_layers
  at = lambda suffix: [sd[f"transformer.h.{i}.{suffix}"] for i in range(n)]
  qkv_w = [np.split(w, 3, axis=1) for w in at("attn.c_attn.weight")]
  qkv_b = [np.split(b, 3) for b in at("attn.c_attn.bias")]
  proj = lambda j: {"kernel": _stack([w[j].reshape(d, h, hd) for w in qkv_w]),
                    "bias": _stack([b[j].reshape(h, hd) for b in qkv_b])}
  ln = lambda name: {"scale": _stack(at(name + ".weight")), "bias": _stack(at(name + ".bias"))}
  dense = lambda name: {"kernel": _stack(at(name + ".weight")), "bias": _stack(at(name + ".bias"))}
  return {
      "word": {"embedding": _c(sd["transformer.wte.weight"])},
      "position": _c(sd["transformer.wpe.weight"]),
      "layers": {
          "attn": {"query": proj(0), "key": proj(1), "value": proj(2),
                   "out": {"kernel": _stack([w.reshape(h, hd, d) for w in at("attn.c_proj.weight")]),
                           "bias": _stack(at("attn.c_proj.bias"))}},
          "mlp": {"fc1": dense("mlp.c_fc"), "fc2": dense("mlp.c_proj")},
          "ln_attn": ln("ln_1"),
          "ln_mlp": ln("ln_2"),
      },
      "ln_final": {"scale": _c(sd["transformer.ln_f.weight"]), "bias": _c(sd["transformer.ln_f.bias"])},
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


_VISION_BLOCK = {
    "ln_attn": "layernorm_before",
    "ln_mlp": "layernorm_after",
    "mlp/fc1": "intermediate.dense",
    "mlp/fc2": "output.dense",
    "attn/query": "attention.attention.query",
    "attn/key": "attention.attention.key",
    "attn/value": "attention.attention.value",
    "attn/out": "attention.output.dense",
}


def _vision_to_hf(cfg: ModelConfig, p: Mapping) -> dict:
  m = "deit" if cfg.distill_token else "vit"
  e = f"{m}.embeddings."
  sd = {
      e + "cls_token": p["cls"],
      e + "position_embeddings": p["pos"],
      e + "patch_embeddings.projection.weight": p["patch"]["kernel"].transpose(3, 2, 0, 1),  # (p,p,C,d)->(d,C,p,p)
      e + "patch_embeddings.projection.bias": p["patch"]["bias"],
  }
  if cfg.distill_token:
    sd[e + "distillation_token"] = p["dist"]
  sd.update(_linear_block_to_hf(cfg, p, _VISION_BLOCK, f"{m}.encoder.layer."))
  sd[f"{m}.layernorm.weight"] = p["ln_final"]["scale"]
  sd[f"{m}.layernorm.bias"] = p["ln_final"]["bias"]
  heads = {"head": "cls_classifier", "head_dist": "distillation_classifier"} if cfg.distill_token else {
      "head": "classifier"}
  for ours, theirs in heads.items():
    sd[theirs + ".weight"] = p[ours]["kernel"].T
    sd[theirs + ".bias"] = p[ours]["bias"]
  return sd


def _vision_from_hf(cfg: ModelConfig, sd: Mapping) -> dict:
  m = "deit" if cfg.distill_token else "vit"
  e = f"{m}.embeddings."
  out = {
      "patch": {"kernel": _c(sd[e + "patch_embeddings.projection.weight"].transpose(2, 3, 1, 0)),
                "bias": _c(sd[e + "patch_embeddings.projection.bias"])},
      "cls": _c(sd[e + "cls_token"]),
      "pos": _c(sd[e + "position_embeddings"]),
      "layers": _linear_block_from_hf(cfg, sd, _VISION_BLOCK, f"{m}.encoder.layer."),
      "ln_final": {"scale": _c(sd[f"{m}.layernorm.weight"]), "bias": _c(sd[f"{m}.layernorm.bias"])},
  }
  if cfg.distill_token:
    out["dist"] = _c(sd[e + "distillation_token"])
  heads = {"head": "cls_classifier", "head_dist": "distillation_classifier"} if cfg.distill_token else {
      "head": "classifier"}
  for ours, theirs in heads.items():
    out[ours] = {"kernel": _c(sd[theirs + ".weight"].T), "bias": _c(sd[theirs + ".bias"])}
  return out


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

_TO_HF: dict[str, Callable] = {"bert": _bert_to_hf, "gpt": _gpt_to_hf, "deit": _vision_to_hf}
_FROM_HF: dict[str, Callable] = {"bert": _bert_from_hf, "gpt": _gpt_from_hf, "deit": _vision_from_hf}
_HF_CONFIG: dict[str, Callable] = {"bert": _bert_hf_config, "gpt": _gpt_hf_config, "deit": _vision_hf_config}
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


# --------------------------------------------------------------------------------------------------------- configs


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


def config_from_hf(config, architecture: str | None = None) -> ModelConfig:
  """Our ``ModelConfig`` for a Hugging Face config (object, dict or ``config.json`` path). Raises if unsupported."""
  d = _config_dict(config)
  a = _resolve_arch(d, (), architecture)
  return a.config_fn(d, a.name)


def to_hf_config(cfg: ModelConfig) -> dict:
  """The ``config.json`` contents (a plain dict) of the Hugging Face model equivalent to ``cfg``."""
  return _HF_CONFIG[cfg.family](cfg)


# -------------------------------------------------------------------------------------------------- state dicts


def _abstract(cfg: ModelConfig):
  """Parameter shapes of ``cfg``; dtype, remat and dropout do not change them, so they are fixed here."""
  return abstract_params(cfg.replace(dtype="float32", remat=False, dropout=0.0))


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
  shapes = jax.eval_shape(lambda p: _TO_HF[cfg.family](cfg, p), _abstract(cfg))
  return {k: tuple(v.shape) for k, v in shapes.items()}


def to_hf_state_dict(cfg: ModelConfig, params) -> dict[str, np.ndarray]:
  """Our ``params`` as a Hugging Face state dict (name -> float32 numpy array), with the names
  ``save_pretrained`` writes (tied copies left out, as it does)."""
  _check_tree(cfg, params, "to_hf_state_dict")
  sd = _TO_HF[cfg.family](cfg, jax.tree_util.tree_map(jnp.asarray, params))
  return {k: np.array(v, dtype=np.float32, order="C") for k, v in sd.items()}  # Writable copies.


def _check_tree(cfg: ModelConfig, params, where: str):
  """Raises unless ``params`` has exactly the paths and shapes of ``cfg``'s parameters."""
  want = {jax.tree_util.keystr(k): tuple(v.shape)
          for k, v in jax.tree_util.tree_flatten_with_path(_abstract(cfg))[0]}
  have = {jax.tree_util.keystr(k): tuple(np.shape(v)) for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  if want.keys() != have.keys():
    raise HFInteropError(f"{where}: parameter tree does not match the config: missing "
                         f"[{_names(want.keys() - have.keys())}], extra [{_names(have.keys() - want.keys())}].")
  bad = [f"{k}: {have[k]} != {want[k]}" for k in want if have[k] != want[k]]
  if bad:
    raise TensorShapeError(f"{where}: parameter shapes do not match the config: {_names(bad)}.")


def _normalise(a: _Arch, sd: Mapping[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
  """Canonical tensor names: legacy LayerNorm gamma/beta, a missing base-model prefix, transformers-5 in-memory
  ViT/DeiT names; tied copies checked and merged; tensors that cannot affect our logits dropped."""
  out = {}
  for k, v in sd.items():
    k = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", k))
    out[k] = v
  if not any(k.startswith(a.prefix + ".") for k in out):  # A checkpoint saved from the base model.
    out = {(k if k.split(".")[0] in a.heads else f"{a.prefix}.{k}"): v for k, v in out.items()}
  if a.family == "deit":
    renamed = {}
    for k, v in out.items():
      for pattern, repl in _V5_VISION_NAMES:
        if pattern.match(k):
          k = pattern.sub(repl, k, count=1)
          break
      renamed[k] = v
    out = renamed
  for alias, canonical in a.aliases.items():
    if alias not in out:
      continue
    v = out.pop(alias)
    if canonical not in out:
      out[canonical] = v
    elif np.shape(v) != np.shape(out[canonical]) or not np.array_equal(v, out[canonical]):
      raise UnsupportedConfigError(f"{alias} differs from {canonical}: an untied output layer is not supported "
                                   "(our LM head is tied to the token embedding).")
  if a.name == "DeiTForImageClassification":
    # One classifier on the class token, but the distillation token still attends: this equals our distilled DeiT
    # (mean of two heads) with head = 2 * classifier and a zero distillation head. Scaling by 2 is exact.
    for suffix in ("weight", "bias"):
      if f"classifier.{suffix}" in out:
        w = out.pop(f"classifier.{suffix}")
        out[f"cls_classifier.{suffix}"] = 2 * np.asarray(w, np.float32)
        out[f"distillation_classifier.{suffix}"] = np.zeros(np.shape(w), np.float32)
  ignored = [k for k in out if any(p.search(k) for p in a.ignored)]
  if ignored:
    log.info("Ignoring tensors that do not affect %s logits: %s", a.name, _names(ignored))
  return {k: v for k, v in out.items() if k not in ignored}


def from_hf_state_dict(state_dict: Mapping[str, Any], config, architecture: str | None = None,
                       **overrides) -> tuple[ModelConfig, dict]:
  """``(ModelConfig, params)`` from a Hugging Face state dict (numpy arrays or torch tensors) and its config.

  ``architecture`` (e.g. ``"BertForMaskedLM"``) overrides ``config.architectures``. ``overrides`` may set the
  fields HF does not describe: ``dtype``, ``remat``, ``dropout``.
  """
  d = _config_dict(config)
  sd = {k: _to_numpy(v) for k, v in state_dict.items()}
  a = _resolve_arch(d, sd.keys(), architecture)
  cfg = a.config_fn(d, a.name)
  bad = sorted(set(overrides) - {"dtype", "remat", "dropout"})
  if bad:
    raise HFInteropError(f"Only dtype, remat and dropout may be overridden on import, not {bad}: the rest comes "
                         "from the checkpoint.")
  cfg = cfg.replace(**overrides)
  sd = _normalise(a, sd, cfg)
  if a.family == "deit" and not _get(d, "qkv_bias", True):  # No q/k/v biases is exactly a zero bias.
    m = a.prefix
    for i in range(cfg.num_layers):
      for proj in ("query", "key", "value"):
        sd.setdefault(f"{m}.encoder.layer.{i}.attention.attention.{proj}.bias", np.zeros(cfg.width, np.float32))

  want = _expected_shapes(cfg)
  missing, unexpected = sorted(want.keys() - sd.keys()), sorted(sd.keys() - want.keys())
  if missing:
    raise MissingTensorError(f"{len(missing)} tensor(s) missing from the {a.name} checkpoint: {_names(missing)}"
                             + (f" (it also has unexpected ones: {_names(unexpected)})" if unexpected else "") + ".")
  if unexpected:
    raise UnexpectedTensorError(f"{len(unexpected)} unexpected tensor(s) in the {a.name} checkpoint that map to "
                                f"nothing in our {cfg.family} model: {_names(unexpected)}.")
  wrong = [f"{k}: {tuple(np.shape(sd[k]))}, expected {want[k]}" for k in want if tuple(np.shape(sd[k])) != want[k]]
  if wrong:
    raise TensorShapeError(f"{len(wrong)} tensor(s) with a shape that does not fit the config: {_names(wrong, 6)}.")
  sd = {k: np.asarray(v, dtype=np.float32) for k, v in sd.items()}
  params = _FROM_HF[cfg.family](cfg, sd)
  _check_tree(cfg, params, "import")
  return cfg, params


# ------------------------------------------------------------------------------------------------------- file I/O


def _to_numpy(v) -> np.ndarray:
  if isinstance(v, np.ndarray):
    return v
  if hasattr(v, "detach"):  # torch.Tensor
    v = v.detach().to("cpu")
    if v.is_floating_point() and v.element_size() < 4:
      v = v.float()  # bfloat16 / float16: numpy has no bfloat16; everything becomes float32 anyway.
    return v.numpy()
  return np.asarray(v)


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
  from safetensors import safe_open
  try:
    with safe_open(str(path), framework="np") as f:
      return {k: f.get_tensor(k) for k in f.keys()}
  except (TypeError, ValueError):  # bfloat16 has no numpy dtype: go through torch.
    with safe_open(str(path), framework="pt") as f:
      return {k: _to_numpy(f.get_tensor(k)) for k in f.keys()}


def _read_torch(path: Path) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError as e:
    raise HFInteropError(f"Reading {path.name} needs torch (pip install torch); safetensors files do not.") from e
  sd = torch.load(str(path), map_location="cpu", weights_only=True)
  if not isinstance(sd, Mapping):
    raise HFInteropError(f"{path} does not hold a state dict (got {type(sd).__name__}).")
  return {k: _to_numpy(v) for k, v in sd.items()}


def _read_weights(path: Path) -> dict[str, np.ndarray]:
  if path.name.endswith(".index.json"):
    index = json.loads(path.read_text())
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
      out.update(_read_weights(path.parent / shard))
    return out
  if path.suffix == ".safetensors":
    return _read_safetensors(path)
  if path.suffix in (".bin", ".pt", ".pth"):
    return _read_torch(path)
  raise HFInteropError(f"Unknown weights file {path}: expected .safetensors, .bin, .pt, .pth or an .index.json.")


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def load_hf(source, *, config=None, architecture: str | None = None, **overrides) -> tuple[ModelConfig, dict]:
  """``(ModelConfig, params)`` from a Hugging Face checkpoint, ready for ``multilevel.models.apply``.

  ``source`` is one of: a ``save_pretrained`` directory; a weights file (``.safetensors``, ``.bin``, a shard
  ``.index.json``) with ``config.json`` beside it or ``config=``; a state dict (with ``config=``); or an in-memory
  ``transformers`` model. Nothing is downloaded: a hub name is not a path and fails. ``overrides`` may set
  ``dtype``, ``remat`` or ``dropout``.
  """
  if hasattr(source, "state_dict") and hasattr(source, "config") and not isinstance(source, (str, os.PathLike)):
    arch = architecture or type(source).__name__
    return from_hf_state_dict(source.state_dict(), config if config is not None else source.config, arch,
                              **overrides)
  if isinstance(source, Mapping):
    return from_hf_state_dict(source, config, architecture, **overrides)
  path = Path(source)
  if path.is_dir():
    files = [path / f for f in _WEIGHT_FILES if (path / f).is_file()]
    if not files:
      raise HFInteropError(f"No weights in {path}: expected one of {list(_WEIGHT_FILES)}.")
    weights, cfg_src = files[0], config if config is not None else path
  elif path.is_file():
    weights, cfg_src = path, config if config is not None else path.parent
  else:
    raise HFInteropError(f"{source!r} is neither a directory nor a file (hub names are not downloaded).")
  return from_hf_state_dict(_read_weights(weights), cfg_src, architecture, **overrides)


def save_hf(cfg: ModelConfig, params, out_dir: PathLike) -> Path:
  """Writes ``config.json`` and ``model.safetensors`` to ``out_dir`` so that
  ``transformers.AutoModelFor...from_pretrained(out_dir)`` (or the class in ``config.architectures``) loads it."""
  from safetensors.numpy import save_file
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  save_file(to_hf_state_dict(cfg, params), str(out / "model.safetensors"), metadata={"format": "pt"})
  (out / "config.json").write_text(json.dumps(to_hf_config(cfg), indent=2, sort_keys=True) + "\n")
  return out


def to_hf_model(cfg: ModelConfig, params):
  """The ``transformers`` model (eval mode, float32) equivalent to ``(cfg, params)``; needs torch and
  transformers. Goes through ``save_hf`` so it is exactly what ``from_pretrained`` gives."""
  import tempfile

  import transformers

  with tempfile.TemporaryDirectory() as tmp:
    save_hf(cfg, params, tmp)
    arch = to_hf_config(cfg)["architectures"][0]
    model, info = getattr(transformers, arch).from_pretrained(tmp, output_loading_info=True)
  bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
  if bad:
    raise HFInteropError(f"transformers did not load every exported tensor: {bad}")
  return model.eval()


__all__ = [
    "HFInteropError", "UnsupportedArchitectureError", "UnsupportedConfigError", "MissingTensorError",
    "UnexpectedTensorError", "TensorShapeError", "load_hf", "save_hf", "from_hf_state_dict", "to_hf_state_dict",
    "config_from_hf", "to_hf_config", "to_hf_model", "supported_architectures",
]
