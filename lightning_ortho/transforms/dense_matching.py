"""Maximum-weight perfect matching of a complete graph given by a dense weight matrix (Edmonds' blossom algorithm).

The stages of an M-transform (Rusu, arXiv 1812.03412, Algorithm 3) are maximum-weight perfect matchings of the
complete graph on the ``n`` coordinates. This is the primal-dual blossom algorithm of NetworkX's
``max_weight_matching(G, maxcardinality=True)`` (Galil, "Efficient algorithms for finding maximum matching in
graphs", 1986; NetworkX's version follows Van Rantwijk's), step for step and with the same floating-point operations,
so it returns the same matching (ties included), with its bookkeeping in arrays so that the two loops that run over
every edge, the scan of an S-vertex's neighbours and the search for the smallest dual change, are vectorised:
NetworkX spends ``O(n^3)`` Python operations on a complete graph, this ``O(n^2)`` numpy calls of length ``n``.

Adapted from NetworkX (``networkx/algorithms/matching.py``), Copyright (C) 2004-2024, NetworkX Developers (Aric
Hagberg, Dan Schult, Pieter Swart), under the 3-clause BSD licence reproduced at the end of this file.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class _Blossom:
    """A non-trivial blossom: ``childs`` (sub-blossoms or vertices, base first), ``edges`` between consecutive
    children, the cached least-slack edges to other S-blossoms, and an integer ``id`` (``>= n``) for the arrays."""

    __slots__ = ["childs", "edges", "mybestedges", "id"]

    def leaves(self) -> Iterator[int]:
        stack = [*self.childs]
        while stack:
            t = stack.pop()
            if isinstance(t, _Blossom):
                stack.extend(t.childs)
            else:
                yield t


def _key(x: int | _Blossom) -> int:
    return x.id if isinstance(x, _Blossom) else x


class _Labels(dict):
    """``label`` of vertices and blossoms (1 = S, 2 = T, None = free), mirrored into ``array`` by id (0 = free)."""

    def __init__(self, array: np.ndarray) -> None:
        super().__init__()
        self.array = array

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.array[_key(key)] = 0 if value is None else value

    def pop(self, key, default=None):
        self.array[_key(key)] = 0
        return super().pop(key, default)

    def clear(self) -> None:
        super().clear()
        self.array[:] = 0


class _InBlossom(dict):
    """``inblossom`` (the top-level blossom of each vertex), mirrored into ``array`` (its id)."""

    def __init__(self, array: np.ndarray) -> None:
        super().__init__((v, v) for v in range(len(array)))
        self.array = array

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.array[key] = _key(value)


class _BestEdges:
    """``bestedge``: the least-slack edge of a vertex (arrays ``first``/``second``, ``-1`` = none, and its slack
    under the current duals, ``inf`` = none) or of a blossom (dict). ``slack_of(v, w)`` prices an edge when it is set;
    :meth:`reprice` recomputes every vertex's after the duals change (the same operations: the same bits)."""

    def __init__(self, n: int, slack_of, slacks_of) -> None:
        self.first = np.full(n, -1, dtype=np.int64)
        self.second = np.full(n, -1, dtype=np.int64)
        self.slack = np.full(n, np.inf)
        self.blossoms: dict[_Blossom, tuple[int, int] | None] = {}
        self._slack_of, self._slacks_of = slack_of, slacks_of

    def get(self, key):
        if isinstance(key, _Blossom):
            return self.blossoms.get(key)
        return None if self.first[key] < 0 else (int(self.first[key]), int(self.second[key]))

    __getitem__ = get

    def __setitem__(self, key, edge) -> None:
        if isinstance(key, _Blossom):
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


