"""DeiT, DeiT III and DINOv2 (with and without registers): prefix tokens, SwiGLU, DINOv2's interpolation.

Parity with timm: a randomly initialised timm model of each architecture (tiny dims) writes its own state dict and
its outputs on scikit-learn's two sample photos; keras-vit loads the file and must give the same numbers. These
run on every backend (the CI's JAX and torch rounds make them the cross-backend parity of each family).
"""

import json

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from reference_runs import TIMM_SCRIPT, run_reference
from sklearn.datasets import load_sample_images

import keras_vit
from keras_vit.config import ViTConfig
from keras_vit.models import build_vit
from keras_vit.tokens import distillation_model, num_prefix_tokens

TOLERANCE = 1e-4
TINY = dict(depth=1, embed_dim=64, num_heads=2)

# name: (timm model, its overrides, image size, file suffix)
TIMM_CASES = {
    "deit": ("deit_tiny_patch16_224", dict(TINY, img_size=32, num_classes=5), 32, ".pth"),
    "deit_distilled": ("deit_tiny_distilled_patch16_224", dict(TINY, img_size=32, num_classes=5), 32, ".pth"),
    "deit3": ("deit3_small_patch16_224", dict(TINY, img_size=32, num_classes=5), 32, ".safetensors"),
    "dinov2": ("vit_small_patch14_dinov2", dict(TINY, img_size=42, num_classes=0), 42, ".safetensors"),
    "dinov2_reg4": ("vit_small_patch14_reg4_dinov2", dict(TINY, img_size=42, num_classes=0), 42, ".pth"),
    "dinov2_swiglu": (
        "vit_giant_patch14_dinov2",
        dict(TINY, img_size=28, num_classes=0, mlp_ratio=4.0),
        28,
        ".safetensors",
    ),
}
DYNAMIC_SIZES = (28, 70)  # the dinov2 case at two other resolutions (grids 2x2 and 5x5 from its 3x3)


def photos(size: int) -> np.ndarray:
    """scikit-learn's two sample photos (china.jpg, flower.jpg), a centre crop of each, every ``4``-th pixel,
    ``size`` square, scaled to [-1, 1]."""
    crops = []
    for image in load_sample_images().images:
        h, w = image.shape[:2]
        top, left = (h - 4 * size) // 2, (w - 4 * size) // 2
        crops.append(image[top : top + 4 * size : 4, left : left + 4 * size : 4].astype("float32"))
    return (np.stack(crops) - 127.5) / 127.5


@pytest.fixture(scope="module")
def timm_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("timm_family")

    def job(model, kwargs, size, outputs, **file):
        images = tmp / f"images{size}.npy"
        np.save(images, photos(size))
        return dict(model=model, kwargs=kwargs, images=str(images), logits=str(tmp / outputs), **file)

    jobs = [
        job(model, kwargs, size, f"{name}.npy", save=str(tmp / f"{name}{suffix}"))
        for name, (model, kwargs, size, suffix) in TIMM_CASES.items()
    ]
    model, kwargs, _, suffix = TIMM_CASES["dinov2"]
    dynamic = dict(kwargs, dynamic_img_size=True)  # timm's own resampling (resample_abs_pos_embed) at two sizes
    load = str(tmp / f"dinov2{suffix}")
    jobs += [job(model, dynamic, size, f"dinov2_{size}.npy", load=load) for size in DYNAMIC_SIZES]
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    run_reference(TIMM_SCRIPT, tmp / "jobs.json")
    return tmp


def _from_timm(timm_files, case, **overrides):
    _, kwargs, _, suffix = TIMM_CASES[case]
    embeddings = {} if kwargs["num_classes"] else dict(include_top=False, pooling="token")
    path = timm_files / f"{case}{suffix}"
    return keras_vit.model_from_checkpoint(path, num_heads=kwargs["num_heads"], **embeddings, **overrides)


