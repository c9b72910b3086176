"""ImagePreprocessor against the hand computation: tf.image.resize (bilinear) of the image, then (x - 127.5) / 127.5.

On every backend: eagerly (the backend's resize) and in tf.data maps (TensorFlow's ops, whatever the backend).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_sample_image

from keras_vit.preprocessing import ImagePreprocessor, preprocess_input

TF_ATOL = 1e-5  # TensorFlow's resize (the TensorFlow backend, and tf.data on every backend) against itself
# JAX's and torch's bilinear resize compute the sample positions in another order: float32 round-off of up to
# 1.6e-5 here (0.002 grey levels; both are within 1.8e-5 of a float64 resize, TensorFlow's too)
ATOL = TF_ATOL if keras.backend.backend() == "tensorflow" else 2e-5


@pytest.fixture(scope="module")
def photos():
    """Real photos (427 x 640) and crops of other sizes and aspect ratios, uint8."""
    china, flower = load_sample_image("china.jpg"), load_sample_image("flower.jpg")
    return [china, flower[40:400, 100:250], china[:97, 5:300], flower[3:33, 10:31]]


def expected(image, size, crop_fraction=None):
    image = tf.convert_to_tensor(image)
    if crop_fraction is not None:
        height, width = image.shape[-3:-1]
        side = int(min(height, width) * crop_fraction)
        top, left = (height - side) // 2, (width - side) // 2
        image = image[..., top : top + side, left : left + side, :]
    return ((tf.image.resize(image, size, method="bilinear") - 127.5) / 127.5).numpy()


def test_preprocess_input():
    x = preprocess_input(np.array([0, 127.5, 255], "float32"))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(x), [-1.0, 0.0, 1.0])
    assert keras.ops.convert_to_numpy(preprocess_input(np.array([255], "uint8"))).dtype == np.float32


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
@pytest.mark.parametrize("size", [(32, 32), (224, 224), (48, 64)])
def test_matches_hand_computation(photos, dtype, size):
    layer = ImagePreprocessor(size)
    for photo in photos:
        image = photo.astype(dtype)
        out = keras.ops.convert_to_numpy(layer(image))  # one image
        assert out.shape == (*size, 3) and out.dtype == np.float32
        np.testing.assert_allclose(out, expected(image, size), atol=ATOL)
        assert out.min() >= -1.0 - ATOL and out.max() <= 1.0 + ATOL
        batched = keras.ops.convert_to_numpy(layer(np.stack([image, image[::-1]])))
        np.testing.assert_allclose(batched, expected(np.stack([image, image[::-1]]), size), atol=ATOL)


@pytest.mark.parametrize("crop_fraction", [0.875, 1.0, 0.3])
def test_centre_crop(photos, crop_fraction):
    layer = ImagePreprocessor(32, crop_fraction=crop_fraction)
    for photo in photos:
        out = keras.ops.convert_to_numpy(layer(photo[None]))
        np.testing.assert_allclose(out, expected(photo[None], (32, 32), crop_fraction), atol=ATOL)


def test_in_tf_data(photos):
    """A map over images of different sizes (unknown static shape), uint8 and float32: TensorFlow's ops on any
    backend (symbolic tf.Tensors go in), so TensorFlow's numbers."""
    layer = ImagePreprocessor(40, crop_fraction=0.9)
    for dtype in ("uint8", "float32"):
        spec = tf.TensorSpec((None, None, 3), dtype)
        ds = tf.data.Dataset.from_generator(lambda d=dtype: (p.astype(d) for p in photos), output_signature=spec)
        outs = next(ds.map(layer).batch(8).as_numpy_iterator())
        assert outs.shape == (len(photos), 40, 40, 3)
        for out, photo in zip(outs, photos):
            np.testing.assert_allclose(out, expected(photo.astype(dtype), (40, 40), 0.9), atol=TF_ATOL)
        scaled = next(ds.map(preprocess_input).as_numpy_iterator())
        np.testing.assert_array_equal(scaled, (photos[0].astype("float32") - 127.5) / 127.5)


