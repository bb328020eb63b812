"""Seeded numpy image augmentation sized to the image: random crop with padding, horizontal flip and (optional,
'strong') random erasing.

Random draws are made for the whole global batch from (seed, epoch, step) and then sliced to this host's rows, so
augmentation does not depend on the number of hosts and a restored iterator repeats it exactly.
"""

from __future__ import annotations

import numpy as np

_SALT = 0xA11


def padding_for(size: int) -> int:
  """Crop padding that suits the image: 4 for 32x32 (CIFAR), 3 for 28x28, 28 for 224."""
  return max(1, size // 8)


def resolve_mode(augment, strong: bool = False) -> str:
  """'none', 'basic' (crop + flip) or 'strong' (+ random erasing) from cfg.augment / strong_augment."""
  if augment in (False, None, 0, "", "none", "false", "False"):
    return "none"
  if augment == "strong":
    return "strong"
  if augment in (True, 1, "basic", "true", "True", "default"):
    return "strong" if strong else "basic"
  raise ValueError(f"data.augment must be True/False, 'basic' or 'strong', got {augment!r}.")


def augment_batch(images: np.ndarray, key: tuple, rows: slice, global_batch: int, *,
                  mode: str = "basic", flip: bool = True) -> np.ndarray:
  """Augments uint8 images [b, H, W, C] (this host's rows of the global batch)."""
  if mode == "none":
    return images
  b, h, w, c = images.shape
  rng = np.random.default_rng([int(k) for k in key] + [_SALT])
  pad = padding_for(min(h, w))
  oy = rng.integers(0, 2 * pad + 1, size=global_batch)[rows]
  ox = rng.integers(0, 2 * pad + 1, size=global_batch)[rows]
  flips = (rng.random(global_batch) < 0.5)[rows]
  erase = rng.random((global_batch, 5))[rows]  # drawn always, so 'basic' and 'strong' share crops.

  padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  ys = oy[:, None] + np.arange(h)[None, :]                      # [b, h]
  xs = ox[:, None] + np.arange(w)[None, :]                      # [b, w]
  xs = np.where(flips[:, None] & flip, xs[:, ::-1], xs)         # flip = read columns backwards
  out = padded[np.arange(b)[:, None, None], ys[:, :, None], xs[:, None, :]]

  if mode == "strong":
    # Random erasing (p=0.5): a rectangle of 2-25% of the area set to zero.
    apply = erase[:, 0] < 0.5
    area = (0.02 + 0.23 * erase[:, 1]) * h * w
    aspect = np.exp(np.log(0.3) + (np.log(3.3) - np.log(0.3)) * erase[:, 2])
    eh = np.clip(np.sqrt(area * aspect).astype(int), 1, h)
    ew = np.clip(np.sqrt(area / aspect).astype(int), 1, w)
    y0 = (erase[:, 3] * (h - eh + 1)).astype(int)
    x0 = (erase[:, 4] * (w - ew + 1)).astype(int)
    yy = np.arange(h)[None, :, None]
    xx = np.arange(w)[None, None, :]
    box = ((yy >= y0[:, None, None]) & (yy < (y0 + eh)[:, None, None]) &
           (xx >= x0[:, None, None]) & (xx < (x0 + ew)[:, None, None]) & apply[:, None, None])
    out = np.where(box[..., None], np.zeros_like(out), out)
  return out