@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
@pytest.mark.parametrize("case", list(TIMM_CASES))
def test_timm_family_state_dicts_give_timms_outputs(timm_files, case):
    model = _from_timm(timm_files, case)
    size = TIMM_CASES[case][2]
    np.testing.assert_allclose(
        to_numpy(model(photos(size))), np.load(timm_files / f"{case}.npy"), atol=TOLERANCE, rtol=0
    )
    expected = {
        "deit": {},
        "deit_distilled": dict(distillation_token=True),
        "deit3": dict(class_position_embedding=False, layer_scale_init=1e-5),
        "dinov2": dict(layer_scale_init=1e-5),
        "dinov2_reg4": dict(num_register_tokens=4, class_position_embedding=False, layer_scale_init=1e-5),
        "dinov2_swiglu": dict(mlp_type="swiglu", layer_scale_init=1e-5),
    }[case]
    for name, value in expected.items():
        assert getattr(model.config, name) == value, name


@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
@pytest.mark.parametrize("size", DYNAMIC_SIZES)
def test_dinov2_interpolation_matches_timm_at_other_sizes(timm_files, size):
    model = _from_timm(timm_files, "dinov2", dynamic_image_size=True, position_interpolation="bicubic")
    outputs = to_numpy(model(photos(size)))
    np.testing.assert_allclose(outputs, np.load(timm_files / f"dinov2_{size}.npy"), atol=TOLERANCE, rtol=0)
    zoomed = _from_timm(timm_files, "dinov2", dynamic_image_size=True)  # the paper's zoom_linear differs
    assert np.abs(to_numpy(zoomed(photos(size))) - outputs).max() > 1e-3
    # the family's name loads the checkpoint at a fixed other size the same way (its position_interpolation)
    tiny = dict(hidden_size=64, depth=1, num_heads=2, mlp_dim=256, include_top=False, pooling="token")
    fixed = keras_vit.ViT("dinov2_s14", weights=str(timm_files / "dinov2.safetensors"), image_size=size, **tiny)
    np.testing.assert_allclose(to_numpy(fixed(photos(size))), outputs, atol=TOLERANCE, rtol=0)


EXPORTED = (
    dict(distillation_token=True),
    dict(num_register_tokens=2, class_position_embedding=False, layer_scale_init=0.1),
    dict(mlp_type="swiglu", class_position_embedding=False),
)


@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
@pytest.mark.backends("tensorflow")
def test_family_exports_back_to_timm(tmp_path):
    np.save(tmp_path / "images.npy", photos(32))
    models, jobs = [], []
    for i, options in enumerate(EXPORTED):  # one timm process for all
        model = keras_vit.ViT(
            None, patch_size=8, hidden_size=64, depth=2, num_heads=4, mlp_dim=128, image_size=32, num_classes=5,
            gelu="exact", **options,
        )  # fmt: skip
        rng = np.random.default_rng(i)
        for variable in model.weights:
            variable.assign(rng.normal(0, 0.1, variable.shape))
        keras_vit.save_timm_safetensors(model, tmp_path / f"model{i}.safetensors")
        kwargs = keras_vit.checkpoints.timm_model_kwargs(model)
        files = dict(images=str(tmp_path / "images.npy"), logits=str(tmp_path / f"logits{i}.npy"))
        jobs.append(dict(model=kwargs.pop("model_name"), kwargs=kwargs, load=str(tmp_path / f"model{i}.safetensors")))
        jobs[-1].update(files)
        models.append(model)
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    run_reference(TIMM_SCRIPT, tmp_path / "jobs.json")
    for i, model in enumerate(models):
        expected = np.load(tmp_path / f"logits{i}.npy")
        np.testing.assert_allclose(expected, to_numpy(model(photos(32))), atol=TOLERANCE, rtol=0)


