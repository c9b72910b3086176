"""Step 1 of the checkpoint pipeline, the source: find the file, tell its format from its content (:data:`FORMATS`),
check a zip, read raw arrays and metadata; and :class:`CheckpointArrays`, the record the steps pass on."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from keras_vit import zoo
from keras_vit.config import ViTConfig
from keras_vit.files import npz_arrays, open_zip
from keras_vit.names import EXPECTED, locate_checkpoint
from keras_vit.zoo.errors import CorruptCheckpointError
from keras_vit.zoo.validate import check_members

__all__ = [
    "FORMATS",
    "HUGGINGFACE_WEIGHT_FILES",
    "TRAINING_PREFIX",
    "CheckpointArrays",
    "check_archive",
    "detect_format",
    "find_checkpoint",
    "from_bfloat16",
    "read_json",
    "read_npz",
    "read_state_dict",
    "read_state_file",
    "recorded_num_heads",
]

FORMATS = {
    "npz": "a Google .npz checkpoint",
    "safetensors": "a safetensors state dict",
    "torch": "a torch state dict (.pth / .bin)",
    "huggingface": "a Hugging Face model folder",
    "keras_hub": "a keras-hub preset folder",
    "keras_weights": "a Keras .weights.h5 file",
    "keras": "a saved keras-vit model (.keras)",
}
HUGGINGFACE_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_SUFFIXES = {
    ".npz": "npz",
    ".safetensors": "safetensors",
    ".pth": "torch",
    ".pt": "torch",
    ".bin": "torch",
    ".h5": "keras_weights",
    ".keras": "keras",
}
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
TRAINING_PREFIX = "opt/target/"  # checkpoints saved with their optimizer state nest the parameters here


@dataclasses.dataclass(frozen=True, eq=False)
class CheckpointArrays(Mapping[str, np.ndarray]):
    """A checkpoint read into the ``.npz`` layout, a read-only mapping of ``arrays`` by key, with ``source`` (for
    messages), ``format`` (:data:`FORMATS`), ``model_options`` (fields its shapes do not show), ``heads_known``
    (False for timm), ``config`` (a saved keras-vit model's) and ``extra`` (variables outside the layout)."""

    arrays: Mapping[str, np.ndarray]
    source: str
    format: str = "npz"
    model_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    heads_known: bool = True
    config: ViTConfig | None = None
    extra: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)


