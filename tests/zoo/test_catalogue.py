"""The zoo's catalogue (``keras_vit.zoo``): complete, consistent rows, model cards, preprocessing, and what is
known of each file (size, sha256 and their source, or that none is known)."""

import dataclasses
import json
import re

import pytest

from keras_vit import zoo
from keras_vit.variants import parse_variant

pytestmark = pytest.mark.backend_independent  # files, names and checks: the same on every backend

GCS = "https://storage.googleapis.com/vit_models/"


def bucket_entries():
    """The entries of the ViT papers' bucket (the family's towers, from the Hub, are tests/test_family_clip.py's)."""
    return [e for e in zoo.catalogue() if e.source_url is None]


def test_catalogue_rows_are_complete_and_consistent():
    entries = zoo.catalogue()
    assert len({e.name for e in entries}) == len(entries) == len({e.path for e in entries})
    for e in bucket_entries():
        assert e.url == GCS + e.path and e.path.endswith(".npz")
        assert e.family in ("original", "augreg") and e.pretrain in ("imagenet21k", "imagenet2012")
        assert e.image_size in (224, 384) and e.num_classes == (21843 if e.finetune is None else 1000)
        assert e.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", e.sha256)
        assert (e.top1 is None) == (e.top1_source is None)
        resnet, _, vit = e.variant.rpartition("+")
        if resnet:
            assert re.fullmatch(r"R\d*", resnet) and e.name.startswith(resnet)
        else:
            parse_variant(vit)
        if e.finetune and e.family == "augreg":
            assert e.path.endswith(f"res_{e.image_size}.npz")


def test_catalogue_holds_the_published_files():
    paths = {e.path for e in zoo.catalogue()}
    assert {
        "imagenet21k/ViT-B_16.npz",
        "imagenet21k/ViT-L_16.npz",
        "imagenet21k/ViT-H_14.npz",
        "imagenet21k+imagenet2012/ViT-B_16.npz",
        "imagenet21k+imagenet2012/ViT-B_16-224.npz",
        "imagenet21k/R50+ViT-B_16.npz",
        "imagenet21k+imagenet2012/R50+ViT-B_16.npz",
        "augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-res_384.npz",
    } <= paths
    assert zoo.get("imagenet21k+imagenet2012/ViT-B_16") is zoo.get("B_16.orig_in21k_ft_in1k")
    assert zoo.get("B_16.orig_in21k_ft_in1k").image_size == 384
    with pytest.raises(ValueError, match=r"Did you mean \['B_16.orig_in21k'"):
        zoo.get("B_16.orig_in21")


def test_every_entry_is_a_model_card():
    for e in bucket_entries():
        assert e.licence == "Apache-2.0" and isinstance(e.parameters, int) and e.parameters > 5_000_000
        assert "arXiv:" + ("2010.11929" if e.family == "original" else "2106.10270") in e.paper
        if e.finetune is None:  # a pre-training-only checkpoint has no ImageNet-1k classifier to score
            assert e.top1 is None and e.num_classes == 21843
        else:
            assert 70 < e.top1 < 90 and e.top1_source.startswith(("https://", "timm's own evaluation"))
    assert "no such number" in json.loads(zoo.CATALOGUE.read_text())["description"]


def test_every_entry_carries_its_preprocessing_and_names_its_source():
    """mean, std, crop fraction and interpolation: timm's pretrained_cfg where timm measured the top-1 (crop_pct 0.9
    at 224, 1.0 at 384, bicubic), the original code's elsewhere ((x - 127.5) / 127.5, no crop, bilinear)."""
    for e in zoo.catalogue():
        p = e.preprocessing
        assert set(p) == {"mean", "std", "crop_fraction", "interpolation", "source"}, e.name
        if e.family not in ("original", "augreg"):  # timm's pretrained_cfg of the tower (tests/test_family_clip.py)
            assert p["source"].startswith(f"timm 1.0.31 pretrained_cfg of {e.aliases[0]}"), e.name
            continue
        assert p["mean"] == p["std"] == [0.5, 0.5, 0.5], e.name
        if (e.top1_source or "").startswith("timm's own evaluation of "):
            timm_name = e.top1_source.split()[4]
            assert p["source"].startswith(f"timm 1.0.31 pretrained_cfg of {timm_name}:"), e.name
            assert (p["crop_fraction"], p["interpolation"]) == ({224: 0.9, 384: 1.0}[e.image_size], "bicubic")
        else:
            assert p["source"].startswith("google-research/vision_transformer vit_jax/input_pipeline.py"), e.name
            assert (p["crop_fraction"], p["interpolation"]) == (None, "bilinear"), e.name
    timm_measured = [e for e in zoo.catalogue() if e.preprocessing["interpolation"] == "bicubic" and e.top1]
    assert len(timm_measured) == 21  # the 21 top-1 figures of timm's evaluation


@pytest.mark.parametrize(
    "name", ["Ti_16.augreg_in21k_ft_in1k_224", "Ti_16.augreg_in21k", "S_32.augreg_in21k_ft_in1k_384"]
)
def test_parameter_counts_are_those_of_the_built_model(name):
    import keras_vit

    e = zoo.get(name)
    model = keras_vit.ViT(e.variant, image_size=e.image_size, num_classes=e.num_classes)
    assert model.count_params() == e.parameters


def test_every_entry_states_what_is_known_of_its_file_and_its_source():
    data = json.loads(zoo.CATALOGUE.read_text())
    for row in data["checkpoints"]:
        assert {"size", "sha256", "checksum_source"} <= set(row), row["name"]  # written out, null or not
        assert (row["checksum_source"] is None) == (row["size"] is None and row["sha256"] is None), row["name"]
    assert "checked by its architecture only" in data["description"]
    entry = zoo.get("Ti_16.augreg_in21k")
    assert entry.checked_by == "its architecture only (no public size or sha256 is known for this file)"
    stated = dataclasses.replace(entry, sha256="0" * 64, checksum_source="the bucket's listing")
    assert stated.checked_by == "its sha256 as the bucket's listing states it, and its architecture"
