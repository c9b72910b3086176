"""The model config: one record from builder to file to flag. A model's ``get_config()`` is its config (through
``.keras``, every option at a non-default value), the config checks itself, and the layers and commands take
their options and choices from it."""

import dataclasses
import inspect
import json
import re
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import config as config_lib
from keras_vit import models
from keras_vit.config import ViTConfig
from keras_vit.fields import add_arguments, given
from keras_vit.layers import format_shape

REPO = Path(__file__).resolve().parents[1]
TINY = dict(patch_size=8, hidden_size=16, depth=2, num_heads=2, mlp_dim=32)

# Between them, every field of the config at a value other than its default (test_every_field_is_covered).
CONFIGS = {
    "hybrid, every structure and numerics option": ViTConfig.from_variant(
        None,
        **{**TINY, "patch_size": 1},
        resnet_stages=(1,),
        image_size=(32, 48),
        channels=1,
        data_format="channels_first",
        include_preprocessing=True,
        crop_fraction=0.875,
        interpolation="bicubic",
        num_classes=7,
        classifier_activation="softmax",
        class_names=("cat", "dog", "emu", "fox", "gnu", "owl", "yak"),
        classifier="gap",
        representation_size=8,
        position_embedding="relative",
        fc_norm=True,
        layer_scale_init=0.1,
        resnet_width=32,
        gelu="exact",
        layer_norm_epsilon=1e-12,
        std_conv_epsilon=1e-8,
        group_norm_epsilon=1e-5,
        weight_standardization="timm",
        dropout=0.1,
        attention_dropout=0.2,
        drop_path=0.3,
        remat=True,
    ),
    "CLIP / SigLIP options: norm_pre, qk-norm, QuickGELU, epsilon, the MAP head; padding": ViTConfig.from_variant(
        None,
        **TINY,
        image_size=(27, 30),
        dynamic_img_pad=True,
        classifier="map",
        norm_pre=True,
        qk_norm=True,
        gelu="quick",
        layer_norm_epsilon=1e-5,
        include_top=False,
        pooling="map",
    ),
    "features of images of any size": ViTConfig.from_variant(
        None, **TINY, image_size=32, dynamic_image_size=True, include_top=False, pooling="avg"
    ),
    "DeiT's and DINOv2's tokens, SwiGLU, bicubic at any size": ViTConfig.from_variant(
        None,
        **TINY,
        image_size=32,
        dynamic_image_size=True,
        position_interpolation="bicubic",
        num_register_tokens=2,
        distillation_token=True,
        class_position_embedding=False,
        mlp_type="swiglu",
    ),
}


def _own_fields():
    return [f for f in dataclasses.fields(ViTConfig) if f.name != "architecture"]


@pytest.mark.backend_independent
def test_every_field_is_covered():
    for field in _own_fields():
        assert any(getattr(c, field.name) != field.default for c in CONFIGS.values()), field.name
    assert any(c.architecture.resnet_stages is not None for c in CONFIGS.values())


@pytest.mark.parametrize(
    "name",  # the hybrid's ResNet compiles for about 15 s on JAX: its record is the same on every backend
    [pytest.param(n, marks=pytest.mark.backends("tensorflow")) if n.startswith("hybrid") else n for n in CONFIGS],
)
def test_get_config_is_the_config_record_through_a_keras_file(name, tmp_path):
    config = CONFIGS[name]
    model = keras_vit.models.build_vit(config)
    assert model.config == config and model.get_config()["config"] == config.to_dict()
    for variable in model.weights:
        variable.assign(np.random.default_rng(len(variable.path)).normal(0, 0.1, variable.shape))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert isinstance(loaded, keras_vit.VisionTransformer) and loaded.config == config
    assert ViTConfig.from_dict(loaded.get_config()["config"]) == config
    size = (40, 24) if config.dynamic_image_size or config.include_preprocessing else config.image_size
    shape = format_shape((2, *size, config.channels), config.data_format)
    images = np.random.default_rng(0).uniform(-1, 1, shape).astype("float32")
    np.testing.assert_array_equal(loaded.predict(images, verbose=0), model.predict(images, verbose=0))


def _trainable(model):
    """Every layer's and every variable's ``trainable``, by path."""
    flags = {path: layer.trainable for path, layer, _ in keras_vit.models._layer_paths(model)}
    return flags, [(variable.path, variable.trainable) for variable in model.weights]


def test_trainable_survives_a_keras_file_layer_by_layer(tmp_path):
    """Every third layer inside the model (each keras-vit layer, its sublayers) frozen or thawed against its
    parent: every flag, and every variable's, is the same after a round trip."""
    model = keras_vit.models.build_vit(CONFIGS["hybrid, every structure and numerics option"])  # every layer kind
    for i, (_, layer, parent) in enumerate(keras_vit.models._layer_paths(model)):
        layer.trainable = parent.trainable if i % 3 else not parent.trainable
    before = _trainable(model)
    assert 0 < len(model.trainable_weights) < len(model.weights)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert _trainable(loaded) == before
    assert len(loaded.trainable_weights) == len(model.trainable_weights)


