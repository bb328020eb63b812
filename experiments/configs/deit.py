"""DeiT (image classification) on Fashion-MNIST by default (or MNIST digits when that is all that is installed).

  python -m experiments.train --config=experiments/configs/deit.py:tiny --workdir=runs/deit-tiny

Sizes: test (unit tests), tiny (minutes on a laptop CPU), s and b (the paper's DeiT-S / DeiT-B on ImageNet, GPU).
"""

from experiments.configs.common import sized_config

SIZES = {
    "test": dict(preset="deit-test", image=28, patch=14, steps=40, batch=16, lr=3e-3),
    "tiny": dict(preset="deit-tiny", image=28, patch=4, steps=600, batch=128, lr=1e-3),
    "s": dict(preset="deit-s", image=224, patch=16, steps=300_000, batch=1024, lr=1e-3),
    "b": dict(preset="deit-b", image=224, patch=16, steps=300_000, batch=1024, lr=1e-3),
}


def _customize(c, s, size):
  c.model.image_size, c.model.patch_size = s["image"], s["patch"]
  c.model.num_classes, c.model.num_channels = 0, 0  # From the data.
  c.train.weight_decay = 0.05
  c.cycle.w_pre = 0.25  # The paper's value for DeiT.
  c.cycle.preln_exact = True  # A no-op for DeiT's width rule; kept explicit for symmetry with GPT.
  if size in ("s", "b"):
    c.data.name = "tfds:imagenet2012"


def get_config(arg: str = "tiny"):
  return sized_config("deit", SIZES, arg, _customize)
