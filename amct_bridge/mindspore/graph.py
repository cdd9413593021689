"""MindSpore network -> framework-free :class:`amct_bridge.graph.Graph` through MindIR.

``extract_graph(net, sample_input)`` exports the network to MindIR (in a temp dir; see
:mod:`amct_bridge.mindspore.mindir`), so it does not depend on how ``construct`` is written
(loops, ``if``, list comprehensions, functional ops all work), and maps the primitives back to
``cells_and_names()`` names. MindIR needs an input: give a shape such as ``(1, 3, 16, 16)``,
an array or a Tensor (a list for several inputs). The network is not run and not modified.

How primitives become nodes:

- A primitive belongs to a cell call when its scope names a known cell (``nn.Conv2d``,
  ``nn.Dense``, ``nn.BatchNorm2d``, activations, pools, ``nn.Flatten``...; the outermost known
  cell of the scope, so a Dense's activation belongs to the Dense) or a custom cell without
  children (MindIR may scope a later instance's functional ops under the class's first
  instance: connected primitives of one custom class are one call, named after the latest
  instance). Its connected primitives form one call: one node named by the cell
  (``layer1.0.conv1``), kind mapped onto the core's vocabulary (``"Conv2D"``, ``"Dense"``,
  ``"BatchNormalization"``...), params from the cell object (``groups``, ``kernel_shape`` OIHW,
  ...). The 2nd, 3rd... call of a cell is ``"<cell>@1"``, ``"<cell>@2"`` (same ``layer``).
- Any other primitive (functional ``x + y``, ``ops.add``, ``ops.concat``, ``ops.relu``,
  ``ops.flatten``, ``ops.mean``... in a container's ``construct``) is a node of its own,
  ``is_layer=False``, kind ``"Add"`` / ``"Concatenate"`` / ``"Relu"``... Its name is
  ``"<owner>.<prim>_op<k>"`` (``layer1.0.add_op0``; ``add_op0`` at the top): ``<prim>`` is the
  primitive's name in lower case, ``k`` counts that primitive per owner in topological order,
  and the owner is the deepest cell holding both the latest node producing one of its inputs
  and the first node reading its output (MindIR scopes of functional ops are not reliable:
  every ``x + y`` of a network may carry the first block's scope). An op whose output is a
  model output, or that reads only model inputs, belongs to the top cell.
- A cell call reading the input-side Reshape of another cell's call reads the tensor before it:
  MindSpore's compiler merges identical primitives, so ``q(h)``, ``k(h)``, ``v(h)`` on tokens
  share one ``Reshape(h, (-1, D))`` scoped under ``q`` (:meth:`_Builder.through`).
- Unknown primitives and cells get a kind no rule knows (``"mindspore:<name>"``): discovery
  stops there with UNKNOWN_OP. Tensors are NCHW (``TensorInfo.channel_axis`` = 1 - rank).

Example:
    >>> from mindspore import nn
    >>> net = nn.SequentialCell([nn.Conv2d(3, 4, 3), nn.ReLU()])
    >>> [(n.name, n.kind, n.op_type) for n in extract_graph(net, (1, 3, 8, 8))]
    [('0', 'Conv2D', 'Conv2D'), ('1', 'ReLU', 'Relu')]
"""

from __future__ import annotations

import logging
from typing import Any

import mindspore as ms
import numpy as np

from amct_bridge.errors import GraphError
from amct_bridge.graph.ir import Graph, Node, TensorInfo
from amct_bridge.mindspore.graph_cells import (
    CELL_PRIMS,
    RESIZE_PRIMS,
    RNN_KINDS,
    cell_kind,
    cell_op_type,
    cell_params,
    ir_cell_kind,
    prim_kind,
    prim_op_type,
    resize_params,
    unknown_kind,
)
from amct_bridge.mindspore.mindir import Prim, export_primitives

_log = logging.getLogger(__name__)


def extract_graph(net: ms.nn.Cell, sample_input: Any) -> Graph:
    """Translate ``net`` into the graph IR (nodes in topological order, NCHW tensors).

    Args:
        net: the network (any ``construct``; it must compile in GRAPH_MODE).
        sample_input: input shape (``(1, 3, 16, 16)``), numpy array, Tensor, or a list of
            arrays/Tensors for a network with several inputs.

    Example:
        >>> from mindspore import nn
        >>> g = extract_graph(nn.Dense(4, 2), (1, 4))
        >>> g.node("").params["kernel_layout"], g.tensors[g.outputs[0]].shape
        ('OI', (1, 2))
    """
    cells = dict(net.cells_and_names())
    prims, input_shapes, outputs = export_primitives(net, sample_input)
    return _Builder(net, cells, prims).build(input_shapes, outputs)


