"""Every layer of ``lightning_ortho.nn`` runs on meta tensors (deferred initialisation, FSDP's shape inference):
built with ``.to("meta")`` or under ``with torch.device("meta")``, its calls give the shapes and dtypes of the same
calls on the CPU. The checks that read values (the fused path's host read, the NaN checks, PyTorch's orthogonality
test) are skipped on meta, not removed: on real tensors they still raise."""

from collections.abc import Callable

import pytest
import torch

from lightning_ortho.nn import (
    ORTHOGONAL_METHODS,
    AuxiliaryReflection,
    HouseholderProduct,
    InvertibleAuxiliaryWeight,
    OrthogonalRNN,
    OrthogonalRNNCell,
    ParametrizedOrthogonal,
    SVDLinear,
    householder_matrix,
    reflect,
)

Input = Callable[[str], torch.Tensor]


def data(*shape: int) -> Input:
    """Random values of ``shape`` on the CPU; an uninitialised tensor of that shape on meta."""
    return lambda device: torch.randn(*shape) if device == "cpu" else torch.empty(*shape, device=device)


# name -> (constructor, call(module, inputs...), input makers)
CASES: dict[str, tuple[Callable, Callable, tuple[Input, ...]]] = {
    "aux": (lambda: AuxiliaryReflection(6), lambda m, x: m(x), (data(4, 6),)),
    "aux_batched": (lambda: AuxiliaryReflection(6), lambda m, x: m(x), (data(2, 3, 6),)),
    "aux_unfused": (lambda: _unfused(AuxiliaryReflection(6)), lambda m, x: m(x), (data(4, 6),)),
    "aux_invertible": (lambda: AuxiliaryReflection(6, invertible=True), lambda m, x: m(x), (data(4, 6),)),
    "aux_network": (
        lambda: AuxiliaryReflection(6, network=torch.nn.Linear(6, 6)),
        lambda m, x: m(x),
        (data(4, 6),),
    ),
    "aux_forward_and_log_det": (
        lambda: AuxiliaryReflection(6),
        lambda m, x: m.forward_and_log_abs_det(x),
        (data(4, 6),),
    ),
    "aux_invertible_forward_and_log_det": (
        lambda: AuxiliaryReflection(6, invertible=True),
        lambda m, x: m.forward_and_log_abs_det(x),
        (data(4, 6),),
    ),
    "aux_jacobian": (lambda: AuxiliaryReflection(6), lambda m, x: m.jacobian(x), (data(4, 6),)),
    "aux_log_det_dense": (
        lambda: AuxiliaryReflection(6),
        lambda m, x: m.log_abs_det_jacobian(x, method="dense"),
        (data(4, 6),),
    ),
    "invertible_weight": (lambda: InvertibleAuxiliaryWeight(6), lambda m: m(), ()),
    "householder_wy": (lambda: HouseholderProduct(6), lambda m, x: m(x), (data(4, 6),)),
    "householder_wy_materialised": (lambda: HouseholderProduct(6), lambda m, x: m(x), (data(64, 6),)),
    "householder_sequential": (
        lambda: HouseholderProduct(6, k=3, strategy="sequential"),
        lambda m, x: m(x),
        (data(4, 6),),
    ),
    "householder_from_orthogonal": (
        lambda: HouseholderProduct.from_orthogonal(torch.linalg.qr(torch.randn(6, 6)).Q),
        lambda m: m.matrix(),
        (),
    ),
    "aux_from_orthogonal": (
        lambda: AuxiliaryReflection.from_orthogonal(torch.linalg.qr(torch.randn(6, 6)).Q),
        lambda m, x: m(x),
        (data(4, 6),),
    ),
    **{
        f"parametrized_{kind}": (
            lambda kind=kind: ParametrizedOrthogonal(6, kind),
            lambda m, x: (m(x), m.matrix()),
            (data(4, 6),),
        )
        for kind in ("cayley", "matrix_exp", "householder")
    },
    **{
        f"svd_linear_{method}": (
            lambda method=method: SVDLinear(6, 4, orthogonal=method),
            lambda m, x: m(x),
            (data(3, 6),),
        )
        for method in ORTHOGONAL_METHODS
    },
    **{
        f"rnn_cell_{transition}": (
            lambda transition=transition: OrthogonalRNNCell(3, 6, transition=transition),
            lambda m, x, h: m(x, h),
            (data(4, 3), data(4, 6)),
        )
        for transition in ("aux", "householder", "cayley")
    },
    **{
        f"rnn_{transition}": (
            lambda transition=transition: OrthogonalRNN(3, 6, transition=transition),
            lambda m, x: m(x),
            (data(4, 5, 3),),
        )
        for transition in ("aux", "householder", "matrix_exp")
    },
    "reflect": (lambda: torch.nn.Identity(), lambda _, x, v: reflect(x, v), (data(4, 6), data(4, 6))),
    "reflect_broadcast": (lambda: torch.nn.Identity(), lambda _, x, v: reflect(x, v), (data(2, 4, 6), data(6))),
    "householder_matrix": (lambda: torch.nn.Identity(), lambda _, v: householder_matrix(v), (data(3, 6),)),
}


def _unfused(layer: AuxiliaryReflection) -> AuxiliaryReflection:
    layer.fused_forward = False
    return layer


def signature(output) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes of the tensors in ``output`` (a tensor or a tuple of them)."""
    tensors = output if isinstance(output, tuple) else (output,)
    return [(tuple(t.shape), t.dtype) for t in tensors]


@pytest.mark.parametrize("construction", ["to_meta", "meta_context"])
@pytest.mark.parametrize("name", list(CASES))
def test_every_layer_propagates_shapes_on_meta(name, construction):
    build, call, inputs = CASES[name]
    torch.manual_seed(0)
    expected = signature(call(build(), *(make("cpu") for make in inputs)))
    if construction == "to_meta":
        module = build().to("meta")
    else:  # deferred initialisation: every tensor the constructor creates is a meta tensor
        with torch.device("meta"):
            module = build()
    assert all(t.is_meta for t in (*module.parameters(), *module.buffers()))
    output = call(module, *(make("meta") for make in inputs))
    assert signature(output) == expected
    assert all(t.is_meta for t in (output if isinstance(output, tuple) else (output,)))


@pytest.mark.parametrize(
    "build",
    [
        lambda: AuxiliaryReflection(6),
        lambda: AuxiliaryReflection(6, invertible=True),
        lambda: HouseholderProduct(6),
        lambda: ParametrizedOrthogonal(6, "cayley"),
        lambda: SVDLinear(6, 4),
    ],
    ids=["aux", "aux_invertible", "householder", "cayley", "svd_linear"],
)
def test_the_checks_skipped_on_meta_still_run_on_real_tensors(build):
    x = torch.randn(4, 6)
    x[1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        build()(x)


@pytest.mark.parametrize("layer", [AuxiliaryReflection(6), HouseholderProduct(6), ParametrizedOrthogonal(6)])
def test_the_orthogonality_check_skipped_on_meta_still_runs_on_real_tensors(layer):
    with pytest.raises(ValueError, match="not orthogonal"):
        layer.reset_orthogonal_(torch.ones(6, 6))
