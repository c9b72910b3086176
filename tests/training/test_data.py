"""Data sources (digits, image folder, TFDS via mock_data) and the tf.data pipelines."""

import hashlib
import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from training_support import TINY, write_images

from keras_vit import preprocess_input
from keras_vit.training import data as data_lib
from keras_vit.training import pipeline
from keras_vit.training.config import DataConfig
from keras_vit.training.data import Split, load_digits, load_folder, load_source, load_tfds
from keras_vit.training.finetune import finetune
from keras_vit.training.pipeline import Augment, eval_dataset, train_dataset
from keras_vit.training.runner import OverImages

# torch runs the library tests, and of these only the tests marked for it below
pytestmark = pytest.mark.backends("tensorflow", "jax")

# sha256 of (images, labels) of the digits' splits as training/data.py made them before keras_vit.datasets.
DIGITS_HELD_OUT = "ef74cf7408b16ebc5c0dbab65af78704cafa3e7bd13212cc1d0ae7e2a3ec6954"
DIGITS_TRAIN = "1c03aaba7a606b1d7d85fd65b122ac89d0f9863d066cd10ded39757a2bbf0799"


@pytest.mark.backend_independent
def test_digits_split_is_held_out_and_stratified():
    source = load_digits()
    assert (source.num_classes, source.train.num_examples + source.eval.num_examples) == (10, 1797)
    assert source.eval.num_examples == 359
    for split, digest in ((source.eval, DIGITS_HELD_OUT), (source.train, DIGITS_TRAIN)):  # the same images as always
        assert hashlib.sha256(split.items.tobytes() + split.labels.tobytes()).hexdigest() == digest
    assert source.train.items.shape[1:] == (8, 8, 3) and source.train.items.dtype == np.uint8
    assert source.train.items.max() == 255
    eval_counts = np.bincount(source.eval.labels, minlength=10)
    assert eval_counts.min() >= 34 and eval_counts.max() <= 37
    train_rows = {row.tobytes() for row in source.train.items}
    overlap = sum(row.tobytes() in train_rows for row in source.eval.items)
    assert overlap < 5  # only accidental duplicates in the 8x8 data itself


@pytest.mark.backend_independent
def test_image_folder_with_a_held_out_fraction(tmp_path):
    write_images(tmp_path)
    source = load_source(str(tmp_path), eval_fraction=0.25)
    assert source.class_names == ("cat", "dog", "emu")
    assert (source.train.num_examples, source.eval.num_examples) == (9, 3)
    for image, label in source.eval.examples():
        assert image.shape[-1] == 3 and image.dtype == tf.uint8
        assert int(tf.argmax(tf.reduce_mean(tf.cast(image, tf.float32), axis=(0, 1)))) == int(label)


@pytest.mark.backend_independent
def test_image_folder_with_train_and_val_folders(tmp_path):
    write_images(tmp_path / "train", per_class=3)
    write_images(tmp_path / "val", per_class=2, first=10)
    source = load_folder(str(tmp_path))
    assert (source.train.num_examples, source.eval.num_examples, source.eval_split) == (9, 6, "val")
    labels = [int(label) for _, label in source.eval.examples()]
    assert labels == [0, 0, 1, 1, 2, 2]


@pytest.mark.backend_independent
def test_image_folder_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_source(str(tmp_path / "missing"))
    write_images(tmp_path, names=("only",))
    with pytest.raises(ValueError, match="at least two class sub-folders"):
        load_folder(str(tmp_path))


