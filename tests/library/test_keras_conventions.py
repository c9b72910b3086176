"""keras-vit under the checks Keras and keras-hub run on their own models, in one place.

Each test names the check it restates: ``applications_test`` (keras/src/applications/applications_test.py: what every
``keras.applications`` model passes), ``imagenet_utils_test`` (keras/src/applications/imagenet_utils_test.py:
``preprocess_input`` and ``decode_predictions``) and ``keras_hub test_case`` (keras_hub/src/tests/test_case.py:
``run_backbone_test`` and what it calls, ``run_serialization_test``, ``run_model_saving_test``,
``run_precision_test``, ``run_quantization_test``, ``run_vision_backbone_test``). The checks are written again here
for keras-vit's public API (``ViT``, the named constructors, ``preprocess_input``, ``decode_predictions``) on one-block
models of 32-pixel images. A check keras-vit does not pass by design is a strict xfail whose reason names the page of
docs/ that says why (docs/models.md, "Keras' and keras-hub's checks", lists them). Many of these behaviours have
fuller tests elsewhere (test_applications.py, test_models.py, test_preprocessing.py, test_labels.py,
test_quantization.py); this module is the short form a Keras user can read against Keras' own.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.applications import imagenet_utils
from keras.ops import convert_to_numpy as to_numpy

import keras_vit
from keras_vit import ViT, ViT_Ti16, decode_predictions, preprocess_input
from keras_vit.models import VisionTransformer

NARROW = dict(depth=1, hidden_size=32, num_heads=2, mlp_dim=32)  # a named constructor's defaults otherwise
TINY = dict(image_size=32, patch_size=8, hidden_size=32, depth=1, num_heads=2, mlp_dim=32, num_classes=5)
WIDTH, TOKENS = 32, 17  # hidden_size; 4x4 patches and the class token
IMAGES = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")  # one shape for every eager call
PIXELS = np.random.default_rng(1).uniform(0, 255, (2, 10, 12, 3))  # float64 pixels in [0, 255]


def tiny(**options) -> keras.Model:
    """``ViT("Ti/16")`` shrunk to one 32-wide block on 32-pixel images (patch 8), a 5-class head."""
    return ViT("Ti/16", **{**TINY, **options})


def with_random_head(model: keras.Model) -> keras.Model:
    """``model`` with a random head kernel: the published zero initialisation gives all-zero logits."""
    head = model.get_layer("head")
    kernel = np.random.default_rng(2).normal(0, 0.5, head.kernel.shape)
    head.kernel.assign(kernel.astype(keras.backend.standardize_dtype(head.kernel.dtype)))
    return model


def channels_first_images(images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2))


def dtype_of(x) -> str:
    return keras.backend.standardize_dtype(x.dtype)


@pytest.fixture(scope="module")
def classifier():
    """The one classifier the tests that do not change a model share (per backend: each pass is its own process);
    channels-last and seeded, whichever test builds it first."""
    keras.utils.set_random_seed(0)
    return with_random_head(tiny(data_format="channels_last"))


@pytest.fixture(scope="module")
def backbone():
    """The shared backbone: ``include_top=False``, all tokens ``(B, N, D)``."""
    keras.utils.set_random_seed(0)
    return tiny(include_top=False, data_format="channels_last")


@pytest.fixture(params=["channels_last", "channels_first"])
def data_format(request):
    """Keras' global ``image_data_format`` for the test (applications_test runs each check in both), restored after."""
    if request.param == "channels_first":
        request.getfixturevalue("channels_first")
    return request.param


# ---------------------------------------------------------------------------------------------------------------------
# applications_test


