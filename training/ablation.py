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
import json
import os
import time
from collections.abc import Sequence

import keras
import numpy as np

import keras_vit
from keras_vit.position import POSITION_EMBEDDINGS, POSITION_VARIABLES, check_position_embedding
from keras_vit.training import config as config_lib
from keras_vit.training.config import TrainConfig
from keras_vit.training.data import Source, load_source
from keras_vit.training.finetune import augment_of, compile_model
from keras_vit.training.finetune import parser as finetune_parser
from keras_vit.training.optimizers import no_decay_variables
from keras_vit.training.pipeline import eval_dataset, train_dataset
from keras_vit.training.strategy import accelerator, get_strategy

DEFAULT_RUNS = tuple((p, "token") for p in POSITION_EMBEDDINGS) + (("learned_1d", "gap"),)
DEFAULT_STEPS = 400


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


def train_one(config: TrainConfig, source: Source, position_embedding: str, classifier: str,
              seed: int) -> tuple[keras.Model, float]:
    """Train one model of the resolved ``config`` for ``config.steps`` steps; return it and its held-out accuracy."""
    keras.utils.set_random_seed(seed)
    model = keras_vit.ViT(config_lib.parse_model_name(config.model), image_size=config.image_size,
                          num_classes=source.num_classes, dropout=config.dropout, drop_path=config.drop_path,
                          classifier=classifier, position_embedding=position_embedding, **config.architecture())
    compile_model(model, config)
    if config.weight_decay:  # spare the position parameters of every kind, as the 1-D ones are spared
        variables = model.trainable_variables
        model.optimizer.exclude_from_weight_decay(
            var_list=no_decay_variables(variables) + [v for v in variables if v.name in POSITION_VARIABLES])
    augment = augment_of(config)
    model.fit(train_dataset(source.train, source.num_classes, config.batch_size, augment, seed=seed,
                            shuffle_buffer=config.shuffle_buffer),
              steps_per_epoch=config.steps, epochs=1, verbose=0)
    scores = model.evaluate(eval_dataset(source.eval, source.num_classes, config.batch_size, augment),
                            return_dict=True, verbose=0)
    return model, float(scores["accuracy"])


def run_ablation(config: TrainConfig, runs: Sequence[tuple[str, str]] = DEFAULT_RUNS, seeds: Sequence[int] = (0,),
                 log=print) -> list[AblationRow]:
    """Train every ``(position_embedding, classifier)`` of ``runs`` once per seed; one row per run."""
    for position_embedding, classifier in runs:
        check_position_embedding(position_embedding)
        if classifier not in ("token", "gap"):
            raise ValueError(f"Unknown classifier {classifier!r}; expected 'token' or 'gap'.")
    source = load_source(config.dataset, data_dir=config.data_dir, manual_dir=config.manual_dir,
                         train_split=config.train_split, eval_split=config.eval_split,
                         eval_fraction=config.eval_fraction, seed=config.seed)
    config = config_lib.resolve(config, train_examples=source.train.num_examples,
                                accelerator=accelerator(get_strategy(config.strategy, config.tpu)))
    log(f"{source.name}: ViT {config.model} {config.architecture()} at {config.image_size}px, {config.steps} steps "
        f"of {config.batch_size}, {config.optimizer} lr {config.lr:g}; seeds {list(seeds)}")
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
    lines = ["| position embedding | classifier | parameters | held-out accuracy | seconds per run |",
             "|---|---|---:|---:|---:|"]
    for row in rows:
        spread = f" ± {row.spread:.3f}" if len(row.accuracies) > 1 else ""
        lines.append(f"| `{row.position_embedding}` | {row.classifier} | {row.parameters:,} | {row.mean:.3f}{spread} "
                     f"| {row.seconds:.0f} |")
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
    p = finetune_parser()
    p.prog = "python -m keras_vit.training.ablation"
    p.description = ("Train one ViT per position embedding (and classifier) under the same budget and print "
                     "the held-out accuracies. Without a dataset: scikit-learn's digits, offline.")
    p.set_defaults(steps=DEFAULT_STEPS, output_dir="runs/ablation")
    g = p.add_argument_group("ablation")
    g.add_argument("--positions", help=f"comma-separated position embeddings (default: {', '.join(POSITION_EMBEDDINGS)})")
    g.add_argument("--classifiers", help="comma-separated classifiers (token, gap) crossed with --positions "
                                          "(default: token; with neither option: every position embedding "
                                          "with token, plus learned_1d with gap)")
    g.add_argument("--seeds", type=int, default=1, help="runs per setting (seeds 0..N-1)")
    return p


def main(argv: Sequence[str] | None = None) -> list[AblationRow]:
    """Parse the command line, run the ablation, print the table and write it to ``OUTPUT_DIR``."""
    p = parser()
    args = vars(p.parse_args(argv))
    if args["weights"]:
        p.error("the ablation trains from scratch; --weights does not apply.")
    runs, seeds = _runs(args.pop("positions"), args.pop("classifiers")), range(args.pop("seeds"))
    args.pop("cpu_devices")
    args["verbose"] = 0
    config = TrainConfig(**args)
    rows = run_ablation(config, runs, seeds)
    text = table(rows)
    print(text, flush=True)
    os.makedirs(config.output_dir, exist_ok=True)
    with open(os.path.join(config.output_dir, "ablation.md"), "w") as file:
        file.write(text + "\n")
    with open(os.path.join(config.output_dir, "ablation.json"), "w") as file:
        json.dump([dataclasses.asdict(r) for r in rows], file, indent=2)
    return rows


if __name__ == "__main__":
    main()
