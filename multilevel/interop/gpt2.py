"""GPT-2 <-> our ``gpt`` family: ``GPT2LMHeadModel`` (exported) and ``GPT2Model`` (import only).

The LM head is the tied token embedding. GPT-2 stores its projections as ``Conv1D`` weights, ``(in, out)``, with
query, key and value side by side in one ``c_attn`` tensor.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import jax.numpy as jnp
import numpy as np

from multilevel.interop.hf_common import (HFArchitecture, UnsupportedConfigError, check_act, check_false, check_tied,
                                          copy32, legacy_norm_name, ln_eps, read, read_int, split_width, stack)
from multilevel.models.config import ModelConfig


# ---------------------------------------------------------------------------------------------------------- config


def _config(d: Mapping) -> ModelConfig:
  check_act(read(d, "activation_function", "gelu_new"), ("gelu_new", "gelu_pytorch_tanh"), "GPT-2")
  if not read(d, "scale_attn_weights", True):
    raise UnsupportedConfigError("scale_attn_weights=False is not supported: our attention divides by "
                                 "sqrt(head_dim).")
  check_false(d, "scale_attn_by_inverse_layer_idx", "our attention scale is the same in every layer")
  check_false(d, "add_cross_attention", "our GPT has no cross-attention")
  check_tied(d)
  width = read_int(d, "n_embd", 768)
  heads = read_int(d, "n_head", 12)
  head_dim, ratio = split_width(width, heads, int(read(d, "n_inner", 4 * width)), ("n_embd", "n_head", "n_inner"))
  max_len = read(d, "n_positions", read(d, "n_ctx", 1024))
  return ModelConfig(
      "gpt", read_int(d, "n_layer", 12), heads, head_dim, ratio, vocab_size=read_int(d, "vocab_size", 50257),
      max_len=int(max_len), dropout=float(read(d, "resid_pdrop", 0.1)),
      ln_eps=ln_eps(read(d, "layer_norm_epsilon", 1e-5), "gpt"))


def _hf_config(cfg: ModelConfig) -> dict:
  eos = 50256 if cfg.vocab_size > 50256 else None
  return {
      "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
      "n_embd": cfg.width, "n_layer": cfg.num_layers, "n_head": cfg.num_heads, "n_positions": cfg.max_len,
      "n_inner": cfg.ffn_dim, "activation_function": "gelu_new", "resid_pdrop": cfg.dropout,
      "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout, "layer_norm_epsilon": cfg.eps,
      "initializer_range": 0.02, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
      "tie_word_embeddings": True, "bos_token_id": eos, "eos_token_id": eos,
  }


# ---------------------------------------------------------------------------------------------------------- tensors


def _to_hf(cfg: ModelConfig, p: Mapping) -> dict:
  sd = {"transformer.wte.weight": p["word"]["embedding"], "transformer.wpe.weight": p["position"]}
  lay = p["layers"]
  d = cfg.width
  for i in range(cfg.num_layers):
    pre = f"transformer.h.{i}."
    sd[pre + "ln_1.weight"] = lay["ln_attn"]["scale"][i]
    sd[pre + "ln_1.bias"] = lay["ln_attn"]["bias"][i]
    sd[pre + "ln_2.weight"] = lay["ln_mlp"]["scale"][i]
    sd[pre + "ln_2.bias"] = lay["ln_mlp"]["bias"][i]
    # Conv1D weights are (in, out); c_attn is q | k | v along the output axis. jnp, not np: this runs traced too.
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


def _from_hf(cfg: ModelConfig, sd: Mapping) -> dict:
  h, hd, d, n = cfg.num_heads, cfg.head_dim, cfg.width, cfg.num_layers
  at = lambda suffix: [sd[f"transformer.h.{i}.{suffix}"] for i in range(n)]
  qkv_w = [np.split(w, 3, axis=1) for w in at("attn.c_attn.weight")]
  qkv_b = [np.split(b, 3) for b in at("attn.c_attn.bias")]
  proj = lambda j: {"kernel": stack([w[j].reshape(d, h, hd) for w in qkv_w]),
                    "bias": stack([b[j].reshape(h, hd) for b in qkv_b])}
  ln = lambda name: {"scale": stack(at(name + ".weight")), "bias": stack(at(name + ".bias"))}
  dense = lambda name: {"kernel": stack(at(name + ".weight")), "bias": stack(at(name + ".bias"))}
  return {
      "word": {"embedding": copy32(sd["transformer.wte.weight"])},
      "position": copy32(sd["transformer.wpe.weight"]),
      "layers": {
          "attn": {"query": proj(0), "key": proj(1), "value": proj(2),
                   "out": {"kernel": stack([w.reshape(h, hd, d) for w in at("attn.c_proj.weight")]),
                           "bias": stack(at("attn.c_proj.bias"))}},
          "mlp": {"fc1": dense("mlp.c_fc"), "fc2": dense("mlp.c_proj")},
          "ln_attn": ln("ln_1"),
          "ln_mlp": ln("ln_2"),
      },
      "ln_final": {"scale": copy32(sd["transformer.ln_f.weight"]), "bias": copy32(sd["transformer.ln_f.bias"])},
  }


# ------------------------------------------------------------------------------------------------------ registry


GPT2_LM = HFArchitecture(
    name="GPT2LMHeadModel", model_types=("gpt2",), family="gpt", config_from_hf=_config, to_hf_config=_hf_config,
    to_hf=_to_hf, from_hf=_from_hf, prefix="transformer", heads=("lm_head",),
    ignored=(r"^transformer\.h\.\d+\.attn\.(bias|masked_bias)$",),  # Causal-mask buffers of older transformers.
    aliases={"lm_head.weight": "transformer.wte.weight"},
    rename=legacy_norm_name, exports=lambda cfg: True, assumed_for=lambda keys: True)

GPT2_BASE = dataclasses.replace(GPT2_LM, name="GPT2Model", exports=None, assumed_for=None)

ARCHITECTURES = (GPT2_LM, GPT2_BASE)
