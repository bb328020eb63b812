"""The records every image source returns (``ImageSplit``, ``ImageSet``) and the fitting of an image to the model's
size, shared by the sources of ``images.py`` and the folder source of ``image_folder.py``."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Callable

import numpy as np

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


@dataclasses.dataclass
class ImageSplit:
  size: int
  get: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # positions -> (uint8 NHWC, int32 labels)


@dataclasses.dataclass
class ImageSet:
  train: ImageSplit
  eval: ImageSplit | None  # None: carve a seeded val_fraction out of train.
  num_classes: int
  description: str
  flip_ok: bool = True
  lazy: bool = False
  identity: str = ""  # What the images are (a folder's file list); a resume on other images is refused.
  class_names: tuple[str, ...] = ()


# ------------------------------------------------------------------ fitting
def fit_image(img: np.ndarray, size: int, resize: bool, where: str = "image") -> np.ndarray:
  """uint8 [size, size, C] from one uint8 [h, w, C] image. With ``resize``, the short side resized (bicubic, up or
  down) to ``size``, then a centre crop: what torchvision's Resize + CenterCrop and the exported HF processor do.
  Without it nothing is resampled: a smaller image is zero-padded to ``size``, a larger one refused."""
  h, w = img.shape[:2]
  if h == size and w == size:
    return img
  if not resize:
    if h <= size and w <= size:
      top, left = (size - h) // 2, (size - w) // 2
      return np.pad(img, ((top, size - h - top), (left, size - w - left), (0, 0)))
    raise ValueError(f"{where} is {h}x{w}, larger than image_size={size}, and data.resize is False: raise image_size or "
                     "set data.resize = True.")
  try:
    from PIL import Image
  except ImportError:
    pad = ", or set data.resize = False to zero-pad it" if h <= size and w <= size else ""
    raise ValueError(f"{where} is {h}x{w}, not image_size={size}; resizing it needs Pillow (pip install "
                     f"pillow){pad}.") from None
  scale = size / min(h, w)
  nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
  pil = Image.fromarray(img[..., 0] if img.shape[2] == 1 else img)
  out = np.asarray(pil.resize((nw, nh), Image.BICUBIC)).reshape(nh, nw, img.shape[2])
  top, left = (nh - size) // 2, (nw - size) // 2
  return out[top:top + size, left:left + size]


def fit_array(x: np.ndarray, size: int, resize: bool) -> np.ndarray:
  """fit_image over a batch; padding is vectorized."""
  if x.ndim == 3:
    x = x[..., None]
  n, h, w, _ = x.shape
  if h == size and w == size:
    return x
  if not resize and h <= size and w <= size:
    top, left = (size - h) // 2, (size - w) // 2
    return np.pad(x, ((0, 0), (top, size - h - top), (left, size - w - left), (0, 0)))
  if not n:
    return np.zeros((0, size, size, x.shape[3]), x.dtype)
  return np.stack([fit_image(img, size, resize) for img in x])


def array_split(x: np.ndarray, y: np.ndarray) -> ImageSplit:
  y = np.asarray(y, dtype=np.int32)
  return ImageSplit(size=len(x), get=lambda pos: (x[pos], y[pos]))


def parallel(fn, items, workers: int):
  """``[fn(i) for i in items]``, on ``workers`` threads where there are enough items (image decoding)."""
  if workers <= 1 or len(items) < 8:
    return [fn(i) for i in items]
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return list(pool.map(fn, items))
