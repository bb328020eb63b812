"""Image classification data from a folder of the user's: one sub-folder per class, or ``train/`` and ``val/``
(``valid/``, ``validation/``, ``test/``) inside, read with Pillow as a user would mean it (hidden and tool folders
are not classes, grayscale only if every sampled image is, 16-bit images scaled, EXIF rotation applied, large JPEGs
decoded at a reduced scale), and refused where it would train on the wrong labels. ``images.make_images`` reads it.
"""

from __future__ import annotations

import os

import numpy as np
from absl import logging

from multilevel.data import common
from multilevel.data.config import DataConfig
from multilevel.data.imageset import IMAGE_EXTENSIONS, ImageSet, ImageSplit, fit_image, parallel

EVAL_FOLDERS = ("val", "valid", "validation", "test")
_GRAY_MODES = ("1", "L", "LA", "I", "I;16", "I;16L", "I;16B", "I;16N", "F")


def _visible(name: str) -> bool:
  """Not a hidden or tool folder/file: '.ipynb_checkpoints', '.DS_Store', macOS's '__MACOSX' and '._x.png'."""
  return not name.startswith((".", "__"))


def _class_names(root: str) -> list[str]:
  return sorted(d for d in os.listdir(root) if _visible(d) and os.path.isdir(os.path.join(root, d)))


def _class_files(root: str, classes: list[str]):
  """Every image file under each class folder (sub-folders and linked folders too; hidden ones not), and its label."""
  files, labels, empty = [], [], []
  for label, cls in enumerate(classes):
    found = []
    for dirpath, dirnames, names in os.walk(os.path.join(root, cls), followlinks=True):
      dirnames[:] = sorted(d for d in dirnames if _visible(d))
      found += [os.path.join(dirpath, n) for n in sorted(names) if _visible(n) and n.lower().endswith(IMAGE_EXTENSIONS)]
    if not found:
      empty.append(cls)
    files += found
    labels += [label] * len(found)
  return files, np.asarray(labels, dtype=np.int32), empty


def _bad_image(file: str, error: BaseException) -> ValueError:
  from PIL import Image
  if os.path.islink(file) and not os.path.exists(file):
    return ValueError(f"Image {file} is a link to a file that does not exist; fix or delete the link.")
  if isinstance(error, Image.DecompressionBombError):
    return ValueError(f"Image {file} has more pixels than Pillow opens by default ({error}); shrink it, or raise "
                      f"PIL.Image.MAX_IMAGE_PIXELS in your script if you trust the file.")
  return ValueError(f"Image {file} cannot be decoded ({type(error).__name__}: {error}): it is damaged or truncated. "
                    "Replace or delete it (data.folder reads every file with an image extension).")


class _Unreadable(ValueError):
  """An image that decodes but that this does not turn into 8 bits (its own message; not 'damaged')."""


def _as_uint8(im, file: str):
  """A 16-bit Pillow image as an 8-bit array (convert('L') would clip it at 255), else None."""
  if not im.mode.startswith("I") and im.mode != "F":
    return None
  x = np.asarray(im, dtype=np.float64)
  if im.mode.startswith("I;16") or (im.mode == "I" and 255 < x.max() <= 65535):
    return np.clip(np.round(x / 257.0), 0, 255).astype(np.uint8)  # 65535 -> 255.
  if im.mode == "I" and x.min() >= 0 and x.max() <= 255:
    return x.astype(np.uint8)
  raise _Unreadable(f"Image {file} holds {im.mode}-mode values from {x.min():g} to {x.max():g} (32-bit integer or "
                   f"float pixels), which have no one way to 8 bits: save it as an 8- or 16-bit image.")


def _folder_mode(files: list[str], labels: np.ndarray) -> tuple[str, int | None]:
  """('L' or 'RGB', the side of square images or None) from the first image of each class and up to 64 more
  spread over the files (headers only): grayscale only if every one of them is."""
  from PIL import Image
  firsts = np.unique(labels, return_index=True)[1]
  picks = sorted(set(firsts.tolist()) | set(np.linspace(0, len(files) - 1, min(64, len(files))).astype(int).tolist()))
  color, native = False, None
  for i in picks:
    try:
      with Image.open(files[i]) as im:
        color = color or im.mode not in _GRAY_MODES
        if i == 0:
          native = im.size[0] if im.size[0] == im.size[1] else None
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError... for a damaged file.
      raise _bad_image(files[i], e) from None
  return ("RGB" if color else "L"), native