HF_SCRIPT = """
import sys
import numpy as np
import torch
import transformers as t
torch.manual_seed(0)
out, images = sys.argv[1], torch.from_numpy(np.load(sys.argv[2])).permute(0, 3, 1, 2)
tiny = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=14)
models = {
    "deit": t.DeiTForImageClassificationWithTeacher(t.DeiTConfig(**tiny, intermediate_size=64, num_labels=3)),
    "dinov2_swiglu": t.Dinov2Model(t.Dinov2Config(**tiny, use_swiglu_ffn=True)),
    "dinov2_registers": t.Dinov2WithRegistersModel(t.Dinov2WithRegistersConfig(**tiny, num_register_tokens=4)),
}
for name, model in models.items():
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.2 if p.ndim == 1 else 0.05))
        model.save_pretrained(f"{out}/{name}")
        result = model(pixel_values=images)
    outputs = result.logits if name == "deit" else result.last_hidden_state
    np.save(f"{out}/{name}.npy", outputs.numpy())
"""


@pytest.mark.reference
@pytest.mark.requires("transformers", "torch")
@pytest.mark.backends("tensorflow")
def test_huggingface_family_folders_give_transformers_outputs(tmp_path):
    np.save(tmp_path / "images.npy", photos(28))
    run_reference(HF_SCRIPT, tmp_path, tmp_path / "images.npy")
    fields = {
        "deit": dict(distillation_token=True),
        "dinov2_swiglu": dict(mlp_type="swiglu", layer_scale_init=1e-5),
        "dinov2_registers": dict(num_register_tokens=4, layer_scale_init=1e-5),
    }
    for name, expected in fields.items():
        tokens = {} if name == "deit" else dict(include_top=False)
        model = keras_vit.model_from_checkpoint(tmp_path / name, **tokens)
        for field, value in expected.items():
            assert getattr(model.config, field) == value, (name, field)
        outputs = to_numpy(model(photos(28)))
        np.testing.assert_allclose(outputs, np.load(tmp_path / f"{name}.npy"), atol=TOLERANCE, rtol=0, err_msg=name)


def tiny(**options) -> keras.Model:
    config = ViTConfig.from_variant(
        None, patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64, image_size=32, num_classes=3
    )
    model = build_vit(config.replace(**options))
    rng = np.random.default_rng(1)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.2, variable.shape))
    return model


def test_distilled_model_returns_the_mean_of_its_two_heads():
    model = tiny(distillation_token=True)
    images = photos(32)
    head, head_dist = (to_numpy(x) for x in distillation_model(model)(images))
    assert np.abs(head - head_dist).max() > 1e-3  # two different heads
    np.testing.assert_allclose(to_numpy(model(images)), (head + head_dist) / 2, atol=1e-6)
    with pytest.raises(ValueError, match="no distillation head"):
        distillation_model(tiny())


def test_register_tokens_sit_after_the_class_token_without_position_embeddings():
    model = tiny(num_register_tokens=3)
    assert num_prefix_tokens(model) == 4
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, 1 + 16, 32)  # class token + patches
    tokens = keras.Model(model.input, model.get_layer("register_tokens").output)(photos(32))
    registers = to_numpy(model.get_layer("register_tokens").tokens)[0]
    np.testing.assert_array_equal(to_numpy(tokens)[:, 1:4], np.broadcast_to(registers, (2, 3, 32)))
    # the features skip the registers: the avg pooling is the mean of the 16 patch tokens only
    features = build_vit(model.config.replace(include_top=False, pooling="avg"))
    features.set_weights(model.get_weights()[:-2])  # all but the head
    encoded = keras.Model(features.input, features.get_layer("encoder_norm").output)(photos(32))
    np.testing.assert_allclose(to_numpy(features(photos(32))), to_numpy(encoded)[:, 4:].mean(axis=1), atol=1e-5)


