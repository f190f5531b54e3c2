"""Closed-form linearisations of cells that do not carry a ``linearize`` method: the ``OrthogonalRNNCell`` of
``nn`` (which never imports ``online``) and :class:`~lightning_ortho.online.GRUCell`. Looked up by
:func:`~lightning_ortho.online.linearization.linearize`, imported on first use."""

from __future__ import annotations

import torch
from torch import nn

from lightning_ortho.online.gru_linearization import gru_linearization
from lightning_ortho.online.linearization import ParameterLayout, StepLinearization
from lightning_ortho.online.orthogonal_linearization import orthogonal_linearization


def closed_form_linearization(
    cell: nn.Module, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout
) -> StepLinearization | None:
    """The closed-form linearisation of ``cell`` at ``(x, h)``, or ``None`` when there is none (generic path)."""
    lin = orthogonal_linearization(cell, x, h, layout)
    return lin if lin is not None else gru_linearization(cell, x, h, layout)
