"""Export a model for serving (SavedModel, LiteRT/TFLite float32 or int8, ONNX, OpenVINO) and run the exported files.
Each file appears at its path only when complete (:func:`load` runs it). Formats, sizes, differences: docs/export.md."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from keras_vit.checks import check_choice
from keras_vit.cli import CommandError, HelpFormatter, add_debug_flag, command_errors, for_weights, load_tensorflow
from keras_vit.files import atomic_path
from keras_vit.names import locate_checkpoint
from keras_vit.optional import INSTALL, require
from keras_vit.staging import staging_folder

if TYPE_CHECKING:
    import keras

__all__ = [
    "FORMATS",
    "QUANTIZATIONS",
    "QUANTIZED_UNSUPPORTED",
    "TOLERANCE",
    "check_export",
    "compare",
    "export_litert",
    "export_onnx",
    "export_openvino",
    "export_saved_model",
    "float32_model",
    "load",
    "main",
    "parser",
    "photo_crops",
    "photo_images",
    "with_preprocessing",
]

QUANTIZATIONS = (None, "dynamic_int8")
Runner = Callable[[np.ndarray], np.ndarray]
# An export's check: float32 outputs within TOLERANCE x max(1, largest |output|) of the float32 Keras model's.
TOLERANCE = 1e-3
OPENVINO_FILE = "model.xml"  # in an OpenVINO folder, beside model.bin
OPENVINO_PRECISIONS = ("f32", "bf16")
STAGING = ".export-"  # the command's staging folders in OUT_DIR: .export-<12 hex>.tmp (keras_vit.staging)

# (backend, format) -> why Keras' exporter does not run there (keras 3.15, torch 2.14; docs/backends.md).
UNSUPPORTED = {
    ("jax", "litert"): "Keras converts to LiteRT from TensorFlow or torch only",
    ("torch", "litert"): "Keras' torch path needs litert-torch and fixes the batch size; not tested here",
    ("torch", "saved_model"): "Keras' torch SavedModel export fails in torch.export, even for a Dense layer",
    ("torch", "onnx"): "Keras' torch ONNX export fails on its own LayerNormalization",
    ("jax", "openvino"): "Keras' jax2tf path leaves an XlaCallModule op that OpenVINO cannot convert",
    ("torch", "openvino"): "Keras traces the model with torch.jit.trace, which fixes a model with preprocessing "
    "inside to the traced batch",
}

# (Keras export format, quantization mode) -> why its runtime does not run a model.quantize(mode) model (Keras
# 3.15, TensorFlow 2.21, OpenVINO 2026.4; docs/export.md). The other pairs are run and checked like any export.
QUANTIZED_UNSUPPORTED = {
    ("litert", "int8"): "the LiteRT converter has no int8 x int8 matmul for Keras' int8 Dense",
    ("litert", "float8"): "LiteRT has no float8 tensors",
    ("openvino", "int8"): "OpenVINO's conversion of Keras' int8 x int8 -> int32 matmul gives other logits",
    ("openvino", "float8"): "OpenVINO does not compile Keras' float8 casts",
}


def _check_quantized(model: keras.Model, fmt: str) -> None:
    """A ``ValueError`` with the ways round it where ``fmt``'s runtime does not run ``model``'s quantized layers."""
    modes = sorted({layer.quantization_mode for layer in model._flatten_layers() if layer.quantization_mode})
    reasons = [QUANTIZED_UNSUPPORTED[(fmt, mode)] for mode in modes if (fmt, mode) in QUANTIZED_UNSUPPORTED]
    if reasons:
        raise ValueError(
            f"{fmt} export of a model quantized by Keras ({', '.join(modes)}) does not run: {'; '.join(reasons)}. "
            "Write a SavedModel, or export the float model with export_litert(..., quantize='dynamic_int8') or "
            "export_openvino(..., quantize='int8', calibration=images)."
        )


def _check_backend(fmt: str) -> None:
    """A ``ValueError`` with the way round it when the current Keras backend cannot export ``fmt``."""
    import keras

    backend = keras.backend.backend()
    reason = UNSUPPORTED.get((backend, fmt))
    if reason is not None:
        raise ValueError(
            f"{fmt} export does not run on the {backend} backend ({reason}). Save the model as .keras here "
            "and export it in a process with KERAS_BACKEND=tensorflow: .keras files load on every backend."
        )


def with_preprocessing(
    model: keras.Model, *, crop_fraction: float | None = None, input_dtype: str = "uint8"
) -> keras.Model:
    """``model`` behind an :class:`ImagePreprocessor`: takes images in [0, 255] of any size, ``(B, H, W, 3)`` (a
    channels-first model: ``(B, 3, H, W)``)."""
    import keras

    from keras_vit.inputs import model_data_format, model_image_shape
    from keras_vit.layers import format_shape
    from keras_vit.preprocessing import ImagePreprocessor

    layout = model_data_format(model)
    inputs = keras.Input(format_shape((None, None, None, 3), layout)[1:], dtype=input_dtype, name="images")
    size = model_image_shape(model)[:2]
    x = ImagePreprocessor(size, crop_fraction=crop_fraction, data_format=layout, name="preprocess")(inputs)
    return keras.Model(inputs, model(x), name=f"{model.name}_with_preprocessing")


def export_saved_model(model: keras.Model, path: str | os.PathLike, **kwargs) -> Path:
    """A TensorFlow SavedModel folder at ``path`` (not existing yet); TensorFlow and JAX backends."""
    _check_backend("saved_model")
    require("tensorflow", "SavedModel export")
    if os.path.lexists(path):
        raise ValueError(f"{path} exists; remove it or choose another folder for the SavedModel.")
    return _export(model, path, "tf_saved_model", **kwargs)


def export_litert(model: keras.Model, path: str | os.PathLike, *, quantize: str | None = None, **kwargs) -> Path:
    """A LiteRT (TFLite) flatbuffer, ``path`` ending in ``.tflite``, float32 or with ``quantize="dynamic_int8"`` int8
    weights (about 4x smaller); ``kwargs`` go to ``tf.lite.TFLiteConverter``. TensorFlow backend only.
    """
    check_choice(quantize, QUANTIZATIONS, "quantize")
    _check_backend("litert")
    tf = require("tensorflow", "LiteRT export")
    if quantize == "dynamic_int8":
        kwargs.setdefault("optimizations", [tf.lite.Optimize.DEFAULT])
    return _export(model, path, "litert", exact=quantize is None, **kwargs)


def export_onnx(model: keras.Model, path: str | os.PathLike, *, opset_version: int | None = None, **kwargs) -> Path:
    """An ONNX file (``model.export(format="onnx")``): through ``tf2onnx`` on TensorFlow (needs ``tf2onnx`` and
    ``onnx``; any batch size), through ``jax2onnx`` on JAX (a fixed shape, given as ``input_signature``)."""
    import keras

    _check_backend("onnx")
    if keras.backend.backend() == "jax" and kwargs.get("input_signature") is None:
        raise ValueError(
            "ONNX export on JAX (jax2onnx) needs a fixed input shape: pass input_signature=[keras.InputSpec("
            "shape=(batch, height, width, 3))], since jax2onnx cannot lower the model's reshapes with a symbolic "
            "batch. Or export from a process with KERAS_BACKEND=tensorflow, whose ONNX file takes any batch."
        )
    model = float32_model(model)
    model(_sample(model, kwargs.get("input_signature")))  # Keras exports only a model that has been called
    return _export(model, path, "onnx", opset_version=opset_version, **kwargs)


def export_openvino(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    quantize: str | None = None,
    calibration: np.ndarray | None = None,
    **kwargs,
) -> Path:
    """An OpenVINO IR folder at ``path`` (not existing yet), ``model.xml`` and ``model.bin`` (needs ``openvino``),
    checked before it is kept. ``quantize="int8"``: NNCF (needs ``nncf``) calibrated on ``calibration``, images as
    the model takes them (docs/export.md)."""
    check_choice(quantize, (None, "int8"), "quantize")
    _check_backend("openvino")
    require("openvino", "OpenVINO export")
    if quantize and (calibration is None or len(calibration) == 0):
        raise ValueError("quantize='int8' needs calibration images (N, H, W, 3), as the model takes them.")
    if quantize:
        require("nncf", "OpenVINO int8 quantisation")
    if os.path.lexists(path):
        raise ValueError(f"{path} exists; remove it or choose another folder for the OpenVINO model.")
    rewrite = (lambda xml: _quantize_openvino(xml, cast(np.ndarray, calibration))) if quantize else None
    return _export(model, path, "openvino", exact=quantize is None, file_name=OPENVINO_FILE, then=rewrite, **kwargs)


def _quantize_openvino(xml: str, calibration: np.ndarray) -> None:
    """The OpenVINO model at ``xml`` replaced by its NNCF int8 quantisation, calibrated one image at a time."""
    import nncf
    import openvino

    quantized = nncf.quantize(
        openvino.Core().read_model(xml),
        nncf.Dataset([np.asarray(image, "float32")[None] for image in calibration]),
        model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(calibration),
    )
    staged = xml.removesuffix(".xml") + ".int8.xml"
    openvino.save_model(quantized, staged, compress_to_fp16=False)
    for suffix in (".bin", ".xml"):
        os.replace(staged.removesuffix(".xml") + suffix, xml.removesuffix(".xml") + suffix)


def float32_model(model: keras.Model) -> keras.Model:
    """``model`` itself when every layer computes in float32, else a float32 copy (its weights cast; quantized
    layers stay quantized, computing in float32): what the exporters write (why: docs/export.md)."""
    import keras

    from keras_vit.cloning import copy_weights

    if all(layer.compute_dtype == "float32" for layer in model._flatten_layers()):
        return model
    copy = keras.saving.deserialize_keras_object(_in_float32(keras.saving.serialize_keras_object(model)))
    return copy_weights(model, copy)  # layer by layer: a quantized layer's variables are not in get_weights' order


def _in_float32(config):
    """A serialized model's config with every dtype policy and half-precision dtype made float32 (a quantized
    policy's source and a policy map's default too)."""
    if isinstance(config, dict):
        if config.get("class_name") == "DTypePolicy":
            return {**config, "config": {**config["config"], "name": "float32"}}
        sources = {key: "float32" for key in ("source_name", "default_policy") if isinstance(config.get(key), str)}
        return {key: _in_float32(value) for key, value in config.items()} | sources
    if isinstance(config, list):
        return [_in_float32(value) for value in config]
    return "float32" if config in ("bfloat16", "float16") else config


def _export(
    model: keras.Model,
    path: str | os.PathLike,
    fmt: str,
    *,
    exact: bool = True,
    file_name: str = "",
    then: Callable[[str], None] | None = None,
    **kwargs,
) -> Path:
    """``model`` in float32 exported to ``path`` as ``fmt``, checked (:func:`check_export`) and renamed into place, or
    removed with a ``ValueError`` saying why; ``file_name``: ``path`` is a new folder holding that file."""
    _check_quantized(model, fmt)
    model = float32_model(model)
    with atomic_path(path, owned=True) as temporary:
        if file_name:
            os.mkdir(temporary)
        target = os.path.join(temporary, file_name) if file_name else temporary
        model.export(target, format=fmt, verbose=False, **kwargs)
        if then is not None:
            then(target)
        check_export(model, temporary, exact=exact, input_signature=kwargs.get("input_signature"), shown_as=path)
    return Path(path)


def _sample(model: keras.Model, input_signature=None) -> np.ndarray:
    """Two random inputs the model takes (the signature's shape when given; 224 where a size is free)."""
    import keras

    spec = input_signature[0] if input_signature else None
    shape = tuple(spec.shape) if spec is not None else (2, *(size or 224 for size in model.input_shape[1:]))
    dtype = np.dtype(keras.backend.standardize_dtype(model.inputs[0].dtype))
    rng = np.random.default_rng(0)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 256, shape).astype(dtype)
    return rng.uniform(-1, 1, shape).astype(dtype)