def test_application_default_arguments(data_format):
    # applications_test: test_application_base (instantiated with the defaults, weights=None)
    model = ViT_Ti16(weights=None, **NARROW)  # the default image size and head; one narrow block, built quickly
    size = (3, 224, 224) if data_format == "channels_first" else (224, 224, 3)
    assert model.input_shape == (None, *size) and model.output_shape == (None, 1000)
    assert model.name == "vit_ti16" and isinstance(model, VisionTransformer)
    smaller = ViT_Ti16(64, weights=None, **NARROW)  # the image size first, as keras.applications' input size
    assert smaller.input_shape == (None, *(s if s == 3 else 64 for s in size))


@pytest.mark.parametrize("pooling", [None, "avg", "max", "token"])
def test_application_pooling(pooling, backbone):
    # applications_test: test_application_pooling ("token": the class token, a ViT's own)
    model = tiny(include_top=False, pooling=pooling)
    model.set_weights(backbone.get_weights())  # no head: the same weights
    expected_shape = (None, TOKENS, WIDTH) if pooling is None else (None, WIDTH)
    assert model.output_shape == expected_shape
    tokens = to_numpy(backbone(IMAGES))
    expected = {
        None: tokens,
        "token": tokens[:, 0],
        "avg": tokens[:, 1:].mean(axis=1),  # the patch tokens, as GlobalAveragePooling2D over the patch grid
        "max": tokens[:, 1:].max(axis=1),
    }[pooling]
    np.testing.assert_allclose(to_numpy(model(IMAGES)), expected, rtol=1e-5, atol=1e-6)


def test_application_pooling_of_a_named_constructor_at_its_default_size(data_format):
    # applications_test: test_application_pooling, literally: app(weights=None, include_top=False, pooling="max")
    model = ViT_Ti16(weights=None, include_top=False, pooling="max", **NARROW)
    assert model.output_shape == (None, WIDTH) and model.input_shape[1:] in ((224, 224, 3), (3, 224, 224))