@pytest.mark.backend_independent
def test_a_class_folder_linked_to_another_class_is_refused_naming_both(tmp_path):
    """Issue 36: one folder (or one file) reached under two classes through a symbolic link would train its images
    under two labels; a link to images outside the dataset is a way to organise data, and keeps working."""
    images, outside = tmp_path / "images", tmp_path / "elsewhere"
    write_images(images)
    write_images(outside, per_class=2, names=("fox",))
    (images / "fox").symlink_to(outside / "fox")  # a class kept outside: fine
    assert load_folder(str(images), eval_fraction=0.25).class_names == ("cat", "dog", "emu", "fox")
    (images / "lion").symlink_to("cat")  # a relative link to another class of the dataset
    with pytest.raises(ValueError, match=re.escape(f"{images / 'cat'} and {images / 'lion'} are one folder")) as error:
        load_folder(str(images))
    assert "two labels" in str(error.value) and "\n" not in str(error.value)
    (images / "lion").unlink()
    (images / "emu" / "9.png").symlink_to(images / "dog" / "0.jpg")  # one file under two classes
    with pytest.raises(ValueError, match=re.escape(f"{images / 'dog' / '0.jpg'} and {images / 'emu' / '9.png'}")):
        load_folder(str(images))
    (images / "emu" / "9.png").unlink()
    (images / "dog" / "9.jpg").symlink_to(images / "dog" / "0.jpg")  # twice in one class: one label, allowed
    (outside / "fox" / "0.jpg").rename(outside / "kept.jpg")
    (images / "emu" / "9.jpg").symlink_to(outside / "kept.jpg")  # an image kept outside the classes: fine
    source = load_folder(str(images), eval_fraction=0.25)
    assert source.train.num_examples + source.eval.num_examples == 12 + 1 + 2


@pytest.mark.backends("tensorflow")  # backend-independent
def test_image_folder_trains_end_to_end(tmp_path):
    write_images(tmp_path / "images")
    result = finetune(
        dataset=str(tmp_path / "images"),
        steps=3,
        eval_fraction=0.25,
        output_dir=str(tmp_path / "run"),
        **{**TINY, "batch_size": 4},
    )
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["dataset"] == "images" and metrics["eval_examples"] == 3
    assert metrics["eval"]["accuracy"] == pytest.approx(result.metrics["accuracy"])
    assert result.model.output_shape == (None, 3)


@pytest.mark.backends("tensorflow")  # backend-independent
def test_tfds_path_with_mock_data(tmp_path, monkeypatch):
    import tensorflow_datasets as tfds

    monkeypatch.setattr(data_lib, "unresolvable_host", lambda urls: None)  # mock data: nothing is downloaded

    with tfds.testing.mock_data(num_examples=20):
        flowers = load_tfds("oxford_flowers102")  # images of varying sizes, stored encoded
        images, labels = next(iter(train_dataset(flowers.train, flowers.num_classes, 4, Augment(8))))
        assert images.shape == (4, 8, 8, 3) and labels.shape == (4, 102)
        assert float(tf.reduce_min(images)) >= -1 and float(tf.reduce_max(images)) <= 1
        assert load_tfds("imagenet2012", manual_dir=str(tmp_path)).eval_split == "validation"
        result = finetune(dataset="cifar10", steps=2, output_dir=str(tmp_path / "run"), **TINY)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert (metrics["dataset"], metrics["eval_split"]) == ("cifar10", "test")
    assert 0.0 <= metrics["eval"]["accuracy"] <= 1.0 and result.model.output_shape == (None, 10)
    with pytest.raises(ValueError, match="Unknown dataset 'no_such_dataset'"):
        load_source("no_such_dataset")


@pytest.mark.backends("tensorflow")  # backend-independent
def test_an_offline_tfds_download_fails_at_once_in_one_line(tmp_path, monkeypatch, capsys):
    """No network: the command names the dataset and the host that does not resolve, not TFDS' retries."""
    import socket

    from keras_vit.training.finetune import main

    def no_dns(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    assert (
        data_lib.unresolvable_host(["https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"]) == "www.cs.toronto.edu"
    )
    with pytest.raises(SystemExit) as exited:
        main(["--dataset", "cifar10", "--data-dir", str(tmp_path / "tfds"), "--output-dir", str(tmp_path / "run")])
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: cannot download TFDS dataset 'cifar10': www.cs.toronto.edu does not resolve")
    assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "run").exists()


@pytest.mark.backend_independent
def test_unresolvable_host_is_none_where_every_host_resolves():
    assert data_lib.unresolvable_host(["http://127.0.0.1:8000/a.tar", "http://localhost/b"]) is None
    assert data_lib.unresolvable_host([]) is None


def _batches(ds, count):
    return [(x.numpy(), y.numpy()) for x, y in ds.take(count)]


