"""LLaMA-style decoder (causal LM) on the bundled Shakespeare corpus by default, with GPT's data pipeline.

  python -m experiments.train --config=experiments/configs/llama.py:tiny --workdir=runs/llama-tiny

Sizes: test (unit tests), tiny (a few minutes on a laptop CPU), small, smollm (the SmolLM-135M shape, GPU).

The V-cycle defaults are the ones measured on GPT (README, "Does it save compute?"). Measured on this family (README,
"The V-cycle on LLaMA", one seed, a 5-point scratch frontier): the default saves 44% of the FLOPs at 2.6 tokens per
parameter and loses 15% at 21. Interpolation (w_pre=0.25) costs 0.27 nats at the hand-over there, but w_pre=0 without
split noise ends worse (its width copies stay tied), so w_pre stays at GPT's value. Untied (the default here), width
growth keeps the function exactly and depth growth with ``depth_growth='zero'`` too, so the grown model starts where
the small one ended.
"""

from experiments.configs.common import sized_config

SIZES = {
    "test": dict(preset="llama-test", max_len=32, steps=40, batch=8, vocab=512, lr=3e-3),
    "tiny": dict(preset="llama-tiny", max_len=128, steps=600, batch=32, vocab=2048, lr=1e-3),
    "small": dict(preset="llama-tiny", layers=6, heads=8, kv_heads=4, ffn=688, max_len=128, steps=3000, batch=32,
                  vocab=4096, lr=6e-4),
    "smollm": dict(preset="smollm-135m", max_len=512, steps=100_000, batch=512, vocab=49152, lr=3e-4),
}


def _customize(c, s, size):
  del size
  c.model.max_len = s["max_len"]
  if "layers" in s:
    c.model.num_layers, c.model.num_heads = s["layers"], s["heads"]
    c.model.num_kv_heads, c.model.ffn_size = s["kv_heads"], s["ffn"]
  c.data.vocab_size = s["vocab"]
  c.cycle.w_pre = 0.25  # GPT's value (the paper's).
  c.cycle.preln_exact = True  # Needed for exact width growth when the head is tied; a no-op when untied.


def get_config(arg: str = "tiny"):
  return sized_config("llama", SIZES, arg, _customize)