def test_application_classifier_activation(classifier):
    # applications_test: test_application_classifier_activation; and None gives the logits
    model = tiny(classifier_activation="softmax")
    model.set_weights(classifier.get_weights())
    assert model.layers[-1].activation.__name__ == "softmax"
    probabilities, logits = to_numpy(model(IMAGES)), to_numpy(classifier(IMAGES))
    np.testing.assert_allclose(probabilities.sum(axis=-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(probabilities, to_numpy(keras.ops.softmax(logits)), rtol=1e-5, atol=1e-7)
    assert logits.min() < 0 and np.abs(logits.sum(axis=-1) - 1).min() > 0.1  # logits, not probabilities


def test_application_classes():
    # applications_test: the classes= argument of every application (keras_vit's own spelling: num_classes)
    model = tiny(num_classes=None, classes=7)
    assert model.output_shape == (None, 7) and tuple(model(IMAGES).shape) == (2, 7)
    with pytest.raises(ValueError, match="num_classes=3 and classes=7 disagree"):
        tiny(num_classes=3, classes=7)


def test_application_notop_custom_input_tensor(data_format):
    # applications_test: test_application_notop_custom_input_tensor (4 channels, a Conv2D to 3, then the model; its
    # numbers: test_applications.py::test_input_tensor_keeps_the_layers_that_made_it)
    shape = (4, 64, 64) if data_format == "channels_first" else (64, 64, 4)
    images = keras.Input(shape, name="custom_input")
    convolved = keras.layers.Conv2D(3, 2, strides=2, name="to_rgb")(images)
    model = tiny(image_size=None, include_top=False, input_tensor=convolved)  # its size: the tensor's, 32
    assert model.inputs[0] is images and "to_rgb" in [layer.name for layer in model.layers]
    assert model.input_shape == (None, *shape) and model.output_shape == (None, TOKENS, WIDTH)


@pytest.mark.xfail(
    strict=True,
    raises=ValueError,
    reason="An image size that is not a multiple of the patch size is refused unless dynamic_img_pad=True "
    "(docs/models.md, 'Data format and image size'): 123 is not a multiple of 8",
)
def test_application_notop_custom_input_shape(data_format):
    # applications_test: test_application_notop_custom_input_shape, literally: 123x123 images
    shape = (3, 123, 123) if data_format == "channels_first" else (123, 123, 3)
    model = tiny(image_size=None, include_top=False, input_shape=shape)
    assert model.output_shape[-1] == WIDTH


def test_application_notop_custom_input_shape_refusal_and_dynamic_img_pad(data_format):
    # applications_test: test_application_notop_custom_input_shape, as keras-vit takes it: the refusal names the
    # fix, and with it the 123x123 images are padded to 128x128 (16x16 patches)
    shape = (3, 123, 123) if data_format == "channels_first" else (123, 123, 3)
    with pytest.raises(ValueError, match=r"123x123 is not divisible by the patch size 8.*dynamic_img_pad=True"):
        tiny(image_size=None, include_top=False, input_shape=shape)
    model = tiny(image_size=None, include_top=False, input_shape=shape, dynamic_img_pad=True)
    assert model.output_shape == (None, 16 * 16 + 1, WIDTH)


@pytest.mark.parametrize("channels", [1, 4])
def test_application_notop_variable_input_channels(channels, data_format):
    # applications_test: test_application_notop_variable_input_channels: (None, None, C) is any image size
    shape = (channels, None, None) if data_format == "channels_first" else (None, None, channels)
    model = tiny(image_size=None, include_top=False, input_shape=shape)
    assert model.input_shape == (None, *shape) and model.config.dynamic_image_size
    assert model.output_shape == (None, None, WIDTH)  # the tokens: their number follows the image size


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="include_top=False with pooling=None returns the tokens (B, N, D), not a (B, H, W, D) map "
    "(docs/models.md, 'ViT's arguments': pooling); keras_vit.feature_model gives the map",
)
def test_application_notop_output_is_a_feature_map():
    # applications_test: test_application_notop_variable_input_channels, its expected shape [None, None, None, D]
    model = tiny(image_size=None, include_top=False, input_shape=(None, None, 3))
    assert list(model.outputs[0].shape) == [None, None, None, WIDTH]


def test_application_input_shape_channels_first(channels_first, classifier):
    # applications_test: each check under set_image_data_format("channels_first"): input_shape (C, H, W), and the
    # model runs (its logits: the channels-last model's on the same weights)
    model = tiny(image_size=None, input_shape=(3, 32, 32))
    assert model.config.data_format == "channels_first" and model.input_shape == (None, 3, 32, 32)
    model.set_weights(classifier.get_weights())
    expected = to_numpy(classifier(IMAGES))
    np.testing.assert_allclose(to_numpy(model(channels_first_images(IMAGES))), expected, rtol=1e-5, atol=1e-6)


def test_application_include_preprocessing_channels_first(channels_first, classifier):
    # applications_test: the channels_first runs, for include_preprocessing (keras.applications' EfficientNetV2 and
    # ConvNeXt argument): raw (B, C, H, W) pixels of another size, resized and scaled as the channels-last images
    model = tiny(include_preprocessing=True)
    assert model.input_shape == (None, 3, None, None)
    model.set_weights(classifier.get_weights())
    pixels = np.random.default_rng(4).uniform(0, 255, (2, 40, 24, 3)).astype("float32")
    scaled = keras_vit.ImagePreprocessor(32, data_format="channels_last")(pixels)
    expected = to_numpy(classifier(scaled))
    np.testing.assert_allclose(to_numpy(model(channels_first_images(pixels))), expected, rtol=1e-5, atol=1e-5)


def test_application_variable_batch_size(classifier):
    # applications_test: the models' batch axis is None: any batch size, each image's logits its own
    assert classifier.input_shape[0] is None
    three = np.concatenate([IMAGES, IMAGES[:1]])
    logits = classifier.predict(three, batch_size=3, verbose=0)
    assert logits.shape == (3, 5)
    np.testing.assert_allclose(logits[2], logits[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logits[:2], to_numpy(classifier(IMAGES)), rtol=1e-5, atol=1e-5)


def test_application_predict_preprocess_and_decode():
    # applications_test: test_application_base's pipeline, preprocess_input -> predict -> decode_predictions (its
    # "African_elephant in the top 3" needs published weights, a download; tests/checkpoints/test_load.py's reference
    # tests compare keras-vit's logits with timm's on the same weights)
    model = with_random_head(tiny(num_classes=1000))
    photo = np.random.default_rng(5).integers(0, 256, (1, 32, 32, 3), dtype="uint8")
    scores = model.predict(preprocess_input(photo), verbose=0)
    decoded = decode_predictions(scores)
    assert len(decoded) == 1 and len(decoded[0]) == 5
    top = np.argsort(-scores[0])[:5]
    names = keras_vit.labels.class_names(spelling="keras")
    assert [name for _, name, _ in decoded[0]] == [names[i] for i in top]
    np.testing.assert_allclose([score for *_, score in decoded[0]], scores[0, top], rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# imagenet_utils_test


@pytest.mark.backend_independent  # numpy in, numpy out
@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "uint8"])
def test_preprocess_input_batch_and_single_image(dtype):
    # imagenet_utils_test: test_preprocess_input (float and int images, a batch and one image, both layouts); the
    # numbers are Keras' own mode="tf" ((x / 127.5) - 1), the output float32 (docs/weights.md)
    for images in (PIXELS.astype(dtype), PIXELS[0].astype(dtype)):
        given = images.copy()
        last = preprocess_input(images, data_format="channels_last")
        assert isinstance(last, np.ndarray) and last.shape == images.shape and last.dtype == np.float32
        keras_tf_mode = imagenet_utils.preprocess_input(images.copy(), mode="tf")
        np.testing.assert_allclose(last, keras_tf_mode, rtol=1e-6, atol=1e-6)
        assert last.min() >= -1.0 and last.max() <= 1.0
        axes = (0, 3, 1, 2) if images.ndim == 4 else (2, 0, 1)
        first = preprocess_input(np.transpose(images, axes), data_format="channels_first")
        np.testing.assert_array_equal(np.transpose(first, np.argsort(axes)), last)
        np.testing.assert_array_equal(images, given)  # the input is left as it was


@pytest.mark.backend_independent
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="preprocess_input returns a new float32 array and leaves its input as it was "
    "(docs/models.md, 'Keras' and keras-hub's checks')",
)
def test_preprocess_input_writes_over_a_float_input():
    # imagenet_utils_test: test_preprocess_input, "writing over the input data works predictably": Keras scales a
    # float array in place
    images = PIXELS.copy()
    scaled = preprocess_input(images, "channels_last")
    np.testing.assert_allclose(images, scaled)


