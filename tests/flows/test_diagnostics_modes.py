"""flows.diagnostics measures in eval mode and afterwards gives every submodule its own mode back: a part of the
Glow the user froze in eval mode stays frozen, the rest trains on."""

import pytest
import torch

from lightning_ortho.flows import Glow, diagnostics

DTYPE = torch.float64


def glow_with_a_frozen_block() -> Glow:
    glow = Glow(in_channels=1, image_size=4, levels=2, steps=1, hidden_channels=4, conv1x1="lu").to(DTYPE)
    glow(torch.rand(8, 1, 4, 4, dtype=DTYPE) - 0.5)  # ActNorm's data-dependent init
    glow.train()
    glow.blocks[0].eval()  # frozen by the user: its modules must not go back to training
    return glow


@pytest.mark.parametrize("measure", [diagnostics.reconstruction, diagnostics.jacobian_sign_flips])
def test_a_diagnostic_leaves_every_submodule_in_the_mode_it_had(measure):
    glow = glow_with_a_frozen_block()
    modes = {name: module.training for name, module in glow.named_modules()}
    assert not all(modes.values()) and any(modes.values())  # a mixed state, so a blanket train() shows
    measure(glow, torch.rand(2, 1, 4, 4, dtype=DTYPE) - 0.5)
    assert {name: module.training for name, module in glow.named_modules()} == modes
