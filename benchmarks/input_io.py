"""The input side of a multi-host fine-tuning run: measured where it runs, then a per-host estimate.

Measures, on the machine it runs on: the bytes of ImageNet-sized JPEG photos (random 375x500 crops of scikit-learn's
two sample photos, quality 90) and the images/s of the fine-tuning input pipeline on them (``keras_vit.training.
pipeline.train_dataset`` over an image folder: read, decode, inception crop, resize to ``--image-size``, flip). Then,
for a run of ``--batch`` images per step on each of ``--hosts`` hosts with one accelerator each, every host reading
only its part, prints per host and step: the images and bytes it reads (and what reading everything, the old ``DATA``
sharding, cost), the accelerator's compute time scaled from a measured B/16 training step (``--step-ms`` at
``--step-batch`` images of ``--step-size`` px; the default is the H200 run of benchmarks/results, 2026-12-04) by the
analytic FLOPs, the gradient all-reduce over ``--link-gbps``, and the CPU cores the pipeline needs to keep up
(docs/distributed.md, "Estimate")::

    python benchmarks/input_io.py --hosts 8 64
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu import forward_flops  # benchmarks/ is not a package

IMAGENET_TRAIN_BYTES = 147_897_477_120  # ILSVRC2012_img_train.tar
IMAGENET_TRAIN_IMAGES = 1_281_167
B16 = dict(depth=12, width=768, mlp_dim=3072, patch=16)


def b16_parameters(image_size: int, num_classes: int = 1000) -> int:
    """Trainable parameters of ViT-B/16 at ``image_size`` px (class token, learned position embeddings)."""
    d, m, p = B16["width"], B16["mlp_dim"], B16["patch"]
    block = (d * 3 * d + 3 * d) + (d * d + d) + (d * m + m) + (m * d + d) + 4 * d
    tokens = (image_size // p) ** 2 + 1
    return p * p * 3 * d + d + d + tokens * d + B16["depth"] * block + 2 * d + d * num_classes + num_classes


def write_photos(root: str, count: int, seed: int = 0) -> float:
    """``count`` JPEGs of 375x500 cut from scikit-learn's sample photos into two class folders; their mean bytes."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos, rng, sizes = load_sample_images().images, np.random.default_rng(seed), []
    for i in range(count):
        photo = photos[i % len(photos)]
        top, left = rng.integers(0, photo.shape[0] - 375 + 1), rng.integers(0, photo.shape[1] - 500 + 1)
        folder = os.path.join(root, f"class{i % 2}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{i}.jpg")
        Image.fromarray(photo[top : top + 375, left : left + 500]).save(path, quality=90)
        sizes.append(os.path.getsize(path))
    return float(np.mean(sizes))


def pipeline_rate(root: str, image_size: int, batch: int, steps: int) -> float:
    """Images/s of the fine-tuning training pipeline over the image folder ``root`` (after 2 warm-up batches)."""
    from keras_vit.training.data import load_folder
    from keras_vit.training.pipeline import Augment, train_dataset

    source = load_folder(root, eval_fraction=0.1)
    data = iter(train_dataset(source.train, 2, batch, Augment(image_size, crop_area=(0.05, 1.0), flip=True)))
    for _ in range(2):
        next(data)
    start = time.perf_counter()
    for _ in range(steps):
        next(data)
    return steps * batch / (time.perf_counter() - start)


def estimate(args, jpeg_bytes: float, rate: float) -> str:
    """The Markdown table of the per-host estimate."""
    per_image_bytes = IMAGENET_TRAIN_BYTES / IMAGENET_TRAIN_IMAGES
    scale = forward_flops(**B16, image_size=args.image_size, num_classes=1000) / forward_flops(
        **B16, image_size=args.step_size, num_classes=1000
    )
    ms_per_image = args.step_ms / args.step_batch * scale
    gradient_bytes = 4 * b16_parameters(args.image_size)
    cores = os.cpu_count() or 1
    rows = [
        "| hosts | images / host / step | read / host / step (every host reads all) | compute / step | all-reduce "
        f"/ step ({args.link_gbps:g} Gb/s) | input CPU cores to keep up (every host decodes all) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for hosts in args.hosts:
        images = args.batch / hosts
        compute = images * ms_per_image
        allreduce = 2 * (hosts - 1) / hosts * gradient_bytes * 8 / (args.link_gbps * 1e9) * 1e3
        step = max(compute, 1e-9) + allreduce
        needed, all_cores = (n / (step / 1e3) / (rate / cores) for n in (images, args.batch))
        read, everything = images * per_image_bytes / 1e6, args.batch * per_image_bytes / 1e6
        rows.append(
            f"| {hosts} | {images:g} | {read:.1f} MB ({everything:.0f} MB) | {compute:.0f} ms | {allreduce:.0f} ms "
            f"| {needed:.1f} ({all_cores:.0f}) |"
        )
    return "\n".join(
        [
            f"measured here: {jpeg_bytes / 1e3:.0f} kB per 375x500 JPEG (quality 90); pipeline {rate:.1f} images/s at "
            f"{args.image_size} px on {cores} cores ({rate / cores:.1f} per core)",
            f"ImageNet-1k training JPEGs: {per_image_bytes / 1e3:.0f} kB each (archive size / images)",
            f"B/16 at {args.image_size} px: {scale:.2f}x the FLOPs of {args.step_size} px; {ms_per_image:.3f} ms per "
            f"image from {args.step_ms:g} ms per {args.step_batch}; gradients {gradient_bytes / 1e6:.0f} MB (float32)",
            "",
            *rows,
        ]
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--batch", type=int, default=512, help="global batch per step")
    parser.add_argument("--image-size", type=int, default=384)
    parser.add_argument("--photos", type=int, default=64)
    parser.add_argument("--pipeline-batch", type=int, default=16)
    parser.add_argument("--pipeline-steps", type=int, default=20)
    parser.add_argument("--step-ms", type=float, default=109.4, help="a measured B/16 training step")
    parser.add_argument("--step-batch", type=int, default=256)
    parser.add_argument("--step-size", type=int, default=224)
    parser.add_argument("--link-gbps", type=float, default=100.0, help="each host's network bandwidth")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        jpeg_bytes = write_photos(root, args.photos)
        rate = pipeline_rate(root, args.image_size, args.pipeline_batch, args.pipeline_steps)
    print(estimate(args, jpeg_bytes, rate))


if __name__ == "__main__":
    main()