@pytest.mark.backend_independent
def test_preprocess_input_is_applied_once():
    # imagenet_utils_test: an integer input is not written over (its maximum moves); keras-vit's scaling is not
    # idempotent either: a second call maps [-1, 1] to [-1.008, -0.992], so images are scaled once, [0, 255] in
    images = PIXELS.astype("int32")
    once = preprocess_input(images)
    assert images.max() != once.max() and once.max() <= 1.0
    twice = preprocess_input(once)
    np.testing.assert_allclose(twice, (once - 127.5) / 127.5, rtol=1e-6)
    assert twice.min() >= -1 - 1 / 127.5 and twice.max() <= -1 + 1 / 127.5


@pytest.mark.backend_independent
def test_preprocess_input_refuses_an_unknown_data_format():
    # imagenet_utils_test: test_preprocess_input, an unknown argument value is a ValueError
    with pytest.raises(ValueError, match="Unknown data_format 'channels_middle'"):
        preprocess_input(PIXELS, data_format="channels_middle")


@pytest.mark.backend_independent
@pytest.mark.xfail(
    strict=True,
    raises=TypeError,
    reason="preprocess_input has no mode: it is the one scaling of keras-vit's checkpoints, Keras' mode='tf' "
    "(docs/models.md, 'Keras' and keras-hub's checks'); mode= is a TypeError",
)
def test_preprocess_input_refuses_an_unknown_mode():
    # imagenet_utils_test: test_preprocess_input, mode="some_unknown_mode" is a ValueError
    with pytest.raises(ValueError):
        preprocess_input(PIXELS, mode="some_unknown_mode")