def read_json(path: Path) -> dict:
    """A JSON file's object; a ``ValueError`` naming the file when it is not JSON, or JSON but not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}).") from exc
    if not isinstance(content, dict):
        raise ValueError(f"{path} holds a JSON {type(content).__name__}, not an object of fields.")
    return content


def check_archive(path: str | os.PathLike, what: str = "a readable zip archive", hint: str = "") -> None:
    """:func:`~keras_vit.zoo.validate.check_members` of the zip at ``path`` (``.npz``, ``.keras``, a zip-based
    ``.pth``) before anything is unpacked: a ``ValueError`` naming ``path`` and the member it refuses; a
    ``CorruptCheckpointError`` "PATH is not WHAT (...)HINT" where the zip itself is damaged
    (:func:`~keras_vit.files.open_zip`)."""
    with open_zip(path, CorruptCheckpointError, what, hint) as archive:
        try:
            check_members(archive)
        except CorruptCheckpointError as exc:
            refused = exc
        else:
            return
    raise ValueError(f"{path} is refused: {refused}.")


def from_bfloat16(array: np.ndarray) -> np.ndarray:
    """A bfloat16 array (``ml_dtypes``', or numpy's ``|V2`` records of one in an ``.npz``) widened to float32;
    another array as it is."""
    if array.dtype.kind == "V" and array.dtype.itemsize == 2 and array.dtype.names is None:
        import ml_dtypes

        return array.view(ml_dtypes.bfloat16).astype("float32")
    return array


def _folder_format(path: Path) -> str:
    config = path / "config.json"
    if config.is_file():
        content = read_json(config)
        registered, module = str(content.get("registered_name", "")), str(content.get("module", ""))
        if registered.startswith("keras_hub>") or "keras_hub" in module:
            return "keras_hub"
        if any((path / name).is_file() for name in HUGGINGFACE_WEIGHT_FILES):
            return "huggingface"
    listed = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "nothing"
    raise ValueError(
        f"{path} is a folder without a checkpoint keras-vit reads (it holds {listed}); expected {EXPECTED}."
    )


def _zip_format(path: Path) -> str | None:
    try:
        with open_zip(path) as archive:
            names = archive.namelist()
    except (ValueError, OSError):
        return None  # truncated or damaged: the suffix decides, and that reader names the damage
    if any(name.endswith("data.pkl") for name in names):
        return "torch"
    if "config.json" in names and any(name.endswith(".weights.h5") or name == "metadata.json" for name in names):
        return "keras"
    if any(name.endswith(".npy") for name in names):
        return "npz"
    return None


def _refuse_misnamed(path: Path, head: bytes, named: str | None) -> None:
    """A ``ValueError`` for a file whose content is plainly not what its name says: a compressed body (gzip,
    bzip2, xz, zstd: decompress it first), or a ``.h5`` / ``.npz`` without the HDF5 / zip signature."""
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            raise ValueError(
                f"{path} is {kind}-compressed data, not a checkpoint: decompress it first (the checkpoint is inside)."
            )
    signatures: dict[str | None, tuple[bytes, str]] = {
        "keras_weights": (_HDF5_MAGIC, "an HDF5 file"),
        "npz": (b"PK", "a zip archive (an .npz is one)"),
    }
    magic, kind = signatures.get(named, (b"", ""))
    if magic and head and not head.startswith(magic[: len(head)]):
        raise ValueError(f"{path} is named {path.suffix} but is not {kind}: it starts {head[:8]!r}.")


def detect_format(path: str | Path) -> str:
    """One of :data:`FORMATS` for an existing file or folder, from its content; a ``ValueError`` saying
    what the file is not and what was expected when no format fits."""
    path = Path(path)
    if path.is_dir():
        return _folder_format(path)
    if path.exists() and not path.is_file():  # opening a FIFO would wait for a writer forever
        raise ValueError(f"{path} is not a regular file or folder (a pipe, socket or device): not a checkpoint.")
    with open(path, "rb") as f:
        head = f.read(16)
    size = path.stat().st_size
    found = None
    if head.startswith(_HDF5_MAGIC):
        found = "keras_weights"
    elif head.startswith(b"PK\x03\x04"):
        found = _zip_format(path)
    elif head[:1] == b"\x80":  # a pickle protocol opcode: the legacy torch.save format
        found = "torch"
    elif len(head) >= 9 and 0 < int.from_bytes(head[:8], "little") <= size - 8 and head[8:9] == b"{":
        found = "safetensors"
    named = next((fmt for suffix, fmt in _SUFFIXES.items() if path.name.endswith(suffix)), None)
    if found is None:
        _refuse_misnamed(path, head, named)
    found = found or named
    if found is None:
        raise ValueError(
            f"{path} ({size:,} bytes, starting {head[:8]!r}) is not a checkpoint keras-vit reads: expected {EXPECTED}."
        )
    return found


def _state_dict_of(loaded, path: Path) -> dict[str, np.ndarray]:
    """The tensors of a torch checkpoint, unwrapping the usual ``{"state_dict": ...}`` / ``{"model": ...}``."""
    for key in ("state_dict", "model", "module"):
        if isinstance(loaded, Mapping) and isinstance(loaded.get(key), Mapping):
            loaded = loaded[key]
    if not isinstance(loaded, Mapping):
        raise ValueError(f"{path} holds a {type(loaded).__name__}, not a state dict (a mapping of name -> tensor).")
    arrays = {}
    for key, value in loaded.items():
        if hasattr(value, "detach"):  # a torch tensor: bfloat16 has no numpy dtype
            value = value.detach().cpu()
            value = (value.float() if str(value.dtype) == "torch.bfloat16" else value).numpy()
        if isinstance(value, np.ndarray):
            arrays[str(key)] = value
    return arrays


def read_state_dict(path: str | Path, fmt: str) -> dict[str, np.ndarray]:
    """The arrays of a ``"safetensors"`` or ``"torch"`` state dict file (torch needed for the latter only)."""
    path = Path(path)
    if fmt == "safetensors":
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            return {key: from_bfloat16(value) for key, value in load_file(path).items()}
        except (SafetensorError, OSError, ValueError, TypeError) as exc:
            raise ValueError(f"{path} is not a readable safetensors file ({type(exc).__name__}: {exc}).") from exc
    try:
        import torch
    except ImportError:
        raise ImportError(
            f"{path} is a torch checkpoint (torch.save); reading it needs PyTorch: pip install torch. "
            "Or convert it once to .safetensors (safetensors.torch.save_file), which keras-vit reads without torch."
        ) from None
    with open(path, "rb") as file:
        if file.read(4) == b"PK\x03\x04":  # torch.save's zip format (a legacy .pth is a bare pickle)
            check_archive(path)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load raises many kinds (UnpicklingError, KeyError, RuntimeError, ...)
        raise ValueError(f"{path} is not a readable torch checkpoint ({type(exc).__name__}: {exc}).") from exc
    return _state_dict_of(loaded, path)


def recorded_num_heads(path: str | Path) -> int | None:
    """The head count a timm ``.safetensors`` records in its metadata (``timm_model_kwargs``, which keras-vit's
    :func:`~keras_vit.checkpoints.timm.save_timm_safetensors` writes); None where it records none."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "np") as file:
            kwargs = json.loads((file.metadata() or {}).get("timm_model_kwargs", "{}"))
    except (SafetensorError, OSError, ValueError, TypeError):
        return None  # the arrays' reader names what is wrong with the file
    heads = kwargs.get("num_heads") if isinstance(kwargs, dict) else None
    return heads if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0 else None