def test_preprocess_input_returns_what_it_was_given():
    """keras.applications' habit: an ndarray comes back as an ndarray, a tensor as the same kind of tensor."""
    pixels = np.array([[0, 127.5, 255]], "float32")
    out = preprocess_input(pixels)
    assert type(out) is np.ndarray and out.dtype == np.float32 and out.tolist() == [[-1.0, 0.0, 1.0]]
    assert type(preprocess_input(pixels.astype("uint8"))) is np.ndarray
    assert preprocess_input([[0, 255]]).tolist() == [[-1.0, 1.0]]
    tensor = preprocess_input(keras.ops.convert_to_tensor(pixels))
    assert keras.ops.is_tensor(tensor) and not isinstance(tensor, np.ndarray)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(tensor), out)  # the same numbers either way
    for data_format in ("channels_first", "channels_last", None):  # the same scaling for any layout
        np.testing.assert_array_equal(preprocess_input(pixels, data_format=data_format), out)
    with pytest.raises(ValueError, match="Unknown data_format 'NCHW'; expected one of"):
        preprocess_input(pixels, data_format="NCHW")


def test_preprocess_input_keeps_the_backends_tensors():
    out = preprocess_input(keras.ops.convert_to_tensor(np.array([[0, 255]], "uint8")))
    assert keras.ops.is_tensor(out) and keras.ops.convert_to_numpy(out).tolist() == [[-1.0, 1.0]]
    assert keras.backend.backend() == "tensorflow" or not tf.is_tensor(out)
    eager_tf = preprocess_input(tf.constant([0.0, 255.0]))  # a tf.Tensor stays one, on any backend
    assert tf.is_tensor(eager_tf) and eager_tf.numpy().tolist() == [-1.0, 1.0]


def test_in_saved_and_reloaded_keras_model(photos, tmp_path):
    inputs = keras.Input((None, None, 3), dtype="uint8")
    model = keras.Model(inputs, ImagePreprocessor((24, 40), crop_fraction=0.75)(inputs))
    model.save(tmp_path / "pre.keras")
    reloaded = keras.models.load_model(tmp_path / "pre.keras")
    layer = reloaded.layers[-1]
    assert isinstance(layer, ImagePreprocessor)
    assert (layer.image_size, layer.crop_fraction, layer.interpolation) == ((24, 40), 0.75, "bilinear")
    for photo in photos:
        out = keras.ops.convert_to_numpy(reloaded(photo[None]))
        np.testing.assert_allclose(out, expected(photo[None], (24, 40), 0.75), atol=ATOL)
    assert reloaded.output_shape == (None, 24, 40, 3)


def test_from_weights_reads_the_catalogue():
    timm_measured = ImagePreprocessor.from_weights("B_16.augreg_in21k_ft_in1k_224")  # timm's crop_pct and bicubic
    assert (timm_measured.image_size, timm_measured.crop_fraction, timm_measured.interpolation) == (
        (224, 224),
        0.9,
        "bicubic",
    )
    assert ImagePreprocessor.from_weights("B_16.augreg_in21k_ft_in1k_384").crop_fraction == 1.0
    original = ImagePreprocessor.from_weights("B_16.orig_in21k_ft_in1k")  # the authors' 84.62: no crop, bilinear
    assert (original.image_size, original.crop_fraction, original.interpolation) == ((384, 384), None, "bilinear")
    assert ImagePreprocessor.from_weights("B_16.orig_in21k", crop_fraction=0.875).crop_fraction == 0.875
    photo = load_sample_image("china.jpg")
    out = keras.ops.convert_to_numpy(
        ImagePreprocessor.from_weights("Ti_16.augreg_in21k_ft_in1k_224", image_size=32)(photo)
    )
    side = int(427 * 0.9)
    crop = photo[(427 - side) // 2 : (427 - side) // 2 + side, (640 - side) // 2 : (640 - side) // 2 + side]
    by_hand = (tf.image.resize(crop.astype("float32"), (32, 32), method="bicubic").numpy() / 255 - 0.5) / 0.5
    if keras.backend.backend() == "torch":  # torch's bicubic kernel (a = -0.75) is not TensorFlow's (a = -0.5)
        bilinear = (tf.image.resize(crop.astype("float32"), (32, 32)).numpy() / 255 - 0.5) / 0.5
        assert np.abs(out - by_hand).mean() < 0.02 < np.abs(out - bilinear).mean()  # measured 0.011 and 0.030
    else:
        np.testing.assert_allclose(out, by_hand, atol=2e-5 if keras.backend.backend() == "tensorflow" else 1e-3)
    with pytest.raises(ValueError, match="image_size="):
        ImagePreprocessor.from_weights("B_16.no_such_checkpoint")


def test_mean_and_std_per_channel():
    """``(x / 255 - mean) / std`` per channel; 0.5 and 0.5 are (x - 127.5) / 127.5."""
    pixels = np.array([[[[0, 127.5, 255], [51, 102, 204]]]], "float32")  # (1, 1, 2, 3)
    layer = ImagePreprocessor((1, 2), mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    by_hand = (pixels / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(pixels)), by_hand, rtol=1e-5, atol=1e-6)
    same = keras.ops.convert_to_numpy(ImagePreprocessor((1, 2))(pixels))
    # JAX's resize to the same size rounds in the last bit
    np.testing.assert_allclose(same, keras.ops.convert_to_numpy(preprocess_input(pixels)), atol=1e-7)


def test_channels_first_images_give_the_channels_last_result_transposed(photos):
    """``(B, C, H, W)`` and ``(C, H, W)`` arrays: preprocess_input scales every channel alike, ImagePreprocessor (a
    crop, per-channel mean and std) is the channels-last layer between two transposes."""
    batch = np.stack([photos[1], photos[1][::-1]])  # (2, 360, 150, 3)
    first = batch.transpose(0, 3, 1, 2)
    scaled = keras.ops.convert_to_numpy(preprocess_input(first, data_format="channels_first"))
    np.testing.assert_array_equal(scaled, keras.ops.convert_to_numpy(preprocess_input(batch)).transpose(0, 3, 1, 2))
    settings = dict(image_size=(24, 40), crop_fraction=0.875, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    last, layer = (ImagePreprocessor(**settings, data_format=layout) for layout in ("channels_last", "channels_first"))
    expected = keras.ops.convert_to_numpy(last(batch)).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(first)), expected, atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(first[0])), expected[0], atol=1e-6)
    assert layer.compute_output_shape((None, 3, None, None)) == (None, 3, 24, 40)


