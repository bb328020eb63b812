"""DeiT (image classification) on Fashion-MNIST by default (or MNIST digits when that is all that is installed).

  python -m experiments.train --config=experiments/configs/deit.py:tiny --workdir=runs/deit-tiny

Sizes: test (unit tests), tiny (minutes on a laptop CPU), s and b (the paper's DeiT-S / DeiT-B on ImageNet, GPU).
"""

from experiments.configs.common import apply_protocol, apply_size, base_config, split_arg

SIZES = {
    "test": dict(preset="deit-test", image=28, patch=14, steps=40, batch=16, lr=3e-3),
    "tiny": dict(preset="deit-tiny", image=28, patch=4, steps=600, batch=128, lr=1e-3),
    "s": dict(preset="deit-s", image=224, patch=16, steps=300_000, batch=1024, lr=1e-3),
    "b": dict(preset="deit-b", image=224, patch=16, steps=300_000, batch=1024, lr=1e-3),
}


def get_config(arg: str = "tiny"):
  size, protocol = split_arg(arg, "tiny")
  if size not in SIZES:
    raise ValueError(f"Unknown deit size {size!r}; choose one of {sorted(SIZES)}.")
  s = SIZES[size]
  c = base_config(s["preset"])
  apply_size(c, s["preset"])
  c.model.image_size, c.model.patch_size = s["image"], s["patch"]
  c.model.num_classes, c.model.num_channels = 0, 0  # From the data.
  c.train.steps, c.train.batch_size, c.train.lr = s["steps"], s["batch"], s["lr"]
  c.train.weight_decay = 0.05
  c.cycle.w_pre = 0.25  # The paper's value for DeiT.
  if size in ("s", "b"):
    c.data.name = "tfds:imagenet2012"
  c.cycle.preln_exact = True  # Pre-LN: with depth_growth='zero' the grown model starts as the small one.
  if size == "test":
    c.train.log_every, c.train.eval_every, c.checkpoint.every = 5, 20, 10
    c.data.max_eval_batches = 2
  apply_protocol(c, protocol)
  return c