def test_preprocess_input_on_backend_tensors():
    # imagenet_utils_test: test_preprocess_input on the backend's tensors: a tensor back, float32, the numpy numbers
    for dtype in ("uint8", "float32"):
        tensor = keras.ops.convert_to_tensor(PIXELS.astype(dtype))
        scaled = preprocess_input(tensor)
        assert keras.ops.is_tensor(scaled) and dtype_of(scaled) == "float32"
        expected = preprocess_input(PIXELS.astype(dtype))
        np.testing.assert_allclose(to_numpy(scaled), expected, atol=1e-7)  # JAX: one float32 step, docs/backends.md


@pytest.mark.parametrize("layout", ["channels_last", "channels_first"])
def test_preprocess_input_symbolic(layout):
    # imagenet_utils_test: test_preprocess_input_symbolic (in a Lambda layer of a functional model, both layouts)
    images = PIXELS if layout == "channels_last" else channels_first_images(PIXELS)
    inputs = keras.Input(images.shape[1:])
    scale = keras.layers.Lambda(lambda x: preprocess_input(x, layout), output_shape=images.shape[1:])
    model = keras.Model(inputs, scale(inputs))
    out = model.predict(images, verbose=0)
    assert out.shape == images.shape
    np.testing.assert_allclose(out, preprocess_input(images.astype("float32")), atol=1e-7)


def test_preprocess_input_symbolic_mixed_precision():
    # imagenet_utils_test: test_preprocess_input_symbolic_mixed_precision (builds under mixed_float16); the values
    # come back float32, preprocess_input's dtype
    keras.mixed_precision.set_global_policy("mixed_float16")  # tests/conftest.py restores float32
    inputs = keras.Input((10, 12, 3))
    outputs = keras.layers.Lambda(lambda x: preprocess_input(x), output_shape=(10, 12, 3))(inputs)
    out = keras.Model(inputs, outputs)(PIXELS.astype("float32"))
    assert dtype_of(out) == "float32"
    np.testing.assert_allclose(to_numpy(out), preprocess_input(PIXELS.astype("float32")), atol=1e-3)


@pytest.mark.backend_independent  # argument checks before any layer runs
def test_obtain_input_shape():
    # imagenet_utils_test: test_obtain_input_shape: the input shapes a model refuses and the ones it builds
    with pytest.raises(ValueError, match=r"image_size=32 and input_shape \(64, 64, 3\) disagree"):
        tiny(input_shape=(64, 64, 3))  # another size than the one asked for
    for shape, message in (
        ((4, 4, 3), "4x4 is not divisible by the patch size 8"),  # smaller than a patch
        ((32, 3), r"input_shape must be \(height, width, channels\)"),  # not an image
        ((None, 32, 3), "give both height and width, or neither"),
    ):
        with pytest.raises(ValueError, match=message):
            tiny(image_size=None, input_shape=shape)
    with pytest.raises(ValueError, match="Pretrained weights need 3 input channels"):  # weights need RGB
        tiny(image_size=None, input_shape=(32, 32, 5), weights="checkpoint.npz")
    assert tiny(image_size=None, input_shape=(None, None, 3)).input_shape == (None, None, None, 3)
    assert tiny(image_size=None, input_shape=(40, 48, 3)).config.image_size == (40, 48)
    first = tiny(image_size=None, input_shape=(3, None, None), data_format="channels_first")
    assert first.input_shape == (None, 3, None, None)