def test_swiglu_is_silu_of_one_half_times_the_other():
    model = tiny(mlp_type="swiglu", depth=1)
    mlp = model.get_layer("encoderblock_0").mlp
    assert mlp.fc1.kernel.shape == (32, 64) and mlp.fc2.kernel.shape == (32, 32)
    x = np.random.default_rng(0).normal(size=(2, 5, 32)).astype("float32")
    h = x @ to_numpy(mlp.fc1.kernel) + to_numpy(mlp.fc1.bias)
    a, b = h[..., :32], h[..., 32:]
    expected = (a / (1 + np.exp(-a)) * b) @ to_numpy(mlp.fc2.kernel) + to_numpy(mlp.fc2.bias)
    np.testing.assert_allclose(to_numpy(mlp(x)), expected, atol=1e-5)
    with pytest.raises(ValueError, match="even"):
        tiny(mlp_type="swiglu", mlp_dim=63)


def test_dinov2_dense_features_at_two_input_sizes():
    model = tiny(
        num_register_tokens=4,
        class_position_embedding=False,
        dynamic_image_size=True,
        position_interpolation="bicubic",
        include_top=False,
    )
    features = keras_vit.feature_model(model, blocks=-1)
    for size in (32, 56):
        maps = to_numpy(features(photos(size)))
        assert maps.shape == (2, size // 8, size // 8, 32)
        tokens = to_numpy(model(photos(size)))
        assert tokens.shape == (2, 5 + (size // 8) ** 2, 32)


@pytest.mark.backends("tensorflow")  # the files and the probe; each backend's numbers: the parity tests
def test_analyses_run_on_a_register_model_and_skip_its_prefix_tokens():
    from keras_vit.analysis.attention import analyse_attention
    from keras_vit.analysis.geometry import token_geometry

    model = tiny(num_register_tokens=4, distillation_token=True)
    geometry = token_geometry(model)
    assert geometry.num_prefix_tokens == 6 and geometry.grid_size == (4, 4)
    result = analyse_attention(model, photos(32))
    assert result.maps.shape == (2, 4, 4) and np.isfinite(result.maps).all()
    assert result.distances.shape == (2, 2) and (result.distances > 0).all()


@pytest.mark.parametrize(
    "options",
    [
        dict(num_register_tokens=4),
        dict(distillation_token=True),
        dict(class_position_embedding=False),
        dict(mlp_type="swiglu"),
        dict(dynamic_image_size=True, position_interpolation="bicubic", num_register_tokens=1),
    ],
)
def test_family_fields_round_trip_through_keras_files(tmp_path, options):
    model = tiny(**options)
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras")
    for name, value in options.items():
        assert getattr(again.config, name) == value
    np.testing.assert_allclose(to_numpy(again(photos(32))), to_numpy(model(photos(32))), atol=1e-6)


def test_family_fields_default_to_todays_model():
    config = ViTConfig.from_variant("Ti/16")
    assert (config.num_register_tokens, config.distillation_token, config.class_position_embedding) == (0, False, True)
    assert (config.mlp_type, config.position_interpolation, config.num_prefix_tokens) == ("gelu", "zoom_linear", 1)
    with pytest.raises(ValueError, match="classifier='token'"):
        ViTConfig.from_variant("Ti/16", classifier="gap", distillation_token=True)
    with pytest.raises(ValueError, match="num_register_tokens"):
        ViTConfig.from_variant("Ti/16", num_register_tokens=-1)


@pytest.mark.parametrize("name", ["deit_b16_distilled", "deit3_l16", "dinov2_g14_reg4", "DINOv2_vitb14_reg"])
def test_family_names_are_variants_with_their_fields(name):
    from keras_vit.variants import canonical_variant, constructor_name, family_variant

    config = ViTConfig.from_variant(name)
    expected = {
        "deit_b16_distilled": dict(hidden_size=768, distillation_token=True, gelu="exact"),
        "deit3_l16": dict(hidden_size=1024, class_position_embedding=False, layer_scale_init=1e-6),
        "dinov2_g14_reg4": dict(hidden_size=1536, depth=40, mlp_type="swiglu", num_register_tokens=4, image_size=518),
        "DINOv2_vitb14_reg": dict(hidden_size=768, num_register_tokens=4, position_interpolation="bicubic"),
    }[name]
    for field, value in expected.items():
        source = config.architecture if hasattr(config.architecture, field) else config
        assert getattr(source, field) == (value if field != "image_size" else (value, value)), field
    assert family_variant(name) and ViTConfig.from_variant(name, gelu="tanh").gelu == "tanh"  # keywords win
    constructor = getattr(keras_vit, constructor_name(name))
    assert constructor.__name__ == constructor_name(canonical_variant(name))
    model = constructor(28 if "14" in name else 32, depth=1, hidden_size=32, num_heads=2, mlp_dim=64, num_classes=3)
    assert model.name == constructor.__name__.lower() and model.config.num_prefix_tokens == config.num_prefix_tokens


SHAPES_SCRIPT = """
import json, sys
import timm, torch
shapes = {}
for name in json.load(open(sys.argv[1])):
    with torch.device("meta"):  # the published layout's shapes, nothing allocated
        model = timm.create_model(name, pretrained=False)
    shapes[name] = {key: list(value.shape) for key, value in model.state_dict().items()}
json.dump(shapes, open(sys.argv[2], "w"))
"""
FAMILIES = ("deit", "deit3", "dinov2")


@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
@pytest.mark.backends("tensorflow")
def test_each_family_catalogue_entry_is_the_architecture_its_name_says(tmp_path):
    from keras_vit import zoo
    from keras_vit.checkpoints.read import check_catalogue_shapes
    from keras_vit.zoo.errors import CorruptCheckpointError

    entries = [e for e in zoo.catalogue() if e.family in FAMILIES]
    names = {v for v in keras_vit.variants.FAMILY_VARIANTS if v.startswith(("DeiT", "DINOv2"))}
    assert {e.variant for e in entries} == names and len(names) == 17
    (tmp_path / "names.json").write_text(json.dumps([e.aliases[0] for e in entries]))
    run_reference(SHAPES_SCRIPT, tmp_path / "names.json", tmp_path / "shapes.json")
    shapes = json.loads((tmp_path / "shapes.json").read_text())
    for entry in entries:
        published = {key: tuple(shape) for key, shape in shapes[entry.aliases[0]].items()}
        check_catalogue_shapes(entry, published, entry.aliases[0])  # raises where the name is another model
        assert zoo.get(entry.aliases[0]) is entry and entry.url.startswith("https://huggingface.co/timm/")
        assert entry.parameters == sum(int(np.prod(shape)) for shape in published.values())
        assert entry.embedding_width == keras_vit.variants.parse_variant(entry.variant).hidden_size
        assert set(entry.preprocessing) == {"mean", "std", "crop_fraction", "interpolation", "source"}
        assert entry.licence == "Apache-2.0" and "arXiv:" in entry.paper and entry.top1 is None
    by_name = {e.name: e for e in entries}
    for name, other in (("dinov2_s14.lvd142m", "dinov2_s14_reg4.lvd142m"), ("deit_b16.fb_in1k", "deit3_b16.fb_in1k")):
        other_shapes = {key: tuple(shape) for key, shape in shapes[by_name[other].aliases[0]].items()}
        with pytest.raises(CorruptCheckpointError, match="another architecture"):
            check_catalogue_shapes(by_name[name], other_shapes, other)


def test_a_family_entrys_parameters_are_those_of_the_built_model():
    from keras_vit import zoo

    entry = zoo.get("deit_tiny_distilled_patch16_224.fb_in1k")  # timm's name, an alias
    model = keras_vit.ViT(entry.variant, image_size=entry.image_size, num_classes=entry.num_classes)
    assert entry.name == "deit_ti16_distilled.fb_in1k" and model.count_params() == entry.parameters


def test_zoo_lists_each_family(capsys):
    from keras_vit.zoo.__main__ import main as zoo_main

    for family in FAMILIES:
        zoo_main(["list", "--family", family, "--json"])
        rows = json.loads(capsys.readouterr().out)
        assert rows and {row["family"] for row in rows} == {family}
        assert all(row["url"].startswith("https://huggingface.co/timm/") and row["aliases"] for row in rows)


@pytest.mark.backends("tensorflow")  # the files and the probe; each backend's numbers: the parity tests
def test_finetune_a_dinov2_register_model_with_lora_from_its_timm_file(tmp_path):
    """The family through the training command's path: ``finetune --model dinov2_s14_reg4 --weights FILE
    --lora-rank 2`` (shrunk to one narrow block) keeps the family's fields (4 registers, layer scale, no class
    position), takes the encoder from the timm file, trains only the adapters and the new head, and its saved model
    reloads with them."""
    from keras_vit.training.finetune import finetune

    shape = dict(hidden_size=32, depth=1, num_heads=2, mlp_dim=64, image_size=28)
    source = keras_vit.ViT("dinov2_s14_reg4", include_top=False, pooling="token", **shape)
    rng = np.random.default_rng(3)
    for variable in source.weights:
        variable.assign(rng.normal(0, 0.2, variable.shape))
    keras_vit.save_timm_safetensors(source, tmp_path / "dinov2.safetensors")
    headed = keras_vit.ViT("dinov2_s14_reg4", num_classes=5, **shape)
    with pytest.warns(UserWarning, match="no classification head. The model's head stays at its initialisation"):
        keras_vit.load_weights(headed, tmp_path / "dinov2.safetensors")  # a backbone's file into a model with a head
    run = dict(batch_size=16, steps=3, eval_every=3, warmup=1, verbose=0, mixed_precision="none", lr=0.05)
    result = finetune(
        model="dinov2_s14_reg4",
        weights=str(tmp_path / "dinov2.safetensors"),
        lora_rank=2,
        output_dir=str(tmp_path / "run"),
        **shape,
        **run,
    )
    config = result.model.config
    assert (config.num_register_tokens, config.class_position_embedding, config.num_classes) == (4, False, 10)
    assert config.layer_scale_init is not None
    registers = result.model.get_layer("register_tokens").weights[0]
    np.testing.assert_allclose(to_numpy(registers), to_numpy(source.get_layer("register_tokens").weights[0]), atol=1e-6)
    trainable = {v.path for v in result.model.trainable_variables}
    assert trainable and all("lora" in p or p.startswith("head/") for p in trainable), sorted(trainable)
    again = keras.saving.load_model(tmp_path / "run" / "model.keras")
    assert again.config.num_register_tokens == 4
    np.testing.assert_allclose(to_numpy(again(photos(28))), to_numpy(result.model(photos(28))), atol=1e-5)


@pytest.mark.backends("tensorflow")  # the files and the probe; each backend's numbers: the parity tests
def test_few_shot_probe_runs_on_dinov2_embeddings():
    """The paper's few-shot linear probe (Section 4.5) on a register model's class-token embedding: scikit-learn's
    digits at 28 px, 10 shots, far above chance (10%) even with random weights."""
    from keras_vit.analysis.fewshot import extract_features, few_shot_evaluation
    from keras_vit.datasets import load_digits, stratified_split

    shape = dict(hidden_size=32, depth=1, num_heads=2, mlp_dim=64, image_size=28)
    model = keras_vit.ViT("dinov2_s14_reg4", include_top=False, pooling="token", **shape)
    rng = np.random.default_rng(1)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.2, variable.shape))
    digits, labels = load_digits()
    images = np.pad(np.repeat(np.repeat(digits, 3, axis=1), 3, axis=2), ((0, 0), (2, 2), (2, 2)))  # 28 px
    images = images[..., None].repeat(3, axis=-1) / 127.5 - 1.0
    kept, held = stratified_split(labels, 0.2)
    train, test = extract_features(model, images[kept[:300]]), extract_features(model, images[held[:200]])
    assert train.shape == (300, 32) and np.isfinite(train).all()
    accuracy = few_shot_evaluation(train, labels[kept[:300]], test, labels[held[:200]], shots=(10,))
    assert accuracy[10].mean() > 0.3, accuracy
