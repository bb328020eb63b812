"""Per-family tensor-name tables and tensor conversion between our parameter trees and Hugging Face state dicts
(BERT, GPT-2, ViT/DeiT), for ``multilevel.interop.hf``.

``_TO_HF[family](cfg, params)`` gives the state dict ``save_pretrained`` would write; ``_FROM_HF[family](cfg, sd)``
the parameter tree (float32 numpy arrays) from a state dict already normalised and checked by ``hf_state_dict``.
"""

from __future__ import annotations

from typing import Callable, Mapping

import jax.numpy as jnp
import numpy as np

from multilevel.models.config import ModelConfig


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


# ------------------------------------------------------------------------------------------------------------ BERT


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


# ------------------------------------------------------------------------------------------------------ by family


_TO_HF: dict[str, Callable] = {"bert": _bert_to_hf, "gpt": _gpt_to_hf, "deit": _vision_to_hf}
_FROM_HF: dict[str, Callable] = {"bert": _bert_from_hf, "gpt": _gpt_from_hf, "deit": _vision_from_hf}
