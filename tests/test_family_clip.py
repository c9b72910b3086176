"""CLIP's and SigLIP's image towers: their features (norm_pre, QuickGELU, qk-norm, the MAP head), variants,
timm and Hugging Face files both ways, and the few-shot probe on their embeddings.

timm and transformers build small random models of each architecture in subprocesses that never import TensorFlow
(see tests/checkpoints/test_timm.py), save them with their own libraries and write their outputs on crops of
scikit-learn's two sample photos; keras-vit loads the files and must give the same numbers (float32, 1e-4).
"""

import json
import warnings

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from reference_runs import TIMM_SCRIPT, run_reference, write_timm_files
from sklearn.datasets import load_sample_images

import keras_vit
from keras_vit import zoo
from keras_vit.analysis.fewshot import extract_features, few_shot_evaluation
from keras_vit.checkpoints.from_timm import timm_to_npz
from keras_vit.checkpoints.infer import checkpoint_info, shapes_only
from keras_vit.checkpoints.read import catalogue_check
from keras_vit.datasets import load_digits, stratified_split
from keras_vit.heads import MAPHead
from keras_vit.variants import FAMILY_VARIANTS
from keras_vit.zoo.errors import CorruptCheckpointError

TOLERANCE = 1e-4
TINY = dict(embed_dim=32, depth=1, num_heads=2)  # timm's names
# name: (timm model, its kwargs, image size, suffix, keras-vit options timm's file does not record)
TIMM_CASES = {
    "clip_b32": ("vit_base_patch32_clip_quickgelu_224", dict(TINY, img_size=64, num_classes=16), 64, ".pth"),
    "clip_b16": ("vit_base_patch16_clip_quickgelu_224", dict(TINY, img_size=32, num_classes=16), 32, ".safetensors"),
    "clip_l14": ("vit_large_patch14_clip_quickgelu_224", dict(TINY, img_size=28, num_classes=24), 28, ".safetensors"),
    "siglip_b16": ("vit_base_patch16_siglip_224", dict(TINY, img_size=32, num_classes=0), 32, ".safetensors"),
    "siglip_b16_384": ("vit_base_patch16_siglip_384", dict(TINY, img_size=48, num_classes=0), 48, ".pth"),
    "qk_norm": ("vit_base_patch16_224", dict(TINY, img_size=32, num_classes=5, qk_norm=True), 32, ".safetensors"),
}
KERAS_OPTIONS = {  # timm's files do not say QuickGELU; a SigLIP tower has no head: its embedding is the MAP head's
    "clip_b32": dict(gelu="quick"),
    "clip_b16": dict(gelu="quick"),
    "clip_l14": dict(gelu="quick"),
    "siglip_b16": dict(include_top=False, pooling="map"),
    "siglip_b16_384": dict(include_top=False, pooling="map"),
}

HF_SCRIPT = """
import sys
import numpy as np
import torch
from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection, SiglipVisionConfig, SiglipVisionModel
torch.manual_seed(0)
out, images = sys.argv[1], torch.from_numpy(np.load(sys.argv[2])).permute(0, 3, 1, 2)
shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
             patch_size=8)
for name, model in (
    ("clip", CLIPVisionModelWithProjection(CLIPVisionConfig(projection_dim=16, **shape))),
    ("siglip", SiglipVisionModel(SiglipVisionConfig(**shape))),
):
    model = model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.2 if p.ndim == 1 else 0.05))
        model.save_pretrained(f"{out}/{name}")
        result = model(pixel_values=images)
    if name == "clip":
        np.save(f"{out}/clip_embeds.npy", result.image_embeds.numpy())
        np.save(f"{out}/clip_pooler.npy", result.last_hidden_state[:, 0].numpy())
    else:
        np.save(f"{out}/siglip_pooler.npy", result.pooler_output.numpy())
"""


def photos(size: int) -> np.ndarray:
    """A ``size`` x ``size`` crop of each of scikit-learn's two sample photos (china, flower), in [-1, 1]."""
    crops = [image[100 : 100 + size, 150 : 150 + size] for image in load_sample_images().images]
    return (np.stack(crops).astype("float32") - 127.5) / 127.5


