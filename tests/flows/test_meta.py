"""The flow layers run on meta tensors (deferred initialisation, FSDP's shape inference): built with ``.to("meta")``
or under ``with torch.device("meta")``, ``forward`` gives the shapes and dtypes it gives on the CPU. ActNorm's
data-dependent initialisation is skipped on meta (there is no batch to take statistics from), not dropped: the layer
stays uninitialised and initialises on its first real batch."""

import pytest
import torch

from lightning_ortho.flows import CONV1X1_KINDS, ActNorm, AffineCoupling, Glow, invertible_1x1_conv

CASES = {
    **{f"conv1x1_{kind}": (lambda kind=kind: invertible_1x1_conv(4, kind), (2, 4, 3, 3)) for kind in CONV1X1_KINDS},
    "actnorm": (lambda: ActNorm(4), (2, 4, 3, 3)),
    "coupling": (lambda: AffineCoupling(4, hidden_channels=8), (2, 4, 3, 3)),
    **{
        f"glow_{kind}": (
            lambda kind=kind: Glow(in_channels=1, image_size=4, levels=2, steps=1, hidden_channels=4, conv1x1=kind),
            (2, 1, 4, 4),
        )
        for kind in CONV1X1_KINDS
    },
}


def signature(output) -> list[tuple[tuple[int, ...], torch.dtype]]:
    tensors = output if isinstance(output, tuple) else (output,)
    return [(tuple(t.shape), t.dtype) for t in tensors]


@pytest.mark.filterwarnings("ignore::UserWarning")  # ActNorm on a small CPU batch starts as the identity
@pytest.mark.parametrize("construction", ["to_meta", "meta_context"])
@pytest.mark.parametrize("name", list(CASES))
def test_flow_layers_propagate_shapes_on_meta(name, construction):
    build, shape = CASES[name]
    torch.manual_seed(0)
    expected = signature(build()(torch.rand(*shape)))
    if construction == "to_meta":
        layer = build().to("meta")
    else:
        with torch.device("meta"):
            layer = build()
    assert all(t.is_meta for t in (*layer.parameters(), *layer.buffers()))
    output = layer(torch.empty(*shape, device="meta"))
    assert signature(output) == expected


def test_actnorm_skips_its_data_dependent_initialisation_on_meta_only(monkeypatch):
    batches = []
    monkeypatch.setattr(ActNorm, "_initialize", lambda self, x: batches.append(tuple(x.shape)))
    layer = ActNorm(3).to("meta")
    layer(torch.empty(8, 3, 4, 4, device="meta"))
    assert batches == []  # nothing to take statistics from; the layer stays uninitialised
    ActNorm(3)(torch.randn(8, 3, 4, 4))
    assert batches == [(8, 3, 4, 4)]  # a real first batch still initialises
