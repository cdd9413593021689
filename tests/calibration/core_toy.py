"""A framework-free toy adapter for the calibration core: numpy layers, host-side statistics.

It implements the core's contract exactly as documented in amct_bridge.calibration (what the
Keras and MindSpore adapters do with real frameworks), so core behaviour can be tested without
TensorFlow or MindSpore.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.calibration import (
    BatchNormParams,
    CalibrationSession,
    LayerDesc,
    ModelDesc,
    PartWeights,
    QuantPart,
    Row,
)
from amct_bridge.graph.ir import Graph, Node, TensorInfo
from amct_bridge.quant.stats import batch_stats

CONV = QuantPart("", "Conv2D", weights=True, channel_wise=True, foldable=True)
DENSE = QuantPart("", "MatMul", weights=True, channel_wise=False, foldable=True)


class ToyWeights:
    """Kernels kept as (array, layout) in the descriptor's params."""

    def part_weights(self, layer: LayerDesc, part: QuantPart) -> PartWeights:
        return PartWeights(layer.params["kernel"], layer.params["layout"], layer.params.get("bias"))

    def batch_norm(self, bn: LayerDesc) -> BatchNormParams:
        p = bn.params
        return BatchNormParams(p["gamma"], p["beta"], p["mean"], p["var"], p["eps"])


class ToyInst:
    """The Instrumentation protocol on the host: every batch comes back with its own hist."""

    python_calls, read_every = 0, 1

    def __init__(self, points):
        self.points, self.rows, self.grids = points, [], {}
        self.steps = [0] * len(points)
        self.installed = False

    def install(self):
        self.installed = True

    def remove(self):
        self.installed = False

    def feed(self, tensors: dict[tuple[str, str], np.ndarray]) -> None:
        """One batch: ``(layer key, role) -> tensor`` for every point."""
        for i, p in enumerate(self.points):
            t = tensors[(p.key, p.role)]
            chan = None
            if p.channel_axis is not None:
                axes = tuple(a for a in range(t.ndim) if a != p.channel_axis % t.ndim)
                chan = np.stack([t.min(axis=axes), t.max(axis=axes)])
            lo, hi = float(np.min(t)), float(np.max(t))
            if np.isfinite(lo) and np.isfinite(hi):
                stats = batch_stats(t, p.bins)
            else:  # what an in-graph summary reports for a NaN/Inf batch
                from amct_bridge.quant.stats import BatchStats

                stats = BatchStats(int(t.size), lo, hi)
            self.rows.append(Row(i, 0, self.steps[i], stats, chan))
            self.steps[i] += 1

    def drain(self):
        rows, self.rows = self.rows, []
        return rows

    def due(self):
        return []

    def take_histograms(self, indices):
        return []

    def set_grid(self, i, lo, hi):
        self.grids[i] = (lo, hi)

    def grid(self, i):
        return self.grids.get(i)

    def set_limit(self, steps):
        pass


class ToySession(CalibrationSession):
    """A session over a fixed ModelDesc."""

    def __init__(self, model: ModelDesc, config, batch_num=None):
        super().__init__(config, batch_num, model_name=model.name)
        self.model = model
        self.inst: ToyInst | None = None

    def describe(self):
        return self.model

    def weight_source(self):
        return ToyWeights()

    def _instrument(self, mode, points):
        self.inst = ToyInst(points)
        return self.inst

    def run(self, batches: list[dict]) -> None:
        """One pass over ``batches`` (each: (key, role) -> tensor)."""
        self.new_run()
        self.start_pass("eval")
        for i, tensors in enumerate(batches):
            if not self.active:
                break
            self.inst.feed(tensors)
            self.batch_begin("eval", i)
            self.batch_end("eval", i)
        self.stop_pass("eval")


def chain_graph(conv_kind="Conv2d", bn_kind="BatchNorm2d", activation="linear", extra_reader=False):
    """x -> c1 -> bn1 -> r1 (-> also read by "tap" when ``extra_reader``)."""
    tensors = {t: TensorInfo((None, 4)) for t in ("x", "y", "z", "w", "v")}
    g = Graph(tensors=tensors, inputs=["x"], outputs=["w"])
    g.add_node(Node("c1", "c1", conv_kind, "Conv2D", ["x"], ["y"], {"activation": activation}))
    g.add_node(Node("bn1", "bn1", bn_kind, "", ["y"], ["z"]))
    g.add_node(Node("r1", "r1", "ReLU", "Relu", ["z"], ["w"]))
    if extra_reader:
        g.add_node(Node("tap", "tap", "Identity", "", ["y"], ["v"]))
        g.outputs.append("v")
    return g
