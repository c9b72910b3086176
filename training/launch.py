"""Start a multi-worker run: ``python -m keras_vit.training.launch --workers 2 -- <finetune options>``
(docs/distributed.md); :mod:`keras_vit.training.distributed.launch` runs the workers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from keras_vit.cli import HelpFormatter
from keras_vit.training.distributed.launch import BACKENDS, free_ports, keras_backend, run

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    """The command line (the training options come after ``--``)."""
    p = argparse.ArgumentParser(
        prog="python -m keras_vit.training.launch",
        description="Run a training command on several workers: a MultiWorkerMirroredStrategy cluster on "
        "TensorFlow, JAX processes (jax.distributed) under KERAS_BACKEND=jax. N local workers on 127.0.0.1, or this "
        "host's task of --hosts. Options after -- go to the training command.",
        formatter_class=HelpFormatter,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--workers", type=int, help="start this many workers on 127.0.0.1 (free ports); this or --hosts is required"
    )
    where.add_argument(
        "--hosts",
        help="host:port of every task, comma-separated (task 0 is the chief, and JAX's coordinator); starts only "
        "task --index here; this or --workers is required",
    )
    for flag, kind, default, help in (
        ("--index", int, None, "this host's task in --hosts (required with --hosts)"),
        ("--module", str, "keras_vit.training.finetune", "the training command's module"),
        ("--connect-timeout", float, 600.0, "seconds a worker waits for its peers before it fails naming them"),
        (
            "--collective-timeout",
            float,
            None,
            "TensorFlow: CommunicationOptions(timeout_seconds) of each collective (debugging; default off)",
        ),
        (
            "--gpus-per-worker",
            int,
            None,
            "local workers: GPUs per worker (0: CPU only). Default: 0 with --workers, all with --hosts",
        ),
        ("--timeout", float, None, "stop the whole job after this many seconds (default: no limit)"),
    ):
        p.add_argument(flag, type=kind, default=default, help=help)
    p.add_argument("options", nargs=argparse.REMAINDER, help="-- then the training command's options")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the workers, return the exit status."""
    args = parser().parse_args(argv)
    options = args.options[1:] if args.options[:1] == ["--"] else args.options
    backend = keras_backend()
    if backend not in BACKENDS:
        parser().error(f"the workers' Keras backend is {backend}; the launcher runs TensorFlow or JAX workers")
    given = any(o == "--strategy" or o.startswith("--strategy=") for o in options)
    if given and backend == "tensorflow":
        parser().error("the launcher sets --strategy multi_worker; do not pass --strategy")
    if args.workers is not None:
        if args.workers < 1 or args.index is not None:
            parser().error("--workers needs a count >= 1 and no --index")
        addresses, indices = [f"127.0.0.1:{port}" for port in free_ports(args.workers)], list(range(args.workers))
        gpus = args.gpus_per_worker or 0
    else:
        addresses = [a.strip() for a in args.hosts.split(",") if a.strip()]
        if args.index is None or not 0 <= args.index < len(addresses):
            parser().error(f"--hosts needs --index in 0..{len(addresses) - 1}")
        indices = [args.index]
        gpus = args.gpus_per_worker
    strategy = [] if given else ["--strategy", "multi_worker" if backend == "tensorflow" else "data_parallel"]
    command = [sys.executable, "-m", args.module, *options, *strategy]
    print(f"launch: {len(addresses)} {backend} workers {','.join(addresses)}; starting {indices} here", flush=True)
    return run(
        command,
        addresses,
        indices,
        connect_timeout=args.connect_timeout,
        collective_timeout=args.collective_timeout,
        gpus_per_worker=gpus,
        timeout=args.timeout,
        backend=backend,
    )


if __name__ == "__main__":
    sys.exit(main())
