"""keras.applications habits of ``ViT`` and the named constructors: ``input_shape``, ``classes``, a positional
``include_top``, ``input_tensor`` and ``include_preprocessing``. Tiny models (one block, small images)."""

import inspect
import pydoc
import sys
import typing

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy  # any backend's tensor (torch's track gradients)
from npz_layout import vit_checkpoint, write_checkpoint
from sklearn.datasets import load_sample_image

import keras_vit
from keras_vit import ImagePreprocessor, ViT, ViT_R26_S32, ViT_Ti16

TINY = dict(depth=1)


@pytest.mark.parametrize("name", sorted(keras_vit.applications.NAMED_CONSTRUCTORS))
@pytest.mark.backend_independent
def test_each_named_constructor_takes_every_argument_of_vit(name):
    """As ``inspect`` (``help``, IDEs) sees it: ViT's arguments, kinds, defaults and annotations, the image size
    first, the rest by keyword, then ``**options``; a plain ``def`` of its own name."""
    constructor = getattr(keras_vit, name)
    assert constructor is keras_vit.applications.NAMED_CONSTRUCTORS[name]
    assert constructor.__name__ == name and constructor.__code__.co_name == name
    ours = dict(inspect.signature(constructor).parameters)
    theirs = {k: v for k, v in inspect.signature(ViT).parameters.items() if k != "variant"}
    assert list(ours) == ["image_size", *(k for k in theirs if k != "image_size")]
    for argument, parameter in theirs.items():
        same = ours[argument]
        assert (same.default, same.annotation) == (parameter.default, parameter.annotation), argument
        if argument != "image_size":
            assert same.kind == parameter.kind, argument
    assert ours["image_size"].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert {
        "include_top",
        "weights",
        "input_tensor",
        "input_shape",
        "pooling",
        "classes",
        "classifier_activation",
    } <= set(ours)
    with pytest.raises(TypeError):
        constructor(32, True)  # everything after the image size is keyword-only, as in ViT


@pytest.mark.backend_independent
def test_typed_arguments_are_vits_keywords():
    """``ViTArguments`` (the named constructors' ``**kwargs`` type) lists exactly ViT's keyword-only arguments."""
    keywords = [k for k, p in inspect.signature(ViT).parameters.items() if p.kind == inspect.Parameter.KEYWORD_ONLY]
    assert list(keras_vit.applications.ViTArguments.__annotations__) == [k for k in keywords if k != "image_size"]


CONSTRUCTORS = sorted(keras_vit.applications.NAMED_CONSTRUCTORS)
OWN_WIDTH = {"ViT_Ti16", "ViT_R26_S32", "DeiT_Ti16_Distilled", "SigLIP_B16", "DINOv2_S14_Reg4"}  # the rest: 32 wide


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", CONSTRUCTORS)
def test_named_constructor_is_vit_of_its_variant(name):
    """A call (image size by position) equals ``ViT(variant, ...)``: same name, config, weights and logits."""
    from keras_vit.variants import FAMILY_VARIANTS, NAMED_VARIANTS, constructor_name, parse_variant

    variant = next(v for v in (*NAMED_VARIANTS, *FAMILY_VARIANTS) if constructor_name(v) == name)
    size = 56 if "14" in name else 64
    arguments = dict(depth=1, num_classes=3, weights=None)
    if name not in OWN_WIDTH:
        arguments.update(hidden_size=32, num_heads=2, mlp_dim=64)
        if parse_variant(variant).resnet_stages is not None:
            arguments.update(resnet_width=32)
    named = getattr(keras_vit, name)(size, **arguments)
    built = ViT(variant, image_size=size, **arguments)
    assert named.name == built.name == name.lower() and named.config == built.config
    built.set_weights(named.get_weights())
    images = np.random.default_rng(0).uniform(-1, 1, (2, *named.input_shape[1:])).astype("float32")
    np.testing.assert_array_equal(to_numpy(named(images)), to_numpy(built(images)))


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", CONSTRUCTORS)
def test_help_shows_every_argument(name):
    """``help()`` prints the constructor's own line, ViT's arguments with their defaults, and its docstring."""
    constructor = getattr(keras_vit, name)
    text = pydoc.render_doc(constructor, renderer=pydoc.plaintext)
    assert f"{name}{inspect.signature(constructor)}" in text
    for argument in ("image_size", "include_top: 'bool' = True", "weights", "classes", "name", "**options"):
        assert argument in text, argument
    assert constructor.__doc__.splitlines()[0] in text and "kwargs" not in text


