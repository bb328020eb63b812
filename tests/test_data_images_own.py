"""A user's own image folder: what the image data must not get silently wrong (found by an audit that fed it
real-world folders). Local files only."""

import json
import os

import numpy as np
import pytest
from absl import logging

from multilevel.data import DataInfo, default_config, make_data

ONE_HOST = dict(process_index=0, process_count=1)


def _cfg(tmp_path, folder, **kw):
  cfg = default_config()
  cfg.cache_dir, cfg.folder, cfg.prefetch, cfg.val_fraction = str(tmp_path / "cache"), str(folder), 0, 0.25
  cfg.update(kw)
  return cfg


def _make(cfg, **kw):
  train, evaluation, info = make_data(cfg, **{**dict(kind="images", batch_size=2, image_size=8), **ONE_HOST, **kw})
  return train, evaluation, info


def _folder(root, classes=("cat", "dog"), n=4, mode="RGB", size=8, seed=0):
  from PIL import Image
  rng = np.random.default_rng(seed)
  for cls in classes:
    (root / cls).mkdir(parents=True, exist_ok=True)
    for i in range(n):
      shape = (size, size, 3) if mode == "RGB" else (size, size)
      Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8)).convert(mode).save(root / cls / f"{i}.png")
  return root


def test_a_grayscale_first_image_does_not_make_a_color_folder_gray(tmp_path):
  from PIL import Image
  root = _folder(tmp_path / "f")
  Image.new("L", (8, 8), 128).save(root / "cat" / "0.png")  # The first file is grayscale, the rest are not.
  _, _, info = _make(_cfg(tmp_path, root))
  assert info.image_shape == (8, 8, 3)
  _, _, gray = _make(_cfg(tmp_path, _folder(tmp_path / "g", mode="L")))
  assert gray.image_shape == (8, 8, 1)


def test_hidden_and_tool_folders_are_not_classes_and_their_files_not_images(tmp_path):
  root = _folder(tmp_path / "f")
  for junk in (".ipynb_checkpoints", "__MACOSX"):
    _folder(root / junk, classes=("x",))
  _folder(root / "cat" / ".ipynb_checkpoints", classes=("y",))
  (root / "dog" / "._0.png").write_bytes(b"\x00\x05\x16\x07 macOS resource fork")
  (root / ".DS_Store").write_bytes(b"\x00")
  _, _, info = _make(_cfg(tmp_path, root, val_fraction=0.25))
  assert info.num_classes == 2 and info.class_names == ("cat", "dog")
  assert info.num_train_examples + info.num_eval_examples == 8


@pytest.mark.parametrize("layout, message", [
    ("empty class", r"1 class folder\(s\) of .* hold no image \(bird\): each would be a class never seen"),
    ("one class", r"has one class folder \(cat\): a classifier needs two or more"),
    ("val beside classes", r"holds val/ beside other folders but no train/: they would be read as classes"),
    ("val classes unknown", r"has class folders that train/ lacks \(Cat, Dog\); train/ has cat, dog"),
])
def test_folders_that_would_train_on_wrong_labels_are_refused(tmp_path, layout, message):
  root = tmp_path / "f"
  if layout == "empty class":
    _folder(root)
    (root / "bird").mkdir()
  elif layout == "one class":
    _folder(root, classes=("cat",))
  elif layout == "val beside classes":
    _folder(root)
    _folder(root / "val")
  else:
    _folder(root / "train")
    _folder(root / "valid", classes=("Cat", "Dog"))  # 'valid' is an evaluation folder too.
  with pytest.raises(ValueError, match=message):
    _make(_cfg(tmp_path, root))


def test_an_evaluation_folder_without_some_classes_is_said(tmp_path, monkeypatch):
  warned = []
  monkeypatch.setattr(logging, "warning", lambda fmt, *a: warned.append(fmt % a))
  root = tmp_path / "f"
  _folder(root / "train", classes=("a", "b", "c"))
  _folder(root / "valid", classes=("a",))
  _, _, info = _make(_cfg(tmp_path, root))
  assert info.num_eval_examples == 4 and "evaluation from" in info.description
  assert any("has no images of 2 of the 3 classes (b, c)" in w for w in warned), warned


def test_resuming_on_a_changed_folder_is_refused_naming_the_change(tmp_path):
  root = _folder(tmp_path / "f")
  train, _, _ = _make(_cfg(tmp_path, root))
  next(train)
  state = train.get_state()
  train.close()
  os.rename(root / "cat", root / "zebra")  # Same images and count; the labels swap.
  again, _, _ = _make(_cfg(tmp_path, root))
  with pytest.raises(ValueError, match="made on other images data .* the image files, the class folders or the "
                                       "validation split changed"):
    again.set_state(state)


