"""keras-hub presets: a backbone keras-hub saved reads with its outputs; ``keras_vit.save_preset`` writes
keras-hub's ``ViTBackbone`` preset plus keras-vit's config and head; ``keras_vit.ViT.from_preset`` reads it back
whole, keras-hub reads the backbone."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from npz_layout import vit_checkpoint
from reference_runs import photos

import keras_vit

pytestmark = pytest.mark.backends("tensorflow")  # keras-hub's save_to_preset, once; the format is backend-free
TOLERANCE = 1e-4


def images():
    return np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")


@pytest.mark.requires("keras_hub", "h5py")
def test_a_preset_folder_reads_back_in_keras_vit_and_in_keras_hub(tmp_path):
    import keras_hub

    arrays = vit_checkpoint(
        patch=8, width=32, depth=2, heads=2, mlp=64, grid=(4, 4), num_classes=5, representation_size=16
    )
    model = keras_vit.model_from_checkpoint(arrays, gelu="exact")  # keras-hub's MLP computes exact GELU
    folder = keras_vit.save_preset(model, tmp_path / "preset")
    back = keras_vit.ViT.from_preset(folder)  # the whole model: backbone, pre_logits and head
    assert back.config == model.config
    np.testing.assert_allclose(back.predict_on_batch(images()), model.predict_on_batch(images()), atol=1e-6)
    hub = keras_hub.models.Backbone.from_preset(str(folder))
    tokens = keras.Model(model.input, model.get_layer("encoder_norm").output)
    np.testing.assert_allclose(np.asarray(hub(images())), tokens.predict_on_batch(images()), atol=1e-4)
    with pytest.raises(ValueError, match="preset exists"):
        keras_vit.save_preset(model, folder)


@pytest.mark.requires("keras_hub", "h5py")
def test_a_model_keras_hub_cannot_hold_is_refused_and_nothing_is_written(tmp_path):
    small = dict(image_size=32, hidden_size=32, depth=1, num_heads=2, mlp_dim=64)
    hybrid = keras_vit.ViT(None, patch_size=1, resnet={"num_layers": (), "width": 32}, **small)
    with pytest.raises(ValueError, match=r"ViTBackbone has no place for .*resnet_stages=\(\)"):
        keras_vit.save_preset(hybrid, tmp_path / "preset")
    sincos = keras_vit.ViT(None, patch_size=8, position_embedding="sincos_2d", **small)
    with pytest.raises(ValueError, match="position_embedding='sincos_2d'"):
        keras_vit.save_preset(sincos, tmp_path / "preset")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.requires("keras_hub")
def test_keras_hub_preset_matches_its_backbone(tmp_path):
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32
    )
    rng = np.random.default_rng(0)
    for variable in backbone.weights:
        variable.assign(variable + rng.normal(0, 0.1, variable.shape))
    backbone.save_to_preset(str(tmp_path / "preset"))
    model = keras_vit.model_from_checkpoint(tmp_path / "preset", include_top=False)
    np.testing.assert_allclose(to_numpy(model(photos(32))), to_numpy(backbone(photos(32))), atol=TOLERANCE, rtol=0)