@pytest.mark.backend_independent  # numpy scores
def test_decode_predictions_top_k_order_and_names():
    # decode_predictions (keras.applications.imagenet_utils): (wnid, name, score) best first, Keras' class names
    scores = np.random.default_rng(6).uniform(0, 1, (2, 1000)).astype("float32")
    scores[0, [386, 2, 999]] = [3.0, 2.0, 1.5]
    decoded = decode_predictions(scores)
    assert len(decoded) == 2 and [len(row) for row in decoded] == [5, 5]
    assert [entry[:2] for entry in decoded[0][:3]] == [
        ("n02504458", "African_elephant"),
        ("n01484850", "great_white_shark"),
        ("n15075141", "toilet_tissue"),
    ]
    for row, image_scores in zip(decoded, scores):
        values = [score for *_, score in row]
        assert values == sorted(values, reverse=True) and values[0] == image_scores.max()
    assert [len(row) for row in decode_predictions(scores, top=3)] == [3, 3]


@pytest.mark.backend_independent
def test_decode_predictions_refuses_a_wrong_shape():
    # decode_predictions: "expects a batch of predictions (samples, 1000)"; keras-vit also knows 21843 classes
    with pytest.raises(ValueError, match=r"shape \(batch, classes\)"):
        decode_predictions(np.zeros((1, 2, 1000)))
    with pytest.raises(ValueError, match="No class names for a head of 10 classes"):
        decode_predictions(np.zeros((2, 10)))


@pytest.mark.backend_independent
@pytest.mark.xfail(
    strict=True,
    raises=pytest.fail.Exception,
    reason="decode_predictions takes one image's scores (classes,) as a batch of one "
    "(docs/models.md, 'Keras' and keras-hub's checks')",
)
def test_decode_predictions_refuses_one_dimensional_scores():
    # decode_predictions: Keras refuses scores that are not 2-D
    with pytest.raises(ValueError):
        decode_predictions(np.zeros(1000))


def test_decode_predictions_takes_backend_tensors(classifier):
    # decode_predictions: ops.convert_to_numpy of the scores, so a model's output as it comes
    scores = keras.ops.softmax(classifier(IMAGES))
    decoded = decode_predictions(scores, labels=[f"class_{i}" for i in range(5)], top=2)
    best = np.argsort(-to_numpy(scores), axis=-1)[:, :2]
    assert [[name for _, name, _ in row] for row in decoded] == [[f"class_{i}" for i in row] for row in best]


# ---------------------------------------------------------------------------------------------------------------------
# keras_hub test_case


def test_serialization(classifier):
    # keras_hub test_case: run_serialization_test (get_config / from_config and serialize_keras_object round trips:
    # the same config as JSON, the same attributes); applications_test: test_application_base (as many weights)
    model = tiny()  # as built: predict() (on the shared model) adds attributes dir() would count
    model.set_weights(classifier.get_weights())
    config = model.get_config()
    as_json = json.dumps(config, sort_keys=True)
    revived = VisionTransformer.from_config(config)
    assert json.dumps(revived.get_config(), sort_keys=True) == as_json
    assert set(dir(revived)) == set(dir(model))
    serialized = json.dumps(keras.saving.serialize_keras_object(model), sort_keys=True)
    again = keras.saving.deserialize_keras_object(json.loads(serialized))
    assert isinstance(again, VisionTransformer) and json.dumps(again.get_config(), sort_keys=True) == as_json
    assert set(dir(again)) == set(dir(model)) and len(again.weights) == len(model.weights)
    again.set_weights(model.get_weights())
    np.testing.assert_array_equal(to_numpy(again(IMAGES)), to_numpy(model(IMAGES)))


def test_model_saving(classifier, tmp_path):
    # keras_hub test_case: run_model_saving_test (a .keras file, keras.saving.load_model: the class and the outputs)
    classifier.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    assert isinstance(restored, VisionTransformer) and restored.config == classifier.config
    np.testing.assert_allclose(to_numpy(restored(IMAGES)), to_numpy(classifier(IMAGES)), rtol=1e-6, atol=1e-6)