def test_16_bit_and_rotated_images_read_as_they_look(tmp_path):
  from PIL import Image
  root = _folder(tmp_path / "f", mode="L")
  ramp = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000)  # 0..63000 of 65535.
  Image.fromarray(ramp).save(root / "cat" / "0.png")  # A 16-bit PNG.
  rot = tmp_path / "r"
  _folder(rot, mode="RGB")
  top_red = np.zeros((4, 8, 3), np.uint8)
  top_red[:, :4] = (255, 0, 0)  # Stored 4 high, 8 wide: left half red ...
  img = Image.fromarray(top_red)
  exif = img.getexif()
  exif[0x0112] = 6  # ... shown rotated 90 degrees clockwise: the red half on top.
  img.save(rot / "cat" / "0.jpg", exif=exif, quality=100)
  from multilevel.data import image_folder as images
  cfg = _cfg(tmp_path, root)
  data, _, _ = images.folder_source(str(root), cfg, 8, True)
  gray = data.train.get(np.array([0]))[0][0, ..., 0].astype(int)
  np.testing.assert_allclose(gray, np.round(ramp / 257), atol=1)  # Was clipped to 255 from the second pixel on.
  data, _, _ = images.folder_source(str(rot), _cfg(tmp_path, rot), 8, True)
  x = data.train.get(np.array([0]))[0][0].astype(int)  # 'cat/0.jpg' sorts first.
  assert x[:3, 2:6, 0].mean() > 200 and x[-2:, 2:6, 0].mean() < 60  # Red on top, as it is shown.


