"""GPT (causal LM) on the bundled Shakespeare corpus by default.

  python -m experiments.train --config=experiments/configs/gpt.py:tiny --workdir=runs/gpt-tiny

Sizes: test (unit tests), tiny (a few minutes on a laptop CPU), small, gpt2 (124M, GPU).
"""

from experiments.configs.common import sized_config

SIZES = {
    "test": dict(preset="gpt-test", max_len=32, steps=40, batch=8, vocab=512, lr=3e-3),
    "tiny": dict(preset="gpt-tiny", max_len=128, steps=600, batch=32, vocab=2048, lr=1e-3),
    "small": dict(preset="gpt-tiny", layers=6, heads=8, max_len=128, steps=3000, batch=32, vocab=4096, lr=6e-4),
    "gpt2": dict(preset="gpt2", max_len=512, steps=100_000, batch=512, vocab=50257, lr=1e-4),
}


def _customize(c, s, size):
  del size
  c.model.max_len = s["max_len"]
  if "layers" in s:
    c.model.num_layers, c.model.num_heads = s["layers"], s["heads"]
  c.data.vocab_size = s["vocab"]
  c.cycle.w_pre = 0.25  # The paper's value for GPT.
  c.cycle.preln_exact = True  # Pre-LN: with depth_growth='zero' the grown model starts as the small one.


def get_config(arg: str = "tiny"):
  return sized_config("gpt", SIZES, arg, _customize)