def test_a_frozen_backbone_under_a_head_stays_frozen_through_a_keras_file_and_fit(tmp_path, recwarn):
    """keras.applications' transfer-learning recipe: 2 trainable weights before and after; one fit of the reloaded
    model moves the head and leaves the backbone bit-identical; no optimizer-state warning on load."""
    backbone = keras_vit.ViT(None, **TINY, image_size=16, include_top=False, pooling="token")
    backbone.trainable = False
    inputs = keras.Input((16, 16, 3))
    model = keras.Model(inputs, keras.layers.Dense(3)(backbone(inputs)))
    model.compile("adam", "mse", run_eagerly=True)  # one step each: no graph to trace
    images = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    targets = np.ones((4, 3), "float32")
    model.fit(images, targets, verbose=0)
    assert len(model.trainable_weights) == 2
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert len(loaded.trainable_weights) == 2 and not loaded.layers[1].trainable
    assert not [w for w in recwarn if "optimizer" in str(w.message)]
    frozen = [keras.ops.convert_to_numpy(w).copy() for w in loaded.layers[1].weights]
    head = keras.ops.convert_to_numpy(loaded.layers[-1].kernel).copy()
    loaded.fit(images, targets, verbose=0)
    for before, variable in zip(frozen, loaded.layers[1].weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), before)
    assert not np.array_equal(keras.ops.convert_to_numpy(loaded.layers[-1].kernel), head)


def test_a_model_saved_under_a_policy_loads_under_it(tmp_path):
    with keras_vit.precision.global_policy("mixed_bfloat16"):
        model = keras_vit.ViT(None, **TINY, image_size=16)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")  # under the float32 policy
    assert loaded.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    assert loaded.get_layer("head").compute_dtype == "float32"


@pytest.mark.backend_independent
def test_the_record_is_plain_json_and_back():
    for config in CONFIGS.values():
        values = json.loads(json.dumps(config.to_dict()))
        assert ViTConfig.from_dict(values) == config
    assert ViTConfig.from_dict(dict(TINY)) == ViTConfig.from_variant(None, **TINY)  # missing fields: defaults


def test_vit_is_parse_replace_build():
    model = keras_vit.ViT("Ti/16", image_size=32, depth=1, gelu="exact", layer_scale_init=1e-4)
    assert model.config == ViTConfig.from_variant("Ti/16", image_size=32, depth=1, gelu="exact", layer_scale_init=1e-4)
    assert model.config.replace(depth=3).architecture.depth == 3
    assert ViTConfig.from_variant("R50+B/16").replace(std_conv_epsilon=1e-8).std_conv_epsilon == 1e-8


@pytest.mark.parametrize(
    "fields, error, message",
    [
        (dict(width=3), TypeError, r"unexpected keyword arguments \['width'\]"),
        (dict(gelu="relu"), ValueError, "Unknown gelu 'relu'"),
        (dict(position_embedding="rope"), ValueError, "Unknown position_embedding 'rope'"),
        (dict(dropout=1.0), ValueError, r"dropout must be a number in \[0, 1\)"),
        (dict(layer_scale_init=0.0), ValueError, "layer_scale_init must be a positive number"),
        (dict(remat="yes"), ValueError, "`remat` must be True or False"),
        (dict(image_size=30), ValueError, "not divisible by the patch size 16.*dynamic_img_pad=True"),
        (dict(data_format="NCHW"), ValueError, "Unknown data_format 'NCHW'; expected one of"),
        (dict(dynamic_img_pad=1), ValueError, "`dynamic_img_pad` must be True or False"),
        (dict(classifier="gap", pooling="token"), ValueError, "needs classifier='token'"),
        (dict(include_preprocessing=True, dynamic_image_size=True), ValueError, "leave dynamic_image_size off"),
        (dict(std_conv_epsilon=1e-8), ValueError, r"\['std_conv_epsilon'\] set a hybrid's ResNet"),
    ],
)
@pytest.mark.backend_independent
def test_the_config_checks_itself(fields, error, message):
    with pytest.raises(error, match=message):
        ViTConfig.from_variant("B/16", **fields)


@pytest.mark.backend_independent
def test_layer_options_are_arguments_of_their_layers():
    config = CONFIGS["hybrid, every structure and numerics option"]
    for layer, cls in (("block", keras_vit.TransformerBlock), ("resnet", keras_vit.ResNetStem)):
        options = config.layer_options(layer)
        assert options and set(options) <= set(inspect.signature(cls).parameters), layer
        assert config_lib.options_of_layer(layer, options) == {
            name: getattr(config, name) for name in config_lib.layer_field_names(layer)
        }