def test_a_large_jpeg_is_decoded_at_a_reduced_scale_to_the_same_picture(tmp_path, monkeypatch):
  from PIL import Image, JpegImagePlugin
  from multilevel.data import image_folder as images
  drafts, draft = [], JpegImagePlugin.JpegImageFile.draft
  monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft",
                      lambda self, *a, **k: drafts.append(a) or draft(self, *a, **k))
  root = _folder(tmp_path / "f")
  yy, xx = np.mgrid[0:800, 0:1200]
  big = np.stack([xx * 255 // 1199, yy * 255 // 799, np.full_like(xx, 90)], -1).astype(np.uint8)
  Image.fromarray(big).save(root / "cat" / "0.jpg", quality=95)
  data, _, _ = images.folder_source(str(root), _cfg(tmp_path, root), 16, True)
  got = data.train.get(np.array([0]))[0][0].astype(float)
  assert drafts == [("RGB", (16, 16))]  # Decoded at 1/8 scale (150x100), not 1200x800.
  full = images.fit_image(np.asarray(Image.open(root / "cat" / "0.jpg").convert("RGB")), 16, True).astype(float)
  assert got.shape == (16, 16, 3) and np.abs(got - full).mean() < 3


def test_class_names_reach_the_summary_and_the_hf_labels(tmp_path):
  pytest.importorskip("safetensors")
  from multilevel import interop, models as M
  root = _folder(tmp_path / "f", classes=("10", "2", "cat"))
  _, _, info = _make(_cfg(tmp_path, root))
  assert info.class_names == ("10", "2", "cat")  # Sorted as text, as torchvision's ImageFolder does.
  cfg = M.preset("deit-test").replace(num_classes=3)
  out = interop.save_hf(cfg, M.init_params(cfg, 0), tmp_path / "hf", labels=info.class_names)
  config = json.loads((out / "config.json").read_text())
  assert config["id2label"] == {"0": "10", "1": "2", "2": "cat"} and config["label2id"]["cat"] == 2
  with pytest.raises(ValueError, match="labels must name each of a classifier's 3 classes once"):
    interop.save_hf(cfg, M.init_params(cfg, 0), tmp_path / "hf2", labels=["a", "b"])


def test_fewer_model_classes_than_class_folders_is_refused():
  from experiments.configs import deit
  from multilevel.cycles.run_config import model_config
  from multilevel.typed_config import ConfigError
  c = deit.get_config("test")
  c.unlock()
  c.model.num_classes = 2
  info = DataInfo(num_classes=3, image_shape=(8, 8, 3))
  with pytest.raises(ConfigError, match="model.num_classes=2 is smaller than the data's 3 classes"):
    model_config(c, info)
  c.model.num_classes = 0
  assert model_config(c, info).num_classes == 3


def test_unreadable_images_say_why(tmp_path):
  from PIL import Image
  root = _folder(tmp_path / "f")
  os.symlink(tmp_path / "nowhere.png", root / "dog" / "9.png")
  with pytest.raises(ValueError, match=r"9.png is a link to a file that does not exist"):
    train, _, _ = _make(_cfg(tmp_path, root, val_fraction=0.25))
    for _ in range(8):
      next(train)
  os.remove(root / "dog" / "9.png")
  os.remove(root / "cat" / "0.png")
  Image.fromarray(np.full((8, 8), 3.5, np.float32)).save(root / "cat" / "0.tiff")  # Label 0's first image.
  from multilevel.data import image_folder as images
  data, _, _ = images.folder_source(str(root), _cfg(tmp_path, root), 8, True)
  with pytest.raises(ValueError, match=r"holds F-mode values from 3.5 to 3.5 .* save it as an 8- or 16-bit image"):
    data.train.get(np.array([0]))


def test_the_description_counts_what_is_trained_on(tmp_path):
  _, _, info = _make(_cfg(tmp_path, _folder(tmp_path / "f", n=10), val_fraction=0.5))
  assert "20 images in 2 classes (10 train / 10 validation: a seeded 50% validation split)" in info.description


def test_the_normalisation_goes_with_an_exported_model(tmp_path):
  pytest.importorskip("transformers")
  import transformers

  from multilevel import interop
  from multilevel import models as M
  _, _, info = _make(_cfg(tmp_path, _folder(tmp_path / "f")))
  assert len(info.image_mean) == len(info.image_std) == 3 and all(0 < s < 1 for s in info.image_std)
  cfg = M.preset("deit-test")
  summary = {"image_normalization": {"mean": list(info.image_mean), "std": list(info.image_std)}}
  assert interop.save_inputs(tmp_path, cfg, summary) == ["its image normalisation"]
  processor = transformers.AutoImageProcessor.from_pretrained(str(tmp_path))
  assert processor.image_mean == pytest.approx(list(info.image_mean))
  pixels = np.full((cfg.image_size, cfg.image_size, 3), 255, np.uint8)
  out = processor(pixels, return_tensors="np")["pixel_values"][0]  # Channels first, as HF's ViT reads them.
  np.testing.assert_allclose(out[:, 0, 0], (1 - np.array(info.image_mean)) / np.array(info.image_std), rtol=1e-5)
  # A larger, non-square image is fitted as training fitted it: short side resized, then a centre crop.
  from multilevel.data.images import fit_image
  yy, xx = np.mgrid[0:cfg.image_size * 3, 0:cfg.image_size * 6]  # Smooth, and an exact 1/3 scale.
  big = np.stack([xx * 255 // xx.max(), yy * 255 // yy.max(), (xx + yy) * 255 // (xx + yy).max()], -1).astype(np.uint8)
  got = processor(big, return_tensors="np")["pixel_values"][0]
  want = (fit_image(big, cfg.image_size, True) / 255.0 - np.array(info.image_mean)) / np.array(info.image_std)
  assert got.shape == (3, cfg.image_size, cfg.image_size)
  assert np.abs(got.transpose(1, 2, 0) - want).mean() < 0.05  # Resampling filters differ slightly.


def test_smaller_images_are_enlarged_as_the_exported_processor_enlarges_them(tmp_path):
  pytest.importorskip("transformers")
  import transformers

  from multilevel import interop
  from multilevel import models as M
  from multilevel.data.images import fit_image
  cfg = M.preset("deit-test")  # image_size 8
  yy, xx = np.mgrid[0:4, 0:6]  # A smaller, non-square image (it was zero-padded in training, enlarged on export).
  small = np.stack([xx * 40, yy * 60, (xx + yy) * 25], -1).astype(np.uint8) + 20
  fitted = fit_image(small, cfg.image_size, True)
  assert fitted.shape == (8, 8, 3) and fitted.min() > 0  # Enlarged to fill the frame: no zero border.
  padded = fit_image(small, cfg.image_size, False)
  assert (padded[:2] == 0).all() and (padded[2:6, 1:7] == small).all()  # data.resize False: never resampled.
  for resize in (True, False):
    out = tmp_path / str(resize)
    out.mkdir()
    norm = {"mean": [0.5] * 3, "std": [0.25] * 3, "resize": resize}
    interop.save_inputs(out, cfg, {"image_normalization": norm})
    processor = transformers.AutoImageProcessor.from_pretrained(str(out))
    if resize:
      got = processor(small, return_tensors="np", input_data_format="channels_last")["pixel_values"][0].transpose(1, 2, 0)
      assert np.abs(got - (fitted / 255.0 - 0.5) / 0.25).mean() < 0.1  # Resampling filters differ slightly.
    else:
      assert not processor.do_resize and not processor.do_center_crop
      got = processor(padded, return_tensors="np", input_data_format="channels_last")["pixel_values"][0].transpose(1, 2, 0)
      np.testing.assert_allclose(got, (padded / 255.0 - 0.5) / 0.25, atol=1e-5)


def test_an_empty_split_is_fitted_to_the_size_and_a_revision_is_refused_for_images(tmp_path):
  from multilevel.data.images import fit_array
  assert fit_array(np.zeros((0, 4, 6, 3), np.uint8), 8, True).shape == (0, 8, 8, 3)  # Was (0, 4, 6, 3).
  with pytest.raises(ValueError, match=r"data.revision='v1' picks a version of a Hugging Face hub data set"):
    _make(_cfg(tmp_path, _folder(tmp_path / "f"), revision="v1"))
  from multilevel.data import DataConfig, check_sources
  with pytest.raises(ValueError, match=r"data.revision='v1'"):  # Any image source, a tfds name too.
    check_sources(DataConfig(name="tfds:cifar10", revision="v1"), "images")
