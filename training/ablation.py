"""The paper's position-embedding ablation (App. D.4) and token vs GAP: ``python -m keras_vit.training.ablation``.

One run per setting and seed into ``OUT/<position>-<classifier>/seed-<seed>/``, the table into ``OUT/ablation.md``
and ``OUT/ablation.json`` (docs/ablations.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from keras_vit import fields
from keras_vit.checks import check_choice
from keras_vit.cli import HelpFormatter, add_debug_flag, command_errors
from keras_vit.config import CLASSIFIERS, POSITION_EMBEDDINGS
from keras_vit.fields import option
from keras_vit.files import atomic_open
from keras_vit.training import command, outputs
from keras_vit.training import config as config_lib
from keras_vit.training.config import TrainConfig

__all__ = [
    "DEFAULT_RUNS",
    "AblationOptions",
    "AblationRow",
    "check_runs",
    "main",
    "parser",
    "run_ablation",
    "run_folder",
    "table",
]

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
    seeds: int = option("runs per setting (seeds --seed, --seed + 1, ..., --seed + N - 1)", 1)

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


def run_folder(output_dir: str, position_embedding: str, classifier: str, seed: int) -> str:
    """Where the run of one setting and seed goes (:data:`keras_vit.training.outputs.ABLATION_FOLDERS`)."""
    return os.path.join(output_dir, f"{position_embedding}-{classifier}", f"seed-{seed}")


def run_ablation(
    config: TrainConfig,
    runs: Sequence[tuple[str, str]] = DEFAULT_RUNS,
    seeds: Sequence[int] | None = None,
    log: Callable[[str], object] = print,
) -> list[AblationRow]:
    """Train every ``(position_embedding, classifier)`` of ``runs`` once per seed (default: the config's), each a
    resumable run in its :func:`run_folder`; write and log the table. One row per setting."""
    seeds = check_runs(config, runs, seeds)
    from keras_vit.training.model import policy_name
    from keras_vit.training.runner import train
    from keras_vit.training.setup import prepare
    from keras_vit.training.supervised import Classification

    setup = prepare(config)
    config, source, optim = setup.config, setup.source, setup.config.optim
    log = log if setup.chief else lambda line: None
    outputs.start_parent(setup, "ablation", ["ablation.md", "ablation.json"])
    log(
        f"{source.name}: ViT {config.model.name} {config.architecture()} at {config.model.image_size}px, "
        f"{optim.steps} steps of {optim.batch_size}, {optim.optimizer} lr {optim.lr:g}, "
        f"{policy_name(config, setup.device)}; seeds {list(seeds)}"
    )
    out, rows = config.run.output_dir, []
    for position_embedding, classifier in runs:
        task, accuracies, started = Classification(position_embedding, classifier), [], time.time()
        for seed in seeds:
            folder = run_folder(out, position_embedding, classifier, seed)
            result = train(setup.replace(seed=seed, overwrite=False, output_dir=folder), task, command="ablation")
            accuracies.append(result.metrics["accuracy"])
        seconds = (time.time() - started) / len(seeds)
        rows.append(AblationRow(position_embedding, classifier, result.model.count_params(), accuracies, seconds))
        log(f"{position_embedding:>10} {classifier:>5}: held-out accuracy {rows[-1].mean:.4f} ({seconds:.0f} s/run)")
    text = table(rows)
    if setup.chief:
        with atomic_open(os.path.join(out, "ablation.md"), "w") as file:
            file.write(text + "\n")
        outputs.write_json(os.path.join(out, "ablation.json"), [dataclasses.asdict(r) for r in rows])
    log(text)
    return rows


def check_runs(config: TrainConfig, runs: Sequence[tuple[str, str]], seeds: Sequence[int] | None) -> tuple[int, ...]:
    """The seeds (default: the config's); a ``ValueError`` for an unknown setting of ``runs``, weights, or no seed."""
    for position_embedding, classifier in runs:
        check_choice(position_embedding, POSITION_EMBEDDINGS, "position_embedding")
        if classifier not in CLASSIFIERS:
            raise ValueError(f"Unknown classifier {classifier!r}; expected 'token' or 'gap'.")
    if config.model.weights:
        raise ValueError("the ablation trains from scratch; --weights does not apply.")
    seeds = (config.optim.seed,) if seeds is None else tuple(seeds)
    if not seeds:
        raise ValueError("--seeds must be >= 1, got 0.")
    return seeds


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
        formatter_class=HelpFormatter,
    )
    config_lib.add_arguments(p, BASE)
    fields.add_arguments(p.add_argument_group("ablation"), AblationOptions())
    add_debug_flag(p)
    return p


def main(argv: Sequence[str] | None = None) -> list[AblationRow]:
    """Parse the command line and run :func:`run_ablation` (seeds ``--seed`` to ``--seed`` + ``--seeds`` - 1); an
    error is one line on stderr and exit status 1."""
    args = parser().parse_args(argv)
    config, options = config_lib.from_args(args, BASE), AblationOptions(**fields.given(args, AblationOptions))
    with command_errors(args):
        first = config.optim.seed
        seeds = check_runs(config, options.runs(), range(first, first + options.seeds))
        command.start(config)
        return run_ablation(config, options.runs(), seeds)


if __name__ == "__main__":
    main()