@pytest.mark.backends("tensorflow", "jax", "torch")
def test_training_stream_restarts_exactly_at_any_step():
    split = load_digits().train
    augment = Augment(16, DataConfig(crop_area=(0.3, 1.0), flip=True))
    full = _batches(train_dataset(split, 10, 100, augment, seed=3), 20)  # 20 batches span 2 epochs
    for start in (0, 7, 14, 19):
        resumed = _batches(train_dataset(split, 10, 100, augment, seed=3, start_step=start), 20 - start)
        for (x, y), (x_full, y_full) in zip(resumed, full[start:]):
            np.testing.assert_array_equal(x, x_full)
            np.testing.assert_array_equal(y, y_full)
    other_seed = _batches(train_dataset(split, 10, 100, augment, seed=4), 1)
    assert not np.array_equal(other_seed[0][0], full[0][0])


@pytest.mark.backends("tensorflow", "jax", "torch")
def test_every_example_once_per_epoch():
    split = Split(12, np.arange(12, dtype=np.uint8).reshape(12, 1, 1, 1).repeat(3, -1), np.arange(12))
    batches = _batches(train_dataset(split, 12, 4, Augment(1, DataConfig())), 6)
    labels = [np.argmax(y, axis=1) for _, y in batches]
    first, second = np.concatenate(labels[:3]), np.concatenate(labels[3:])
    assert sorted(first) == list(range(12)) and sorted(second) == list(range(12))
    assert not np.array_equal(first, second)  # reshuffled every epoch
    values = np.concatenate([x[:, 0, 0, 0] for x, _ in batches[:3]])
    np.testing.assert_allclose(values, (first - 127.5) / 127.5, atol=1e-6)  # pixels scaled to [-1, 1]


@pytest.mark.backends("tensorflow", "jax", "torch")
def test_the_pipelines_scale_pixels_with_preprocess_input_on_every_backend():
    """keras_vit.preprocess_input runs inside the tf.data maps (TensorFlow ops there, on every backend)."""
    pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1).repeat(3, axis=-1)
    split = Split(1, pixels, np.array([0]))
    expected = keras.ops.convert_to_numpy(preprocess_input(pixels[0]))
    assert (expected.min(), expected.max()) == (-1.0, 1.0)
    held_out = next(iter(eval_dataset(split, 2, 1, Augment(16))))[0][0].numpy()
    trained = next(iter(train_dataset(split, 2, 1, Augment(16, DataConfig()))))[0][0].numpy()
    for images in (held_out, trained):
        assert images.dtype == np.float32
        np.testing.assert_allclose(images, expected, rtol=0, atol=1e-6)


@pytest.mark.backend_independent
def test_inception_crop_and_flip_change_images_but_eval_does_not():
    image = np.arange(16 * 16 * 3, dtype=np.uint8).reshape(1, 16, 16, 3)
    split = Split(1, image, np.array([0]))
    crops = [x[0] for x, _ in _batches(train_dataset(split, 2, 1, Augment(16)), 8)]
    assert len({c.tobytes() for c in crops}) == 8
    plain = next(iter(eval_dataset(split, 2, 1, Augment(16))))[0][0].numpy()
    np.testing.assert_allclose(plain, (image[0] - 127.5) / 127.5, atol=1e-5)
    centre = next(iter(eval_dataset(split, 2, 1, Augment(8, DataConfig(eval_crop=0.5)))))[0][0].numpy()
    assert centre.shape == (8, 8, 3)
    np.testing.assert_allclose(centre, (image[0, 4:12, 4:12] - 127.5) / 127.5, atol=1e-5)


@pytest.mark.backends("tensorflow")  # backend-independent
def test_mixup_and_cutmix_mix_labels():
    split = load_digits().train
    for augment in (
        Augment(8, DataConfig(crop_area=(0.05, 1.0), flip=True, mixup=0.8)),
        Augment(8, DataConfig(crop_area=(0.05, 1.0), flip=True, cutmix=1.0)),
        Augment(8, DataConfig(crop_area=(0.05, 1.0), flip=True, mixup=0.8, cutmix=1.0, randaugment=(2, 0.5))),
    ):
        images, labels = next(iter(train_dataset(split, 10, 32, augment)))
        labels = labels.numpy()
        np.testing.assert_allclose(labels.sum(axis=1), 1.0, atol=1e-5)
        assert (labels.max(axis=1) < 0.999).any()  # some labels are mixtures
        assert images.shape == (32, 8, 8, 3)


