"""Hugging Face ``transformers`` folders (``ViTModel``, ``ViTForImageClassification``): their outputs, and
``config.json`` honoured field by field or refused naming the field."""

import json

import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy  # any backend's tensor (torch's track gradients)
from reference_runs import photos, run_reference

import keras_vit
from keras_vit.checkpoints.load import read_checkpoint

pytestmark = pytest.mark.backends("tensorflow")  # the default backend only: backend-independent or slow

TOLERANCE = 1e-4

HF_SCRIPT = """
import json, sys
import numpy as np
import torch
from transformers import ViTConfig, ViTForImageClassification, ViTModel
torch.manual_seed(0)
out, images = sys.argv[1], torch.from_numpy(np.load(sys.argv[2])).permute(0, 3, 1, 2)
extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
config = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                   image_size=32, patch_size=8, num_labels=5, **extra)
for cls, name in ((ViTForImageClassification, "classifier"), (ViTModel, "model")):
    model = cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.2 if p.ndim == 1 else 0.05))
        model.save_pretrained(f"{out}/{name}")
        result = model(pixel_values=images)
    if name == "classifier":
        np.save(f"{out}/classifier.npy", result.logits.numpy())
    else:
        np.save(f"{out}/tokens.npy", result.last_hidden_state.numpy())
        np.save(f"{out}/pooler.npy", result.pooler_output.numpy())
"""


@pytest.mark.reference
@pytest.mark.requires("transformers", "torch")
def test_huggingface_folders_give_transformers_outputs(tmp_path):
    np.save(tmp_path / "images.npy", photos(32))
    run_reference(HF_SCRIPT, tmp_path, tmp_path / "images.npy")
    classifier = keras_vit.model_from_checkpoint(tmp_path / "classifier")
    np.testing.assert_allclose(
        to_numpy(classifier(photos(32))), np.load(tmp_path / "classifier.npy"), atol=TOLERANCE, rtol=0
    )
    # ViTModel: the tokens after the final LayerNorm, and its pooler as pre_logits (a tanh Dense)
    encoder = keras_vit.model_from_checkpoint(tmp_path / "model", include_top=False)
    np.testing.assert_allclose(to_numpy(encoder(photos(32))), np.load(tmp_path / "tokens.npy"), atol=TOLERANCE, rtol=0)
    assert "pre_logits/kernel" in keras_vit.load_weights(encoder, tmp_path / "model").skipped
    pooled = read_checkpoint(tmp_path / "model/model.safetensors")
    tokens = np.load(tmp_path / "tokens.npy")
    pooler = np.tanh(tokens[:, 0] @ pooled["pre_logits/kernel"] + pooled["pre_logits/bias"])
    np.testing.assert_allclose(pooler, np.load(tmp_path / "pooler.npy"), atol=TOLERANCE, rtol=0)


@pytest.mark.reference
@pytest.mark.requires("transformers", "torch")
def test_a_hugging_face_config_is_honoured_field_by_field_or_refused_naming_the_field(tmp_path):
    """``layer_norm_eps`` and ``hidden_act`` as transformers wrote them give its outputs; a field that disagrees with
    the weights, is of the wrong type, or is unknown is refused, named, never dropped."""
    np.save(tmp_path / "images.npy", photos(32))
    numerics = dict(layer_norm_eps=1e-2, hidden_act="gelu_pytorch_tanh")
    run_reference(HF_SCRIPT, tmp_path, tmp_path / "images.npy", json.dumps(numerics))
    folder, expected = tmp_path / "classifier", np.load(tmp_path / "classifier.npy")
    model = keras_vit.model_from_checkpoint(folder)
    assert (model.config.layer_norm_epsilon, model.config.gelu) == (1e-2, "tanh")
    np.testing.assert_allclose(to_numpy(model(photos(32))), expected, atol=TOLERANCE, rtol=0)
    with pytest.warns(UserWarning, match="layer_norm_epsilon=0.01"):
        dropped = keras_vit.model_from_checkpoint(folder, layer_norm_epsilon=1e-6)  # as if the field were ignored
    assert np.abs(to_numpy(dropped(photos(32))) - expected).max() > 1e-3
    config = json.loads((folder / "config.json").read_text())
    refused = {
        "num_attention_heads": ("2", r"config.json's num_attention_heads must be a positive integer, got '2'"),
        "hidden_act": ("relu", r"uses hidden_act='relu'; keras-vit has GELU only"),
        "qkv_bias": (False, r"disagrees with the weights: qkv_bias=False \(the weights have q/k/v biases\)"),
        "hidden_size": (64, r"disagrees with the weights: hidden_size=64 \(the weights: 32\)"),
        "use_absolute_position_embeddings": (  # BEiT's: keras-vit does not know it (DINOv2's use_mask_token it does)
            True,
            r"sets fields keras-vit does not know, so cannot honour: \['use_absolute_position_embeddings'\]",
        ),
    }
    for field, (value, message) in refused.items():
        (folder / "config.json").write_text(json.dumps({**config, field: value}))
        with pytest.raises(ValueError, match=message):
            keras_vit.model_from_checkpoint(folder)
    (folder / "config.json").write_text(json.dumps({**config, "num_attention_heads": 3}))
    with pytest.raises(ValueError, match=r"num_attention_heads=3 \(does not divide the weights' width 32\)"):
        keras_vit.model_from_checkpoint(folder)
