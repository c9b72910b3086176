"""docs/worked-example.md, run: every command of the doc, in its order, on a folder of real image files.

The commands are read from the doc's ``bash`` blocks and run through each module's ``main`` in this process (one
TensorFlow start). To stay fast, each ``finetune`` gets ``--steps 2 --batch-size 8 --image-size 32 --depth 1``
appended, and the catalogue name is replaced by a tiny checkpoint in the published ``.npz`` layout (a Ti/16 of one
block at 32 pixels), as the network is not there.
"""

import importlib
import os
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from npz_layout import vit_checkpoint, write_checkpoint
from PIL import Image

pytestmark = [pytest.mark.backends("tensorflow"), pytest.mark.requires("tf2onnx", "onnxruntime")]

DOC = Path(__file__).resolve().parent.parent / "docs" / "worked-example.md"
CLASSES = {"cat": (200, 60, 60), "dog": (60, 200, 60), "emu": (60, 60, 200)}  # a colour per class
TINY_RUN = ["--steps", "2", "--batch-size", "8", "--image-size", "32", "--depth", "1", "--verbose", "0"]
CATALOGUE_NAME = "Ti_16.augreg_in21k_ft_in1k_224"


def doc_commands() -> list[list[str]]:
    """The ``python -m ...`` lines of the doc's ``bash`` blocks, split as a shell would."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line.startswith("python -m ")]


def _photo(colour, rng) -> np.ndarray:
    return np.clip(rng.normal(0, 25, (40, 40, 3)) + colour, 0, 255).astype(np.uint8)


def _folders(root: Path) -> None:
    rng = np.random.default_rng(0)
    for name, colour in CLASSES.items():
        (root / "pets" / name).mkdir(parents=True)
        for i in range(8):
            Image.fromarray(_photo(colour, rng)).save(root / "pets" / name / f"{i:04d}.jpg", quality=95)
    (root / "new_photos" / "garden").mkdir(parents=True)
    for i, colour in enumerate(CLASSES.values()):
        Image.fromarray(_photo(colour, rng)).save(root / "new_photos" / "garden" / f"{i}.png")


def _predictions(printed: str) -> dict[str, list[tuple[str, float]]]:
    """``predict``'s table: image -> [(class name, score)]."""
    table, image = {}, None
    for line in printed.splitlines():
        if not line.startswith(" "):
            image = line
            table[image] = []
        elif line.split()[0] != "rank":  # not the header
            _, _, name, score = line.split()
            table[image].append((name, float(score)))
    return table


def test_every_command_of_the_worked_example_runs(tmp_path, monkeypatch, capsys):
    commands = doc_commands()
    modules = [command[2] for command in commands]
    assert modules == [
        "keras_vit.training.finetune",
        "keras_vit.training.finetune",
        "keras_vit.predict",
        "keras_vit.training.finetune",
        "keras_vit.export",
        "keras_vit.zoo",
        "keras_vit.predict",
    ]
    assert "--lora-rank" in commands[1] and "--lora-rank" not in commands[0]
    monkeypatch.chdir(tmp_path)
    _folders(tmp_path)
    tiny = vit_checkpoint(patch=16, width=192, depth=1, heads=3, mlp=768, grid=(2, 2), num_classes=1000)
    checkpoint = str(write_checkpoint(tmp_path / "tiny_ti16.npz", tiny))
    printed = []
    for command in commands:
        argv = [checkpoint if arg == CATALOGUE_NAME else arg for arg in command[3:]]
        if command[2] == "keras_vit.training.finetune":
            argv += TINY_RUN
        main = importlib.import_module(f"{command[2]}.__main__" if command[2] == "keras_vit.zoo" else command[2]).main
        main(argv)
        printed.append(capsys.readouterr().out)

    names = sorted(CLASSES)
    for run in ("pets", "pets-lora", "pets-more"):
        assert (tmp_path / "runs" / run / "classes.txt").read_text().split() == names, run
    new_photos = sorted(str(Path("new_photos/garden") / f"{i}.png") for i in range(3))
    from_keras, from_shared = _predictions(printed[2]), _predictions(printed[6])
    assert sorted(from_keras) == sorted(from_shared) == new_photos  # the folder: every image in it
    for image in new_photos:
        assert {name for name, _ in from_keras[image]} <= set(names)  # the run's class names, from the model
        assert [name for name, _ in from_shared[image]] == [name for name, _ in from_keras[image]]
        np.testing.assert_allclose(  # tanh vs exact GELU: the third decimal
            [score for _, score in from_shared[image]], [score for _, score in from_keras[image]], atol=0.02
        )
    assert {"saved_model", "onnx"} <= {line.split()[0] for line in printed[4].splitlines()[1:]}
    assert os.path.isdir(tmp_path / "exported" / "saved_model") and (tmp_path / "exported" / "model.onnx").is_file()
    assert (tmp_path / "pets.safetensors").is_file()
