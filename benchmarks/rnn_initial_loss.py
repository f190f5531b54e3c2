"""Why pixel-MNIST training starts at a loss far above log 10: input scale against the paper's setting.

    python -m benchmarks.rnn_initial_loss          # a few seconds: forward passes on 4 x 128 real MNIST sequences

At initialisation the orthogonal RNN of Section 3.2 (hidden 170, modReLU, Cayley initialisation, V
Kaiming-normal as in expRNN) reads 784 pixels; with a norm-preserving transition every step adds
``||V x_t||^2 ~ 2 H x_t^2`` to ``||h||^2``, so ``||h_T||`` and the read-out's logits grow with the input's
second moment. This script measures, on the first training batches of the 5,000 real MNIST images
(benchmarks/mnist5k.py), the initial cross-entropy, ``||h_T||`` and the logits' spread for each transition
under two input scalings: pixels in [0, 1] (expRNN's ``transforms.ToTensor()``, the code the paper used) and
standardised with MNIST's mean and standard deviation (what ``recipes/rnn_pixel_mnist.yaml`` did before).

Writes benchmarks/results/rnn_initial_loss-HARDWARE.json.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from benchmarks._common import benchmark_parser, configured, parse_args, reject, write_result
from benchmarks.mnist5k import prepare as prepare_mnist5k
from lightning_ortho.datamodules import MNISTDataModule, SequentialImageDataModule
from lightning_ortho.models import OrthogonalRNNClassifier

SCALINGS = {"pixels in [0, 1] (expRNN)": ((0.0,), (1.0,)), "standardised (0.1307, 0.3081)": ((0.1307,), (0.3081,))}
TRANSITIONS = {
    "aux": {"transition": "aux"},
    "170 reflections": {"transition": "householder"},
    "cayley": {"transition": "cayley"},
}


@torch.no_grad()
def measure(scaling: str, transition: str, batches: int, seed: int) -> dict:
    mean, std = SCALINGS[scaling]
    images = MNISTDataModule(root=str(prepare_mnist5k()), flatten=False, batch_size=128, val_size=0, mean=mean, std=std)
    data = SequentialImageDataModule(images, mode="pixel")
    torch.manual_seed(seed)
    model = OrthogonalRNNClassifier(in_features=1, hidden_size=170, **TRANSITIONS[transition]).eval()
    losses, norms, spreads = [], [], []
    for index, (x, y) in enumerate(data.train_dataloader()):
        if index == batches:
            break
        _, h = model.rnn(x)
        logits = model.head(h)
        losses.append(float(torch.nn.functional.cross_entropy(logits, y)))
        norms.append(float(torch.linalg.vector_norm(h, dim=-1).mean()))
        spreads.append(float(logits.std()))
    return {
        "scaling": scaling,
        "transition": transition,
        "seed": seed,
        "initial_loss": sum(losses) / len(losses),
        "final_state_norm": sum(norms) / len(norms),
        "logit_std": sum(spreads) / len(spreads),
        "batches": len(losses),
    }


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("rnn_initial_loss", __doc__)
    parser.add_argument("--batches", type=int, default=4, help="training batches per measurement (1 with --quick)")
    args = parse_args(parser, argv)
    reject(parser, args, rounds="rnn_initial_loss times nothing", device="rnn_initial_loss runs on the CPU only")
    with configured(args) as device:
        return _run(args, device)


def _run(args, device) -> Path:
    """``--quick``: one batch, one transition."""
    transitions = ["aux"] if args.quick else list(TRANSITIONS)
    batches = 1 if args.quick else args.batches
    rows = [measure(s, t, batches, seed=0) for s in SCALINGS for t in transitions]
    for row in rows:
        print(
            f"{row['scaling']:32s} {row['transition']:16s} loss {row['initial_loss']:6.2f}  |h_T| {row['final_state_norm']:7.1f}"
        )
    at = {(r["scaling"], r["transition"]): r["initial_loss"] for r in rows}
    raw, standard = list(SCALINGS)
    claims = [
        {
            "claim": f"standardising the pixels multiplies the initial loss of {t} (figure = ratio to pixels in [0, 1])",
            "figure": round(at[standard, t] / at[raw, t], 2),
            "holds": at[standard, t] > at[raw, t],
        }
        for t in transitions
    ]
    claims.append(
        {
            "claim": "even in the paper's setting the initial loss is far above log 10 = 2.30 (figure = mean initial loss, pixels in [0, 1])",
            "figure": round(sum(at[raw, t] for t in transitions) / len(transitions), 2),
            "holds": min(at[raw, t] for t in transitions) > 2 * math.log(10),
        }
    )
    setup = {"data": "first training batches of the 5,000 real MNIST images", "batch_size": 128, "batches": batches}
    return write_result("rnn_initial_loss", device, rows, claims, args, extra={"setup": setup})


if __name__ == "__main__":
    main()