def check_export(
    model: keras.Model, path: str | os.PathLike, *, exact: bool = True, input_signature=None, shown_as=None
) -> float:
    """Run the export at ``path`` once in its runtime (:func:`load`) on random inputs: a ``ValueError`` naming
    the file when it does not run, gives outputs of another shape, non-finite ones, or (``exact``) outputs
    further than ``TOLERANCE x max(1, largest |output|)`` from ``model``'s. Returns the largest difference."""
    import keras

    shown_as = shown_as or path
    images = _sample(model, input_signature)
    expected = keras.tree.flatten(model(images, training=False))[0]
    expected = keras.ops.convert_to_numpy(expected).astype("float32")
    try:
        got = np.asarray(load(path, precision="f32" if _is_openvino(Path(path)) else None)(images), dtype="float32")
    except ImportError:
        raise
    except Exception as exc:  # whatever the runtime raises (onnxruntime's own types, LiteRT's RuntimeError)
        raise ValueError(f"{shown_as}: the exported file does not run, so it was not kept: {exc}") from exc
    if got.shape != expected.shape or not np.isfinite(got).all():
        raise ValueError(
            f"{shown_as}: the exported file gives outputs of shape {got.shape} (finite: {np.isfinite(got).all()}), "
            f"the model {expected.shape}, so it was not kept."
        )
    difference = float(np.abs(got - expected).max())
    bound = TOLERANCE * max(1.0, float(np.abs(expected).max()))
    if exact and difference > bound:
        raise ValueError(
            f"{shown_as}: the exported file's outputs differ from the model's by up to {difference:.3g} "
            f"(allowed {bound:.3g}), so it was not kept."
        )
    return difference