#: Kinds that read a rank-3 tensor as NCW (channels on axis 1): nn.Conv1d, the 1-D pools,
#: nn.BatchNorm1d, ``ops.mean`` over W.
_NCW_KINDS = (
    "Conv1D",
    "MaxPooling1D",
    "AveragePooling1D",
    "BatchNormalization",
    "GlobalAveragePooling2D",
    "GlobalMaxPooling2D",
)


def sequence_layout(graph: Graph, cells: dict[str, Any]) -> bool:
    """Whether the network's rank-3 tensors are sequences ``(N, T, D)`` (a Transformer's
    tokens: features last, which the chip holds as they are) rather than NCW maps (nn.Conv1d:
    transposed to the chip's NWC): an nn.Dense, an nn.GRU / nn.LSTM or an nn.LayerNorm over
    the last axis reads a rank-3 tensor (or an nn.Embedding makes one), and no 1-D conv, pool
    or BatchNorm1d does.

    Example:
        >>> from mindspore import nn
        >>> net = nn.SequentialCell([nn.LayerNorm((8,)), nn.Dense(8, 4)])
        >>> sequence_layout(extract_graph(net, (1, 6, 8)), dict(net.cells_and_names()))
        True
    """
    tokens = ncw = False
    for node in graph:
        cell = cells.get(node.layer) if node.is_layer else None
        if isinstance(cell, ms.nn.Embedding):  # (N, T) indices -> (N, T, D) tokens
            tokens = True
        if 3 not in [len(graph.tensors[t].shape) for t in node.inputs]:
            continue
        last_axis = isinstance(cell, ms.nn.LayerNorm) and int(cell.begin_norm_axis) % 3 == 2
        if node.kind in ("Dense", *RNN_KINDS) or last_axis:
            tokens = True
        elif node.kind in _NCW_KINDS:
            ncw = True
    return tokens and not ncw


def tensor_info(shape: tuple[int, ...]) -> TensorInfo:
    """A MindSpore tensor's facts: channel axis 1 (NCHW / NC), -1 for rank 0-1."""
    rank = len(shape)
    return TensorInfo(tuple(shape), channel_axis=1 - rank if rank >= 2 else -1)