@pytest.mark.backend_independent
@pytest.mark.skipif(sys.version_info < (3, 11), reason="typing.Unpack is Python 3.11's")
def test_type_hints_take_the_typed_arguments():
    from typing import Unpack

    hints = typing.get_type_hints(ViT_Ti16)
    assert hints["kwargs"] == Unpack[keras_vit.applications.ViTArguments] and hints["return"] is keras.Model


@pytest.mark.backend_independent
def test_a_wrong_argument_is_a_type_error_naming_it():
    with pytest.raises(
        TypeError, match=r"ViT_Ti16\(\) got unexpected keyword arguments \['dept'\] \(dept: did you mean 'depth'\?\)"
    ):
        ViT_Ti16(dept=1)
    with pytest.raises(
        TypeError, match=r"ViT\(\) got unexpected keyword arguments \['weight'\] \(weight: did you mean 'weights'\?\)"
    ):
        ViT(weight=None)
    with pytest.raises(TypeError, match=r"ViT_Ti16\(\) got an unexpected keyword argument 'variant'"):
        ViT_Ti16(variant="B/16")
    with pytest.raises(TypeError, match=r"ViT_Ti16\(\) takes from 0 to 1 positional arguments but 2"):
        ViT_Ti16(32, True)
    with pytest.raises(TypeError, match=r"ViT_R26_S32\(\) fixes the ResNet to \(2, 2, 2, 2\)"):
        ViT_R26_S32(resnet=(1, 1))


def _same_weights(model: keras.Model, other: keras.Model) -> None:
    other.set_weights(model.get_weights())


def test_input_shape_and_classes_are_aliases():
    by_shape = ViT_Ti16(input_shape=(64, 64, 3), classes=10, **TINY)
    by_size = ViT_Ti16(image_size=64, num_classes=10, **TINY)
    assert by_shape.input_shape == by_size.input_shape == (None, 64, 64, 3)
    assert by_shape.output_shape == by_size.output_shape == (None, 10)
    assert by_shape.count_params() == by_size.count_params()
    assert ViT("Ti/16", input_shape=(32, 64, 1), **TINY).input_shape == (None, 32, 64, 1)
    assert ViT_Ti16(input_shape=(None, None, 3), **TINY).input_shape == (None, None, None, 3)  # any size
    assert ViT_Ti16(input_shape=(32, 32, 3), image_size=32, classes=4, num_classes=4, **TINY).output_shape == (None, 4)


@pytest.mark.parametrize(
    "kwargs, names",
    [
        (dict(input_shape=(64, 64, 3), image_size=32), ("image_size", "input_shape")),
        (dict(input_shape=(64, 64, 3), channels=1), ("channels", "input_shape")),
        (dict(classes=10, num_classes=5), ("num_classes", "classes")),
    ],
)
@pytest.mark.backend_independent
def test_conflicting_spellings_raise_naming_both(kwargs, names):
    with pytest.raises(ValueError, match=f"{names[0]}.*{names[1]}"):
        ViT_Ti16(**kwargs, **TINY)


@pytest.mark.parametrize("constructor", [ViT_Ti16, ViT_R26_S32, ViT])
@pytest.mark.backend_independent
def test_a_positional_bool_is_not_taken_for_a_size(constructor):
    for value in (False, True):
        with pytest.raises(ValueError, match=f"include_top={value}"):
            constructor(value)


def test_input_tensor_keeps_the_layers_that_made_it():
    images = keras.Input((32, 32, 3))
    scaled = keras.layers.Rescaling(1 / 127.5, offset=-1, name="scale")(images)
    model = ViT_Ti16(input_tensor=scaled, num_classes=5, **TINY)  # no image_size: 32 from the tensor
    assert model.input_shape == (None, 32, 32, 3) and model.inputs[0] is images
    assert "scale" in [layer.name for layer in model.layers]
    plain = ViT_Ti16(image_size=32, num_classes=5, **TINY)
    _same_weights(model, plain)
    pixels = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(model(pixels)), to_numpy(plain(pixels / 127.5 - 1.0)), atol=1e-5)
    with pytest.raises(ValueError, match="image_size"):
        ViT_Ti16(input_tensor=scaled, image_size=64, **TINY)


def _photos() -> list[np.ndarray]:
    china, flower = load_sample_image("china.jpg"), load_sample_image("flower.jpg")
    return [china[None, :300, :400], flower[None, 100:, 50:]]  # uint8, two different sizes


def test_include_preprocessing_takes_raw_photos_of_any_size(tmp_path):
    model = ViT_Ti16(include_preprocessing=True, image_size=32, num_classes=5, **TINY)
    assert model.input_shape == (None, None, None, 3)
    plain = ViT_Ti16(image_size=32, num_classes=5, **TINY)
    _same_weights(model, plain)
    preprocess = ImagePreprocessor(32)
    for photo in _photos():
        assert photo.dtype == np.uint8
        np.testing.assert_allclose(model.predict(photo, verbose=0), to_numpy(plain(preprocess(photo))), atol=1e-5)
    path = tmp_path / "model.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path)
    photo = _photos()[1]
    np.testing.assert_array_equal(reloaded.predict(photo, verbose=0), model.predict(photo, verbose=0))


