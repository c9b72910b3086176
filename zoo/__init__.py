"""The zoo: the catalogue of published ViT checkpoints (``catalogue.json``) and their download cache under
``$KERAS_HOME/models/vit_models/`` (``zoo.names()``, ``zoo.get(name)``, ``zoo.fetch(name)``; ``KERAS_VIT_ZOO_URL``:
a mirror). Cache layout and faults: docs/faults.md; command line: ``python -m keras_vit.zoo``."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from . import download
from .cache import CORRUPT, check_file
from .download import DEFAULT_TIMEOUT, CorruptCheckpointError, DownloadError
from .progress import ProgressBar
from .validate import validator

CATALOGUE = Path(__file__).with_name("catalogue.json")
MIRROR_ENV = "KERAS_VIT_ZOO_URL"

__all__ = [
    "Checkpoint",
    "CorruptCheckpointError",
    "DownloadError",
    "aliases",
    "base_url",
    "cache_path",
    "cache_root",
    "catalogue",
    "check_cached",
    "families",
    "fetch",
    "find",
    "get",
    "names",
    "resolve_alias",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """One published checkpoint (a row of ``catalogue.json``; fields with a default may be left out of a row)."""

    name: str
    path: str  # relative to the bucket, e.g. "imagenet21k/ViT-B_16.npz"
    variant: str  # "B/16", "R50+B/16", a family's "deit_s16_distilled", "dinov2_s14_reg4", ...
    family: str  # "original" (the ViT paper), "augreg" ("How to train your ViT?"), "deit", "deit3", "dinov2"
    pretrain: str  # "imagenet21k" or "imagenet2012"
    finetune: str | None  # "imagenet2012" or None (pre-trained only)
    image_size: int
    num_classes: int
    top1: float | None  # reported ImageNet-1k top-1 (%); None for pre-training-only checkpoints (no such number)
    top1_source: str | None  # where top1 is reported (timm's own evaluation says so)
    sha256: str | None  # None: unknown, not checked
    size: int | None = None  # bytes; None: unknown, not checked
    checksum_source: str | None = None  # the public source stating size and sha256; None: none known
    parameters: int | None = None  # values in the file (the model at image_size with its head)
    paper: str | None = None  # the publication the checkpoint comes from
    licence: str | None = None  # SPDX identifier, e.g. "Apache-2.0"
    # the evaluation's input pipeline: mean, std (pixels in [0, 1]), crop_fraction (None: no crop), interpolation
    # and source (where these come from); keras_vit.preprocessing.ImagePreprocessor.from_weights applies them
    preprocessing: dict = dataclasses.field(default_factory=dict)
    # the ViT family's checkpoints (docs/family.md: CLIP, SigLIP, DeiT, DINOv2), timm's files on the Hugging Face Hub
    source_url: str | None = None  # the file's own URL (None: base_url + path)
    aliases: tuple[str, ...] = ()  # other names of the checkpoint: timm's
    embedding_width: int | None = None  # width of the image embedding (CLIP: its projection, the head; else the
    # features of a model without a head, num_classes 0)

    @property
    def url(self) -> str:
        """Where the file is: ``base_url + path``; a family checkpoint's own ``source_url`` unless a mirror is set
        (``$KERAS_VIT_ZOO_URL`` serves every file at its ``path``)."""
        own = self.source_url if not os.environ.get(MIRROR_ENV) else None
        return own or base_url() + self.path

    @property
    def most_bytes(self) -> int | None:
        """The most bytes the file can be: its ``size``, else 4 bytes (float32) per parameter x 1.25 + 1 MiB (the
        archive's headers); None when neither is recorded."""
        return self.size or (self.parameters and int(self.parameters * 4 * 1.25) + (1 << 20))

    @property
    def checked_by(self) -> str:
        """How a download of the file is checked: the published digest or size (naming their source), else its
        architecture only."""
        if self.sha256 or self.size:
            stated = "sha256" if self.sha256 else "size"
            return f"its {stated} as {self.checksum_source} states it, and its architecture"
        return "its architecture only (no public size or sha256 is known for this file)"

    @property
    def pre_logits(self) -> bool:
        """Whether the file holds a tanh ``pre_logits`` layer (as wide as the model): the original ImageNet-21k ones."""
        return self.family == "original" and self.finetune is None


@functools.cache
def _load() -> tuple[str, tuple[Checkpoint, ...], dict[str, tuple[str, ...]]]:
    with open(CATALOGUE) as f:
        data = json.load(f)
    aliases = {name: tuple(tags) for name, tags in data["aliases"].items() if name != "description"}
    rows: Iterator[dict[str, Any]] = (
        {key: tuple(v) if isinstance(v, list) else v for key, v in row.items()} for row in data["checkpoints"]
    )
    return data["base_url"], tuple(Checkpoint(**row) for row in rows), aliases


def aliases() -> tuple[str, ...]:
    """The names ``weights=`` takes besides the catalogue's (``"imagenet"``, ``"imagenet21k"``, ``"augreg"``)."""
    return tuple(_load()[2])


def resolve_alias(alias: str, entries: Sequence[Checkpoint], image_size: int) -> str:
    """The catalogue name ``alias`` stands for among ``entries`` (those of one variant) at ``image_size``: the
    entry whose tag (the name after the dot) first matches the alias's list in the catalogue; a ``ValueError``
    naming what there is when none does."""
    tags = _load()[2][alias]
    for pattern in (tag.format(size=image_size) for tag in tags):
        for entry in entries:
            if entry.image_size == image_size and fnmatch.fnmatchcase(entry.name.partition(".")[2], pattern):
                return entry.name
    there = ", ".join(f"{e.name} ({e.image_size} px)" for e in entries) or "none"
    raise ValueError(f"No {alias!r} checkpoint of this variant at {image_size} px in the catalogue; it has: {there}.")


def base_url() -> str:
    """The bucket's URL: ``$KERAS_VIT_ZOO_URL`` (a mirror) or the catalogue's ``base_url``."""
    base = os.environ.get(MIRROR_ENV) or _load()[0]
    return base if base.endswith("/") else base + "/"


def catalogue() -> tuple[Checkpoint, ...]:
    """Every catalogue entry, in file order."""
    return _load()[1]


def families() -> tuple[str, ...]:
    """The catalogue's families, in file order: ``"original"``, ``"augreg"``, ``"clip"``, ``"siglip"``, ``"deit"``,
    ``"deit3"``, ``"dinov2"``."""
    return tuple(dict.fromkeys(entry.family for entry in catalogue()))


def names(pattern: str | None = None) -> list[str]:
    """The catalogue's names, or those matching a shell-style ``pattern`` (``"B_16.*"``, ``"*in21k"``; ``fnmatch``,
    case-sensitive)."""
    return [entry.name for entry in catalogue() if pattern is None or fnmatch.fnmatchcase(entry.name, pattern)]


def find(name: str) -> Checkpoint | None:
    """The entry called ``name`` (or one of its ``aliases``: timm's names), or whose bucket path is ``name`` (with or
    without ``.npz``); else None."""
    for entry in catalogue():
        if name in (entry.name, entry.path, entry.path.removesuffix(".npz"), *entry.aliases):
            return entry
    return None


def get(name: str) -> Checkpoint:
    """Like :func:`find`, but an unknown name is a ``ValueError`` that suggests close names."""
    entry = find(name)
    if entry is None:
        import difflib

        close = difflib.get_close_matches(name, names(), n=5, cutoff=0.5)
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(
            f"No checkpoint {name!r} in the zoo catalogue.{hint} List them with `python -m keras_vit.zoo list`."
        )
    return entry


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where checkpoints are cached: ``<cache_dir or $KERAS_HOME or ~/.keras>/models/vit_models``."""
    base = cache_dir or os.environ.get("KERAS_HOME") or Path.home() / ".keras"
    return Path(base).expanduser() / "models" / "vit_models"


def cache_path(entry: Checkpoint | str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where ``entry`` is (or will be) cached."""
    entry = get(entry) if isinstance(entry, str) else entry
    return cache_root(cache_dir) / entry.path


def fetch(
    name: Checkpoint | str,
    cache_dir: str | os.PathLike | None = None,
    *,
    progress: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    deadline: float | None = None,
    check: Callable[[Path], None] | None = None,
    **download_kwargs,
) -> Path:
    """The local path of a catalogue checkpoint, downloaded first when it is not cached (saying how it was checked).
    ``timeout``, ``deadline`` and other keywords: :func:`~keras_vit.zoo.download.download`'s; ``progress``: a bar on
    stderr; ``check(path)`` raises ``CorruptCheckpointError`` for a file that is not the entry's (before a download
    enters the cache, and on a cached file). Raises ``DownloadError``; a cached file that changed is a
    ``CorruptCheckpointError`` naming it, kept."""
    entry = get(name) if isinstance(name, str) else name
    cached = cache_path(entry, cache_dir).is_file()

    def validate(path: Path) -> None:
        validator(entry.path)(path)
        if check is not None:
            check(path)

    path = download.download(
        entry.url,
        cache_path(entry, cache_dir),
        sha256=entry.sha256,
        size=entry.size,
        limit=entry.most_bytes,
        validate=validate,
        timeout=timeout,
        deadline=deadline,
        progress=ProgressBar(entry.name) if progress else None,
        **download_kwargs,
    )
    if check is not None:
        check(path)  # a file cached before, by hand or by an older version, is held to the entry too
    if not cached:
        print(f"{entry.name}: downloaded and checked by {entry.checked_by}", file=sys.stderr)
    return path


def check_cached(
    name: Checkpoint | str,
    cache_dir: str | os.PathLike | None = None,
    check: Callable[[Path], None] | None = None,
) -> tuple[str, str] | None:
    """``(status, detail)`` of a cached checkpoint, status ``"OK"``, ``"corrupt"`` or ``"unrecorded"`` (see
    :mod:`keras_vit.zoo.cache`); None when it is not cached. Reads the whole file. ``check``: as :func:`fetch`'s
    (a file of another architecture is corrupt)."""
    entry = get(name) if isinstance(name, str) else name
    path = cache_path(entry, cache_dir)
    if not path.is_file():
        return None
    status, detail, _ = check_file(path, sha256=entry.sha256, validate=validator(entry.path))
    if status != CORRUPT and check is not None:
        try:
            check(path)
        except CorruptCheckpointError as exc:
            return CORRUPT, str(exc)
    return status, detail
