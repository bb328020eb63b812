"""ViT and DeiT <-> our ``deit`` family.

==========================================  ====================================================================
``ViTForImageClassification``               ``distill_token=False``
``DeiTForImageClassificationWithTeacher``   ``distill_token=True`` (the mean of the two heads)
``DeiTForImageClassification``              ``distill_token=True``, imported exactly as ``head = 2 * classifier``
                                            and a zero ``head_dist`` (import only: it exports as ``...WithTeacher``)
==========================================  ====================================================================

The blocks are BERT's tensors under other names (``bert.block_to_hf``); the pooler is dropped, and a config with
``qkv_bias=False`` imports zero query, key and value biases.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Mapping

import numpy as np

from multilevel.interop.bert import block_from_hf, block_to_hf, encoder_shape
from multilevel.interop.hf_common import (HFArchitecture, UnsupportedConfigError, check_act, copy32,
                                          legacy_norm_name, ln_eps, read, read_int)
from multilevel.models.config import ModelConfig


# ---------------------------------------------------------------------------------------------------------- config


def _square(v, name: str) -> int:
  if isinstance(v, (list, tuple)):
    if len(v) != 2 or int(v[0]) != int(v[1]):
      raise UnsupportedConfigError(f"{name}={list(v)}: only square images and patches are supported.")
    v = v[0]
  return int(v)


def _config(d: Mapping, distill: bool) -> ModelConfig:
  check_act(read(d, "hidden_act", "gelu"), ("gelu", "gelu_python"), "ViT/DeiT")
  shape = encoder_shape(d)
  labels = d.get("id2label")
  num_classes = len(labels) if labels else read_int(d, "num_labels", 2)
  if num_classes < 1:
    raise UnsupportedConfigError("num_labels=0 (a classifier replaced by the identity) is not supported.")
  image, patch = _square(read(d, "image_size", 224), "image_size"), _square(read(d, "patch_size", 16), "patch_size")
  if image % patch:
    raise UnsupportedConfigError(f"image_size {image} is not a multiple of patch_size {patch}.")
  return ModelConfig(
      "deit", *shape, image_size=image, patch_size=patch, num_channels=read_int(d, "num_channels", 3),
      num_classes=num_classes, distill_token=distill, dropout=float(read(d, "hidden_dropout_prob", 0.0)),
      ln_eps=ln_eps(read(d, "layer_norm_eps", 1e-12), "deit"))


def _hf_config(cfg: ModelConfig) -> dict:
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


# ---------------------------------------------------------------------------------------------------------- tensors


BLOCK = {  # our block path -> HF name under {vit,deit}.encoder.layer.{i}.
    "ln_attn": "layernorm_before",
    "ln_mlp": "layernorm_after",
    "mlp/fc1": "intermediate.dense",
    "mlp/fc2": "output.dense",
    "attn/query": "attention.attention.query",
    "attn/key": "attention.attention.key",
    "attn/value": "attention.attention.value",
    "attn/out": "attention.output.dense",
}


def _heads(cfg: ModelConfig) -> dict[str, str]:
  """Our classifier heads -> their HF names."""
  return {"head": "cls_classifier", "head_dist": "distillation_classifier"} if cfg.distill_token else {
      "head": "classifier"}


def _to_hf(cfg: ModelConfig, p: Mapping) -> dict:
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
  sd.update(block_to_hf(cfg, p, BLOCK, f"{m}.encoder.layer."))
  sd[f"{m}.layernorm.weight"] = p["ln_final"]["scale"]
  sd[f"{m}.layernorm.bias"] = p["ln_final"]["bias"]
  for ours, theirs in _heads(cfg).items():
    sd[theirs + ".weight"] = p[ours]["kernel"].T
    sd[theirs + ".bias"] = p[ours]["bias"]
  return sd


def _from_hf(cfg: ModelConfig, sd: Mapping) -> dict:
  m = "deit" if cfg.distill_token else "vit"
  e = f"{m}.embeddings."
  out = {
      "patch": {"kernel": copy32(sd[e + "patch_embeddings.projection.weight"].transpose(2, 3, 1, 0)),
                "bias": copy32(sd[e + "patch_embeddings.projection.bias"])},
      "cls": copy32(sd[e + "cls_token"]),
      "pos": copy32(sd[e + "position_embeddings"]),
      "layers": block_from_hf(cfg, sd, BLOCK, f"{m}.encoder.layer."),
      "ln_final": {"scale": copy32(sd[f"{m}.layernorm.weight"]), "bias": copy32(sd[f"{m}.layernorm.bias"])},
  }
  if cfg.distill_token:
    out["dist"] = copy32(sd[e + "distillation_token"])
  for ours, theirs in _heads(cfg).items():
    out[ours] = {"kernel": copy32(sd[theirs + ".weight"].T), "bias": copy32(sd[theirs + ".bias"])}
  return out


# transformers >= 5 names the block tensors of an in-memory model differently from the files it writes
# (save_pretrained converts back). Map those names to the file names; the first pattern that matches applies.
_V5_NAMES = [
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\.attention\.q_proj\."), r"\1.encoder.layer.\2.attention.attention.query."),
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\.attention\.k_proj\."), r"\1.encoder.layer.\2.attention.attention.key."),
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\.attention\.v_proj\."), r"\1.encoder.layer.\2.attention.attention.value."),
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\.attention\.o_proj\."), r"\1.encoder.layer.\2.attention.output.dense."),
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\.mlp\.fc1\."), r"\1.encoder.layer.\2.intermediate.dense."),
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\.mlp\.fc2\."), r"\1.encoder.layer.\2.output.dense."),
    (re.compile(r"^(vit|deit)\.layers\.(\d+)\."), r"\1.encoder.layer.\2."),
]


def _rename(key: str) -> str:
  key = legacy_norm_name(key)
  for pattern, repl in _V5_NAMES:
    if pattern.match(key):
      return pattern.sub(repl, key, count=1)
  return key


def _adapt(sd: dict, cfg: ModelConfig, d: Mapping, prefix: str, single_head: bool = False) -> dict:
  if single_head:
    # One classifier on the class token, but the distillation token still attends: this equals our distilled DeiT
    # (mean of two heads) with head = 2 * classifier and a zero distillation head. Scaling by 2 is exact.
    for suffix in ("weight", "bias"):
      if f"classifier.{suffix}" in sd:
        w = sd.pop(f"classifier.{suffix}")
        sd[f"cls_classifier.{suffix}"] = 2 * np.asarray(w, np.float32)
        sd[f"distillation_classifier.{suffix}"] = np.zeros(np.shape(w), np.float32)
  if not read(d, "qkv_bias", True):  # No q/k/v biases is exactly a zero bias.
    for i in range(cfg.num_layers):
      for proj in ("query", "key", "value"):
        sd.setdefault(f"{prefix}.encoder.layer.{i}.{BLOCK['attn/' + proj]}.bias", np.zeros(cfg.width, np.float32))
  return sd


# ------------------------------------------------------------------------------------------------------ registry


VIT = HFArchitecture(
    name="ViTForImageClassification", model_types=("vit",), family="deit",
    config_from_hf=functools.partial(_config, distill=False), to_hf_config=_hf_config, to_hf=_to_hf,
    from_hf=_from_hf, prefix="vit", heads=("classifier",), ignored=(r"^vit\.pooler\.",), rename=_rename,
    adapt=functools.partial(_adapt, prefix="vit"), exports=lambda cfg: not cfg.distill_token,
    assumed_for=lambda keys: True)

DEIT = dataclasses.replace(
    VIT, name="DeiTForImageClassificationWithTeacher", model_types=("deit",),
    config_from_hf=functools.partial(_config, distill=True), prefix="deit",
    heads=("cls_classifier", "distillation_classifier"), ignored=(r"^deit\.pooler\.",),
    adapt=functools.partial(_adapt, prefix="deit"), exports=lambda cfg: cfg.distill_token,
    assumed_for=lambda keys: any(k.startswith("cls_classifier.") for k in keys))

DEIT_SINGLE_HEAD = dataclasses.replace(
    DEIT, name="DeiTForImageClassification", heads=("classifier",),
    adapt=functools.partial(_adapt, prefix="deit", single_head=True), exports=None, assumed_for=lambda keys: True)

ARCHITECTURES = (VIT, DEIT, DEIT_SINGLE_HEAD)  # DEIT before DEIT_SINGLE_HEAD: it is assumed only with its heads.
