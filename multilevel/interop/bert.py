"""BERT <-> our ``bert`` family: ``BertForMaskedLM`` (exported) and ``BertForPreTraining`` (import only).

The pooler and the next-sentence head are dropped, as ``BertForMaskedLM`` itself does; the MLM decoder is the tied
token embedding. The encoder-block helpers (``block_to_hf``, ``block_from_hf``) serve ViT and DeiT too, whose blocks
have the same tensors under other names.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from multilevel.interop.hf_common import (HFArchitecture, UnsupportedConfigError, check_act, check_false, check_tied,
                                          copy32, heads_in_from_hf, heads_in_to_hf, heads_out_from_hf,
                                          heads_out_to_hf, legacy_norm_name, ln_eps, read, read_int, split_width,
                                          stack)
from multilevel.models.config import ModelConfig


# ---------------------------------------------------------------------------------------------------------- config


def encoder_shape(d: Mapping) -> tuple[int, int, int, int]:
  """``(num_layers, num_heads, head_dim, ffn_ratio)`` from the BERT-style config keys (BERT, ViT, DeiT)."""
  width = read_int(d, "hidden_size", 768)
  heads = read_int(d, "num_attention_heads", 12)
  head_dim, ratio = split_width(width, heads, read_int(d, "intermediate_size", 3072),
                                ("hidden_size", "num_attention_heads", "intermediate_size"))
  return read_int(d, "num_hidden_layers", 12), heads, head_dim, ratio


def _config(d: Mapping) -> ModelConfig:
  check_act(read(d, "hidden_act", "gelu"), ("gelu", "gelu_python"), "BERT")
  pos = read(d, "position_embedding_type", "absolute")
  if pos != "absolute":
    raise UnsupportedConfigError(f"position_embedding_type={pos!r} (relative position embeddings) is not supported; "
                                 "our BERT has absolute learned positions only.")
  check_false(d, "is_decoder", "our BERT is a bidirectional encoder")
  check_false(d, "add_cross_attention", "our BERT has no cross-attention")
  check_tied(d)
  if "embedding_size" in d and int(d["embedding_size"]) != int(d.get("hidden_size", 768)):
    raise UnsupportedConfigError("A factorised embedding (embedding_size != hidden_size) is not supported.")
  return ModelConfig(
      "bert", *encoder_shape(d), vocab_size=read_int(d, "vocab_size", 30522),
      max_len=read_int(d, "max_position_embeddings", 512), type_vocab_size=read_int(d, "type_vocab_size", 2),
      dropout=float(read(d, "hidden_dropout_prob", 0.1)), ln_eps=ln_eps(read(d, "layer_norm_eps", 1e-12), "bert"))


def _hf_config(cfg: ModelConfig) -> dict:
  return {
      "architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.width, "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
      "intermediate_size": cfg.ffn_dim, "hidden_act": "gelu", "hidden_dropout_prob": cfg.dropout,
      "attention_probs_dropout_prob": cfg.dropout, "max_position_embeddings": cfg.max_len,
      "type_vocab_size": cfg.type_vocab_size, "initializer_range": 0.02, "layer_norm_eps": cfg.eps,
      "pad_token_id": 0, "position_embedding_type": "absolute", "is_decoder": False, "tie_word_embeddings": True,
  }


# ---------------------------------------------------------------------------------------------------------- tensors


BLOCK = {  # our block path -> HF name under bert.encoder.layer.{i}.
    "ln_attn": "attention.output.LayerNorm",
    "ln_mlp": "output.LayerNorm",
    "mlp/fc1": "intermediate.dense",
    "mlp/fc2": "output.dense",
    "attn/query": "attention.self.query",
    "attn/key": "attention.self.key",
    "attn/value": "attention.self.value",
    "attn/out": "attention.output.dense",
}


def block_to_hf(cfg: ModelConfig, p: Mapping, names: Mapping[str, str], prefix: str) -> dict:
  """Our stacked blocks ``p["layers"]`` as per-layer ``nn.Linear``/``LayerNorm`` tensors named
  ``f"{prefix}{i}.{names[path]}.weight"`` (and ``.bias``), ``names`` keyed like ``BLOCK``."""
  lay, sd = p["layers"], {}
  for i in range(cfg.num_layers):
    at = lambda key: f"{prefix}{i}.{names[key]}"
    for ln in ("ln_attn", "ln_mlp"):
      sd[at(ln) + ".weight"] = lay[ln]["scale"][i]
      sd[at(ln) + ".bias"] = lay[ln]["bias"][i]
    for proj in ("query", "key", "value"):
      sd[at(f"attn/{proj}") + ".weight"] = heads_in_to_hf(lay["attn"][proj]["kernel"][i])
      sd[at(f"attn/{proj}") + ".bias"] = lay["attn"][proj]["bias"][i].reshape(-1)
    sd[at("attn/out") + ".weight"] = heads_out_to_hf(lay["attn"]["out"]["kernel"][i])
    sd[at("attn/out") + ".bias"] = lay["attn"]["out"]["bias"][i]
    for fc in ("fc1", "fc2"):
      sd[at(f"mlp/{fc}") + ".weight"] = lay["mlp"][fc]["kernel"][i].T
      sd[at(f"mlp/{fc}") + ".bias"] = lay["mlp"][fc]["bias"][i]
  return sd


def block_from_hf(cfg: ModelConfig, sd: Mapping, names: Mapping[str, str], prefix: str) -> dict:
  """The inverse of ``block_to_hf``: our ``layers`` subtree."""
  h, hd, n = cfg.num_heads, cfg.head_dim, cfg.num_layers
  at = lambda key, suffix: [sd[f"{prefix}{i}.{names[key]}.{suffix}"] for i in range(n)]
  ln = lambda key: {"scale": stack(at(key, "weight")), "bias": stack(at(key, "bias"))}
  proj = lambda key: {"kernel": stack([heads_in_from_hf(w, h, hd) for w in at(key, "weight")]),
                      "bias": stack([b.reshape(h, hd) for b in at(key, "bias")])}
  dense = lambda key: {"kernel": stack([w.T for w in at(key, "weight")]), "bias": stack(at(key, "bias"))}
  return {
      "attn": {"query": proj("attn/query"), "key": proj("attn/key"), "value": proj("attn/value"),
               "out": {"kernel": stack([heads_out_from_hf(w, h, hd) for w in at("attn/out", "weight")]),
                       "bias": stack(at("attn/out", "bias"))}},
      "mlp": {"fc1": dense("mlp/fc1"), "fc2": dense("mlp/fc2")},
      "ln_attn": ln("ln_attn"),
      "ln_mlp": ln("ln_mlp"),
  }


def _to_hf(cfg: ModelConfig, p: Mapping) -> dict:
  e = "bert.embeddings."
  t = "cls.predictions.transform."
  sd = {
      e + "word_embeddings.weight": p["word"]["embedding"],
      e + "position_embeddings.weight": p["position"],
      e + "token_type_embeddings.weight": p["token_type"],
      e + "LayerNorm.weight": p["ln_embed"]["scale"],
      e + "LayerNorm.bias": p["ln_embed"]["bias"],
  }
  sd.update(block_to_hf(cfg, p, BLOCK, "bert.encoder.layer."))
  sd[t + "dense.weight"] = p["mlm_dense"]["kernel"].T
  sd[t + "dense.bias"] = p["mlm_dense"]["bias"]
  sd[t + "LayerNorm.weight"] = p["mlm_ln"]["scale"]
  sd[t + "LayerNorm.bias"] = p["mlm_ln"]["bias"]
  sd["cls.predictions.bias"] = p["mlm_bias"]
  return sd


def _from_hf(cfg: ModelConfig, sd: Mapping) -> dict:
  e = "bert.embeddings."
  t = "cls.predictions.transform."
  return {
      "word": {"embedding": copy32(sd[e + "word_embeddings.weight"])},
      "position": copy32(sd[e + "position_embeddings.weight"]),
      "token_type": copy32(sd[e + "token_type_embeddings.weight"]),
      "ln_embed": {"scale": copy32(sd[e + "LayerNorm.weight"]), "bias": copy32(sd[e + "LayerNorm.bias"])},
      "layers": block_from_hf(cfg, sd, BLOCK, "bert.encoder.layer."),
      "mlm_dense": {"kernel": copy32(sd[t + "dense.weight"].T), "bias": copy32(sd[t + "dense.bias"])},
      "mlm_ln": {"scale": copy32(sd[t + "LayerNorm.weight"]), "bias": copy32(sd[t + "LayerNorm.bias"])},
      "mlm_bias": copy32(sd["cls.predictions.bias"]),
  }


# ------------------------------------------------------------------------------------------------------ registry


BERT_MLM = HFArchitecture(
    name="BertForMaskedLM", model_types=("bert",), family="bert", config_from_hf=_config, to_hf_config=_hf_config,
    to_hf=_to_hf, from_hf=_from_hf, prefix="bert", heads=("cls",),
    ignored=(r"^bert\.pooler\.", r"^cls\.seq_relationship\.", r"^bert\.embeddings\.(position_ids|token_type_ids)$"),
    aliases={"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
             "cls.predictions.decoder.bias": "cls.predictions.bias"},
    rename=legacy_norm_name, exports=lambda cfg: True, assumed_for=lambda keys: True)

BERT_PRETRAINING = dataclasses.replace(BERT_MLM, name="BertForPreTraining", exports=None, assumed_for=None)

ARCHITECTURES = (BERT_MLM, BERT_PRETRAINING)