def folder_source(path: str, cfg: DataConfig, size: int | None, resize: bool) -> tuple[ImageSet, int | None, int]:
  """A folder with one sub-folder per class, or with train/ and val|valid|validation|test/ inside."""
  path = os.path.expanduser(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"Image folder {path!r} (data.folder) does not exist.")
  try:
    from PIL import Image, ImageOps
  except ImportError:
    raise ValueError("Reading an image folder needs Pillow: pip install pillow.") from None
  train_root, eval_root = path, None
  top = _class_names(path)
  if os.path.isdir(os.path.join(path, "train")):
    train_root = os.path.join(path, "train")
    eval_root = next((os.path.join(path, d) for d in EVAL_FOLDERS if os.path.isdir(os.path.join(path, d))), None)
  elif set(top) & set(EVAL_FOLDERS) and len(top) > 1:
    held = sorted(set(top) & set(EVAL_FOLDERS))
    raise ValueError(f"{path} holds {', '.join(held)}/ beside other folders but no train/: they would be read as "
                     f"classes. Put the training classes in {os.path.join(path, 'train')}/, or move {held[0]}/ out.")
  classes = _class_names(train_root)
  files, labels, empty = _class_files(train_root, classes)
  if not classes or not files:
    raise ValueError(f"No images ({', '.join(IMAGE_EXTENSIONS)}) in class sub-folders of {train_root}: expected "
                     "<folder>/<class name>/<image files>.")
  if empty:
    raise ValueError(f"{len(empty)} class folder(s) of {train_root} hold no image ({', '.join(empty[:5])}): each "
                     f"would be a class never seen in training. Remove them, or add their images (read: "
                     f"{', '.join(IMAGE_EXTENSIONS)}).")
  if len(classes) < 2:
    raise ValueError(f"{train_root} has one class folder ({classes[0]}): a classifier needs two or more, one "
                     "sub-folder per class.")
  mode, native = _folder_mode(files, labels)
  target = size or native
  if target is None:
    raise ValueError(f"The images in {path} are not square: pass image_size to make_data.")
  channels = 1 if mode == "L" else 3
  workers = cfg.num_workers

  def load(file):
    try:
      with Image.open(file) as im:
        if target and im.format == "JPEG" and min(im.size) >= 2 * target:
          im.draft("RGB" if mode == "RGB" else "L", (target, target))  # Decode a large JPEG at 1/2-1/8 scale.
        if im.getexif().get(0x0112, 1) != 1:  # A photo taken sideways carries its rotation (EXIF orientation).
          im = ImageOps.exif_transpose(im)  # Only then: it copies the whole image even when nothing turns.
        deep = _as_uint8(im, file)
        if deep is not None:
          im = Image.fromarray(deep)
        img = np.asarray(im.convert(mode), dtype=np.uint8).reshape(im.size[1], im.size[0], channels)
    except _Unreadable:
      raise
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError... for a damaged file.
      raise _bad_image(file, e) from None
    return fit_image(img, target, resize, f"Image {file}")

  def split_of(fs, ls):
    def get(pos):
      return np.stack(parallel(load, [fs[int(p)] for p in pos], workers)), ls[pos]
    return ImageSplit(size=len(fs), get=get)

  evaluation, efiles = None, []
  if eval_root:
    eval_classes = _class_names(eval_root)
    unknown = sorted(set(eval_classes) - set(classes))
    if unknown:
      raise ValueError(f"{eval_root} has class folders that train/ lacks ({', '.join(unknown[:5])}); train/ has "
                       f"{', '.join(classes[:10])}{', ...' if len(classes) > 10 else ''}. The evaluation classes must "
                       f"be named as the training ones (case counts).")
    efiles, elabels, missing = _class_files(eval_root, classes)
    if missing:
      logging.warning("%s has no images of %d of the %d classes (%s): evaluation covers the others only.", eval_root,
                      len(missing), len(classes), ", ".join(missing[:5]))
    evaluation = split_of(efiles, elabels) if efiles else None
  identity = common.fingerprint([classes, [os.path.relpath(f, path) for f in files],
                                 [os.path.relpath(f, path) for f in efiles]])
  desc = f"Image folder {path}: {len(files):,} images in {len(classes)} classes" + (
      f", evaluation from {eval_root}" if evaluation else "")
  return (ImageSet(split_of(files, labels), evaluation, len(classes), desc, lazy=True, identity=identity,
                   class_names=tuple(classes)), native, channels)