class _Builder:
    def __init__(self, net: ms.nn.Cell, cells: dict[str, Any], prims: list[Prim]) -> None:
        self.net, self.cells, self.prims = net, cells, prims
        self.graph = Graph()
        self.group_of: list[int] = []  # prim index -> call index
        self.calls: list[list[int]] = []  # call -> prim indices
        self.owner: list[str | None] = []  # call -> cell name (None: functional op)
        self.cell_order = {name: k for k, name in enumerate(cells)}

    # ---- which cell a primitive belongs to ------------------------------------------------
    def prim_cell(self, prim: Prim) -> str | None:
        path = prim.cell_path
        while path and path not in self.cells:
            path = path.rsplit(".", 1)[0] if "." in path else ""
        if path not in self.cells:
            return None
        owner, probe = None, path
        while True:  # the outermost known cell of the scope
            if cell_kind(self.cells[probe]) is not None:
                owner = probe
            if not probe:
                break
            probe = probe.rsplit(".", 1)[0] if "." in probe else ""
        if owner is not None:
            return owner
        cell = self.cells[path]
        if path and not list(cell.name_cells()):  # a custom leaf cell: one opaque call
            return path
        return None

    def group_calls(self) -> None:
        """Union connected primitives of one cell; every other primitive is its own call."""
        n = len(self.prims)
        parent = list(range(n))
        owners = [self.prim_cell(p) for p in self.prims]
        self.claim_rnn(owners)

        def find(a: int) -> int:
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        for p in self.prims:
            if owners[p.index] is None:
                continue
            for v in _node_values(p.inputs):
                if self.same_call(owners[v[1]], owners[p.index]) or self.stray_activation(
                    p, owners[v[1]], owners[p.index]
                ):
                    ra, rb = find(v[1]), find(p.index)
                    parent[max(ra, rb)] = min(ra, rb)
        members: dict[int, list[int]] = {}
        for i in range(n):
            members.setdefault(find(i), []).append(i)
        for root, group in members.items():
            if owners[root] is not None and self.stray_ops(group, owners[root]):
                for i in group:
                    owners[i] = None
        chunk_of: dict[int, tuple[int, int]] = {}  # prim -> (group root, call in the group)
        for root, group in members.items():
            if owners[root] is None:  # functional: each primitive is its own call
                for i in group:
                    chunk_of[i] = (i, 0)
                continue
            chunks = self.split_calls(group, owners)
            for k, chunk in enumerate(chunks):
                for i in chunk:
                    chunk_of[i] = (root, k)
        calls: dict[tuple[int, int], int] = {}
        for i in range(n):
            key = chunk_of[i]
            if key not in calls:  # calls are numbered by their first primitive
                calls[key] = len(self.calls)
                self.calls.append([])
                self.owner.append(owners[i])
            c = calls[key]
            self.calls[c].append(i)
            # functional ops inside a custom cell may carry the scope of the class's first
            # instance: the later instance named in the call is the true one
            if self.cell_order.get(owners[i], -1) > self.cell_order.get(self.owner[c], -1):
                self.owner[c] = owners[i]
        self.group_of = [calls[chunk_of[i]] for i in range(n)]

    def claim_rnn(self, owners: list[str | None]) -> None:
        """Give an nn.GRU / nn.LSTM call the primitives MindIR scopes under no cell (its CPU
        construct unrolls a GRU's steps as plain MatMul / Split / Sigmoid ... primitives):
        those on a path from one of the cell's scoped primitives, or one reading its
        parameters, to a scoped one (its output Transpose / Stack)."""
        readers: dict[int, list[int]] = {}
        for p in self.prims:
            for v in _node_values(p.inputs):
                readers.setdefault(v[1], []).append(p.index)
        for name, cell in self.cells.items():
            if cell_kind(cell) not in RNN_KINDS:
                continue
            params = {p.name for p in cell.get_parameters()}
            scoped = [p.index for p in self.prims if owners[p.index] == name]
            seeds = scoped + [
                p.index
                for p in self.prims
                if any(v[0] == "param" and v[1] in params for v in p.inputs)
            ]
            down = _downstream(seeds, readers)
            # what reads another cell reading this one is past the call (MindIR may scope
            # x + y after it under the cell, as any scope: see stray_ops)
            after = _downstream([i for i in down if owners[i] not in (None, name)], readers)
            inside = [i for i in scoped if i not in after]
            up, todo = set(inside), list(inside)
            while todo:
                for v in _node_values(self.prims[todo.pop()].inputs):
                    if v[1] not in up:
                        up.add(v[1])
                        todo.append(v[1])
            for i in scoped:
                if i in after:
                    owners[i] = None
            region = (down & up) - after
            grown = True
            while grown:  # the per-step slices of a time-major input (batch_first=False)
                grown = False
                for i in up - region - after:
                    users = readers.get(i, [])
                    if self.prims[i].op in _SLICE_OPS and users and set(users) <= region:
                        region.add(i)
                        grown = True
            for i in region:
                if owners[i] is None:
                    owners[i] = name

    def stray_ops(self, group: list[int], owner: str) -> bool:
        """Functional arithmetic that MindIR scoped under a known leaf cell it is no call of
        (``x + self.fc2(self.gelu(...))``: the Add may carry the scope ``gelu``): none of the
        cell's required primitives, only element-wise arithmetic or concat."""
        kind = cell_kind(self.cells[owner])
        required = CELL_PRIMS.get(kind or "", ((), ()))[0]
        ops = [self.prims[i].op for i in group]
        return bool(required) and all(op in _STRAY for op in ops)

    def split_calls(self, group: list[int], owners: list[str | None]) -> list[list[int]]:
        """Connected primitives of one cell (``group``, topological order) as its calls.

        A cell called back to back (``fc(fc(x))``) gives one connected group with one scope:
        the MindIR holds nothing else telling the calls apart. A known cell's call holds one
        of its required primitives (a Dense one MatMul; of several kinds present, the rarest
        counts): k of them are k calls, cut into k equal repeats when the group is one
        (``Reshape`` ... ``Reshape`` of a Dense on a map may be folded away between the calls:
        then each required primitive starts a call). A custom leaf cell's group that repeats
        itself (same primitives, parameters and constants, each repeat reading the one before)
        is cut after as many primitives as the cell runs when exported alone on the first
        repeat's inputs (Dropout / Identity: one primitive per call).
        """
        cell = self.cells[owners[group[0]]]
        kind = cell_kind(cell)
        if kind in RNN_KINDS:  # one call (claim_rnn); a second call is refused by the export
            return [group]
        required, optional = CELL_PRIMS.get(kind or "", ((), ()))
        present: dict[str, int] = {}
        for i in group:
            if self.prims[i].op in required:
                present[self.prims[i].op] = present.get(self.prims[i].op, 0) + 1
        if present:
            # the rarest one marks the calls: an activation cell may run Cast, Sigmoid, Cast
            marker = min(present, key=present.__getitem__)
            count = present[marker]
            if count < 2:
                return [group]
            if len(group) % count == 0 and _repeats(self.prims, group, len(group) // count):
                return _chunks(group, len(group) // count)
            return self.split_at(group, (marker,))
        if required:  # none of them: not a call of this class as known (unknown kind later)
            return [group]
        period = next(
            (p for p in range(1, len(group)) if _repeats(self.prims, group, p)), len(group)
        )
        if period == len(group):
            return [group]
        if kind is not None and all(self.prims[i].op in optional for i in group):
            return _chunks(group, period)
        per_call = self.prims_per_call(cell, group[:period], owners[group[0]])
        if per_call is None or per_call % period or len(group) % per_call:
            per_call = period
        return _chunks(group, per_call)

    def split_at(self, group: list[int], required: tuple[str, ...]) -> list[list[int]]:
        """Each required primitive starts a call (the ones before it join the call before)."""
        depth: dict[int, int] = {}
        for i in group:
            ups = [depth[v[1]] for v in _node_values(self.prims[i].inputs) if v[1] in depth]
            depth[i] = max(ups, default=0) + (self.prims[i].op in required)
        calls: dict[int, list[int]] = {}
        for i in group:
            calls.setdefault(max(depth[i] - 1, 0), []).append(i)
        return [calls[k] for k in sorted(calls)]

    def prims_per_call(self, cell: ms.nn.Cell, first: list[int], name: str) -> int | None:
        """How many primitives one call of ``cell`` runs: the cell exported alone on zeros
        shaped as the inputs of its first call (None if that does not compile)."""
        inside = set(first)
        ins: list[tuple] = []
        for i in first:
            for v in _tensor_values(self.prims[i].inputs):
                if not (v[0] == "node" and v[1] in inside) and v not in ins:
                    ins.append(v)
        shapes = [
            self.input_shapes[v[1]] if v[0] == "input" else self.prims[v[1]].shapes[v[2]]
            for v in ins
        ]
        try:
            prims, _, _ = export_primitives(cell, [np.zeros(s, np.float32) for s in shapes])
        except (GraphError, IndexError):
            _log.warning(
                "cell %r: its calls back to back are told apart by their repeating "
                "primitives (the cell alone does not export on inputs of shapes %s)",
                name,
                shapes,
            )
            return None
        return len(prims)

    def same_call(self, a: str | None, b: str | None) -> bool:
        """Primitives of cells ``a`` and ``b`` connected by data belong to one call."""
        if a is None or b is None:
            return False
        if a == b:
            return True
        ca, cb = self.cells[a], self.cells[b]
        return type(ca) is type(cb) and cell_kind(ca) is None  # custom leaf cells, see above

    def stray_activation(self, prim: Prim, producer: str | None, owner: str | None) -> bool:
        """A primitive of a later ``nn.Dense``'s activation that MindIR scoped under the first
        instance of the class (``0.activation`` for the second Dense's SiLU / GELU / LeakyReLU,
        MindSpore 2.10) reading that later Dense: it belongs to the later Dense's call."""
        if producer is None or owner is None or producer == owner:
            return False
        a, b = self.cells[producer], self.cells[owner]
        return (
            type(a) is type(b)
            and cell_kind(a) == "Dense"
            and _in_scope(prim.cell_path, f"{owner}.activation" if owner else "activation")
            and self.cell_order.get(producer, -1) > self.cell_order.get(owner, -1)
        )

    # ---- building --------------------------------------------------------------------------
    def build(self, input_shapes: list[tuple[int, ...]], outputs: list[tuple]) -> Graph:
        self.input_shapes = input_shapes
        for k, shape in enumerate(input_shapes):
            tid = f"input{k}"
            self.graph.tensors[tid] = tensor_info(shape)
            self.graph.inputs.append(tid)
        self.group_calls()
        call_outputs = self.call_outputs(outputs)
        order = self.topo_order()
        self.tensor_ids: dict[tuple[int, int], str] = {}
        self.sites: dict[int, list[str]] = {}
        self.names_taken: dict[str, int] = {}
        self.first = self.first_consumers(order, outputs)
        for c in order:
            self.add_call(c, call_outputs[c], self.first.get(c))
        self.graph.outputs = [self.resolve(v) for v in outputs if v[0] in ("node", "input")]
        by_layer: dict[str, int] = {}
        for node in self.graph.nodes:
            by_layer[node.layer] = by_layer.get(node.layer, 0) + 1
        for node in self.graph.nodes:
            node.shared = by_layer[node.layer] > 1
        return self.graph

    def through(self, v: tuple, reader: int) -> tuple:
        """The value a cell call ``reader`` reads for ``v``: when ``v`` is the input-side
        Reshape of another cell's call (a Dense on (N, T, D) flattens its input first), the
        tensor before it. MindSpore's compiler merges identical primitives (CSE): ``q(h)``,
        ``k(h)``, ``v(h)`` share one ``Reshape(h, (-1, D))``, scoped under ``q``, so ``k`` and
        ``v`` would seem to read ``q``'s inside; each Dense flattens ``h`` itself."""
        if self.owner[reader] is None:
            return v  # a functional op reads what it reads
        while v[0] == "node" and self.group_of[v[1]] != reader:
            prim, call = self.prims[v[1]], self.group_of[v[1]]
            if self.owner[call] is None or prim.op not in _VIEW_OPS:
                break
            inside = any(
                u[1] == prim.index
                for i in self.calls[call]
                for u in _node_values(self.prims[i].inputs)
            )
            ins = _tensor_values(prim.inputs)
            if not inside or len(ins) != 1:
                break  # the call's own output (its last Reshape): a tensor it computes
            v = ins[0]
        return v

    def call_outputs(self, outputs: list[tuple]) -> list[list[tuple[int, int]]]:
        """(prim, output index) pairs each call exposes, in first-use order."""
        used: list[list[tuple[int, int]]] = [[] for _ in self.calls]
        for p in self.prims:
            for v in _node_values(p.inputs):
                v = self.through(v, self.group_of[p.index])
                if v[0] != "node":
                    continue
                key = (v[1], v[2])
                call = self.group_of[v[1]]
                if call != self.group_of[p.index] and key not in used[call]:
                    used[call].append(key)
        for v in outputs:
            if v[0] == "node" and (v[1], v[2]) not in used[self.group_of[v[1]]]:
                used[self.group_of[v[1]]].append((v[1], v[2]))
        return used

    def call_inputs(self, c: int) -> list[tuple]:
        """Tensor values a call reads from outside; a functional op keeps repeats (concat x, x)."""
        if self.owner[c] is None:
            return _tensor_values(self.prims[self.calls[c][0]].inputs)
        ins: list[tuple] = []
        for i in self.calls[c]:
            for v in _tensor_values(self.prims[i].inputs):
                if v[0] == "node" and self.group_of[v[1]] == c:
                    continue
                v = self.through(v, c)
                if v not in ins:
                    ins.append(v)
        return ins

    def topo_order(self) -> list[int]:
        deps = [
            {self.group_of[v[1]] for v in self.call_inputs(c) if v[0] == "node"}
            for c in range(len(self.calls))
        ]
        done: set[int] = set()
        order: list[int] = []
        pending = list(range(len(self.calls)))  # calls are numbered by their first primitive
        while pending:
            ready = next((c for c in pending if deps[c] <= done), None)
            if ready is None:
                names = [self.owner[c] or self.prims[self.calls[c][0]].op for c in pending[:3]]
                raise GraphError(f"cannot order the calls of {names}: cyclic cell calls")
            pending.remove(ready)
            done.add(ready)
            order.append(ready)
        return order

    def first_consumers(self, order: list[int], outputs: list[tuple]) -> dict[int, int | None]:
        """call -> the first call (in ``order``) reading one of its outputs; None: model output."""
        position = {c: k for k, c in enumerate(order)}
        first: dict[int, int | None] = {}
        for c in order:
            for v in self.call_inputs(c):
                if v[0] == "node":
                    src = self.group_of[v[1]]
                    if src not in first or position[c] < position.get(first[src], 1 << 30):
                        first[src] = c
        for v in outputs:
            if v[0] == "node":
                first[self.group_of[v[1]]] = None  # reaching the output: the top cell owns it
        return first

    def resolve(self, v: tuple) -> str:
        if v[0] == "input":
            return self.graph.inputs[v[1]]
        return self.tensor_ids[(v[1], v[2])]

    def add_call(self, c: int, outs: list[tuple[int, int]], consumer: int | None) -> None:
        prims = [self.prims[i] for i in self.calls[c]]
        tensor_ins = [v for v in self.call_inputs(c) if v[0] in ("node", "input")]
        inputs = [self.resolve(v) for v in tensor_ins]
        in_rank = len(self.graph.tensors[inputs[0]].shape) if inputs else 0
        cell_name = self.owner[c]
        if cell_name is not None:
            layer, is_layer = cell_name, True
            kind, op_type, params = self.cell_node(cell_name, prims, in_rank)
            self.sites[c] = cell_name.split(".") if cell_name else []
        else:
            prim = prims[0]
            owner = self.functional_owner(tensor_ins, consumer)
            self.sites[c] = [*owner, f"#{c}"]
            count = self.names_taken.get(".".join([*owner, prim.op.lower()]), 0)
            self.names_taken[".".join([*owner, prim.op.lower()])] = count + 1
            layer = ".".join([*owner, f"{prim.op.lower()}_op{count}"])
            kind, op_type, params = self.prim_node(prim, in_rank)
            is_layer = False
        call_index = sum(1 for n in self.graph.nodes if n.layer == layer)
        name = layer if call_index == 0 else f"{layer}@{call_index}"
        out_ids = []
        for k, (pi, oi) in enumerate(outs):
            tid = f"{name}:{k}"
            shapes = self.prims[pi].shapes
            info = tensor_info(shapes[oi] if oi < len(shapes) else ())
            if "channel_axis" in params and info.shape:  # e.g. a Dense on a map: last axis
                info = TensorInfo(info.shape, channel_axis=params["channel_axis"])
            self.graph.tensors[tid] = info
            self.tensor_ids[(pi, oi)] = tid
            out_ids.append(tid)
        if not out_ids:  # a call nobody reads still gets its (first) output tensor
            tid = f"{name}:0"
            self.graph.tensors[tid] = tensor_info(prims[-1].shapes[0] if prims[-1].shapes else ())
            out_ids.append(tid)
        node = Node(name, layer, kind, op_type, inputs, out_ids, params, is_layer, False)
        node.call_index = call_index
        self.graph.add_node(node)

    def cell_node(self, cell_name: str, prims: list[Prim], in_rank: int) -> tuple:
        cell = self.cells[cell_name]
        kind = cell_kind(cell)
        ops = [p.op for p in prims]
        if kind == "Dense" and getattr(cell, "activation_flag", False):
            # the primitives of its own activation cell (nn.Dense(activation="softmax")): the
            # params name that activation (dense_activation), so none computes unseen
            inner = f"{cell_name}.activation" if cell_name else "activation"
            ops = [
                p.op
                for p in prims
                if not _in_scope(p.cell_path, inner) and self.prim_cell(p) == cell_name
            ]  # (another instance's scope: a stray_activation primitive of this call)
        required, optional = CELL_PRIMS.get(kind or "", ((), ()))
        if kind is None or (required and not any(op in required for op in ops)):
            kind = None
        elif any(op not in required and op not in optional for op in ops):
            kind = None  # e.g. a subclass whose construct does more than its base class
        if kind is None:
            return unknown_kind(type(cell).__name__), "", {"framework_class": type(cell).__name__}
        params = cell_params(cell, kind, in_rank, [p.op for p in prims])
        resize = next((p for p in prims if p.op in RESIZE_PRIMS), None)
        if resize is not None:  # nn.Upsample: the scales are the call's shapes
            params.update(self.resize(resize))
        return ir_cell_kind(kind), cell_op_type(kind, params), params

    def value_shape(self, v: tuple) -> tuple[int, ...]:
        """Shape of a primitive's tensor input (a model input or a primitive's output)."""
        if v[0] == "input":
            return tuple(self.input_shapes[v[1]])
        shapes = self.prims[v[1]].shapes
        return tuple(shapes[v[2]]) if v[2] < len(shapes) else ()

    def resize(self, prim: Prim) -> dict[str, Any]:
        """:func:`resize_params` of a resize primitive (NCHW input and output shapes)."""
        ins = _tensor_values(prim.inputs)
        in_shape = self.value_shape(ins[0]) if ins else ()
        consts = [v[1] for v in prim.inputs if v[0] == "const"]
        out_shape = tuple(prim.shapes[0]) if prim.shapes else ()
        return resize_params(prim.op, consts, in_shape, out_shape)

    def prim_node(self, prim: Prim, in_rank: int) -> tuple:
        consts = [v[1] for v in prim.inputs if v[0] == "const"]
        channel_axis = 1 - in_rank if in_rank >= 2 else -1
        axes = _axes(consts, in_rank) if prim.op.startswith(("Reduce", "Mean", "Sum")) else None
        kind = prim_kind(prim.op, axes, channel_axis)
        params: dict[str, Any] = {"primitive": prim.op}
        if prim.op in ("InplaceAddExt", "InplaceSubExt") and any(
            np.ndim(c) == 0 and c is not None and float(c) != 1.0 for c in consts
        ):
            kind = unknown_kind(f"{prim.op}(alpha != 1)")  # x + alpha * y is no plain Add
        if prim.op == "StridedSlice":  # begin, end, strides, then the five masks
            params["slice"] = [_plain(c) for c in consts]
        if kind.startswith("mindspore:"):
            return kind, "", params  # unknown: stops as UNKNOWN_OP whatever its operands
        params["const_operands"] = sum(
            1 for v in prim.inputs if v[0] == "param" or (v[0] == "const" and np.ndim(v[1]) > 0)
        )
        if kind in _ELEMENTWISE:
            # scalar operands and their position (x + 3.0, 3.0 - x, x * (1 / 6)): the ESP-DL v3
            # export writes them as constants; AddExt's third input is its alpha, no operand
            scalars = [
                (i, float(np.asarray(v[1]).item()))
                for i, v in enumerate(prim.inputs[:2])
                if v[0] == "const" and _is_number(v[1])
            ]
            if scalars:
                params["scalar_operands"] = scalars
        if kind == "UpSampling2D":
            params["const_operands"] = 0
            params.update(self.resize(prim))
        elif kind == "Concatenate":
            params["const_operands"] = 0
            rank = len(prim.shapes[0]) if prim.shapes else in_rank
            params["axis"] = _neg(_first_int(consts, 0), rank)
        elif kind in ("Transpose",):
            params["const_operands"] = 0
            params["axes"] = next((tuple(c) for c in consts if isinstance(c, tuple)), None)
        elif kind == "Matmul":
            # MatMul / BatchMatMul(transpose_a, transpose_b): two bool inputs after the
            # operands (ops.BatchMatMul(transpose_b=True)(q, k) is q @ kᵀ); MatMulExt has none
            flags = [bool(v[1]) for v in prim.inputs[2:4] if v[0] == "const"]
            params["transpose"] = tuple((*flags, False, False)[:2])
        elif kind in ("Reshape", "Flatten") or axes is not None:
            params["const_operands"] = 0
            if axes is not None:
                params["axis"] = axes
        elif kind == "Softmax":
            params["const_operands"] = 0
            params["axis"] = _axes(consts, in_rank) or (-1,)
        elif kind == "Split":
            params["const_operands"] = 0
            params["axis"] = _neg(_first_int(consts, 0), in_rank)
            params["split_sizes"] = [s[params["axis"]] for s in prim.shapes]
        return kind, prim_op_type(prim.op, kind), params

    def functional_owner(self, tensor_ins: list[tuple], consumer: int | None) -> list[str]:
        producers = [self.group_of[v[1]] for v in tensor_ins if v[0] == "node"]
        if not producers or consumer is None:
            return []
        placed = {c: k for k, c in enumerate(self.sites)}
        latest = max(producers, key=placed.__getitem__)
        a, b = self.sites[latest], self.consumer_site(consumer)
        common: list[str] = []
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            common.append(x)
        # the op sits strictly inside a container: never inside a leaf cell call itself
        while common and (common == a or common == b) and not common[-1].startswith("#"):
            common.pop()
        return [p for p in common if not p.startswith("#")]

    def consumer_site(self, c: int | None) -> list[str]:
        seen = set()
        while c is not None and self.owner[c] is None and c not in seen:
            seen.add(c)  # a functional consumer is not placed yet: follow it downstream
            c = self.first.get(c)
        if c is None or self.owner[c] is None:
            return []
        return self.owner[c].split(".") if self.owner[c] else []


def _signature(prim: Prim) -> tuple:
    """What two calls of one cell share per primitive: op, parameters and constants."""
    out: list[Any] = [prim.op]
    for v in prim.inputs:
        if v[0] == "param":
            out.append(v)
        elif v[0] == "const":
            c = v[1]
            out.append((np.shape(c), np.asarray(c).tobytes()) if isinstance(c, np.ndarray) else c)
    return tuple(out)


def _repeats(prims: list[Prim], group: list[int], period: int) -> bool:
    """``group`` is repeats of its first ``period`` primitives, each reading the one before."""
    if period < 1 or len(group) % period or len(group) == period:
        return False
    pos = {i: k for k, i in enumerate(group)}
    for k in range(period, len(group)):
        a, b = prims[group[k % period]], prims[group[k]]
        if _signature(a) != _signature(b):
            return False
        ta, tb = _tensor_values(a.inputs), _tensor_values(b.inputs)
        if len(ta) != len(tb):
            return False
        start = k - k % period  # the repeat's first primitive
        for va, vb in zip(ta, tb, strict=True):
            inside_a = va[0] == "node" and va[1] in pos
            inside_b = vb[0] == "node" and vb[1] in pos
            if inside_a:  # the same wiring inside the repeat
                if not inside_b or pos[vb[1]] != start + pos[va[1]] or va[2] != vb[2]:
                    return False
            elif inside_b and not start - period <= pos[vb[1]] < start:
                return False  # a call's input comes from the call before or from outside
    return True


def _downstream(start: list[int], readers: dict[int, list[int]]) -> set[int]:
    """``start`` and every primitive reading one of them, transitively."""
    seen, todo = set(start), list(start)
    while todo:
        for j in readers.get(todo.pop(), []):
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return seen


def _chunks(group: list[int], size: int) -> list[list[int]]:
    return [group[k : k + size] for k in range(0, len(group), size)]


def _node_values(values: list[tuple]) -> list[tuple]:
    return [v for v in _tensor_values(values) if v[0] == "node"]


def _tensor_values(values: list[tuple]) -> list[tuple]:
    out = []
    for v in values:
        if v[0] == "tuple":
            out.extend(_tensor_values(v[1]))
        elif v[0] in ("node", "input"):
            out.append(v)
    return out


#: Functional primitives MindIR may scope under a cell they are no call of (see stray_ops).
_STRAY = frozenset(
    {"Add", "AddExt", "AddN", "Sub", "SubExt", "Mul", "Muls", "Div", "RealDiv", "Divs", "Concat"}
)

#: Primitives an nn.GRU's unrolled steps read its input through (see _Builder.claim_rnn).
_SLICE_OPS = frozenset({"StridedSlice", "Squeeze", "Reshape", "ExpandDims"})

#: Shape-only primitives a cell call may start with (see _Builder.through).
_VIEW_OPS = frozenset({"Reshape", "ExpandDims"})

#: Element-wise kinds whose operands may be scalars (``x + 3.0``).
_ELEMENTWISE = ("Add", "Subtract", "Multiply", "Divide", "Maximum", "Minimum", "Power")


def _is_number(value: Any) -> bool:
    """A scalar constant (Python number or 0-d array), not a bool or a tensor."""
    if isinstance(value, bool | np.bool_) or value is None:
        return False
    return isinstance(value, int | float | np.number) or (
        isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf"
    )


def _plain(value: Any) -> Any:
    """A constant as plain Python (tuples of ints, ints), for params."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _neg(axis: int, rank: int) -> int:
    return axis - rank if axis >= 0 else axis


def _first_int(consts: list[Any], default: int) -> int:
    return next((int(c) for c in consts if isinstance(c, int) and not isinstance(c, bool)), default)


def _axes(consts: list[Any], rank: int) -> tuple[int, ...] | None:
    for c in consts:
        if isinstance(c, tuple) and all(isinstance(a, int) for a in c):
            return tuple(_neg(int(a), rank) for a in c)
        if isinstance(c, int) and not isinstance(c, bool):
            return (_neg(int(c), rank),)
    return None


def _in_scope(path: str, scope: str) -> bool:
    """Whether a primitive's cell path lies in the cell named ``scope``."""
    return path == scope or path.startswith(scope + ".")