def find_checkpoint(
    weights: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    check: Callable[[zoo.Checkpoint], Callable[[Path], None]] | None = None,
) -> Path:
    """A local checkpoint path for ``weights``: an existing file or folder, or a zoo catalogue name (downloaded,
    then checked with ``check(entry)``); a ``FileNotFoundError`` for a path that is not there
    (:func:`~keras_vit.names.locate_checkpoint`)."""
    entry = locate_checkpoint(weights)
    if isinstance(entry, Path):
        return entry
    # keras.applications shows its download too: the command's progress bar
    return zoo.fetch(entry, cache_dir=cache_dir, check=None if check is None else check(entry), progress=True)


def read_npz(path: str | os.PathLike) -> CheckpointArrays:
    """All arrays of an ``.npz`` checkpoint. Raises ``CorruptCheckpointError`` naming the file when it is not a
    readable zip of arrays (truncated, damaged), ``ValueError`` when its members are refused or not a ViT's."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint file at {path}.")
    with open(path, "rb") as file:
        if file.read(6) == b"\x93NUMPY":
            raise ValueError(f"{path} is not a readable .npz checkpoint: it holds one array, not named arrays (.npy).")
    what, advice = "a readable .npz checkpoint", ". The file is truncated or corrupt: delete it and download it again."
    check_archive(path, what, advice)  # what a member declares, before numpy unpacks it
    with open_zip(path, CorruptCheckpointError, what, advice) as archive:
        arrays = {key: from_bfloat16(array) for key, array in npz_arrays(archive).items()}
    if any(key.startswith(TRAINING_PREFIX) for key in arrays):
        arrays = {key[len(TRAINING_PREFIX) :]: a for key, a in arrays.items() if key.startswith(TRAINING_PREFIX)}
    if "embedding/kernel" not in arrays:
        listed = ", ".join(sorted(arrays)[:5]) or "none"
        raise ValueError(f"{path} is not a ViT checkpoint: it has no 'embedding/kernel' key (keys: {listed}).")
    return CheckpointArrays(arrays, str(path))


def read_state_file(path: Path, fmt: str) -> tuple[dict[str, np.ndarray], Path, str, dict | None, int | None]:
    """A state dict file or Hugging Face folder (``fmt``, :func:`detect_format`'s): its arrays, the weights file,
    its format, the ``config.json`` beside it (None without) and the head count its metadata records (None)."""
    if fmt == "keras_weights":
        raise ValueError(
            f"{path} is a Keras .weights.h5: it holds no architecture. Build the model it was saved from "
            "and load it there (keras_vit.ViT(..., weights=path) or model.load_weights(path))."
        )
    config = None
    if fmt == "huggingface":
        config = read_json(path / "config.json")
        path = next(path / name for name in HUGGINGFACE_WEIGHT_FILES if (path / name).is_file())
        fmt = detect_format(path)
    elif path.with_name("config.json").is_file():  # a Hugging Face weights file in its folder
        config = read_json(path.with_name("config.json"))
    heads = recorded_num_heads(path) if fmt == "safetensors" else None
    return read_state_dict(path, fmt), path, fmt, config, heads
