"""Classify images: ``python -m keras_vit.predict IMAGE_OR_FOLDER... --weights NAME_OR_PATH``.
Class names (``--labels``, the model's own, ImageNet's) and examples: docs/weights.md. Errors: one line, exit 1."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import numpy as np

from keras_vit.cli import CommandError, HelpFormatter, add_debug_flag, command_errors, for_weights, load_tensorflow
from keras_vit.images import image_files, read_image
from keras_vit.names import locate_checkpoint
from keras_vit.precision import add_mixed_precision_flag, global_policy, policy_of_choice

__all__ = ["classify", "main"]

SCORES = ("softmax", "sigmoid", "logits")
_BATCH = 16


def _scores(logits: np.ndarray, kind: str) -> np.ndarray:
    if kind == "softmax":
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)
    if kind == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    return logits


def classify(
    model,
    images: Sequence[np.ndarray],
    *,
    top: int = 5,
    labels: str | Sequence[str] | None = None,
    scores: str = "softmax",
    weights: str | None = None,
) -> list[list[tuple[str, str, float]]]:
    """The ``top`` ``(id, name, score)`` of each uint8 ``(H, W, 3)`` image under ``model``, preprocessed as catalogue
    checkpoint ``weights`` was evaluated, else resized whole; ``labels`` as :func:`keras_vit.labels.decode_predictions`
    (default: the model's class names, else ImageNet's by the head's size)."""
    from keras_vit.inputs import for_model, model_image_shape
    from keras_vit.labels import decode_predictions
    from keras_vit.preprocessing import ImagePreprocessor, checkpoint_preprocessor

    size, layout = model_image_shape(model)[:2], "channels_last"  # the images read; the model's own: for_model
    preprocess = checkpoint_preprocessor(weights, size, layout) or ImagePreprocessor(size, data_format=layout)
    logits = []
    for start in range(0, len(images), _BATCH):
        batch = for_model(np.stack([np.asarray(preprocess(image)) for image in images[start : start + _BATCH]]), model)
        logits.append(np.asarray(model.predict_on_batch(batch), dtype="float64"))
    if labels is None:
        labels = getattr(getattr(model, "config", None), "class_names", None)
    return decode_predictions(_scores(np.concatenate(logits), scores), top=top, labels=labels)


def _build_model(weights: str, mixed_precision: str, num_heads: int | None = None):
    """The checkpoint's model, built under the dtype policy of ``mixed_precision`` (``auto``: the hardware's), its
    weights cast once (:func:`~keras_vit.models.for_inference`); ``num_heads`` for a file that does not record them
    (a timm state dict)."""
    import keras_vit

    try:
        policy = policy_of_choice(mixed_precision)
    except ValueError as exc:  # float16 on JAX's CPU
        raise CommandError(str(exc)) from exc
    with for_weights(weights), global_policy(policy):
        return keras_vit.for_inference(keras_vit.model_from_checkpoint(weights, num_heads=num_heads))


def _table(path: str, predictions: list[tuple[str, str, float]], scores: str) -> str:
    """The image's path, a header (the score column named by ``scores``), then one row per class, best first."""
    ids = max(len("class id"), *(len(wnid) for wnid, _, _ in predictions))
    names = max(len("name"), *(len(name) for _, name, _ in predictions))
    rows = [path, f"  {'rank':>4}  {'class id':<{ids}}  {'name':<{names}}  {scores:>8}"] + [
        f"  {rank:>4}  {wnid:<{ids}}  {name:<{names}}  {score:>8.4f}"
        for rank, (wnid, name, score) in enumerate(predictions, 1)
    ]
    return "\n".join(rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m keras_vit.predict", description=__doc__.split("\n")[0], formatter_class=HelpFormatter
    )
    parser.add_argument(
        "images", nargs="+", metavar="IMAGE", help="image files (any format PIL reads) or folders of them"
    )
    parser.add_argument(
        "--weights",
        required=True,
        metavar="NAME_OR_PATH",
        help="a zoo catalogue name (python -m keras_vit.zoo list), a checkpoint file or a saved model (.keras)",
    )
    parser.add_argument(
        "--num-heads",
        type=int,
        help="attention heads, for a file that does not record them (a timm state dict; default: the usual for its "
        "width, printed as a warning)",
    )
    parser.add_argument("--top", type=int, default=5, help="classes per image (default 5)")
    parser.add_argument(
        "--labels",
        metavar="SET_OR_FILE",
        help="imagenet1k, imagenet21k, or a file of class names, one a line in head order (a run's classes.txt); "
        "default: the model's recorded classes, else ImageNet's by the head's size (1000 or 21843)",
    )
    parser.add_argument(
        "--scores", choices=SCORES, default="softmax", help="what to print, the last column (default softmax)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print JSON instead of the table (per image: its path, a header, a row a class)",
    )
    add_mixed_precision_flag(parser)
    add_debug_flag(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command (exit status 0); an error is one line on stderr and exit status 1 (:mod:`keras_vit.cli`)."""
    args = _parser().parse_args(argv)
    with command_errors(args):
        if args.top < 1:
            raise CommandError(f"--top must be at least 1, got {args.top}")
        from keras_vit.labels import LABEL_SETS, read_label_file

        paths = image_files(args.images)
        images = [read_image(path) for path in paths]
        labels = args.labels if args.labels in (None, *LABEL_SETS) else read_label_file(args.labels)
        with for_weights(args.weights):
            locate_checkpoint(args.weights)  # a file, a folder or a catalogue name
        load_tensorflow()  # every argument checked and every image read
        model = _build_model(args.weights, args.mixed_precision, args.num_heads)
        results = classify(model, images, top=args.top, labels=labels, scores=args.scores, weights=args.weights)
    if args.json:
        out = [
            {"image": path, "predictions": [{"wnid": w, "name": n, "score": s} for w, n, s in preds]}
            for path, preds in zip(paths, results)
        ]
        print(json.dumps(out, indent=1))
    else:
        print("\n".join(_table(path, preds, args.scores) for path, preds in zip(paths, results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