@pytest.fixture(scope="module")
def timm_files(tmp_path_factory):
    return write_timm_files(tmp_path_factory.mktemp("timm_clip"), TIMM_CASES, photos)


@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
@pytest.mark.parametrize("case", list(TIMM_CASES))
@pytest.mark.filterwarnings("ignore:.*was trained with gelu='exact'")  # timm's files do not record QuickGELU
def test_timm_state_dicts_give_timms_outputs(timm_files, case):
    _, _, size, suffix = TIMM_CASES[case]
    model = keras_vit.model_from_checkpoint(timm_files / f"{case}{suffix}", num_heads=2, **KERAS_OPTIONS.get(case, {}))
    expected = np.load(timm_files / f"{case}.npy")
    assert model.output_shape == (None, expected.shape[-1])
    np.testing.assert_allclose(to_numpy(model(photos(size))), expected, atol=TOLERANCE, rtol=0)
    config = model.config
    clip, siglip = case.startswith("clip"), case.startswith("siglip")
    assert (config.norm_pre, config.layer_norm_epsilon == 1e-5, config.classifier == "map") == (clip, clip, siglip)
    assert config.qk_norm == (case == "qk_norm")


def tiny_tower(variant: str, **options):
    """A randomised tower of ``variant`` at 32 pixels (patch 8 where the variant's is larger than the image)."""
    shape = dict(hidden_size=32, depth=1, num_heads=2, mlp_dim=64, image_size=32, patch_size=8)
    model = keras_vit.ViT(variant, **shape, **options)
    rng = np.random.default_rng(2)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.1, variable.shape))
    return model


@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
@pytest.mark.backends("tensorflow")  # the files and the probe; each backend's numbers: the parity tests
def test_towers_export_to_timm(tmp_path):
    """CLIP (qk-norm on too: its patch bias folds into the position embeddings) and SigLIP (with a head), written
    by keras-vit, load strictly into timm's models of ``timm_model_kwargs`` and give the same outputs."""
    models = {
        "clip": tiny_tower("CLIP-B/16", qk_norm=True),
        "siglip": tiny_tower("SigLIP-B/16", num_classes=5, gelu="exact"),
    }
    np.save(tmp_path / "images.npy", photos(32))
    jobs = []
    for name, model in models.items():
        state = keras_vit.save_timm_safetensors(model, tmp_path / f"{name}.safetensors")
        assert "patch_embed.proj.bias" not in state if name == "clip" else "attn_pool.kv.weight" in state
        kwargs = keras_vit.checkpoints.timm_model_kwargs(model)
        files = dict(load=str(tmp_path / f"{name}.safetensors"), logits=str(tmp_path / f"{name}.npy"))
        jobs.append(dict(model=kwargs.pop("model_name"), kwargs=kwargs, images=str(tmp_path / "images.npy"), **files))
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    run_reference(TIMM_SCRIPT, tmp_path / "jobs.json")
    for name, model in models.items():
        expected = to_numpy(model(photos(32)))
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.npy"), expected, atol=TOLERANCE, rtol=0)


def test_tower_timm_files_round_trip_without_torch(tmp_path):
    for variant, options in (("CLIP-B/32", dict(qk_norm=True)), ("SigLIP-B/16", dict(num_classes=3))):
        model = tiny_tower(variant, **options)
        keras_vit.save_timm_safetensors(model, tmp_path / "m.safetensors")
        with pytest.warns(UserWarning, match="gelu='exact'"):  # timm's files do not record the GELU
            again = keras_vit.model_from_checkpoint(tmp_path / "m.safetensors", num_heads=2, gelu=model.config.gelu)
        assert (again.config.norm_pre, again.config.classifier) == (model.config.norm_pre, model.config.classifier)
        np.testing.assert_allclose(to_numpy(again(photos(32))), to_numpy(model(photos(32))), atol=1e-5)
    with warnings.catch_warnings():  # SigLIP's tokens: the MAP head is dropped on request, unsaid
        warnings.simplefilter("error")
        tokens = keras_vit.model_from_checkpoint(tmp_path / "m.safetensors", num_heads=2, include_top=False)
    assert tokens.output_shape == (None, 16, 32)


