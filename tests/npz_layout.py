"""Random checkpoints in the exact layout of the published Google ``.npz`` files, written with numpy alone.

Keys and shapes follow the Flax modules of google-research/vision_transformer: ``embedding/kernel``
``(P, P, C, D)``, ``cls`` ``(1, 1, D)``, ``Transformer/posembed_input/pos_embedding`` ``(1, N, D)``,
``.../MultiHeadDotProductAttention_1/{query,key,value}/kernel`` ``(D, heads, head_dim)`` and
``bias`` ``(heads, head_dim)``, ``out/kernel`` ``(heads, head_dim, D)``, LayerNorm ``scale``/``bias``,
``MlpBlock_3/Dense_{0,1}``, ``encoder_norm``, ``pre_logits``, ``head``; the hybrids add BiT's ResNet
(``conv_root``, ``gn_root``, ``block{s}/unit{u}/...``). Nothing here uses keras_vit.

Values are drawn so that every parameter changes the output noticeably (kernels ~ 1/sqrt(fan_in),
biases and position embeddings O(0.1-0.5), LayerNorm scales around 1).
"""

from __future__ import annotations

import numpy as np

# Ti/16 as the catalogue's Ti_16.* files have it (AugReg's "Ti" of Steiner et al., 2021, arXiv:2106.10270): what a
# mirror must serve under those names, the smallest published shape (14 x 14 patches at 224 px).
TI_16 = dict(patch=16, width=192, depth=12, heads=3, mlp=768, grid=(14, 14))


def vit_checkpoint(
    *,
    patch: int = 16,
    width: int = 64,
    depth: int = 2,
    heads: int = 4,
    mlp: int = 128,
    grid: tuple[int, int] = (2, 2),
    classifier: str = "token",
    num_classes: int | None = 10,
    representation_size: int | None = None,
    channels: int = 3,
    seed: int = 0,
    zeros: bool = False,
) -> dict[str, np.ndarray]:
    """The arrays of a checkpoint; ``zeros=True`` only for their keys and shapes (fast for large sizes)."""
    rng = np.random.default_rng(seed)

    def normal(*shape, std):
        return np.zeros(shape, "float32") if zeros else rng.normal(0.0, std, shape).astype("float32")

    def dense(fan_in, *shape):
        return normal(fan_in, *shape, std=fan_in**-0.5)

    def norm(prefix):
        return {f"{prefix}/scale": 1.0 + normal(width, std=0.2), f"{prefix}/bias": normal(width, std=0.1)}

    head_dim = width // heads
    arrays = {
        "embedding/kernel": normal(patch, patch, channels, width, std=(patch * patch * channels) ** -0.5),
        "embedding/bias": normal(width, std=0.1),
    }
    prefix = 1 if classifier == "token" else 0
    if prefix:
        arrays["cls"] = normal(1, 1, width, std=0.5)
    arrays["Transformer/posembed_input/pos_embedding"] = normal(1, prefix + grid[0] * grid[1], width, std=0.5)
    for i in range(depth):
        block = f"Transformer/encoderblock_{i}"
        attn = f"{block}/MultiHeadDotProductAttention_1"
        arrays.update(norm(f"{block}/LayerNorm_0"))
        for name in ("query", "key", "value"):
            arrays[f"{attn}/{name}/kernel"] = dense(width, heads, head_dim)
            arrays[f"{attn}/{name}/bias"] = normal(heads, head_dim, std=0.1)
        arrays[f"{attn}/out/kernel"] = normal(heads, head_dim, width, std=width**-0.5)
        arrays[f"{attn}/out/bias"] = normal(width, std=0.1)
        arrays.update(norm(f"{block}/LayerNorm_2"))
        arrays[f"{block}/MlpBlock_3/Dense_0/kernel"] = dense(width, mlp)
        arrays[f"{block}/MlpBlock_3/Dense_0/bias"] = normal(mlp, std=0.1)
        arrays[f"{block}/MlpBlock_3/Dense_1/kernel"] = dense(mlp, width)
        arrays[f"{block}/MlpBlock_3/Dense_1/bias"] = normal(width, std=0.1)
    arrays.update(norm("Transformer/encoder_norm"))
    features = width
    if representation_size is not None:
        arrays["pre_logits/kernel"] = dense(width, representation_size)
        arrays["pre_logits/bias"] = normal(representation_size, std=0.1)
        features = representation_size
    if num_classes is not None:
        arrays["head/kernel"] = dense(features, num_classes)
        arrays["head/bias"] = normal(num_classes, std=0.1)
    return arrays


def flax_hybrid_checkpoint(seed, *, num_layers, width, hidden, depth, heads, mlp, grid, num_classes, kernel_scale=None):
    """Random arrays in the published hybrid ``.npz`` layout: the ResNet's Flax module paths, written from
    the paper's architecture (not from keras-vit's key map), plus the ViT's (:func:`vit_checkpoint`) with a
    1x1 embedding of the feature map. ``gn_root`` is stored as (1, 1, 1, C), as BiT does.

    ``kernel_scale``: give each output channel of every ResNet kernel a spread of about
    ``kernel_scale * uniform(0.3, 3)`` (where the standardisation's epsilon starts to matter).
    """
    rng = np.random.default_rng(seed)
    arrays = {}

    def normal(shape, scale=1.0, offset=0.0):
        return (offset + scale * rng.normal(size=shape)).astype("float32")

    def conv_norm(conv, norm, size, cin, cout, norm_shape=()):
        if kernel_scale is None:
            arrays[f"{conv}/kernel"] = normal((size, size, cin, cout), offset=0.1)  # standardised anyway
        else:
            arrays[f"{conv}/kernel"] = normal((size, size, cin, cout)) * kernel_scale * rng.uniform(0.3, 3.0, cout)
        arrays[f"{norm}/scale"] = normal((*norm_shape, cout), 0.2, 1.0)
        arrays[f"{norm}/bias"] = normal((*norm_shape, cout), 0.2)

    conv_norm("conv_root", "gn_root", 7, 3, width, norm_shape=(1, 1, 1))
    channels = width
    for stage, units in enumerate(num_layers):
        features = width * 2**stage
        for unit in range(units):
            prefix = f"block{stage + 1}/unit{unit + 1}/"
            if unit == 0:
                conv_norm(prefix + "conv_proj", prefix + "gn_proj", 1, channels, 4 * features)
            conv_norm(prefix + "conv1", prefix + "gn1", 1, channels, features)
            conv_norm(prefix + "conv2", prefix + "gn2", 3, features, features)
            conv_norm(prefix + "conv3", prefix + "gn3", 1, features, 4 * features)
            channels = 4 * features
    arrays.update(
        vit_checkpoint(
            patch=1,
            channels=channels,
            width=hidden,
            depth=depth,
            heads=heads,
            mlp=mlp,
            grid=(grid, grid),
            num_classes=num_classes,
            seed=seed,
        )
    )
    return arrays


def write_checkpoint(path, arrays: dict[str, np.ndarray]):
    """Write ``arrays`` as the published files are stored: one uncompressed ``.npz``."""
    np.savez(path, **arrays)
    return path