def _saved_model_runner(path: Path) -> Runner:
    tf = require("tensorflow", "Running a SavedModel")
    loaded = tf.saved_model.load(str(path))  # kept alive by the closure: it owns the variables
    return lambda images: np.asarray(loaded.serve(images))


def _litert_runner(path: Path) -> Runner:
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        Interpreter = require("tensorflow", "Running a .tflite file without ai-edge-litert").lite.Interpreter
    interpreter = Interpreter(model_path=str(path))
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()

    def run(images: np.ndarray) -> np.ndarray:
        images = np.asarray(images, dtype=inp["dtype"])
        if tuple(interpreter.get_input_details()[0]["shape"]) != images.shape:
            interpreter.resize_tensor_input(inp["index"], images.shape)
        interpreter.allocate_tensors()
        interpreter.set_tensor(inp["index"], images)
        interpreter.invoke()
        return interpreter.get_tensor(out["index"]).copy()

    return run


def _onnx_runner(path: Path) -> Runner:
    onnxruntime = require("onnxruntime", "Running an .onnx file")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    return lambda images: session.run(None, {inp.name: np.asarray(images)})[0]


def _openvino_runner(path: Path, precision: str | None) -> Runner:
    openvino = require("openvino", "Running an OpenVINO model")
    from keras_vit.precision import openvino_precision

    precision = check_choice(precision or openvino_precision(), OPENVINO_PRECISIONS, "OpenVINO precision")
    xml = path / OPENVINO_FILE if path.is_dir() else path
    compiled = openvino.Core().compile_model(str(xml), "CPU", {"INFERENCE_PRECISION_HINT": precision})
    return lambda images: np.asarray(compiled(np.asarray(images))[0])


