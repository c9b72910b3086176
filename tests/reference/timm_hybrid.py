"""Reference outputs of timm's hybrid ViTs, run in their own process (TensorFlow and timm in one process crash).

Usage: ``python tests/reference/timm_hybrid.py jobs.json`` where ``jobs.json`` is a list of jobs
``{"model": timm name, "kwargs": {...}, "checkpoint": .npz, "images": .npz, "output": .npz}``. Each
builds ``timm.create_model(model, pretrained=False, **kwargs)``, loads the Google ``.npz`` checkpoint
with timm's own loader (``VisionTransformer.load_pretrained``), runs the NHWC ``images`` (key
``images``) and writes the ResNet's feature map ``resnet`` (NHWC), the ``logits`` and ``num_params``.
A job without ``checkpoint``/``images`` only writes ``num_params``.

Imports only numpy, torch and timm.
"""

import json
import sys

import numpy as np
import timm
import torch


def run(job):
    model = timm.create_model(job["model"], pretrained=False, **job.get("kwargs", {})).eval()
    outputs = {"num_params": np.int64(sum(p.numel() for p in model.parameters()))}
    if "checkpoint" in job:
        model.load_pretrained(job["checkpoint"])
        images = torch.from_numpy(np.load(job["images"])["images"]).permute(0, 3, 1, 2)
        with torch.no_grad():
            feature_map = model.patch_embed.backbone(images)  # as timm's HybridEmbed runs it
            if isinstance(feature_map, (list, tuple)):
                feature_map = feature_map[-1]
            outputs["resnet"] = feature_map.permute(0, 2, 3, 1).numpy()
            outputs["logits"] = model(images).numpy()
    np.savez(job["output"], **outputs)


def main(path):
    torch.set_num_threads(2)
    with open(path) as f:
        for job in json.load(f):
            run(job)


if __name__ == "__main__":
    main(sys.argv[1])