@pytest.mark.reference
@pytest.mark.requires("transformers", "torch")
def test_huggingface_clip_and_siglip_folders_give_transformers_outputs(tmp_path):
    np.save(tmp_path / "images.npy", photos(32))
    run_reference(HF_SCRIPT, tmp_path, tmp_path / "images.npy")
    clip = keras_vit.model_from_checkpoint(tmp_path / "clip")  # the projection is the head: image_embeds
    assert (clip.config.gelu, clip.config.layer_norm_epsilon, clip.config.norm_pre) == ("quick", 1e-5, True)
    embeds = np.load(tmp_path / "clip_embeds.npy")
    np.testing.assert_allclose(to_numpy(clip(photos(32))), embeds, atol=TOLERANCE, rtol=0)
    with warnings.catch_warnings():  # the projection (the head), dropped on request: unsaid
        warnings.simplefilter("error")
        pooled = keras_vit.model_from_checkpoint(tmp_path / "clip", include_top=False, pooling="token")
    tokens = np.load(tmp_path / "clip_pooler.npy")  # before post_layernorm: normalise as CLIP's pooler does
    norm = clip.get_layer("encoder_norm")
    expected = to_numpy(norm(tokens))
    np.testing.assert_allclose(to_numpy(pooled(photos(32))), expected, atol=TOLERANCE, rtol=0)
    siglip = keras_vit.model_from_checkpoint(tmp_path / "siglip", include_top=False, pooling="map")
    assert siglip.config.classifier == "map" and siglip.config.gelu == "tanh"
    np.testing.assert_allclose(
        to_numpy(siglip(photos(32))), np.load(tmp_path / "siglip_pooler.npy"), atol=TOLERANCE, rtol=0
    )


@pytest.mark.backends("tensorflow")  # the files and the probe; each backend's numbers: the parity tests
def test_family_variants_build_their_towers():
    clip = keras_vit.CLIP_L14(28, depth=1)
    assert clip.name == "clip_l14" and clip.output_shape == (None, 768)
    assert clip.get_layer("embedding").kernel.shape == (14, 14, 3, 1024)
    assert clip.get_layer("norm_pre").epsilon == 1e-5 and clip.get_layer("encoderblock_0").gelu == "quick"
    siglip = keras_vit.SigLIP_B16_384(depth=1, include_top=False, pooling="map")
    assert siglip.input_shape == (None, 384, 384, 3) and siglip.output_shape == (None, 768)
    assert not any(isinstance(layer, keras_vit.ClassToken) for layer in siglip.layers)
    towers = [name for name in FAMILY_VARIANTS if name.startswith(("CLIP", "SigLIP"))]
    assert {keras_vit.parse_variant(name).variant for name in towers} == {"B/32", "B/16", "L/14"}
    assert keras_vit.ViT("clip_b32", depth=1, image_size=64).config == keras_vit.CLIP_B32(64, depth=1).config


def test_quick_gelu_and_qk_norm_follow_their_equations():
    x = np.linspace(-4, 4, 17, dtype="float32")
    quick = to_numpy(keras_vit.layers.activation(keras.ops.convert_to_tensor(x), "quick"))
    np.testing.assert_allclose(quick, x / (1 + np.exp(-1.702 * x)), rtol=1e-6, atol=1e-7)
    attention = keras_vit.MultiHeadSelfAttention(2, qk_norm=True)
    tokens = np.random.default_rng(0).normal(size=(1, 5, 8)).astype("float32")
    _, probs = attention(tokens, return_attention_scores=True)
    q, k, _ = np.split(tokens[0] @ to_numpy(attention.qkv.kernel) + to_numpy(attention.qkv.bias), 3, axis=-1)
    for head in range(2):
        qh, kh = (
            (a[:, 4 * head : 4 * head + 4] - a[:, 4 * head : 4 * head + 4].mean(-1, keepdims=True))
            / np.sqrt(a[:, 4 * head : 4 * head + 4].var(-1, keepdims=True) + 1e-6)
            for a in (q, k)
        )
        logits = qh @ kh.T / 2.0
        expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        np.testing.assert_allclose(to_numpy(probs)[0, head], expected, atol=1e-5)


