"""Reference outputs from timm, run in its own process (TensorFlow and timm in one process crash).

Usage: ``python tests/reference/timm_vit.py jobs.json``. ``jobs.json`` is a list of jobs:

- ``{"kind": "vit", "checkpoint": .npz, "images": .npz, "output": .npz, "model": {...}}``: builds
  ``timm.models.vision_transformer.VisionTransformer(**model)``, loads the Google ``.npz`` checkpoint
  with timm's own loader (``_load_weights``), runs the NHWC ``images`` (key ``images``) and writes
  ``features`` (the pooled, pre-head features) and ``logits``.
- ``{"kind": "resample", "input": .npz, "output": .npz, "new_size": [h, w], "num_prefix_tokens": n,
  "interpolation": str, "antialias": bool}``: timm's ``resample_abs_pos_embed`` on key ``posemb``.

Imports only numpy, torch and timm.
"""

import json
import sys

import numpy as np
import torch
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer, _load_weights


def run_vit(job):
    model = VisionTransformer(**job["model"]).eval()
    _load_weights(model, job["checkpoint"])
    images = torch.from_numpy(np.load(job["images"])["images"]).permute(0, 3, 1, 2)
    with torch.no_grad():
        tokens = model.forward_features(images)
        features = model.forward_head(tokens, pre_logits=True)
        logits = model.forward_head(tokens)
    np.savez(job["output"], features=features.numpy(), logits=logits.numpy())


def run_resample(job):
    posemb = torch.from_numpy(np.load(job["input"])["posemb"])
    out = resample_abs_pos_embed(
        posemb,
        new_size=job["new_size"],
        num_prefix_tokens=job["num_prefix_tokens"],
        interpolation=job["interpolation"],
        antialias=job["antialias"],
    )
    np.savez(job["output"], posemb=out.numpy())


def main(path):
    torch.set_num_threads(2)
    with open(path) as f:
        jobs = json.load(f)
    for job in jobs:
        {"vit": run_vit, "resample": run_resample}[job["kind"]](job)


if __name__ == "__main__":
    main(sys.argv[1])