def _is_openvino(path: Path) -> bool:
    return path.suffix == ".xml" or (path / OPENVINO_FILE).is_file()


def load(path: str | os.PathLike, *, precision: str | None = None) -> Runner:
    """A function ``images -> outputs`` (numpy) that runs an export: a SavedModel folder, ``.tflite``, ``.onnx``, or an
    OpenVINO folder or ``.xml``. ``precision`` is OpenVINO's (``"f32"``, ``"bf16"``; ``None``:
    :func:`~keras_vit.precision.openvino_precision`)."""
    path = Path(path)
    if _is_openvino(path):
        return _openvino_runner(path, precision)
    if precision is not None:
        raise ValueError(f"precision={precision!r} is OpenVINO's; {path} runs in the precision it was written in.")
    if path.is_dir():
        return _saved_model_runner(path)
    if path.suffix == ".tflite":
        return _litert_runner(path)
    if path.suffix == ".onnx":
        return _onnx_runner(path)
    raise ValueError(
        f"Can't tell the format of {path}: expected a SavedModel or OpenVINO folder, a .tflite, .onnx or .xml file."
    )


# --- measuring an export against the Keras model ---------------------------------------------------------------

FORMATS = {  # name -> (file name in the output folder, exporter)
    "saved_model": ("saved_model", export_saved_model),
    "litert": ("model.tflite", export_litert),
    "litert_int8": ("model_int8.tflite", lambda model, path: export_litert(model, path, quantize="dynamic_int8")),
    "onnx": ("model.onnx", export_onnx),
    "openvino": ("openvino", export_openvino),
}