@pytest.mark.backend_independent  # the checkpoint's size read into the config
def test_include_preprocessing_uses_the_checkpoint_resolution(tmp_path):
    path = write_checkpoint(tmp_path / "tiny.npz", vit_checkpoint(width=64, depth=1, heads=4, mlp=128, grid=(3, 3)))
    arch = dict(patch_size=16, hidden_size=64, depth=1, num_heads=4, mlp_dim=128)
    model = ViT(None, weights=str(path), include_preprocessing=True, **arch)
    plain = ViT(None, weights=str(path), **arch)
    assert plain.input_shape == (None, 48, 48, 3) and model.get_layer("preprocessing").image_size == (48, 48)
    photo = _photos()[0]
    np.testing.assert_allclose(
        model.predict(photo, verbose=0), to_numpy(plain(ImagePreprocessor(48)(photo))), atol=1e-5
    )


SMALL = dict(image_size=32, patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64)


def test_pooling_max_is_the_channelwise_maximum_of_the_patch_tokens():
    """keras.applications' pooling="max" (GlobalMaxPooling2D over the patches; the class token left out)."""
    model = ViT(None, include_top=False, pooling="max", **SMALL)
    assert model.output_shape == (None, 32)
    tokens = keras.Model(model.input, model.get_layer("encoder_norm").output)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(model(images)), to_numpy(tokens(images))[:, 1:].max(axis=1), rtol=1e-6)
    with pytest.raises(ValueError, match="pooling"):
        ViT(None, include_top=False, pooling="min", **SMALL)


def test_with_new_head_keeps_the_backbone_and_its_flags_and_starts_a_zero_head(tmp_path):
    arrays = vit_checkpoint(
        patch=8, width=32, depth=2, heads=2, mlp=64, grid=(4, 4), num_classes=10, representation_size=16
    )
    model = keras_vit.model_from_checkpoint(arrays)
    model.get_layer("encoderblock_0").trainable = False
    new = keras_vit.with_new_head(model, 3, classifier_activation="softmax")
    assert isinstance(new, keras_vit.VisionTransformer) and new.output_shape == (None, 3)
    assert new.config.representation_size is None and not to_numpy(new.get_layer("head").kernel).any()
    assert model.output_shape == (None, 10)  # the model given is left as it was
    assert not new.get_layer("encoderblock_0").trainable and new.get_layer("encoderblock_1").trainable
    backbone = [w for w in model.weights if not w.path.split("/")[0].startswith(("head", "pre_logits"))]
    assert len(new.weights) == len(backbone) + 2
    for ours, theirs in zip(new.weights, backbone):
        np.testing.assert_array_equal(to_numpy(ours), to_numpy(theirs))
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(new(images)), np.full((2, 3), 1 / 3), rtol=1e-6)  # zero logits
    headless = keras_vit.with_new_head(ViT(None, include_top=False, **SMALL), 4)
    assert headless.output_shape == (None, 4)
    with pytest.raises(ValueError, match=r"with_new_head needs a keras_vit model.*keras_vit.ViT\(\.\.\., classes=3\)"):
        keras_vit.with_new_head(keras.Model(model.input, model.output), 3)


@pytest.mark.parametrize(
    "name, variant, size",
    [
        ("vit_base_patch16_224", "B/16", 224),
        ("vit_base_patch16_384.augreg2_in21k_ft_in1k", "B/16", 384),
        ("vit_huge_patch14_224.orig_in21k", "H/14", 224),
        ("vit_base_r50_s16_384", "R50+B/16", 384),
        ("vit_small_r26_s32_224.augreg_in21k", "R26+S/32", 224),
        ("B_16.augreg_in21k_ft_in1k_384", "B/16", 384),
        ("R50_B_16.orig_in21k_ft_in1k", "R50+B/16", 384),
        ("B/16", "B/16", None),
    ],
)
@pytest.mark.backend_independent
def test_timm_and_catalogue_names_give_the_architecture_and_resolution(name, variant, size):
    from keras_vit.names import name_parts as _name_parts

    assert _name_parts(name)[:2] == (variant, size)


