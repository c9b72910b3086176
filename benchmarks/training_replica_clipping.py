"""Does global-norm clipping under MirroredStrategy match one-device training? Prints a table.

Trains the same tiny ViT for a few SGD steps (clip at global norm ``--clip``) on the same global
batches under the default strategy and under MirroredStrategy over two logical CPUs, once with
Keras' own ``keras.optimizers.SGD`` and once with ``training.optimizers.SGD`` (which clips the
cross-replica sum), and prints the largest weight difference between the two strategies.

    python benchmarks/training_replica_clipping.py [--steps 8] [--clip 1.0] [--lr 0.5]
"""

from __future__ import annotations

import argparse

from keras_vit.training.distributed.strategy import split_cpu

split_cpu(2)  # before TensorFlow initialises its devices

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.training import optimizers  # noqa: E402


def train(strategy, optimizer_class, args) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (args.steps * 8, 16, 16, 3)).astype("float32")
    labels = np.eye(3, dtype="float32")[rng.integers(0, 3, args.steps * 8)]
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras_vit.ViT("Ti/8", image_size=16, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=3)
        model.get_layer("head").kernel.assign(rng.normal(0, 1, (32, 3)).astype("float32"))  # large gradients
        model.compile(
            optimizer_class(args.lr, momentum=0.9, global_clipnorm=args.clip),
            loss=keras.losses.CategoricalCrossentropy(from_logits=True),
        )
    model.fit(tf.data.Dataset.from_tensor_slices((images, labels)).batch(8), epochs=1, verbose=0)
    return model.get_weights()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    print(
        f"| optimizer | max weight difference, MirroredStrategy x2 vs default ({args.steps} steps, clip {args.clip}) |"
    )
    print("|---|---:|")
    for name, cls in (
        ("keras.optimizers.SGD", keras.optimizers.SGD),
        ("keras_vit.training.optimizers.SGD", optimizers.SGD),
    ):
        one = train(tf.distribute.get_strategy(), cls, args)
        two = train(mirrored, cls, args)
        print(f"| `{name}` | {max(float(np.abs(a - b).max()) for a, b in zip(one, two)):.2e} |")


if __name__ == "__main__":
    main()
