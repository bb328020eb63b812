"""Llama <-> our ``llama`` family: ``LlamaForCausalLM`` (import and export).

HF's layout needs no permutation: its rotary embedding rotates the two halves of each head (``rotate_half``), as
ours does. Projections are ``nn.Linear`` weights, ``(out, in)``; query head n reads key/value head n // r in both
(HF's ``repeat_kv``). With ``tie_word_embeddings`` the LM head is the token embedding; an untied ``lm_head`` is its
own tensor. Llama 3's rotary rescaling (``rope_type: llama3``, Llama 3.1 and 3.2) is our ``rope_scaling='llama3'``.
What our model does not compute is refused, never approximated: the other rotary scaling variants (``linear``,
``dynamic``, ``yarn``, ``longrope``, ...), partial rotary embeddings, biases, another activation, a head size that
is not ``hidden_size / num_attention_heads``, attention dropout.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from multilevel.interop.hf_common import (UnsupportedConfigError, check_act, check_false, copy32, heads_in_from_hf,
                                          heads_in_to_hf, heads_out_from_hf, heads_out_to_hf, HFArchitecture, ln_eps,
                                          read, read_int, stack)
from multilevel.models.config import ModelConfig


# ---------------------------------------------------------------------------------------------------------- config


_LLAMA3_KEYS = (("factor", "rope_factor"), ("low_freq_factor", "rope_low_freq_factor"),
                ("high_freq_factor", "rope_high_freq_factor"))


def rope_settings(d: Mapping) -> dict:
  """Our rotary settings (``rope_base``, and ``rope_scaling`` with its four numbers for Llama 3's rescaling) for a HF
  Llama config: ``rope_parameters`` in transformers 5, ``rope_theta`` and ``rope_scaling`` before (which
  transformers 5 still reads first). Raises ``UnsupportedConfigError`` on any other scaling variant."""
  params = read(d, "rope_parameters", None) or {}
  scaling = read(d, "rope_scaling", None) or {}
  kinds = {}
  for where, rope in (("rope_parameters", params), ("rope_scaling", scaling)):
    kinds[where] = kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "llama3"):
      raise UnsupportedConfigError(
          f"{where} of type {kind!r} is not supported: our rotary embedding computes the plain frequencies "
          f"base ** (-2i / head_dim) or Llama 3's rescaling of them, and loading the weights without the {kind!r} "
          f"rescaling would change the model. Only the default rotary embedding and rope_type 'llama3' are imported.")
  partial = float(params.get("partial_rotary_factor", read(d, "partial_rotary_factor", 1.0)))
  if partial != 1.0:
    raise UnsupportedConfigError(f"partial_rotary_factor={partial} is not supported: our rotary embedding rotates "
                                 "every channel of a head.")
  # transformers 5 takes a non-empty rope_scaling over rope_parameters; older versions read only rope_scaling.
  where, rope = ("rope_scaling", scaling) if scaling else ("rope_parameters", params)
  out = {"rope_base": float(rope.get("rope_theta", params.get("rope_theta", read(d, "rope_theta", 10000.0))))}
  if params and scaling:
    compared = [k for k, _ in _LLAMA3_KEYS] + ["original_max_position_embeddings", "rope_theta"]
    shared = [k for k in compared if k in params and k in scaling]
    if kinds["rope_parameters"] != kinds["rope_scaling"] or any(params[k] != scaling[k] for k in shared):
      raise UnsupportedConfigError(
          f"rope_scaling={dict(scaling)} and rope_parameters={dict(params)} disagree, and transformers versions read "
          f"different ones (5 takes rope_scaling first, 4 only reads it); keep one of them.")
  if kinds[where] == "default":
    return out
  missing = [k for k, _ in _LLAMA3_KEYS if rope.get(k) is None]
  if missing:
    raise UnsupportedConfigError(f"{where} of type 'llama3' has no {', '.join(missing)}: Llama 3's rescaling needs "
                                 "factor, low_freq_factor and high_freq_factor (and original_max_position_embeddings).")
  # transformers 5 reads a top-level original_max_position_embeddings first, then the scaling's, then
  # max_position_embeddings; older versions read the scaling's only.
  inner, outer = rope.get("original_max_position_embeddings"), read(d, "original_max_position_embeddings", None)
  if inner is not None and outer is not None and inner != outer:
    raise UnsupportedConfigError(
        f"original_max_position_embeddings={outer} at the top of the config but {inner} in {where}: transformers "
        f"versions read different ones; keep one of them.")
  if inner is None:
    inner = outer if outer is not None else read_int(d, "max_position_embeddings", 2048)
  return {**out, "rope_scaling": "llama3", **{ours: float(rope[k]) for k, ours in _LLAMA3_KEYS},
          "rope_original_max_len": int(inner)}


def _config(d: Mapping) -> ModelConfig:
  check_act(read(d, "hidden_act", "silu"), ("silu",), "Llama")
  check_false(d, "attention_bias", "our LLaMA projections have no biases")
  check_false(d, "mlp_bias", "our SwiGLU has no biases")
  if float(read(d, "attention_dropout", 0.0)):
    raise UnsupportedConfigError(f"attention_dropout={d['attention_dropout']} is not supported: our LLaMA drops "
                                 "no attention probabilities.")
  width = read_int(d, "hidden_size", 4096)
  heads = read_int(d, "num_attention_heads", 32)
  if heads < 1 or width % heads:
    raise UnsupportedConfigError(f"hidden_size={width} is not divisible by num_attention_heads={heads}: the head "
                                 "size must be an integer.")
  head_dim = read_int(d, "head_dim", width // heads)
  if head_dim * heads != width:
    raise UnsupportedConfigError(f"head_dim={head_dim} x num_attention_heads={heads} != hidden_size={width}: our "
                                 "attention width is the hidden size.")
  kv = read_int(d, "num_key_value_heads", heads)
  if kv < 1 or heads % kv:
    raise UnsupportedConfigError(f"num_key_value_heads={kv} does not divide num_attention_heads={heads}.")
  return ModelConfig(
      "llama", read_int(d, "num_hidden_layers", 32), heads, head_dim, ffn_size=read_int(d, "intermediate_size", 11008),
      vocab_size=read_int(d, "vocab_size", 32000), max_len=read_int(d, "max_position_embeddings", 2048),
      num_kv_heads=0 if kv == heads else kv, **rope_settings(d),
      tie_embeddings=bool(read(d, "tie_word_embeddings", False)), dropout=0.0,
      ln_eps=ln_eps(read(d, "rms_norm_eps", 1e-6), "llama"))


def _hf_config(cfg: ModelConfig) -> dict:
  return {
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.width, "intermediate_size": cfg.ffn_dim, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
      "hidden_act": "silu", "max_position_embeddings": cfg.context, "rms_norm_eps": cfg.eps,
      "rope_theta": cfg.rope_base, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
      "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "mlp_bias": False,
      "attention_dropout": 0.0, "initializer_range": 0.02, "bos_token_id": None, "eos_token_id": None,
      "pad_token_id": None, "use_cache": True, **_hf_rope_scaling(cfg),
  }


def _hf_rope_scaling(cfg: ModelConfig) -> dict:
  """Llama 3's rescaling as transformers 5 (``rope_parameters``) and older versions (``rope_scaling``) read it;
  nothing for plain RoPE."""
  if cfg.rope_scaling != "llama3":
    return {}
  scaling = {"rope_type": "llama3", **{k: getattr(cfg, ours) for k, ours in _LLAMA3_KEYS},
             "original_max_position_embeddings": cfg.rope_original_max_len}
  return {"rope_scaling": scaling, "rope_parameters": {**scaling, "rope_theta": cfg.rope_base}}


# ---------------------------------------------------------------------------------------------------------- tensors

_ATTN = (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj"))
_MLP = (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj"))


def _to_hf(cfg: ModelConfig, p: Mapping) -> dict:
  sd = {"model.embed_tokens.weight": p["embed"]["embedding"], "model.norm.weight": p["norm_final"]["scale"]}
  if not cfg.tie_embeddings:
    sd["lm_head.weight"] = p["lm_head"]["kernel"].T
  lay = p["layers"]
  for i in range(cfg.num_layers):
    pre = f"model.layers.{i}."
    sd[pre + "input_layernorm.weight"] = lay["norm_attn"]["scale"][i]
    sd[pre + "post_attention_layernorm.weight"] = lay["norm_mlp"]["scale"][i]
    for ours, theirs in _ATTN:
      sd[pre + f"self_attn.{theirs}.weight"] = heads_in_to_hf(lay["attn"][ours]["kernel"][i])
    sd[pre + "self_attn.o_proj.weight"] = heads_out_to_hf(lay["attn"]["out"]["kernel"][i])
    for ours, theirs in _MLP:
      sd[pre + f"mlp.{theirs}.weight"] = lay["mlp"][ours]["kernel"][i].T
  return sd


def _from_hf(cfg: ModelConfig, sd: Mapping) -> dict:
  n, hd = cfg.num_layers, cfg.head_dim
  at = lambda suffix: [sd[f"model.layers.{i}.{suffix}.weight"] for i in range(n)]
  heads = {"query": cfg.num_heads, "key": cfg.kv_heads, "value": cfg.kv_heads}
  attn = {ours: {"kernel": stack([heads_in_from_hf(w, heads[ours], hd) for w in at(f"self_attn.{theirs}")])}
          for ours, theirs in _ATTN}
  attn["out"] = {"kernel": stack([heads_out_from_hf(w, cfg.num_heads, hd) for w in at("self_attn.o_proj")])}
  params = {
      "embed": {"embedding": copy32(sd["model.embed_tokens.weight"])},
      "layers": {
          "attn": attn,
          "mlp": {ours: {"kernel": stack([w.T for w in at(f"mlp.{theirs}")])} for ours, theirs in _MLP},
          "norm_attn": {"scale": stack(at("input_layernorm"))},
          "norm_mlp": {"scale": stack(at("post_attention_layernorm"))},
      },
      "norm_final": {"scale": copy32(sd["model.norm.weight"])},
  }
  if not cfg.tie_embeddings:
    params["lm_head"] = {"kernel": copy32(sd["lm_head.weight"].T)}
  return params


def _adapt(sd: dict, cfg: ModelConfig, hf_config: Mapping) -> dict:
  """A tied model's ``lm_head.weight`` (in-memory state dicts carry it) must be the embedding; it is then dropped."""
  del hf_config
  if cfg.tie_embeddings and "lm_head.weight" in sd:
    head, embed = sd.pop("lm_head.weight"), sd.get("model.embed_tokens.weight")
    if embed is None or np.shape(head) != np.shape(embed) or not np.array_equal(head, embed):
      raise UnsupportedConfigError("lm_head.weight differs from model.embed_tokens.weight although the config says "
                                   "tie_word_embeddings=True; fix the config (tie_word_embeddings=False) or the "
                                   "checkpoint.")
  return sd


# ------------------------------------------------------------------------------------------------------ registry


LLAMA_LM = HFArchitecture(
    name="LlamaForCausalLM", model_types=("llama",), family="llama", config_from_hf=_config,
    to_hf_config=_hf_config, to_hf=_to_hf, from_hf=_from_hf, prefix="model", heads=("lm_head",),
    ignored=(r"^model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq$",),  # RoPE buffers of older transformers.
    adapt=_adapt, exports=lambda cfg: True, assumed_for=lambda keys: True)

ARCHITECTURES = (LLAMA_LM,)