def test_a_global_channels_first_resizes_the_images_not_their_channels(photos, channels_first):
    """Under ``keras.config.set_image_data_format("channels_first")`` the layer's resize (channels-last inside) names
    its layout: ``ops.image.resize`` defaults to the global one and resized (B, 3, 40, 24) to (B, 16, 40, 16)."""
    batch = np.stack([photos[3], photos[3][::-1]]).astype("float32")  # (2, 30, 21, 3)
    expected = keras.ops.convert_to_numpy(ImagePreprocessor(16, data_format="channels_last")(batch))
    out = keras.ops.convert_to_numpy(ImagePreprocessor(16)(batch.transpose(0, 3, 1, 2)))
    assert out.shape == (2, 3, 16, 16)
    np.testing.assert_allclose(out, expected.transpose(0, 3, 1, 2), atol=1e-6)


def test_the_default_layout_is_keras_image_data_format_but_a_saved_layer_keeps_its_own(channels_first):
    assert ImagePreprocessor(32).data_format == "channels_first"
    config = ImagePreprocessor(32, data_format="channels_last").get_config()
    assert ImagePreprocessor.from_config(config).data_format == "channels_last"
    del config["data_format"]  # saved before the argument existed: channels-last images
    assert ImagePreprocessor.from_config(config).data_format == "channels_last"


@pytest.mark.backend_independent  # argument checks, before any tensor
def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="Unknown data_format 'NCHW'"):
        ImagePreprocessor(224, data_format="NCHW")
    with pytest.raises(ValueError, match="crop_fraction"):
        ImagePreprocessor(224, crop_fraction=1.5)
    with pytest.raises(ValueError, match="image_size"):
        ImagePreprocessor((224, 224, 3))


# Keras' torch backend has no uint16 tensors (convert_to_tensor makes them int32): the tensor case is TF's and JAX's.
TENSOR = pytest.param(True, marks=pytest.mark.backends("tensorflow", "jax"))


@pytest.mark.parametrize("as_tensor", [False, TENSOR], ids=["numpy", "tensor"])
def test_16_bit_values_are_scaled_into_the_model_range(as_tensor):
    values = np.array([[[[0, 32896, 65535]]]], dtype=np.uint16)  # 32896 = 128 * 257
    got = preprocess_input(keras.ops.convert_to_tensor(values) if as_tensor else values)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(got), [[[[-1.0, 0.5 / 127.5, 1.0]]]], atol=1e-6)
    eight_bit = preprocess_input(np.array([[[[0, 128, 255]]]], dtype=np.uint8))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(got), eight_bit, atol=1e-6)
