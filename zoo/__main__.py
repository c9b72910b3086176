"""``python -m keras_vit.zoo`` (or ``keras-vit-zoo``): list, download, inspect and convert the published checkpoints.

Usage and examples: docs/weights.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

from keras_vit import zoo
from keras_vit.cli import HelpFormatter, add_debug_flag, command_errors, load_tensorflow
from keras_vit.config import RESIZE_METHODS, field_names, model_flags
from keras_vit.fields import add_arguments, given
from keras_vit.names import locate_checkpoint
from keras_vit.zoo.download import DEADLINE_ENV, redact
from keras_vit.zoo.progress import ProgressBar

# convert's model flags: what a checkpoint's model may be built with (fields of keras_vit.config.ViTConfig).
_CONVERT_FLAGS = ("image_size", "num_classes", *field_names("numerics"))
CONVERT_FLAGS = model_flags(
    "ConvertFlags",
    _CONVERT_FLAGS,
    "The model the checkpoint is built into (keras_vit.config.ViTConfig)",
    unset=dict.fromkeys(_CONVERT_FLAGS, "the checkpoint's"),
)
STAGING = ".convert-"  # convert's staging folders beside its output: .convert-<12 hex>.tmp (keras_vit.staging)


def _list(args) -> None:
    chosen = set(zoo.names(args.pattern))
    entries = [e for e in zoo.catalogue() if args.family in (None, e.family) and e.name in chosen]
    if args.json:
        print(json.dumps([dict(dataclasses.asdict(e), url=redact(e.url)) for e in entries], indent=1))
        return
    head = f"{'name':36} {'variant':19} {'pre-training':13} {'fine-tuning':13} {'res':>4} {'top-1':>7}  {'params':>7}"
    print(f"{head}  {'licence':10} cached")
    for e in entries:
        top1 = "-" if e.top1 is None else f"{e.top1:.2f}"
        mark = "*" if _timm_number(e) else " "
        params = "-" if e.parameters is None else f"{e.parameters / 1e6:.1f}M"
        cached = "yes" if zoo.cache_path(e, args.cache_dir).is_file() else ""
        print(
            f"{e.name:36} {e.variant:19} {e.pretrain:13} {e.finetune or '-':13} {e.image_size:4} {top1:>7}{mark} "
            f"{params:>7}  {e.licence or '-':10} {cached}"
        )
    if any(map(_timm_number, entries)):
        print("* top-1 of timm's own evaluation, not the authors' (see top1_source: --json)")
    hosts = {"the Hugging Face Hub (timm's copies)" if e.source_url else redact(zoo.base_url()) for e in entries}
    where = " and ".join(sorted(hosts)) or redact(zoo.base_url())
    print(f"\n{len(entries)} checkpoints from {where} (cache: {zoo.cache_root(args.cache_dir)})")


def _timm_number(entry) -> bool:
    return entry.top1 is not None and (entry.top1_source or "").startswith("timm's own evaluation")


def _fetch(name: str, cache_dir, **kwargs) -> Path:
    """``zoo.fetch`` held to the entry's architecture (the loader's check: a file of another model is refused)."""
    load_tensorflow()  # the checkpoint readers load Keras
    from keras_vit.checkpoints.read import catalogue_check

    return zoo.fetch(name, cache_dir=cache_dir, progress=True, check=catalogue_check(zoo.get(name)), **kwargs)


def _download(args) -> None:
    for name in args.names:  # every name checked before TensorFlow loads
        zoo.get(name)
    for name in args.names:
        print(_fetch(name, args.cache_dir, timeout=args.timeout, deadline=args.deadline))


def _verify(args) -> int:
    entries = [zoo.get(name) for name in args.names] or list(zoo.catalogue())
    load_tensorflow()
    from keras_vit.checkpoints.read import catalogue_check

    corrupt = checked = architecture_only = 0
    for entry in entries:
        result = zoo.check_cached(entry, args.cache_dir, check=catalogue_check(entry))
        if result is None:
            if args.names:
                print(f"{'missing':10} {entry.name}: not cached")
            continue
        status, detail = result
        checked += 1
        corrupt += status == "corrupt"
        architecture_only += not (entry.sha256 or entry.size)
        path = zoo.cache_path(entry, args.cache_dir)
        print(f"{status:10} {entry.name}: {path} ({detail}; checked by {entry.checked_by})")
    print(
        f"{checked} cached files checked, {corrupt} corrupt; {architecture_only} by their architecture only, with no "
        f"public size or sha256 (cache: {zoo.cache_root(args.cache_dir)})"
    )
    return 1 if corrupt else 0


def _local(source: str, cache_dir) -> Path:
    """A local path for ``source``: a file, or a catalogue name that is cached (downloading it if asked)."""
    if Path(source).exists():  # a file, or a Hugging Face / keras-hub folder
        return Path(source)
    return _fetch(source, cache_dir)


def _info(args) -> None:
    locate_checkpoint(args.source)  # a missing path or an unknown name, told before TensorFlow loads
    load_tensorflow()
    from keras_vit.checkpoints import checkpoint_info, read_npz
    from keras_vit.zoo.validate import check_npz

    entry = zoo.find(args.source)
    if entry is not None:
        print(json.dumps(dict(dataclasses.asdict(entry), url=redact(entry.url)), indent=1))
    path = _local(args.source, args.cache_dir)
    if path.is_file():
        check_npz(path, required=())  # the zoo's own verdict on a damaged file, before numpy reads it
    arrays = read_npz(path)
    print(f"{arrays.source}: {len(arrays)} arrays, {sum(a.size for a in arrays.values()):,} parameters")
    print(checkpoint_info(arrays).describe())


# --format -> (output suffix, what it writes); without --format the output's suffix picks the format.
FORMATS = {
    "keras": (".keras", "a .keras model"),
    "weights_h5": (".weights.h5", "Keras weights"),
    "timm-safetensors": (".safetensors", "a timm state dict"),
    "saved_model": ("", "a TensorFlow SavedModel folder"),
    "litert": (".tflite", "a LiteRT (TFLite) flatbuffer"),
    "onnx": (".onnx", "an ONNX file"),
}


def _output_format(output: Path, chosen: str | None) -> str:
    """The format to write ``output`` in: ``--format``, else the one its suffix names."""
    if chosen is not None:
        suffix = FORMATS[chosen][0]
        if not output.name.endswith(suffix):
            raise ValueError(f"--format {chosen} writes a path ending in {suffix!r}, got {output}.")
        return chosen
    for name, (suffix, _) in FORMATS.items():
        if suffix and output.name.endswith(suffix):
            return name
    known = ", ".join(suffix for suffix, _ in FORMATS.values() if suffix)
    raise ValueError(f"Can't tell the output format of {output}: end it in {known}, or pass --format saved_model.")


def _write(model, path: Path, output_format: str, quantize: str | None) -> None:
    """Write ``model`` to ``path`` in ``output_format``: in a staging folder beside it (:mod:`keras_vit.staging`,
    whose next use removes a killed convert's), moved onto ``path`` when complete; every file gets the umask's mode
    (:func:`keras_vit.files.atomic_path`). A failure leaves no partial output."""
    from keras_vit import export
    from keras_vit.checkpoints import save_timm_safetensors
    from keras_vit.files import atomic_path
    from keras_vit.staging import staging_folder

    def atomically(save, target):
        with atomic_path(target) as temporary:
            save(temporary)

    writers: dict[str, Callable[[Path], object]] = {
        "keras": lambda p: atomically(model.save, p),
        "weights_h5": lambda p: atomically(model.save_weights, p),
        "timm-safetensors": lambda p: save_timm_safetensors(model, p),
        "saved_model": lambda p: export.export_saved_model(model, p),
        "litert": lambda p: export.export_litert(model, p, quantize=quantize),
        "onnx": lambda p: export.export_onnx(model, p),
    }
    with staging_folder(path.parent, STAGING) as staging:
        try:
            writers[output_format](staging / path.name)
        except ImportError as exc:
            raise ValueError(f"--format {output_format}: {exc}") from None  # names the module and how to install it
        os.replace(staging / path.name, path)


def _convert(args) -> None:
    out = Path(args.output)
    output_format = _output_format(out, args.format)
    if out.is_dir() or (out.exists() and not args.overwrite):  # checked before the model is built
        how = "remove it or choose another name" if out.is_dir() else "pass --overwrite to replace it"
        raise ValueError(f"The output {out} exists ({'a folder' if out.is_dir() else 'a file'}): {how}.")
    if args.quantize and output_format != "litert":
        raise ValueError(f"--quantize applies to --format litert (.tflite), not {output_format}.")
    locate_checkpoint(args.source)  # a missing path or an unknown name, told before TensorFlow loads
    load_tensorflow()
    import keras

    from keras_vit.checkpoints import model_from_checkpoint
    from keras_vit.zoo.validate import check_archive

    kwargs = dict(include_top=not args.no_top, **given(args, CONVERT_FLAGS))
    if args.num_heads:
        kwargs["num_heads"] = args.num_heads
    if args.source.endswith(".keras") and Path(args.source).is_file():
        check_archive(args.source)  # its declared sizes, before Keras unpacks it
        model = keras.saving.load_model(args.source)  # e.g. a model fine-tuned here, back to timm
    else:
        model = model_from_checkpoint(_local(args.source, args.cache_dir), resize_method=args.resize_method, **kwargs)
    _write(model, out, output_format, args.quantize)
    written = FORMATS[output_format][1] + (f", {args.quantize}" if args.quantize else "")
    print(f"{model.name}: {model.count_params():,} parameters, input {model.input_shape} -> {out} ({written})")


def build_parser() -> argparse.ArgumentParser:
    """The command line: ``list``, ``download``, ``verify``, ``info`` and ``convert``."""
    parser = argparse.ArgumentParser(
        prog="python -m keras_vit.zoo", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter
    )
    parser.add_argument("--cache-dir", help="cache root (default: $KERAS_HOME or ~/.keras)")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, run, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, formatter_class=HelpFormatter)
        sub.set_defaults(run=run)
        return sub

    listing = command("list", _list, "list the catalogue")
    listing.add_argument(
        "pattern", nargs="?", help="names matching a shell-style pattern, e.g. 'B_16*' (quoted; default: every name)"
    )
    listing.add_argument("--family", choices=zoo.families(), help="only this family's checkpoints (default: all)")
    listing.add_argument("--json", action="store_true", help="every field, as JSON")
    download = command("download", _download, "download checkpoints into the cache")
    download.add_argument("names", nargs="+", help="catalogue names (python -m keras_vit.zoo list)")
    download.add_argument(
        "--timeout",
        type=float,
        default=zoo.DEFAULT_TIMEOUT,
        help="seconds without a byte before a try fails (default: %(default)s)",
    )
    download.add_argument(
        "--deadline",
        type=float,
        help=f"seconds for each file, all tries included (default: ${DEADLINE_ENV}, else from the size)",
    )
    verify = command("verify", _verify, "check cached files against their recorded sha256")
    verify.add_argument("names", nargs="*", help="catalogue names (default: every cached checkpoint)")
    command("info", _info, "the architecture a checkpoint's shapes describe").add_argument(
        "source", help="catalogue name or .npz path"
    )
    convert = command(
        "convert", _convert, "a checkpoint as .keras, .weights.h5, timm .safetensors, SavedModel, .tflite or .onnx"
    )
    convert.add_argument("source", help="catalogue name, .npz, timm / Hugging Face / keras-hub checkpoint, or .keras")
    convert.add_argument(
        "output", help="path ending in .keras, .weights.h5, .safetensors (timm), .tflite or .onnx; or a folder"
    )
    convert.add_argument("--format", choices=list(FORMATS), help="default: from the output's suffix")
    convert.add_argument(
        "--quantize", choices=("dynamic_int8",), help="int8 weights (--format litert only; default: float32)"
    )
    convert.add_argument("--no-top", action="store_true", help="drop the classifier (features only)")
    convert.add_argument(
        "--overwrite", action="store_true", help="replace an existing output file (once the new one is complete)"
    )
    convert.add_argument("--num-heads", type=int, help="attention heads of a timm state dict (default: from width)")
    convert.add_argument(
        "--resize-method",
        choices=RESIZE_METHODS,
        default=RESIZE_METHODS[0],
        help="how position embeddings go to another image size (default: %(default)s)",
    )
    add_arguments(convert.add_argument_group("model", CONVERT_FLAGS.__doc__), CONVERT_FLAGS())
    add_debug_flag(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run the command line; an error is one line on stderr and exit status 1 (:mod:`keras_vit.cli`)."""
    args = build_parser().parse_args(argv)
    with command_errors(args):
        try:
            status = args.run(args)
        finally:
            ProgressBar.end_line()  # an error's line starts a line of its own
    if status:
        raise SystemExit(status)


if __name__ == "__main__":
    main()
