"""affine_parts reads an affine module's (W, b) in eval mode, then gives every submodule its mode back through its
own ``train(mode)``: what an override changed with the mode (here a marker) is that of the mode it had again."""

import torch
from torch import nn

from lightning_ortho.transforms.compression import affine_parts


class Remembers(nn.Module):
    """Records the mode its ``train(mode)`` override last saw (as a noise level or frozen part would follow it)."""

    def __init__(self):
        super().__init__()
        self.seen = "train"

    def train(self, mode=True):
        super().train(mode)
        self.seen = "train" if mode else "eval"
        return self


class AffineWithModes(Remembers):
    """An affine map that is not an nn.Linear (so affine_parts probes it), with a child frozen in eval mode."""

    in_features = 4

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3).double()
        self.frozen = Remembers()

    def forward(self, x):
        return self.linear(x)


def test_affine_parts_restores_each_modules_mode_through_its_train_override():
    module = AffineWithModes()
    module.frozen.eval()
    weight, bias = affine_parts(module)
    torch.testing.assert_close(weight, module.linear.weight.detach())
    torch.testing.assert_close(bias, module.linear.bias.detach())
    assert module.training and module.seen == "train"  # not left as eval() set it
    assert not module.frozen.training and module.frozen.seen == "eval"  # the frozen child stays frozen
