"""What a name given to :func:`keras_vit.ViT` means: a variant, a timm model name or a catalogue name, and which
checkpoint ``weights=`` names (an alias, a timm tag, a catalogue name or a path)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from keras_vit import zoo
from keras_vit.config import DEFAULT_IMAGE_SIZE
from keras_vit.variants import NAMED_VARIANTS, canonical_variant, parse_timm_name, parse_variant

# What a checkpoint path may hold (the messages of keras_vit.checkpoints.source).
EXPECTED = (
    "a Google .npz, a timm or Hugging Face state dict (.safetensors, .pth, .bin), a Hugging Face folder "
    "(config.json + model.safetensors or pytorch_model.bin), a keras-hub preset folder (config.json + "
    "model.weights.h5), a Keras .weights.h5 or a saved keras-vit model (.keras)"
)
_PATH_LIKE = re.compile(r"[/\\~]|\.(npz|safetensors|pth|pt|bin|h5|keras|json)$")


def name_parts(name: str | None) -> tuple[str | None, int | None, str | None]:
    """``(variant, image size, checkpoint tag)`` of what ``ViT``'s first argument names: a variant (``"B/16"``: no
    size, no tag), a timm model name (``"vit_base_patch16_224.augreg2_in21k_ft_in1k"``: its size and tag) or a
    catalogue name (``"B_16.augreg_in21k_ft_in1k_384"``: its variant and resolution, the name as the tag)."""
    timm = None if name is None else parse_timm_name(name)
    if timm is not None:
        return timm
    entry = None if name is None else zoo.find(name)
    if entry is not None:
        return entry.variant, entry.image_size, entry.name
    return name, None, None


def variant_name(name: str) -> str:
    """``name`` if it names a variant a command builds, in any spelling :func:`~keras_vit.variants.parse_variant`
    takes; else a ``ValueError`` naming a timm name's variant and size (``"vit_base_patch16_224"``: ``B/16``, 224 px)
    or listing the known variants."""
    timm = parse_timm_name(name)
    if timm is not None:
        variant, size, tag = timm
        weights = f" and --weights {tag}" if tag else ""
        raise ValueError(
            f"{name!r} is timm's name of {canonical_variant(variant)} at {size} px: give the variant "
            f"{canonical_variant(variant)} with --image-size {size}{weights}."
        )
    parse_variant(name)
    return name


def _catalogue_size(weights: str, variant: str | None, image_size) -> tuple[list, int]:
    """The catalogue entries of ``variant`` and the (square) resolution asked for, for ``weights=`` to choose from."""
    if variant is None:
        raise ValueError(f"weights={weights!r} needs a variant ('B/16', ...) to choose its checkpoint.")
    size = image_size or DEFAULT_IMAGE_SIZE
    height, width = (size, size) if isinstance(size, int) else size
    if height != width:
        raise ValueError(f"weights={weights!r}: the published checkpoints are square, got image_size={size}.")
    architecture = parse_variant(variant)
    entries = [e for e in zoo.catalogue() if e.variant in NAMED_VARIANTS and parse_variant(e.variant) == architecture]
    return entries, height


def alias_checkpoint(alias: str, variant: str | None, image_size) -> str:
    """The catalogue name ``weights=alias`` (``"imagenet"``, ...) stands for with ``variant`` at ``image_size``."""
    return zoo.resolve_alias(alias, *_catalogue_size(alias, variant, image_size))


def tag_checkpoint(tag: str, variant: str | None, image_size) -> str:
    """The catalogue entry of ``variant`` at ``image_size`` whose tag is timm's ``tag`` (``"augreg_in21k_ft_in1k"``;
    the catalogue writes a fine-tune's resolution after it, ``..._224``); a ``ValueError`` when there is none."""
    entries, size = _catalogue_size(tag, variant, image_size)
    for entry in entries:
        if entry.image_size == size and entry.name.partition(".")[2] in (tag, f"{tag}_{size}"):
            return entry.name
    there = ", ".join(f"{e.name} ({e.image_size} px)" for e in entries) or "none"
    raise ValueError(
        f"timm's tag {tag!r} of {variant} at {size} px has no checkpoint in the keras-vit catalogue (Google's "
        "files); a timm or Hugging Face file of it loads by its path (weights='model.safetensors'). The catalogue "
        f"has: {there}."
    )


def checkpoint_name(weights: str, variant: str | None, image_size, tag: str | None) -> str:
    """What ``weights=`` names: an alias (``"imagenet"``: the model name's tag when it has one, else the catalogue's
    choice for the variant and size), a tagged timm name or a timm tag of the variant (its catalogue entry), or
    else itself (a catalogue name, a path). Raises ``ValueError`` for an empty name."""
    if not weights.strip():
        raise ValueError(f"weights={weights!r} names no checkpoint: pass a catalogue name, a file, or None (random).")
    if weights in zoo.aliases():
        if tag is None:
            return alias_checkpoint(weights, variant, image_size)
        return tag if zoo.find(tag) is not None else tag_checkpoint(tag, variant, image_size)
    timm = parse_timm_name(weights)
    if timm is not None and timm[2] is not None:
        named, size, _ = timm
        if variant is not None and parse_variant(named) != parse_variant(variant):
            raise ValueError(f"weights={weights!r} is timm's {named}; the model is {variant}.")
        return tag_checkpoint(timm[2], named, image_size or size)
    if zoo.find(weights) is not None or "/" in weights or "." in weights:
        return weights
    if variant is not None and any(e.name.partition(".")[2].startswith(weights) for e in zoo.catalogue()):
        return tag_checkpoint(weights, variant, image_size)
    return weights


def locate_checkpoint(weights: str | os.PathLike) -> Path | zoo.Checkpoint:
    """Where ``weights`` is, from names alone (nothing read or downloaded): an existing file or folder, else its
    catalogue entry; a ``FileNotFoundError`` for a path that is not there, else :func:`keras_vit.zoo.get`'s
    ``ValueError`` (suggesting close names)."""
    path = Path(weights).expanduser()
    if path.exists():
        return path
    entry = zoo.find(str(weights))
    if entry is None and (isinstance(weights, os.PathLike) or _PATH_LIKE.search(str(weights))):
        raise FileNotFoundError(f"No checkpoint file at {path} (nor a folder); expected {EXPECTED}.")
    return entry or zoo.get(str(weights))


def check_weights(weights: str | None) -> None:
    """Refuse, before any framework loads, a ``weights=`` of :func:`keras_vit.ViT` that :func:`checkpoint_name`
    keeps as it is and :func:`locate_checkpoint` finds nowhere, with its error. What names a checkpoint through the
    variant (an alias, a timm tag, a tagged timm name) or is blank is left to ``ViT``."""
    if weights is None or not weights.strip() or weights in zoo.aliases():
        return
    timm = parse_timm_name(weights)
    if (timm is not None and timm[2] is not None) or any(
        e.name.partition(".")[2].startswith(weights) for e in zoo.catalogue()
    ):
        return
    locate_checkpoint(weights)
