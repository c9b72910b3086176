"""The paper's position-embedding ablation (Appendix D.4), and token vs GAP: ``python -m keras_vit.training.ablation``.

Trains one ViT per position embedding of :data:`keras_vit.position.POSITION_EMBEDDINGS` (and per
classifier, ``token`` or ``gap``) under the same budget -- same data, steps, optimizer, schedule
and augmentation as ``python -m keras_vit.training.finetune`` would use -- and prints a Markdown table of
held-out accuracy (mean and spread over ``--seeds``). Without ``--dataset`` it runs offline on
scikit-learn's digits with the ``digits`` preset's small ViT. The paper (Table 8: ViT-B/16, ImageNet
5-shot linear accuracy) found 1-D, 2-D and relative embeddings within 0.2% of each other (64.2%,
64.0%, 64.0%) and all about 3% above none (61.4%).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Sequence

import keras
import numpy as np

from keras_vit.files import atomic_open
from keras_vit.position import POSITION_EMBEDDINGS, POSITION_VARIABLES, check_position_embedding
from keras_vit.training import config as config_lib
from keras_vit.training import fields, outputs, steps
from keras_vit.training.config import TrainConfig
from keras_vit.training.data import Source
from keras_vit.training.errors import add_debug_flag, command_errors
from keras_vit.training.fields import option
from keras_vit.training.optimizers import no_decay_variables
from keras_vit.training.pipeline import eval_dataset, train_dataset

__all__ = ["DEFAULT_RUNS", "AblationOptions", "AblationRow", "main", "parser", "run_ablation", "table", "train_one"]

DEFAULT_RUNS = (*((p, "token") for p in POSITION_EMBEDDINGS), ("learned_1d", "gap"))
BASE = TrainConfig().replace(steps=400, output_dir="runs/ablation", verbose=0)  # the command's defaults


@dataclasses.dataclass(frozen=True)
class AblationOptions:
    """Which settings to train, and how often."""

    positions: str | None = option("comma-separated position embeddings", unset=", ".join(POSITION_EMBEDDINGS))
    classifiers: str | None = option(
        "comma-separated classifiers (token, gap) crossed with --positions",
        unset="token; with neither option: every position embedding with token, plus learned_1d with gap",
    )
    seeds: int = option("runs per setting (seeds 0..N-1)", 1)

    def runs(self) -> tuple[tuple[str, str], ...]:
        """The ``(position_embedding, classifier)`` settings."""
        return _runs(self.positions, self.classifiers)


@dataclasses.dataclass
class AblationRow:
    """One setting's results: held-out accuracy per seed, parameters, training seconds per seed."""

    position_embedding: str
    classifier: str
    parameters: int
    accuracies: list[float]
    seconds: float

    @property
    def mean(self) -> float:
        return float(np.mean(self.accuracies))

    @property
    def spread(self) -> float:
        """Standard deviation over seeds (0 for one seed)."""
        return float(np.std(self.accuracies, ddof=1)) if len(self.accuracies) > 1 else 0.0


def train_one(
    config: TrainConfig, source: Source, position_embedding: str, classifier: str, seed: int
) -> tuple[keras.Model, float]:
    """Train one model of the resolved ``config`` for its steps; return it and its held-out accuracy."""
    keras.utils.set_random_seed(seed)
    model = steps.build_model(config, source.num_classes, classifier=classifier, position_embedding=position_embedding)
    steps.compile_model(model, config)
    if config.optim.weight_decay:  # spare the position parameters of every kind, as the 1-D ones are spared
        variables = model.trainable_variables
        model.optimizer.exclude_from_weight_decay(
            var_list=no_decay_variables(variables) + [v for v in variables if v.name in POSITION_VARIABLES]
        )
    augment, batch = steps.augment_of(config), config.optim.batch_size
    model.fit(
        train_dataset(
            source.train, source.num_classes, batch, augment, seed=seed, shuffle_buffer=config.data.shuffle_buffer
        ),
        steps_per_epoch=config.optim.steps,
        epochs=1,
        verbose=0,
    )
    scores = model.evaluate(eval_dataset(source.eval, source.num_classes, batch, augment), return_dict=True, verbose=0)
    return model, float(scores["accuracy"])