def test_map_head_pools_by_its_probe():
    """One head, identity projections: the output is ``a + MLP(LN(a))`` with ``a = softmax(p . x / sqrt(D)) x``."""
    head = MAPHead(1, 8)
    tokens = np.random.default_rng(1).normal(size=(2, 6, 4)).astype("float32")
    head.build(tokens.shape)
    for dense in (head.query, head.key_value, head.out):
        dense.kernel.assign(np.tile(np.eye(4, dtype="float32"), (1, dense.kernel.shape[1] // 4)))
        dense.bias.assign(np.zeros(dense.bias.shape))
    probe = to_numpy(head.probe).reshape(4)
    weights = np.exp(tokens @ probe / 2.0)
    a = (weights[..., None] * tokens).sum(1) / weights.sum(1, keepdims=True)
    expected = a + to_numpy(head.mlp(head.norm(a)))
    np.testing.assert_allclose(to_numpy(head(tokens)), expected, atol=1e-5)
    _, probs = head(tokens, return_attention_scores=True)
    assert probs.shape == (2, 1, 1, 6)


@pytest.mark.parametrize("variant", ["CLIP-B/16", "SigLIP-B/16"])
@pytest.mark.backends("tensorflow")  # the files and the probe; each backend's numbers: the parity tests
def test_few_shot_probe_on_tower_embeddings(variant):
    """The paper's few-shot probe on the towers' embeddings (CLIP: the projection; SigLIP: the MAP head's) of
    scikit-learn's digits: far above chance (10%) even with random weights."""
    options = dict(num_classes=16) if variant.startswith("CLIP") else dict(include_top=False, pooling="map")
    model = tiny_tower(variant, **options)
    digits, labels = load_digits()
    images = np.repeat(np.repeat(digits, 4, axis=1), 4, axis=2)[..., None].repeat(3, axis=-1) / 127.5 - 1.0  # 32 px
    kept, held = stratified_split(labels, 0.2)
    train, test = extract_features(model, images[kept[:300]]), extract_features(model, images[held[:200]])
    assert train.shape == (300, 16 if variant.startswith("CLIP") else 32)
    accuracy = few_shot_evaluation(train, labels[kept[:300]], test, labels[held[:200]], shots=(10,))
    assert accuracy[10].mean() > 0.3, accuracy  # 0.39 for CLIP here


# --- the catalogue ---------------------------------------------------------------------------------

TOWER_ENTRIES = {e.name: e for e in zoo.catalogue() if e.family in ("clip", "siglip")}
SHAPES_SCRIPT = """
import json, sys
import timm, torch
shapes = {}
for name in sys.argv[2:]:
    with torch.device("meta"):  # shapes only: nothing allocated
        model = timm.create_model(name, pretrained=False)
    shapes[name] = {key: list(value.shape) for key, value in model.state_dict().items()}
json.dump(shapes, open(sys.argv[1], "w"))
"""


def test_tower_entries_are_model_cards():
    assert set(TOWER_ENTRIES) == {
        "CLIP_B_32.openai",
        "CLIP_B_16.openai",
        "CLIP_L_14.openai",
        "SigLIP_B_16.webli_224",
        "SigLIP_B_16.webli_384",
    }
    for e in TOWER_ENTRIES.values():
        (timm_name,) = e.aliases
        clip = e.family == "clip"
        assert zoo.find(timm_name) is e and zoo.get(e.name).url == e.source_url
        assert e.url == f"https://huggingface.co/timm/{timm_name}/resolve/main/model.safetensors"
        assert e.path == f"timm/{timm_name}/model.safetensors" and e.finetune is None and e.top1 is None
        assert e.licence == ("MIT" if clip else "Apache-2.0")
        assert ("arXiv:2103.00020" if clip else "arXiv:2303.15343") in e.paper
        p = e.preprocessing
        assert p["mean"] == ([0.48145466, 0.4578275, 0.40821073] if clip else [0.5, 0.5, 0.5])
        assert p["std"] == ([0.26862954, 0.26130258, 0.27577711] if clip else [0.5, 0.5, 0.5])
        assert p["interpolation"] == "bicubic" and 0.5 < p["crop_fraction"] <= 1.0
        assert e.num_classes == (e.embedding_width if clip else 0)
        assert f"_{e.image_size}" in timm_name


@pytest.mark.requires("timm", "torch")
@pytest.mark.backends("tensorflow")  # the files and the probe; each backend's numbers: the parity tests
def test_tower_entries_architectures_match_their_names(tmp_path):
    """timm builds each entry's model (its alias) on the meta device: the published file's keys and shapes, whose
    architecture, read by keras-vit as from a file's header (nothing allocated), is the entry's variant at its
    resolution, with the entry's embedding and parameter count; a sparse file of these shapes passes the entry's
    download check and fails every other entry's."""
    aliases = [e.aliases[0] for e in TOWER_ENTRIES.values()]
    run_reference(SHAPES_SCRIPT, tmp_path / "shapes.json", *aliases)
    shapes = json.loads((tmp_path / "shapes.json").read_text())
    for e in TOWER_ENTRIES.values():
        state = {key: tuple(shape) for key, shape in shapes[e.aliases[0]].items()}
        assert sum(int(np.prod(shape)) for shape in state.values()) == e.parameters
        info = checkpoint_info(timm_to_npz(shapes_only(state))[0])
        expected = keras_vit.ViTConfig.from_variant(e.variant, image_size=e.image_size)
        assert info.architecture == expected.architecture and (info.image_size, info.image_size) == expected.image_size
        assert (info.classifier, "norm_pre.weight" in state) == (expected.classifier, expected.norm_pre), e.name
        if e.family == "clip":
            assert info.num_classes == expected.num_classes == e.embedding_width
        else:
            assert state["attn_pool.latent"][-1] == e.embedding_width and info.num_classes is None
        path = tmp_path / f"{e.name}.safetensors"
        sparse_safetensors(path, shapes[e.aliases[0]])
        catalogue_check(e)(path)  # what a download under this name must pass (its header only is read)
        for other in TOWER_ENTRIES.values():
            if other.name != e.name:
                with pytest.raises(CorruptCheckpointError, match=f"not the checkpoint {other.name}.*another arch"):
                    catalogue_check(other)(path)


def sparse_safetensors(path, shapes: dict) -> None:
    """A float32 ``.safetensors`` file of ``shapes`` whose data are a hole (zeros taking no disk)."""
    header, offset = {}, 0
    for key, shape in shapes.items():
        size = 4 * int(np.prod(shape))
        header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(8 + len(text) + offset)


def test_a_damaged_safetensors_download_is_named(tmp_path):
    from keras_vit.zoo.validate import check_safetensors, validator

    path = tmp_path / "m.safetensors"
    keras_vit.save_timm_safetensors(tiny_tower("SigLIP-B/16", num_classes=3), path)
    assert validator(TOWER_ENTRIES["SigLIP_B_16.webli_224"].path) is check_safetensors
    check_safetensors(path)
    whole = path.read_bytes()
    path.write_bytes(whole[:-100])
    with pytest.raises(
        CorruptCheckpointError, match=r"m.safetensors is not a valid .safetensors file: its tensors end"
    ):
        check_safetensors(path)
    path.write_bytes(b"<html>not found</html>")
    with pytest.raises(CorruptCheckpointError, match=r"m.safetensors is not a valid .safetensors file"):
        check_safetensors(path)