def test_vit_takes_timm_and_catalogue_names():
    model = ViT("vit_tiny_patch16_224.augreg2_in21k_ft_in1k", depth=1)  # timm's tag: the architecture only
    assert model.config == keras_vit.ViTConfig.from_variant("Ti/16", image_size=224, depth=1)
    assert model.name == "vit_ti16"
    assert ViT("S_32.augreg_in21k_ft_in1k_384", depth=1).config.image_size == (384, 384)
    assert ViT("vit_small_patch32_384", depth=1, image_size=64).config.image_size == (64, 64)  # given size wins
    with pytest.raises(ValueError, match="Unknown ViT variant 'vit_base_patch16_clip_224'"):
        ViT("vit_base_patch16_clip_224")


@pytest.mark.backend_independent
def test_weights_take_timm_tags_to_their_catalogue_entry():
    from keras_vit.names import checkpoint_name as _checkpoint_name

    assert _checkpoint_name("augreg_in21k_ft_in1k", "B/16", 384, None) == "B_16.augreg_in21k_ft_in1k_384"
    assert _checkpoint_name("vit_base_patch16_224.augreg_in1k", None, None, None) == "B_16.augreg_in1k_224"
    assert _checkpoint_name("orig_in21k", "ViT_H14", None, None) == "H_14.orig_in21k"
    # weights="imagenet" with a tagged model name: that tag's checkpoint, not the alias's first choice
    assert _checkpoint_name("imagenet", "B/16", 224, "orig_in21k_ft_in1k") == "B_16.orig_in21k_ft_in1k_224"
    assert _checkpoint_name("imagenet", "B/16", 384, "orig_in21k_ft_in1k") == "B_16.orig_in21k_ft_in1k"
    assert _checkpoint_name("imagenet", "B/16", 384, None) == "B_16.augreg_in21k_ft_in1k_384"
    assert _checkpoint_name("imagenet", "B/16", 384, "B_16.orig_in21k_ft_in1k") == "B_16.orig_in21k_ft_in1k"
    assert _checkpoint_name("runs/model.npz", "B/16", None, None) == "runs/model.npz"
    with pytest.raises(ValueError, match=r"timm's tag 'augreg2_in21k_ft_in1k' of B/16 at 224 px has no checkpoint"):
        _checkpoint_name("imagenet", "B/16", 224, "augreg2_in21k_ft_in1k")
    with pytest.raises(ValueError, match=r"is timm's S/16; the model is B/16"):
        _checkpoint_name("vit_small_patch16_224.augreg_in21k", "B/16", None, None)


@pytest.mark.backend_independent
@pytest.mark.parametrize("weights", ["", "  "])
def test_an_empty_weights_name_is_refused_not_read_as_the_current_folder(weights):
    with pytest.raises(ValueError, match=r"names no checkpoint"):
        ViT_Ti16(weights=weights, **TINY)


@pytest.mark.backends("tensorflow")  # JAX and torch: test_keras_conventions' precision checks
def test_dtype_takes_a_policy_as_keras_hub_backbones_do(tmp_path):
    """``dtype=``: the model's layers under that policy (the global one untouched), float32 logits from a mixed
    policy, the policy kept by a ``.keras`` file; pretrained weights load into bfloat16 variables."""
    path = write_checkpoint(tmp_path / "tiny.npz", vit_checkpoint(width=64, depth=1, heads=4, mlp=128, grid=(2, 2)))
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    before = keras.mixed_precision.dtype_policy().name
    mixed = ViT(weights=path, dtype="mixed_bfloat16")  # the file's model: 32 px, one block of width 64
    assert keras.mixed_precision.dtype_policy().name == before
    assert (
        mixed.dtype_policy.name == ViT_Ti16(32, depth=1, dtype="mixed_bfloat16").dtype_policy.name == "mixed_bfloat16"
    )
    assert mixed.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    assert mixed.get_layer("head").compute_dtype == mixed.get_layer("head").variable_dtype == "float32"
    logits = mixed(images)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    mixed.save(tmp_path / "mixed.keras")
    loaded = keras.saving.load_model(tmp_path / "mixed.keras")
    assert loaded.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    np.testing.assert_array_equal(to_numpy(loaded(images)), to_numpy(logits))

    plain = ViT(weights=path)
    pure = ViT(weights=path, dtype=keras.DTypePolicy("bfloat16"))
    assert {keras.backend.standardize_dtype(v.dtype) for v in pure.weights} == {"bfloat16"}
    for a, b in zip(pure.weights, plain.weights):  # the checkpoint's values, rounded to bfloat16
        np.testing.assert_allclose(to_numpy(a).astype("float32"), to_numpy(b), rtol=2**-8, atol=1e-6)
    expected = to_numpy(plain(images))
    for model in (mixed, pure):  # bfloat16 arithmetic: the float32 logits to about 2 decimal digits
        np.testing.assert_allclose(
            to_numpy(model(images)).astype("float32"), expected, atol=0.1 * np.abs(expected).max()
        )