@pytest.mark.backends("tensorflow")  # tf.data's layers: backend-independent
def test_augmentation_is_channels_last_under_a_global_channels_first():
    """The pipeline's images are channels-last whatever Keras' global format (its augmentation layers follow that by
    default): on grey images (three equal channels) CutMix's boxes and RandAugment's geometry keep the channels
    equal; read as channels-first they would cut and move across the channel axis."""
    grey = np.random.default_rng(0).uniform(0, 255, (8, 16, 16, 1)).repeat(3, axis=-1).astype("float32")
    labels = np.eye(8, dtype="float32")
    augment = Augment(16, DataConfig(cutmix=1.0, randaugment=(3, 1.0)))
    keras.config.set_image_data_format("channels_first")
    try:
        mixed, mixed_labels = pipeline._mixer(augment, 0)(tf.constant(grey), tf.constant(labels))
        moved = np.stack([pipeline._randaugment(augment, seed)(tf.constant(grey[0])).numpy() for seed in range(8)])
    finally:
        keras.config.set_image_data_format("channels_last")
    for images in (mixed.numpy(), moved):
        assert images.shape[-3:] == (16, 16, 3)
        np.testing.assert_array_equal(images[..., 0], images[..., 1])
        np.testing.assert_array_equal(images[..., 0], images[..., 2])
    assert not np.array_equal(mixed.numpy(), grey) and (mixed_labels.numpy().max(axis=1) < 0.999).any()
    assert not np.array_equal(moved, np.broadcast_to(grey[0], moved.shape))


@pytest.mark.backend_independent
def test_bad_augment_settings_are_refused_by_the_data_section():
    with pytest.raises(ValueError, match=re.escape("--crop-area must be in (0, 1], got 0.5,1.5.")):
        DataConfig(crop_area=(0.5, 1.5))
    with pytest.raises(ValueError, match=re.escape("--crop-area must be low,high with low <= high, got 0.9,0.5.")):
        DataConfig(crop_area=(0.9, 0.5))
    with pytest.raises(ValueError, match=re.escape("--eval-crop must be in (0, 1], got 0.")):
        DataConfig(eval_crop=0.0)
    with pytest.raises(ValueError, match=re.escape("--mixup must be >= 0, got -1.")):
        DataConfig(mixup=-1.0)


@pytest.mark.parametrize("batch", [16, 359, 7])
def test_whole_eval_batches_score_every_image_once(batch):
    """``whole_batches`` (TPU, JAX DataParallel): whole batches, the last filled with blanks of weight 0. A model
    evaluated on them scores what it scores on the plain batches: the accuracy exactly, the loss once scaled by
    (images + blanks) / images, as runner.OverImages does (359 digits: 9 blanks at batch 16, none at 359 or 7)."""
    split = load_digits(0.2, 0).eval
    augment = Augment(16, DataConfig())
    padded = list(eval_dataset(split, 10, batch, augment, whole_batches=True))
    assert all(x.shape[0] == batch and w.shape == (batch,) for x, _, w in padded)
    weights = np.concatenate([w.numpy() for *_, w in padded])
    blanks = -split.num_examples % batch
    assert (weights.sum(), len(weights)) == (split.num_examples, split.num_examples + blanks)
    assert np.all(weights[: split.num_examples] == 1.0)
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile(
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1),
        weighted_metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
    )
    plain = model.evaluate(eval_dataset(split, 10, batch, augment), return_dict=True, verbose=0)
    whole = model.evaluate(eval_dataset(split, 10, batch, augment, whole_batches=True), return_dict=True, verbose=0)
    assert whole["accuracy"] == pytest.approx(plain["accuracy"], abs=1e-7)
    assert whole["loss"] * OverImages(split.num_examples, blanks).scale == pytest.approx(plain["loss"], rel=1e-5)