def test_a_plain_functional_model_shows_its_options_through_its_layers():
    model = keras_vit.ViT(
        None, **TINY, image_size=16, gelu="exact", layer_scale_init=0.5, classifier="gap", fc_norm=True
    )
    wrapped = keras.Model(model.inputs, model.outputs)
    options = keras_vit.models.model_options(wrapped)
    assert {k: options[k] for k in ("gelu", "layer_scale_init", "fc_norm")} == dict(
        gelu="exact", layer_scale_init=0.5, fc_norm=True
    )


def test_model_flags_come_from_the_config():
    names = config_lib.field_names("architecture", "structure", "numerics")
    flags = config_lib.model_flags("Flags", names, "the flags", unset={"gelu": "the source's"})
    fields = {f.name: f for f in dataclasses.fields(flags)}
    assert list(fields) == list(names) and all(f.default is None for f in fields.values())
    assert fields["gelu"].metadata["choices"] == config_lib.GELUS and fields["gelu"].metadata["unset"] == "the source's"
    assert fields["fc_norm"].metadata["help"] == {f.name: f for f in _own_fields()}["fc_norm"].metadata["help"]
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser, flags())
    args = parser.parse_args(["--gelu", "exact", "--resnet-stages", "3,4,9", "--fc-norm", "--layer-scale-init", "1e-5"])
    assert given(args, flags) == dict(gelu="exact", resnet_stages=(3, 4, 9), fc_norm=True, layer_scale_init=1e-5)
    with pytest.raises(SystemExit):
        parser.parse_args(["--gelu", "erf"])


@pytest.mark.backend_independent
def test_choice_lists_are_written_once():
    """Every choice list of the config is typed out in keras_vit/config.py only: not in the library, the
    training commands or the zoo's."""
    choices = [config_lib.GELUS, config_lib.CLASSIFIERS, config_lib.RESIZE_METHODS, config_lib.WEIGHT_STANDARDIZATIONS]
    patterns = [re.compile(r",\s*".join(f"[\"']{re.escape(c)}[\"']" for c in choice)) for choice in choices]
    for path in (path for folder in ("keras_vit", "training", "zoo") for path in (REPO / folder).rglob("*.py")):
        if path == REPO / "keras_vit" / "config.py":
            continue
        text = path.read_text()
        for pattern in patterns:
            assert not pattern.search(text), f"{path.relative_to(REPO)} types out {pattern.pattern}"


# --- bad model arguments: a ValueError naming the argument and its value, raised before any layer is built ---------

BAD_INPUT_TINY = dict(image_size=32, patch_size=8, depth=1, num_classes=5)
BAD_INPUT_HYBRID = ("R26+S/32", dict(image_size=32, depth=1, num_classes=5))

# (argument, bad value): each must be a ValueError naming both, from keras_vit.ViT and the named constructors.
BAD_MODEL_ARGUMENTS = [
    ("image_size", 0),
    ("image_size", -32),
    ("image_size", (32, 0)),
    ("image_size", True),
    ("patch_size", 0),
    ("patch_size", True),
    ("num_heads", 0),
    ("depth", 0),
    ("depth", -1),
    ("channels", 0),
    ("channels", True),
    ("num_classes", 0),
    ("drop_path", 1.0),
    ("drop_path", -0.1),
    ("drop_path", float("nan")),
    ("dropout", 1.0),
    ("dropout", -0.5),
    ("attention_dropout", 1.5),
    ("attention_dropout", -0.1),
]


def _ids(cases):
    return [f"{name}={value!r}" for name, value in cases]


@pytest.fixture
def no_layers(monkeypatch):
    """Fail the test if the builder gets as far as making a layer."""

    def embed(*args, **kwargs):
        raise AssertionError("a layer was built before the arguments were checked")

    monkeypatch.setattr(models, "embed", embed)


@pytest.mark.backend_independent
@pytest.mark.parametrize("name, value", BAD_MODEL_ARGUMENTS, ids=_ids(BAD_MODEL_ARGUMENTS))
def test_vit_rejects_a_bad_argument_naming_it_before_building(no_layers, name, value):
    with pytest.raises(ValueError, match=name) as error:
        keras_vit.ViT("Ti/16", **{**BAD_INPUT_TINY, name: value})
    assert repr(value) in str(error.value)
    with pytest.raises(ValueError, match=name):
        keras_vit.ViT_Ti16(**{**BAD_INPUT_TINY, name: value})


@pytest.mark.parametrize("name, value", [("image_size", 0), ("drop_path", 1.0), ("channels", 0), ("depth", 0)])
@pytest.mark.backends("tensorflow", "torch")  # slow to compile on JAX
def test_hybrid_constructors_reject_bad_arguments_too(no_layers, name, value):
    with pytest.raises(ValueError, match=name):
        keras_vit.ViT_R26_S32(**{**BAD_INPUT_HYBRID[1], name: value})