def test_backbone(backbone):
    # keras_hub test_case: run_backbone_test (an eager call, a compiled predict, predict on a tf.data set of
    # batches of 2: three images, so a last batch of 1)
    eager = to_numpy(backbone(IMAGES))
    assert eager.shape == (2, TOKENS, WIDTH)
    np.testing.assert_allclose(backbone.predict(IMAGES, verbose=0), eager, rtol=1e-5, atol=1e-5)
    three = np.concatenate([IMAGES, IMAGES[:1]])
    from_dataset = backbone.predict(tf.data.Dataset.from_tensor_slices(three).batch(2), verbose=0)
    assert from_dataset.shape == (3, TOKENS, WIDTH)
    np.testing.assert_allclose(from_dataset, np.concatenate([eager, eager[:1]]), rtol=1e-5, atol=1e-5)


@pytest.mark.backend_independent  # a name
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="a model is named after its variant as keras.applications names its models (vit_b16; docs/models.md, "
    "'ViT's arguments': name), not after its class",
)
def test_backbone_name_maps_to_class_name(backbone):
    # keras_hub test_case: run_backbone_test, "name maps to classname": VisionTransformer -> vision_transformer
    assert "vision_transformer" in backbone.name


def precision_mismatches(model: keras.Model, policy: keras.DTypePolicy) -> list:
    """What of ``model`` run_precision_test finds not in ``policy``: a float output (eager and its spec) not in the
    compute dtype, a float weight not in the variable dtype, a layer under other dtypes."""
    found = []
    spec = model.compute_output_spec(keras.ops.convert_to_tensor(IMAGES))  # (numpy: Keras' own layers refuse it)
    for what, out in (("output", model(IMAGES)), ("output spec", spec)):
        if dtype_of(out) != policy.compute_dtype:
            found.append((what, dtype_of(out)))
    for weight in model.weights:
        if "float" in dtype_of(weight) and dtype_of(weight) != policy.variable_dtype:
            found.append((weight.path, dtype_of(weight)))
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, (keras.layers.InputLayer, keras.layers.Softmax)):
            continue
        if (layer.compute_dtype, layer.variable_dtype) != (policy.compute_dtype, policy.variable_dtype):
            found.append((layer.name, layer.compute_dtype, layer.variable_dtype))
    return found


POLICIES = ["mixed_float16", "mixed_bfloat16", "bfloat16"]


@pytest.mark.parametrize("name", POLICIES)
def test_precision(name):
    # keras_hub test_case: run_precision_test on the backbone (dtype= as keras-hub's backbones take it), every
    # backend (keras-hub leaves torch CPUs out; torch runs these on CPUs); and the global policy builds the same model
    model = tiny(include_top=False, dtype=name)
    assert precision_mismatches(model, keras.DTypePolicy(name)) == []
    keras.mixed_precision.set_global_policy(name)  # tests/conftest.py restores float32
    under_global = tiny(include_top=False)
    assert under_global.dtype_policy.name == name and under_global.get_config() == model.get_config()


@pytest.mark.parametrize("name", POLICIES)
def test_precision_of_a_classifier(name):
    # keras_hub test_case: run_precision_test on a model with its head: float32 logits from the float32 head of a
    # mixed policy, as keras-vit documents (docs/models.md, 'ViT's arguments': dtype, head_dtype); with
    # head_dtype=the policy, every layer in it as run_precision_test asks
    policy = keras.DTypePolicy(name)
    mixed = name.startswith("mixed")
    documented = [("output", "float32"), ("output spec", "float32"), ("head", "float32", "float32")] if mixed else []
    assert precision_mismatches(tiny(dtype=name), policy) == documented
    assert precision_mismatches(tiny(dtype=name, head_dtype=name), policy) == []