def photo_crops(count: int = 16, seed: int = 0) -> list[np.ndarray]:
    """``count`` uint8 crops (random windows, 30-100% of each side) of scikit-learn's two sample photos."""
    from sklearn.datasets import load_sample_image

    photos = [load_sample_image("china.jpg"), load_sample_image("flower.jpg")]
    rng = np.random.default_rng(seed)
    crops = []
    for i in range(count):
        photo = photos[i % 2]
        height, width = (int(rng.uniform(0.3, 1.0) * n) for n in photo.shape[:2])
        top, left = rng.integers(0, photo.shape[0] - height + 1), rng.integers(0, photo.shape[1] - width + 1)
        crops.append(photo[top : top + height, left : left + width])
    return crops


def photo_images(image_size: int | tuple[int, int], count: int = 16, seed: int = 0) -> np.ndarray:
    """``(count, H, W, 3)`` float32 in [-1, 1]: :func:`photo_crops` ``(count, seed)`` through
    :class:`~keras_vit.preprocessing.ImagePreprocessor` at ``image_size``, the inputs a model of that size takes.
    Different seeds give different crops (e.g. calibration and evaluation sets for int8 quantisation)."""
    import keras

    from keras_vit.preprocessing import ImagePreprocessor

    preprocess = ImagePreprocessor(image_size, data_format="channels_last")
    return np.stack([keras.ops.convert_to_numpy(preprocess(crop)) for crop in photo_crops(count, seed)])


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def compare(model: keras.Model, path: str | os.PathLike, images: np.ndarray) -> dict:
    """Run the export at ``path`` and ``model`` on ``images``: size, largest output difference, top-1 agreement."""
    expected = np.asarray(model.predict_on_batch(images))
    got = load(path)(images)
    return {
        "bytes": _size(Path(path)),
        "max_abs_diff": float(np.abs(got - expected).max()),
        "top1_agreement": float(np.mean(got.argmax(-1) == expected.argmax(-1))),
        "max_abs_output": float(np.abs(expected).max()),
    }


