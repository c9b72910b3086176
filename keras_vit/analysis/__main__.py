"""``python -m keras_vit.analysis [VARIANT] [--weights ...]``: write the paper's analysis figures for a model.
Usage, outputs (all or none, ``--overwrite``) and errors (one line, exit 1): docs/analyses.md."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import numpy as np

from keras_vit.analysis.data import check_fewshot_dataset
from keras_vit.cli import CommandError, HelpFormatter, add_debug_flag, command_errors, load_tensorflow
from keras_vit.config import field_names, model_flags
from keras_vit.fields import add_arguments, given
from keras_vit.images import read_image
from keras_vit.names import check_weights, name_parts
from keras_vit.precision import add_mixed_precision_flag, global_policy, policy_of_choice
from keras_vit.variants import parse_variant

__all__ = [
    "ANALYSES",
    "FIGURES",
    "applicable_analyses",
    "build_model",
    "build_parser",
    "few_shot_split",
    "main",
    "model_input",
    "run",
    "run_few_shot",
]

ANALYSES = ("attention", "distance", "position", "filters", "fewshot")
# analysis -> the figure it draws; every run also writes results.json
FIGURES = {
    "attention": "attention_maps.png",
    "distance": "attention_distance.png",
    "position": "position_similarity.png",
    "filters": "embedding_filters.png",
    "fewshot": "few_shot.png",
}
STAGING = ".analysis-"  # the staging folders in --output-dir: .analysis-<12 hex>.tmp (keras_vit.staging)
# The model's flags: the image size, the architecture and what makes the model (fields of keras_vit.config.ViTConfig).
MODEL_FLAGS = model_flags(
    "ModelFlags",
    ("image_size", *field_names("architecture", "structure", "numerics")),
    "The model: its variant's fields replaced (keras_vit.config.ViTConfig)",
    unset={"image_size": "the checkpoint's, else 224"},
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m keras_vit.analysis",
        formatter_class=HelpFormatter,
        description="Attention maps, attention distance, position-embedding similarity, embedding-filter "
        "components and few-shot linear evaluation of a ViT, as PNG figures and results.json.",
    )
    parser.add_argument(
        "variant",
        nargs="?",
        help="ViT variant, e.g. 'B/16' or 'ViT_B16', or a hybrid: 'R50+B/16', 'ViT_R26_S32' (default: the model of "
        "the checkpoint given as --weights, else B/16)",
    )
    parser.add_argument(
        "--weights", help="checkpoint path, saved model (.keras) or catalogue name (default: random init)"
    )
    add_mixed_precision_flag(parser)
    add_arguments(parser.add_argument_group("model", MODEL_FLAGS.__doc__), MODEL_FLAGS())
    parser.add_argument(
        "--analyses", nargs="+", choices=ANALYSES, help="which figures (default: all that apply to the model)"
    )
    parser.add_argument(
        "--images",
        nargs="+",
        help="image files for the attention analyses (default: scikit-learn's china.jpg and flower.jpg)",
    )
    parser.add_argument(
        "--dataset",
        default="digits",
        help="few-shot dataset: 'digits' (scikit-learn), a .npz file or 'tfds:NAME' (default: digits)",
    )
    parser.add_argument(
        "--shots", type=int, nargs="+", default=[1, 5, 10, 25], help="training examples per class of each few-shot run"
    )
    parser.add_argument("--seeds", type=int, default=3, help="few-shot draws averaged per n")
    parser.add_argument(
        "--pooling",
        choices=("token", "avg"),
        help="few-shot features (default: the class token, or the patch mean without one)",
    )
    parser.add_argument("--pool-per-class", type=int, default=50, help="training examples kept per class")
    parser.add_argument("--test-examples", type=int, default=1000, help="held-out examples scored")
    parser.add_argument("--components", type=int, default=28, help="principal components of the filters to draw")
    parser.add_argument("--batch-size", type=int, default=16, help="images per forward pass")
    parser.add_argument("--dpi", type=int, default=100, help="resolution of the figures")
    parser.add_argument("--output-dir", default="vit_analysis", help="folder for the figures and results.json")
    parser.add_argument("--overwrite", action="store_true", help="replace figures and results.json OUTPUT_DIR holds")
    add_debug_flag(parser)
    return parser


def build_model(args: argparse.Namespace):
    """The encoder (``include_top=False``: all tokens) with the requested weights, built under the dtype policy
    of ``args.mixed_precision`` (:func:`keras_vit.precision.policy_of_choice`)."""
    import keras_vit

    with global_policy(policy_of_choice(args.mixed_precision)):
        return keras_vit.ViT(args.variant, include_top=False, weights=args.weights, **given(args, MODEL_FLAGS))


def applicable_analyses(model) -> list[str]:
    """The analyses that apply: filters need an embedding of RGB pixels (not a hybrid's features),
    position similarity needs absolute position embeddings."""
    from keras_vit.position import AddPositionEmbs

    chosen = list(ANALYSES)
    if model.get_layer("embedding").kernel.shape[2] not in (1, 3):
        chosen.remove("filters")
    if not any(isinstance(layer, AddPositionEmbs) for layer in model.layers):
        chosen.remove("position")
    return chosen


def _keep_per_class(labels: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of at most ``per_class`` random examples of each class."""
    counts: dict[int, int] = {}
    keep = []
    for i in rng.permutation(len(labels)):
        if counts.get(int(labels[i]), 0) < per_class:
            counts[int(labels[i])] = counts.get(int(labels[i]), 0) + 1
            keep.append(i)
    return np.sort(np.asarray(keep, dtype=np.int64))


def few_shot_split(args) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The few-shot training pool and test examples of ``args.dataset``: ``(images, labels, test_images,
    test_labels)``; a ``ValueError`` when a class of the pool has fewer examples than the largest of ``args.shots``."""
    from keras_vit import datasets
    from keras_vit.analysis import data

    dataset = data.load_fewshot_dataset(args.dataset)
    images, labels = dataset.images, np.asarray(dataset.labels, dtype=np.int64)
    if dataset.test_images is None:
        train, test = datasets.stratified_split(labels, 0.5, seed=0)
        test_images, test_labels = images[test], labels[test]
        images, labels = images[train], labels[train]
    else:
        test_images, test_labels = dataset.test_images, np.asarray(dataset.test_labels, dtype=np.int64)
    rng = np.random.default_rng(0)
    pool = _keep_per_class(labels, args.pool_per_class, rng)
    test = np.sort(rng.permutation(len(test_labels))[: args.test_examples])
    classes, counts = np.unique(labels[pool], return_counts=True)
    if len(classes) < 2 or len(test) == 0:
        raise ValueError(
            f"Few-shot dataset {args.dataset!r} needs training examples of 2 or more classes and test "
            f"examples; it has {len(classes)} classes and {len(test)} test examples."
        )
    if counts.min() < max(args.shots):
        raise ValueError(
            f"--shots {max(args.shots)} needs {max(args.shots)} training examples of every class, but "
            f"class {classes[counts.argmin()]} of {args.dataset!r} has {counts.min()} "
            f"(--pool-per-class {args.pool_per_class})."
        )
    return images[pool], labels[pool], test_images[test], test_labels[test]


def run_few_shot(
    model, args, size: tuple[int, int], pooling: str, split: tuple[np.ndarray, ...] | None = None
) -> tuple[dict[int, np.ndarray], float]:
    """n-shot accuracies on ``split`` (default: :func:`few_shot_split` of ``args``), and the chance level."""
    from keras_vit.analysis import fewshot
    from keras_vit.inputs import model_data_format

    images, labels, test_images, test_labels = few_shot_split(args) if split is None else split

    def features(x):
        batch = model_input(x, size, args.weights, model_data_format(model))
        return fewshot.extract_features(model, batch, pooling=pooling, batch_size=args.batch_size)

    accuracies = fewshot.few_shot_evaluation(
        features(images), labels, features(test_images), test_labels, shots=args.shots, seeds=args.seeds
    )
    return accuracies, 1.0 / len(np.unique(labels))


def model_input(
    images, size: tuple[int, int], weights: str | None = None, data_format: str = "channels_last"
) -> np.ndarray:
    """uint8 ``(H, W, C)`` images of any size as the model's float32 input in ``data_format``, numpy: preprocessed as
    the catalogue checkpoint ``weights`` was evaluated (its crop, interpolation, mean and std: CLIP's are not
    [-1, 1]), else centre-cropped to the aspect ratio, resized (:func:`~keras_vit.analysis.data.resize_images`) and
    scaled to [-1, 1]."""
    import keras

    import keras_vit
    from keras_vit.analysis.data import as_rgb, resize_images
    from keras_vit.inputs import in_data_format
    from keras_vit.preprocessing import checkpoint_preprocessor

    preprocess = checkpoint_preprocessor(weights, size, "channels_last")
    if preprocess is not None:
        batch = np.stack([keras.ops.convert_to_numpy(preprocess(as_rgb(image))) for image in images])
    else:
        batch = keras.ops.convert_to_numpy(keras_vit.preprocess_input(resize_images(images, size)))
    return in_data_format(batch.astype(np.float32), data_format)


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("seeds", "pool_per_class", "test_examples", "components", "batch_size", "dpi"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}.")
    if min(args.shots) < 1 or max(args.shots) > args.pool_per_class:
        parser.error(f"--shots must be between 1 and --pool-per-class ({args.pool_per_class}), got {args.shots}.")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    with command_errors(args):
        # before TensorFlow loads, in run's order: the variant's name, the weights, the images (read again by run), the
        # few-shot dataset, what every run writes (results.json) and the figures asked for
        if args.variant is not None:
            parse_variant(cast(str, name_parts(args.variant)[0]))  # a name always has a variant part
        check_weights(args.weights)
        if args.images and (args.analyses is None or {"attention", "distance"} & set(args.analyses)):
            for path in args.images:
                read_image(path)
        if args.analyses is None or "fewshot" in args.analyses:
            check_fewshot_dataset(args.dataset)
        _check_output_dir(args.output_dir, [FIGURES[name] for name in args.analyses or ()], args.overwrite)
        load_tensorflow()
        results = run(args)
    for name in results["figures"]:
        print(os.path.join(args.output_dir, name))
    if "few_shot" in results:
        shots = results["few_shot"].items()
        print("few-shot accuracy: " + ", ".join(f"{n}-shot {100 * r['mean']:.1f}%" for n, r in shots))
    return 0


def run(args: argparse.Namespace) -> dict:
    """Check, compute, then draw the chosen analyses (:func:`_write_outputs`); returns what results.json holds."""
    from keras_vit.analysis import attention, data, embeddings, plots
    from keras_vit.analysis.geometry import token_geometry
    from keras_vit.inputs import model_data_format, model_image_shape

    model = build_model(args)
    size = model_image_shape(model)[:2]
    applicable = applicable_analyses(model)
    chosen = args.analyses or applicable
    if set(chosen) - set(applicable):
        raise ValueError(
            f"--analyses {' '.join(sorted(set(chosen) - set(applicable)))} does not apply to this model "
            "(a hybrid's embedding filters act on ResNet features; relative/none position embeddings)."
        )
    # Read every input first: a missing or unreadable image, or a dataset too small for --shots, fails here.
    originals = None
    if {"attention", "distance"} & set(chosen):
        originals = [*map(read_image, args.images)] if args.images else [*map(data.sample_image, data.SAMPLE_IMAGES)]
        image_names = [os.path.basename(path) for path in args.images or data.SAMPLE_IMAGES]
    split = few_shot_split(args) if "fewshot" in chosen else None
    _check_output_dir(args.output_dir, [FIGURES[name] for name in chosen], args.overwrite)

    results: dict = {
        "variant": args.variant or model.name,
        "weights": args.weights,
        "image_size": list(size),
        "precision": model.dtype_policy.name,
        "figures": [],
    }
    # the figures' titles name the model: its variant and weights (a file's name, or a catalogue name)
    style: dict[str, Any] = {
        "dpi": args.dpi,
        "model": f"{results['variant']} ({os.path.basename(args.weights) if args.weights else 'random init'})",
    }
    drawings: dict[str, Callable[[str], object]] = {}  # analysis -> draw(path), drawn once all is computed
    if originals is not None:
        found = attention.analyse_attention(
            model, model_input(originals, size, args.weights, model_data_format(model)), batch_size=args.batch_size
        )
        if "attention" in chosen:
            shown = data.resize_images(originals, size).astype(np.float32) / 255.0
            overlays = np.stack([attention.overlay(p, m) for p, m in zip(shown, found.maps)])
            drawings["attention"] = partial(plots.plot_attention_maps, shown, overlays, names=image_names, **style)
        if "distance" in chosen:
            drawings["distance"] = partial(plots.plot_attention_distance, found.distances, names=image_names, **style)
            results["mean_attention_distance"] = found.distances.round(3).tolist()
    if "position" in chosen:
        similarity = embeddings.model_position_similarity(model)
        drawings["position"] = partial(plots.plot_position_similarity, similarity, **style)
    if "filters" in chosen:
        kernel_shape = model.get_layer("embedding").kernel.shape
        k = min(args.components, int(np.prod(kernel_shape[:3])), kernel_shape[3] - 1)
        components, explained = embeddings.model_filter_components(model, k)
        tiles = embeddings.to_rgb_tiles(components)
        drawings["filters"] = partial(plots.plot_filter_components, tiles, explained=explained, **style)
        results["filter_variance_explained"] = explained.round(5).tolist()
    if split is not None:
        pooling = args.pooling or ("token" if token_geometry(model).num_prefix_tokens else "avg")
        few_shot, chance = run_few_shot(model, args, size, pooling, split)
        dataset = os.path.basename(args.dataset)
        drawings["fewshot"] = partial(plots.plot_few_shot, few_shot, chance=chance, dataset=dataset, **style)
        results["few_shot"] = {
            str(n): {"mean": float(a.mean()), "std": float(a.std()), "per_seed": a.tolist()}
            for n, a in few_shot.items()
        }
        results["few_shot_pooling"] = pooling
    results["figures"] = [FIGURES[name] for name in drawings]
    _write_outputs(args.output_dir, [(FIGURES[name], draw) for name, draw in drawings.items()], results)
    return results


def _check_output_dir(out_dir: str, figures: list[str], overwrite: bool) -> None:
    """A ``CommandError`` if ``out_dir`` is a file, or holds any of ``figures``, results.json, and not ``overwrite``."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CommandError(f"--output-dir {out_dir} is a file, not a folder.")
    existing = [p for name in (*figures, "results.json") if os.path.lexists(p := os.path.join(out_dir, name))]
    if existing and not overwrite:
        raise CommandError(f"{', '.join(existing)} already exist: pass --overwrite to replace them.")


def _write_outputs(out_dir: str, drawings: list[tuple[str, Callable[[str], object]]], results: dict) -> None:
    """Draw every figure and results.json in a staging folder inside ``out_dir`` (:mod:`keras_vit.staging`, whose
    next use removes a killed run's), then move them all into place; a failure leaves ``out_dir`` as it was (and
    removes it if this call made it)."""
    from keras_vit.files import write_json
    from keras_vit.staging import staging_folder

    created = not os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    names = [name for name, _ in drawings] + ["results.json"]
    try:
        with staging_folder(out_dir, STAGING) as staging:
            for name, draw in drawings:
                draw(str(staging / name))
            write_json(staging / "results.json", results)  # strict JSON: a NaN is written as null
            for name in names:
                os.replace(staging / name, os.path.join(out_dir, name))
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(out_dir)  # only if empty
        raise


if __name__ == "__main__":
    sys.exit(main())
