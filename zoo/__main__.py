"""``python -m keras_vit.zoo`` (or ``keras-vit-zoo``): list, download, inspect and convert the published checkpoints.

    python -m keras_vit.zoo list [--family augreg] [--json]
    python -m keras_vit.zoo download B_16.augreg_in21k_ft_in1k_384 [--timeout 30] [--deadline 3600]
    python -m keras_vit.zoo verify [NAMES...]      # OK / corrupt / unrecorded per cached file; exit 1 if corrupt
    python -m keras_vit.zoo info B_16.orig_in21k | path/to/file.npz
    python -m keras_vit.zoo convert B_16.orig_in21k_ft_in1k vit_b16_384.keras [--image-size 512] [--num-classes 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from keras_vit import zoo
from keras_vit.zoo.progress import ProgressBar


def _list(args) -> None:
    entries = [e for e in zoo.catalogue() if args.family in (None, e.family)]
    if args.json:
        print(json.dumps([dict(dataclasses.asdict(e), url=e.url) for e in entries], indent=1))
        return
    print(f"{'name':36} {'variant':9} {'pre-training':13} {'fine-tuning':13} {'res':>4} {'top-1':>7}  cached")
    for e in entries:
        top1 = "-" if e.top1 is None else f"{e.top1:.2f}"
        cached = "yes" if zoo.cache_path(e, args.cache_dir).is_file() else ""
        print(f"{e.name:36} {e.variant:9} {e.pretrain:13} {e.finetune or '-':13} {e.image_size:4} {top1:>7}  {cached}")
    print(f"\n{len(entries)} checkpoints from {zoo.base_url()} (cache: {zoo.cache_root(args.cache_dir)})")


def _download(args) -> None:
    for name in args.names:
        print(zoo.fetch(name, cache_dir=args.cache_dir, progress=True, timeout=args.timeout, deadline=args.deadline))


def _verify(args) -> int:
    entries = [zoo.get(name) for name in args.names] or list(zoo.catalogue())
    corrupt = checked = 0
    for entry in entries:
        result = zoo.check_cached(entry, args.cache_dir)
        if result is None:
            if args.names:
                print(f"{'missing':10} {entry.name}: not cached")
            continue
        status, detail = result
        checked += 1
        corrupt += status == "corrupt"
        print(f"{status:10} {entry.name}: {zoo.cache_path(entry, args.cache_dir)} ({detail})")
    print(f"{checked} cached files checked, {corrupt} corrupt (cache: {zoo.cache_root(args.cache_dir)})")
    return 1 if corrupt else 0


def _local(source: str, cache_dir) -> Path:
    """A local path for ``source``: a file, or a catalogue name that is cached (downloading it if asked)."""
    if Path(source).is_file():
        return Path(source)
    return zoo.fetch(source, cache_dir=cache_dir, progress=True)


def _info(args) -> None:
    from keras_vit.checkpoints import checkpoint_info, read_npz

    entry = zoo.find(args.source)
    if entry is not None:
        print(json.dumps(dict(dataclasses.asdict(entry), url=entry.url), indent=1))
    arrays = read_npz(_local(args.source, args.cache_dir))
    print(f"{arrays.source}: {len(arrays)} arrays, {sum(a.size for a in arrays.values()):,} parameters")
    print(checkpoint_info(arrays).describe())


def _convert(args) -> None:
    from keras_vit.checkpoints import model_from_checkpoint

    out = Path(args.output)
    if not out.name.endswith((".keras", ".weights.h5")):
        raise SystemExit(f"The output must end in .keras or .weights.h5, got {out}.")
    kwargs = dict(gelu=args.gelu, include_top=not args.no_top)
    if args.image_size:
        kwargs["image_size"] = args.image_size
    if args.num_classes:
        kwargs["num_classes"] = args.num_classes
    model = model_from_checkpoint(_local(args.source, args.cache_dir), resize_method=args.resize_method, **kwargs)
    suffix = ".keras" if out.name.endswith(".keras") else ".weights.h5"
    partial = out.with_name(out.name[: -len(suffix)] + ".partial" + suffix)
    (model.save if suffix == ".keras" else model.save_weights)(partial)
    os.replace(partial, out)
    print(f"{model.name}: {model.count_params():,} parameters, input {model.input_shape} -> {out}")


def main(argv: list[str] | None = None) -> None:
    """Run the command line; an error is one line on stderr and exit status 1 (130 when interrupted)."""
    parser = argparse.ArgumentParser(prog="python -m keras_vit.zoo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", help="cache root (default: $KERAS_HOME or ~/.keras)")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="list the catalogue")
    listing.add_argument("--family", choices=("original", "augreg"))
    listing.add_argument("--json", action="store_true", help="every field, as JSON")
    listing.set_defaults(run=_list)
    download = commands.add_parser("download", help="download checkpoints into the cache")
    download.add_argument("names", nargs="+")
    download.add_argument("--timeout", type=float, default=zoo.DEFAULT_TIMEOUT,
                          help="seconds without a byte before a try fails (default: %(default)s)")
    download.add_argument("--deadline", type=float, help="seconds for each file, all tries included (default: none)")
    download.set_defaults(run=_download)
    verify = commands.add_parser("verify", help="check cached files against their recorded sha256")
    verify.add_argument("names", nargs="*", help="catalogue names (default: every cached checkpoint)")
    verify.set_defaults(run=_verify)
    info = commands.add_parser("info", help="the architecture a checkpoint's shapes describe")
    info.add_argument("source", help="catalogue name or .npz path")
    info.set_defaults(run=_info)
    convert = commands.add_parser("convert", help="a checkpoint as a .keras (or .weights.h5) file")
    convert.add_argument("source", help="catalogue name or .npz path")
    convert.add_argument("output", help="path ending in .keras or .weights.h5")
    convert.add_argument("--image-size", type=int, help="resolution (default: the checkpoint's)")
    convert.add_argument("--num-classes", type=int, help="classes (default: the checkpoint's head)")
    convert.add_argument("--no-top", action="store_true", help="drop the classifier (features only)")
    convert.add_argument("--gelu", choices=("tanh", "exact"), default="tanh", help="tanh: as the Flax models")
    convert.add_argument("--resize-method", choices=("zoom_linear", "bilinear", "bicubic"), default="zoom_linear")
    convert.set_defaults(run=_convert)
    args = parser.parse_args(argv)
    try:
        status = args.run(args)
    except (ValueError, OSError) as exc:  # DownloadError is an OSError
        ProgressBar.end_line()
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        ProgressBar.end_line()
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    if status:
        raise SystemExit(status)


if __name__ == "__main__":
    main()
