"""The vocabulary in which each model family declares which space each axis of each parameter lives in.

The operators (``multilevel.operators``) read these tables and never look at a model's code. A table maps a parameter
path ("layers/attn/query/kernel") to a tuple with one role per axis; ``None`` means the axis never changes size.

Roles and what coalescing does along them (de-coalescing is the normalized transpose, section 5 of method.md):
- ``LAYERS``: the leading axis of the stacked blocks; merged layers are averaged.
- ``HIDDEN_OUT`` / ``HEADS_OUT`` / ``FFN_OUT``: an output side; merged units are averaged (copied back on growth).
- ``HIDDEN_IN`` / ``HEADS_IN`` / ``FFN_IN``: an input side; merged units are summed (divided on growth).
- ``KV_HEADS_OUT``: the key/value heads of grouped-query attention (LLaMA), an output side. Their map follows the
  query heads' (``LevelMap.kv_map``, ``operators.groups.kv_groups``): merged query heads keep their key/value
  heads, which merge together.
- ``EMBED``: the hidden axis of an embedding table that writes the residual stream. Tied to an LM head (BERT, GPT,
  LLaMA with ``tie_embeddings``) it is summed like an input side (the paper's factor 2 for pairs); otherwise (DeiT,
  untied LLaMA) averaged like an output.
- ``RESIDUAL``: the hidden output of a residual branch (attention output, FFN output). Averaged by default; with
  ``preln_exact`` it follows the ``EMBED`` rule, which makes width growth function-preserving for pre-LN GPT.
"""

LAYERS = "layers"
HIDDEN_IN = "hidden:in"
HIDDEN_OUT = "hidden:out"
HEADS_IN = "heads:in"
HEADS_OUT = "heads:out"
FFN_IN = "ffn:in"
FFN_OUT = "ffn:out"
KV_HEADS_OUT = "kv:out"
EMBED = "hidden:embed"
RESIDUAL = "hidden:residual"

ROLES = (LAYERS, HIDDEN_IN, HIDDEN_OUT, HEADS_IN, HEADS_OUT, FFN_IN, FFN_OUT, KV_HEADS_OUT, EMBED, RESIDUAL)

# One transformer block; every path sits under "layers/" with the stacked-layer axis first.
BLOCK_AXES = {
    "attn/query/kernel": (LAYERS, HIDDEN_IN, HEADS_OUT, None),
    "attn/query/bias": (LAYERS, HEADS_OUT, None),
    "attn/key/kernel": (LAYERS, HIDDEN_IN, HEADS_OUT, None),
    "attn/key/bias": (LAYERS, HEADS_OUT, None),
    "attn/value/kernel": (LAYERS, HIDDEN_IN, HEADS_OUT, None),
    "attn/value/bias": (LAYERS, HEADS_OUT, None),
    "attn/out/kernel": (LAYERS, HEADS_IN, None, RESIDUAL),
    "attn/out/bias": (LAYERS, RESIDUAL),
    "mlp/fc1/kernel": (LAYERS, HIDDEN_IN, FFN_OUT),
    "mlp/fc1/bias": (LAYERS, FFN_OUT),
    "mlp/fc2/kernel": (LAYERS, FFN_IN, RESIDUAL),
    "mlp/fc2/bias": (LAYERS, RESIDUAL),
    "ln_attn/scale": (LAYERS, HIDDEN_OUT),
    "ln_attn/bias": (LAYERS, HIDDEN_OUT),
    "ln_mlp/scale": (LAYERS, HIDDEN_OUT),
    "ln_mlp/bias": (LAYERS, HIDDEN_OUT),
}


def with_blocks(table: dict) -> dict:
  """A family's own table plus the shared block entries under ``layers/``."""
  out = dict(table)
  out.update({f"layers/{k}": v for k, v in BLOCK_AXES.items()})
  return out