def max_weight_perfect_matching(weights: np.ndarray) -> list[tuple[int, int]]:
    """A maximum-weight perfect matching of the complete graph with edge weights ``weights[i, j]`` (``i != j``).

    Args:
        weights: ``(n, n)`` float64, symmetric (only the upper triangle is read), ``n`` even, finite.

    Returns:
        ``n / 2`` pairs ``(i, j)``, ``i < j``, sorted: the matching NetworkX's
        ``max_weight_matching(G, maxcardinality=True)`` returns for the complete graph ``G`` whose nodes ``0..n-1``
        and edges ``(i, j)``, ``i < j``, were added in increasing order.

    Raises:
        ValueError: ``weights`` is not a square 2-d array with an even ``n >= 2``, or holds NaN/inf.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 2 or weights.shape[0] != weights.shape[1] or weights.shape[0] < 2 or weights.shape[0] % 2:
        raise ValueError(f"max_weight_perfect_matching: weights must be (n, n) with n even >= 2, got {weights.shape}.")
    n = weights.shape[0]
    upper = np.triu(weights, 1)
    if not np.isfinite(upper).all():
        raise ValueError("max_weight_perfect_matching: weights hold NaN or inf.")
    W = upper + upper.T  # noqa: N806 - exactly symmetric, so slack(v, w) == slack(w, v) bit for bit
    rows = W.tolist()  # scalar reads in the Python parts
    maxweight = max(0, float(upper[np.triu_indices(n, 1)].max()))

    mate: dict[int, int] = {}
    label_ids = np.zeros(2 * n, dtype=np.int64)
    label = _Labels(label_ids)
    labeledge: dict = {}
    top = np.arange(n, dtype=np.int64)
    inblossom = _InBlossom(top)
    blossomparent: dict = dict.fromkeys(range(n))
    blossombase: dict = {v: v for v in range(n)}
    dualvar = np.full(n, maxweight, dtype=np.float64)
    blossomdual: dict = {}
    allowed = np.zeros((n, n), dtype=bool)
    queue: list[int] = []
    free_ids = list(range(2 * n - 1, n - 1, -1))
    NoNode = object()  # noqa: N806

    def slack(v, w):
        return dualvar[v] + dualvar[w] - 2 * rows[v][w]

    def edge_slacks(first: np.ndarray, second: np.ndarray) -> np.ndarray:
        return dualvar[first] + dualvar[second] - 2 * W[first, second]

    bestedge = _BestEdges(n, slack, edge_slacks)

    def assignLabel(w, t, v):  # noqa: N802
        b = inblossom[w]
        label[w] = label[b] = t
        if v is not None:
            labeledge[w] = labeledge[b] = (v, w)
        else:
            labeledge[w] = labeledge[b] = None
        bestedge[w] = bestedge[b] = None
        if t == 1:
            if isinstance(b, _Blossom):
                queue.extend(b.leaves())
            else:
                queue.append(b)
        elif t == 2:
            base = blossombase[b]
            assignLabel(mate[base], 1, base)

    def scanBlossom(v, w):  # noqa: N802
        path = []
        base = NoNode
        while v is not NoNode:
            b = inblossom[v]
            if label[b] & 4:
                base = blossombase[b]
                break
            path.append(b)
            label[b] = 5
            if labeledge[b] is None:
                v = NoNode
            else:
                v = labeledge[b][0]
                b = inblossom[v]
                v = labeledge[b][0]
            if w is not NoNode:
                v, w = w, v
        for b in path:
            label[b] = 1
        return base

    def addBlossom(base, v, w):  # noqa: N802
        bb = inblossom[base]
        bv = inblossom[v]
        bw = inblossom[w]
        b = _Blossom()
        b.id = free_ids.pop()
        blossombase[b] = base
        blossomparent[b] = None
        blossomparent[bb] = b
        b.childs = path = []
        b.edges = edgs = [(v, w)]
        while bv != bb:
            blossomparent[bv] = b
            path.append(bv)
            edgs.append(labeledge[bv])
            v = labeledge[bv][0]
            bv = inblossom[v]
        path.append(bb)
        path.reverse()
        edgs.reverse()
        while bw != bb:
            blossomparent[bw] = b
            path.append(bw)
            edgs.append((labeledge[bw][1], labeledge[bw][0]))
            w = labeledge[bw][0]
            bw = inblossom[w]
        label[b] = 1
        labeledge[b] = labeledge[bb]
        blossomdual[b] = 0
        for v in b.leaves():
            if label[inblossom[v]] == 2:
                queue.append(v)
            inblossom[v] = b
        bestedgeto = {}
        for bv in path:
            if isinstance(bv, _Blossom):
                if bv.mybestedges is not None:
                    nblist = bv.mybestedges
                    bv.mybestedges = None
                else:
                    nblist = [(v, w) for v in bv.leaves() for w in range(n) if v != w]
            else:
                nblist = [(bv, w) for w in range(n) if bv != w]
            for k in nblist:
                (i, j) = k
                if inblossom[j] == b:
                    i, j = j, i
                bj = inblossom[j]
                if bj != b and label.get(bj) == 1 and ((bj not in bestedgeto) or slack(i, j) < slack(*bestedgeto[bj])):
                    bestedgeto[bj] = k
            bestedge[bv] = None
        b.mybestedges = list(bestedgeto.values())
        mybestedge = mybestslack = None
        bestedge[b] = None
        for k in b.mybestedges:
            kslack = slack(*k)
            if mybestedge is None or kslack < mybestslack:
                mybestedge, mybestslack = k, kslack
        bestedge[b] = mybestedge

    def expandBlossom(b, endstage):  # noqa: N802
        def _recurse(b, endstage):
            for s in b.childs:
                blossomparent[s] = None
                if isinstance(s, _Blossom):
                    if endstage and blossomdual[s] == 0:
                        yield s
                    else:
                        for v in s.leaves():
                            inblossom[v] = s
                else:
                    inblossom[s] = s
            if (not endstage) and label.get(b) == 2:
                entrychild = inblossom[labeledge[b][1]]
                j = b.childs.index(entrychild)
                if j & 1:
                    j -= len(b.childs)
                    jstep = 1
                else:
                    jstep = -1
                v, w = labeledge[b]
                while j != 0:
                    if jstep == 1:
                        p, q = b.edges[j]
                    else:
                        q, p = b.edges[j - 1]
                    label[w] = None
                    label[q] = None
                    assignLabel(w, 2, v)
                    allowed[p, q] = allowed[q, p] = True
                    j += jstep
                    if jstep == 1:
                        v, w = b.edges[j]
                    else:
                        w, v = b.edges[j - 1]
                    allowed[v, w] = allowed[w, v] = True
                    j += jstep
                bw = b.childs[j]
                label[w] = label[bw] = 2
                labeledge[w] = labeledge[bw] = (v, w)
                bestedge[bw] = None
                j += jstep
                while b.childs[j] != entrychild:
                    bv = b.childs[j]
                    if label.get(bv) == 1:
                        j += jstep
                        continue
                    if isinstance(bv, _Blossom):
                        for v in bv.leaves():
                            if label.get(v):
                                break
                    else:
                        v = bv
                    if label.get(v):
                        label[v] = None
                        label[mate[blossombase[bv]]] = None
                        assignLabel(v, 2, labeledge[v][0])
                    j += jstep
            label.pop(b, None)
            labeledge.pop(b, None)
            bestedge.pop(b, None)
            del blossomparent[b]
            del blossombase[b]
            del blossomdual[b]
            free_ids.append(b.id)

        stack = [_recurse(b, endstage)]
        while stack:
            top_of_stack = stack[-1]
            for s in top_of_stack:
                stack.append(_recurse(s, endstage))
                break
            else:
                stack.pop()

    def augmentBlossom(b, v):  # noqa: N802
        def _recurse(b, v):
            t = v
            while blossomparent[t] != b:
                t = blossomparent[t]
            if isinstance(t, _Blossom):
                yield (t, v)
            i = j = b.childs.index(t)
            if i & 1:
                j -= len(b.childs)
                jstep = 1
            else:
                jstep = -1
            while j != 0:
                j += jstep
                t = b.childs[j]
                if jstep == 1:
                    w, x = b.edges[j]
                else:
                    x, w = b.edges[j - 1]
                if isinstance(t, _Blossom):
                    yield (t, w)
                j += jstep
                t = b.childs[j]
                if isinstance(t, _Blossom):
                    yield (t, x)
                mate[w] = x
                mate[x] = w
            b.childs = b.childs[i:] + b.childs[:i]
            b.edges = b.edges[i:] + b.edges[:i]
            blossombase[b] = blossombase[b.childs[0]]

        stack = [_recurse(b, v)]
        while stack:
            top_of_stack = stack[-1]
            for args in top_of_stack:
                stack.append(_recurse(*args))
                break
            else:
                stack.pop()

    def augmentMatching(v, w):  # noqa: N802
        for s, j in ((v, w), (w, v)):
            while 1:
                bs = inblossom[s]
                if isinstance(bs, _Blossom):
                    augmentBlossom(bs, s)
                mate[s] = j
                if labeledge[bs] is None:
                    break
                t = labeledge[bs][0]
                bt = inblossom[t]
                s, j = labeledge[bt]
                if isinstance(bt, _Blossom):
                    augmentBlossom(bt, j)
                mate[j] = s

    def scan(v) -> bool:
        """The neighbour loop of an S-vertex ``v`` (NetworkX's, in order ``w = 0..n-1``): runs of edges that are not
        allowable only update least-slack edges, so each run is one vectorised step; the allowable edges between
        them (few) run the Python steps. Returns whether the matching was augmented."""
        kslack = dualvar[v] + dualvar - 2 * W[v]
        tight = allowed[v] | (kslack <= 0)
        start = 0
        while start < n:
            bv = inblossom[v]
            tops = top[start:]
            valid = tops != _key(bv)  # excludes w == v and the edges inside v's blossom
            event = valid & tight[start:]
            first_event = int(event.argmax())
            found = bool(event[first_event])
            end = start + first_event if found else n
            if end > start:
                run = slice(start, end)
                length = end - start
                top_labels = label_ids[tops[:length]]
                ks = kslack[run]
                to_s = np.where(valid[:length] & (top_labels == 1), ks, np.inf)
                w = int(to_s.argmin())
                if to_s[w] < np.inf:  # least-slack edge from bv to another S-blossom: the first smallest
                    w += start
                    current = bestedge.get(bv)
                    if current is None or kslack[w] < slack(*current):
                        bestedge[bv] = (v, w)
                # least-slack edge to each free vertex (or unreached vertex of a T-blossom); none known: inf
                better = valid[:length] & (top_labels != 1) & (label_ids[run] == 0) & (ks < bestedge.slack[run])
                if better.any():
                    index = np.flatnonzero(better)
                    bestedge.slack[start + index] = ks[index]
                    bestedge.first[start + index] = v
                    bestedge.second[start + index] = start + index
            if not found:
                return False
            w = end
            bw = inblossom[w]
            allowed[v, w] = allowed[w, v] = True
            if label.get(bw) is None:
                assignLabel(w, 2, v)
            elif label.get(bw) == 1:
                base = scanBlossom(v, w)
                if base is not NoNode:
                    addBlossom(base, v, w)
                else:
                    augmentMatching(v, w)
                    return True
            elif label.get(w) is None:
                label[w] = 2
                labeledge[w] = (v, w)
            start = w + 1
        return False

    vertices = np.arange(n)
    while 1:
        label.clear()
        labeledge.clear()
        bestedge.clear()
        for b in blossomdual:
            b.mybestedges = None
        allowed[:] = False
        queue[:] = []
        for v in range(n):
            if (v not in mate) and label.get(inblossom[v]) is None:
                assignLabel(v, 1, None)
        augmented = 0
        while 1:
            while queue and not augmented:
                augmented = scan(queue.pop())
            if augmented:
                break
            deltatype = -1
            delta = deltaedge = deltablossom = None
            top_labels = label_ids[top]
            # delta2: least slack of an edge from an S-vertex to a free vertex (first vertex on ties)
            known = bestedge.first >= 0
            slacks = np.where((top_labels == 0) & known, bestedge.slack, np.inf)
            v = int(slacks.argmin())
            if slacks[v] < np.inf:
                delta, deltatype, deltaedge = slacks[v], 2, bestedge[v]
            # delta3: half the least slack between two S-blossoms; vertices first, then blossoms in creation order
            halves = np.where((top == vertices) & (top_labels == 1) & known, bestedge.slack, np.inf) / 2.0
            v = int(halves.argmin())
            if halves[v] < np.inf and (deltatype == -1 or halves[v] < delta):
                delta, deltatype, deltaedge = halves[v], 3, bestedge[v]
            for b in blossomdual:
                if blossomparent[b] is None and label.get(b) == 1 and bestedge.get(b) is not None:
                    d = slack(*bestedge[b]) / 2.0
                    if deltatype == -1 or d < delta:
                        delta, deltatype, deltaedge = d, 3, bestedge[b]
            # delta4: least dual of a T-blossom
            for b in blossomdual:
                if blossomparent[b] is None and label.get(b) == 2 and (deltatype == -1 or blossomdual[b] < delta):
                    delta, deltatype, deltablossom = blossomdual[b], 4, b
            if deltatype == -1:  # maximum cardinality reached: a last dual update, as NetworkX makes
                deltatype = 1
                delta = max(0, dualvar.min())
            dualvar[top_labels == 1] -= delta
            dualvar[top_labels == 2] += delta
            bestedge.reprice()
            for b in blossomdual:
                if blossomparent[b] is None:
                    if label.get(b) == 1:
                        blossomdual[b] += delta
                    elif label.get(b) == 2:
                        blossomdual[b] -= delta
            if deltatype == 1:
                break
            elif deltatype in (2, 3):
                (v, w) = deltaedge
                allowed[v, w] = allowed[w, v] = True
                queue.append(v)
            elif deltatype == 4:
                expandBlossom(deltablossom, False)
        if not augmented:
            break
        for b in list(blossomdual.keys()):
            if b not in blossomdual:
                continue
            if blossomparent[b] is None and label.get(b) == 1 and blossomdual[b] == 0:
                expandBlossom(b, True)
    pairs = sorted((v, w) for v, w in mate.items() if v < w)
    if len(pairs) != n // 2:  # pragma: no cover - a complete graph on an even number of vertices
        raise AssertionError("max_weight_perfect_matching: the matching is not perfect")
    return pairs


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
