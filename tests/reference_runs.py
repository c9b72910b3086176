"""Reference outputs from timm and transformers, each run in a fresh interpreter (TensorFlow and torch in one process
crash): the scripts and the helpers the checkpoint tests share."""

import json
import subprocess
import sys
import textwrap

import numpy as np
from sklearn.datasets import load_sample_image

TIMM_SCRIPT = """
import json, sys
import numpy as np
import timm, torch
from safetensors.torch import save_file
torch.manual_seed(0)
torch.set_num_threads(2)
for job in json.load(open(sys.argv[1])):
    model = timm.create_model(job["model"], pretrained=False, **job["kwargs"]).eval()
    if "load" in job:
        from safetensors.torch import load_file
        model.load_state_dict(load_file(job["load"]))
    else:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.add_(torch.randn_like(p) * (0.2 if p.ndim == 1 else 0.05))
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if job["save"].endswith(".safetensors"):
            save_file(state, job["save"])
        else:
            torch.save(state, job["save"])
    images = torch.from_numpy(np.load(job["images"])).permute(0, 3, 1, 2)
    with torch.no_grad():
        np.save(job["logits"], model(images).numpy())
"""


def photos(size: int, count: int = 2) -> np.ndarray:
    """``count`` crops of scikit-learn's china.jpg, scaled to [-1, 1]."""
    image = load_sample_image("china.jpg").astype("float32")
    crops = [image[40 + 90 * i : 40 + 90 * i + size, 100 + 130 * i : 100 + 130 * i + size] for i in range(count)]
    return (np.stack(crops) - 127.5) / 127.5


def run_reference(script: str, *args) -> None:
    """Run a reference script in a fresh interpreter (its test is marked ``requires`` for the script's library)."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]


def write_timm_files(tmp, cases: dict, images=photos):
    """timm's files of ``cases`` (name: (model, kwargs, image size, suffix)) in ``tmp``, with its outputs on
    ``images(size)`` (``{name}.npy``): one subprocess for all."""
    jobs = []
    for name, (model, kwargs, size, suffix) in cases.items():
        np.save(tmp / f"images{size}.npy", images(size))
        jobs.append(
            dict(
                model=model,
                kwargs=kwargs,
                images=str(tmp / f"images{size}.npy"),
                save=str(tmp / f"{name}{suffix}"),
                logits=str(tmp / f"{name}.npy"),
            )
        )
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    run_reference(TIMM_SCRIPT, tmp / "jobs.json")
    return tmp