def run_ablation(
    config: TrainConfig, runs: Sequence[tuple[str, str]] = DEFAULT_RUNS, seeds: Sequence[int] = (0,), log=print
) -> list[AblationRow]:
    """Train every ``(position_embedding, classifier)`` of ``runs`` once per seed; one row per run."""
    for position_embedding, classifier in runs:
        check_position_embedding(position_embedding)
        if classifier not in ("token", "gap"):
            raise ValueError(f"Unknown classifier {classifier!r}; expected 'token' or 'gap'.")
    setup = steps.prepare(config)
    config, source, optim = setup.config, setup.source, setup.config.optim
    log(
        f"{source.name}: ViT {config.model.name} {config.architecture()} at {config.model.image_size}px, "
        f"{optim.steps} steps of {optim.batch_size}, {optim.optimizer} lr {optim.lr:g}; seeds {list(seeds)}"
    )
    rows = []
    for position_embedding, classifier in runs:
        accuracies, started = [], time.time()
        for seed in seeds:
            model, accuracy = train_one(config, source, position_embedding, classifier, seed)
            accuracies.append(accuracy)
        seconds = (time.time() - started) / len(seeds)
        rows.append(AblationRow(position_embedding, classifier, model.count_params(), accuracies, seconds))
        log(f"{position_embedding:>10} {classifier:>5}: held-out accuracy {rows[-1].mean:.4f} ({seconds:.0f} s/run)")
    return rows


def table(rows: Sequence[AblationRow]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| position embedding | classifier | parameters | held-out accuracy | seconds per run |",
        "|---|---|---:|---:|---:|",
    ]
    for row in rows:
        spread = f" ± {row.spread:.3f}" if len(row.accuracies) > 1 else ""
        lines.append(
            f"| `{row.position_embedding}` | {row.classifier} | {row.parameters:,} | {row.mean:.3f}{spread} "
            f"| {row.seconds:.0f} |"
        )
    return "\n".join(lines)


def _runs(positions: str | None, classifiers: str | None) -> tuple[tuple[str, str], ...]:
    """:data:`DEFAULT_RUNS` when neither is given, else every position embedding with every classifier."""
    if positions is None and classifiers is None:
        return DEFAULT_RUNS
    names = positions.split(",") if positions else POSITION_EMBEDDINGS
    heads = classifiers.split(",") if classifiers else ("token",)
    return tuple((p.strip(), c.strip()) for c in heads for p in names)


def parser() -> argparse.ArgumentParser:
    """``python -m keras_vit.training.finetune``'s options (the shared budget) plus the ablation's."""
    p = argparse.ArgumentParser(
        prog="python -m keras_vit.training.ablation",
        description="Train one ViT per position embedding (and classifier) under the same budget and print "
        "the held-out accuracies. Without a dataset: scikit-learn's digits, offline.",
    )
    config_lib.add_arguments(p, BASE)
    fields.add_arguments(p.add_argument_group("ablation"), AblationOptions())
    add_debug_flag(p)
    return p


def main(argv: Sequence[str] | None = None) -> list[AblationRow]:
    """Parse the command line, run the ablation, print the table and write it to ``OUTPUT_DIR``; an error is one
    line on stderr and exit status 1."""
    p = parser()
    args = p.parse_args(argv)
    config, options = config_lib.from_args(args, BASE), AblationOptions(**fields.given(args, AblationOptions))
    if config.model.weights:
        p.error("the ablation trains from scratch; --weights does not apply.")
    with command_errors(args):
        rows = run_ablation(config, options.runs(), range(options.seeds))
        text = table(rows)
        print(text, flush=True)
        out = config.run.output_dir
        outputs.mark_output(out, "ablation")
        with atomic_open(os.path.join(out, "ablation.md"), "w") as file:
            file.write(text + "\n")
        outputs.write_json(os.path.join(out, "ablation.json"), [dataclasses.asdict(r) for r in rows])
    return rows


if __name__ == "__main__":
    main()