QUANTIZABLE = (keras.layers.Dense, keras.layers.EinsumDense)  # run_quantization_test's (keras-vit has no Embedding)


@pytest.mark.parametrize("mode", ["int8", "float8"])
def test_quantization(mode, classifier):
    # keras_hub test_case: run_quantization_test (a DTypePolicyMap of every Dense as dtype=, an eager call, each
    # layer's quantization_mode, the get_config round trip, the weights loaded into the revived model)
    policies = keras.dtype_policies.DTypePolicyMap("float32")
    for layer in classifier._flatten_layers():
        if type(layer) in QUANTIZABLE:
            policies[layer.path] = keras.dtype_policies.get(f"{mode}_from_float32")
    assert len(policies) == 5  # qkv, out, the MLP's two, head
    model = tiny(dtype=policies)
    assert tuple(model(IMAGES).shape) == (2, 5)
    assert {layer.quantization_mode for layer in model._flatten_layers() if type(layer) in QUANTIZABLE} == {mode}
    config = model.get_config()
    revived = VisionTransformer.from_config(config)
    assert revived.get_config() == config
    revived.set_weights(model.get_weights())
    np.testing.assert_array_equal(to_numpy(revived(IMAGES)), to_numpy(model(IMAGES)))


@pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method implemented:UserWarning")  # Keras'
def test_quantize_predict_and_keras_file(classifier, tmp_path):
    # keras_hub test_case: run_quantization_test's subject, by Keras' model.quantize("int8"): predict close to the
    # float model's, and a .keras round trip with the same predictions
    model = tiny()
    model.set_weights(classifier.get_weights())
    model.quantize("int8")
    logits, exact = to_numpy(model(IMAGES)), to_numpy(classifier(IMAGES))
    assert 0 < np.abs(logits - exact).max() < 0.1 * np.abs(exact).max()
    model.save(tmp_path / "int8.keras")
    restored = keras.saving.load_model(tmp_path / "int8.keras")
    assert restored.get_layer("head").quantization_mode == "int8"
    np.testing.assert_array_equal(to_numpy(restored(IMAGES)), logits)


def test_variable_input(classifier):
    # keras_hub test_case: run_backbone_test's variable-length inputs, for images: dynamic_image_size=True takes any
    # size (the position embeddings interpolated in the graph): at the built size the fixed model's logits, at
    # another the logits of the fixed model resized to it (predict_on_batch: JAX compiles one step per size)
    model = tiny(dynamic_image_size=True)
    model.set_weights(classifier.get_weights())
    assert model.input_shape == (None, None, None, 3)
    np.testing.assert_allclose(to_numpy(model(IMAGES)), to_numpy(classifier(IMAGES)), rtol=1e-5, atol=1e-6)
    small = np.random.default_rng(7).uniform(-1, 1, (2, 16, 16, 3)).astype("float32")
    assert model.predict_on_batch(small).shape == (2, 5)
    other = np.random.default_rng(8).uniform(-1, 1, (2, 48, 40, 3)).astype("float32")
    resized = keras_vit.resize_position_embeddings(classifier, (48, 40))
    np.testing.assert_allclose(model.predict_on_batch(other), resized.predict_on_batch(other), rtol=1e-4, atol=1e-5)


def test_vision_backbone_channels_first(channels_first, backbone):
    # keras_hub test_case: run_vision_backbone_test's data format check (the backbone test again under a global
    # channels_first, images transposed): the same tokens
    model = tiny(include_top=False)
    assert model.input_shape == (None, 3, 32, 32)
    model.set_weights(backbone.get_weights())
    tokens = to_numpy(model(channels_first_images(IMAGES)))
    assert tokens.shape == (2, TOKENS, WIDTH)
    np.testing.assert_allclose(tokens, to_numpy(backbone(IMAGES)), rtol=1e-5, atol=1e-6)