def parser() -> argparse.ArgumentParser:
    """The command line: ``OUT_DIR --weights NAME_OR_PATH [--formats ...] [--images N] [--overwrite]``."""
    parser = argparse.ArgumentParser(
        prog="python -m keras_vit.export", description=__doc__.split("\n")[0], formatter_class=HelpFormatter
    )
    parser.add_argument("out", metavar="OUT_DIR", help="folder for the exported files")
    parser.add_argument(
        "--weights", required=True, metavar="NAME_OR_PATH", help="zoo name, checkpoint file or saved model (.keras)"
    )
    parser.add_argument(
        "--formats",
        nargs="+",
        choices=list(FORMATS),
        default=list(FORMATS),
        metavar="FORMAT",
        help=f"which to write, of {', '.join(FORMATS)} (default: all)",
    )
    parser.add_argument("--images", type=int, default=16, help="photo crops to compare on (default 16)")
    parser.add_argument("--overwrite", action="store_true", help="replace exported files OUT_DIR already holds")
    add_debug_flag(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m keras_vit.export OUT_DIR --weights NAME_OR_PATH [--formats ...]``: export, compare, print a table."""
    command_line = parser()
    args = command_line.parse_args(argv)
    if args.images < 1:
        command_line.error(f"--images must be positive, got {args.images}.")
    with command_errors(args):
        targets = _targets(Path(args.out), args.formats, args.overwrite)  # before TensorFlow loads, as the weights
        with for_weights(args.weights):
            locate_checkpoint(args.weights)  # a file, a folder or a catalogue name
        load_tensorflow()
        _export_and_compare(args, targets)
    return 0


def _targets(out: Path, formats: Sequence[str], overwrite: bool) -> dict[str, Path]:
    """``{format: its path in out}``; a ``CommandError`` when ``out`` is a file, or holds one and not ``overwrite``."""
    if out.exists() and not out.is_dir():
        raise CommandError(f"OUT_DIR {out} is a file, not a folder.")
    targets = {name: out / FORMATS[name][0] for name in formats}
    existing = [str(path) for path in targets.values() if path.exists()]
    if existing and not overwrite:
        raise CommandError(f"{', '.join(existing)} already exist: pass --overwrite to replace them.")
    return targets


def _export_and_compare(args: argparse.Namespace, targets: dict[str, Path]) -> None:
    """The command's work: each format written, run and compared with the model (one table row each), in a
    staging folder inside ``OUT_DIR``; the files enter ``OUT_DIR`` only when every format is done."""
    import keras_vit
    from keras_vit.inputs import for_model, model_image_shape

    out = Path(args.out)
    with for_weights(args.weights):
        model = keras_vit.model_from_checkpoint(args.weights)
    images = for_model(photo_images(model_image_shape(model)[:2], args.images), model)
    out.mkdir(parents=True, exist_ok=True)
    with staging_folder(out, STAGING) as staging:  # a killed export's staging folder is removed here
        print(f"{'format':<12} {'size (MB)':>10} {'max |diff|':>11} {'top-1 agree':>12} {'max |out|':>10}")
        written, skipped = [], []
        for name, target in targets.items():
            try:
                FORMATS[name][1](model, staging / target.name)
            except (ImportError, ValueError) as exc:  # a converter not installed, a format this backend can't write
                print(f"{name:<12} skipped: {_why_skipped(exc)}")
                skipped.append(name)
                continue
            written.append(target)
            row = compare(model, staging / target.name, images)
            print(
                f"{name:<12} {row['bytes'] / 1e6:>10.2f} {row['max_abs_diff']:>11.2e} {row['top1_agreement']:>12.3f}"
                f" {row['max_abs_output']:>10.2f}"
            )
        for target in written:  # all formats done: replace (--overwrite) and move in
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(staging / target.name, target)
    if skipped:
        raise CommandError(f"not exported: {', '.join(skipped)} (see the table above).")


def _why_skipped(error: Exception) -> str:
    """The table's reason for a skipped format; a missing package names its install command."""
    module = getattr(error, "name", None) if isinstance(error, ImportError) else None
    if module is None or "pip install" in str(error):
        return str(error)
    return f"{error}: {INSTALL.get(module.split('.')[0], 'pip install ' + module.split('.')[0])}"


if __name__ == "__main__":
    sys.exit(main())
