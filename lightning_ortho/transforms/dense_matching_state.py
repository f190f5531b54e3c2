"""The bookkeeping of :func:`~lightning_ortho.transforms.dense_matching.max_weight_perfect_matching`: NetworkX's
dictionaries of the blossom algorithm, each mirrored into an array so that the loops over every edge can be
vectorised (adapted from NetworkX, ``networkx/algorithms/matching.py``; licence at the end of this file)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class Blossom:
    """A non-trivial blossom: ``childs`` (sub-blossoms or vertices, base first), ``edges`` between consecutive
    children, the cached least-slack edges to other S-blossoms, and an integer ``id`` (``>= n``) for the arrays."""

    __slots__ = ["childs", "edges", "mybestedges", "id"]

    def leaves(self) -> Iterator[int]:
        stack = [*self.childs]
        while stack:
            t = stack.pop()
            if isinstance(t, Blossom):
                stack.extend(t.childs)
            else:
                yield t


def key_of(x: int | Blossom) -> int:
    return x.id if isinstance(x, Blossom) else x


class Labels(dict):
    """``label`` of vertices and blossoms (1 = S, 2 = T, None = free), mirrored into ``array`` by id (0 = free)."""

    def __init__(self, array: np.ndarray) -> None:
        super().__init__()
        self.array = array

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.array[key_of(key)] = 0 if value is None else value

    def pop(self, key, default=None):
        self.array[key_of(key)] = 0
        return super().pop(key, default)

    def clear(self) -> None:
        super().clear()
        self.array[:] = 0


class InBlossom(dict):
    """``inblossom`` (the top-level blossom of each vertex), mirrored into ``array`` (its id)."""

    def __init__(self, array: np.ndarray) -> None:
        super().__init__((v, v) for v in range(len(array)))
        self.array = array

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.array[key] = key_of(value)


class BestEdges:
    """``bestedge``: the least-slack edge of a vertex (arrays ``first``/``second``, ``-1`` = none, and its slack
    under the current duals, ``inf`` = none) or of a blossom (dict). ``slack_of(v, w)`` prices an edge when it is set;
    :meth:`reprice` recomputes every vertex's after the duals change (the same operations: the same bits)."""

    def __init__(self, n: int, slack_of, slacks_of) -> None:
        self.first = np.full(n, -1, dtype=np.int64)
        self.second = np.full(n, -1, dtype=np.int64)
        self.slack = np.full(n, np.inf)
        self.blossoms: dict[Blossom, tuple[int, int] | None] = {}
        self._slack_of, self._slacks_of = slack_of, slacks_of

    def get(self, key):
        if isinstance(key, Blossom):
            return self.blossoms.get(key)
        return None if self.first[key] < 0 else (int(self.first[key]), int(self.second[key]))

    __getitem__ = get

    def __setitem__(self, key, edge) -> None:
        if isinstance(key, Blossom):
            self.blossoms[key] = edge
        elif edge is None:
            self.first[key], self.second[key], self.slack[key] = -1, -1, np.inf
        else:
            self.first[key], self.second[key] = edge
            self.slack[key] = self._slack_of(*edge)

    def pop(self, key, default=None):
        self.blossoms.pop(key, default)

    def clear(self) -> None:
        self.blossoms.clear()
        self.first[:] = -1
        self.second[:] = -1
        self.slack[:] = np.inf

    def reprice(self) -> None:
        known = self.first >= 0
        self.slack[known] = self._slacks_of(self.first[known], self.second[known])


# NetworkX is distributed with the following licence (BSD 3-Clause):
#
# Copyright (C) 2004-2024, NetworkX Developers
# Aric Hagberg <hagberg@lanl.gov>
# Dan Schult <dschult@colgate.edu>
# Pieter Swart <swart@lanl.gov>
# All rights reserved.
#
# Redistribution and use in source and binary forms, with or without modification, are permitted provided that the
# following conditions are met:
#
#   * Redistributions of source code must retain the above copyright notice, this list of conditions and the
#     following disclaimer.
#   * Redistributions in binary form must reproduce the above copyright notice, this list of conditions and the
#     following disclaimer in the documentation and/or other materials provided with the distribution.
#   * Neither the name of the NetworkX Developers nor the names of its contributors may be used to endorse or
#     promote products derived from this software without specific prior written permission.
#
# THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS" AND ANY EXPRESS OR IMPLIED WARRANTIES,
# INCLUDING, BUT NOT LIMITED TO, THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
# DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT OWNER OR CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL,
# SPECIAL, EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
# SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY OF LIABILITY,
# WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
# OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
