"""MindSpore callback keeping 2:4 selective masks applied while ``Model.train`` runs, and
writing the ``selective_prune`` record at the end (the counterpart of
:class:`amct_bridge.keras.selective_prune_callback.SelectivePruneCallback`).

The masks come from :func:`amct_bridge.mindspore.prune.selective_masks` (the 2 largest |w| of
every 4 consecutive input channels, core: :mod:`amct_bridge.graph.selective`) when the first
step begins, its batch being the MindIR export's input, or are given. They are applied before
the first step and re-applied after every step (``weight = weight * mask`` with ``ops.assign``
on the Parameter): the optimizer's update of a pruned weight (momentum, weight decay) is undone
before the next step reads it, in GRAPH_MODE and PyNative alike (the compiled train graph reads
the Parameter). In a data-parallel run (``msrun``) every rank applies the same masks (the
ranks' weights are the same) and rank 0 alone writes the record.

Example:
    >>> import os, tempfile, numpy as np
    >>> from mindspore import dataset as ds, nn
    >>> from mindspore.train import Model
    >>> net = nn.SequentialCell([nn.Dense(8, 2)])
    >>> x, y = np.ones((4, 8), np.float32), np.zeros(4, np.int32)
    >>> data = ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(2)
    >>> loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    >>> model = Model(net, loss, nn.SGD(net.trainable_params(), 0.1))
    >>> path = os.path.join(tempfile.mkdtemp(), "prune.txt")
    >>> model.train(1, data, callbacks=[SelectivePruneCallback(path)])
    >>> int((net[0].weight.asnumpy() != 0).sum()), os.path.exists(path)
    (8, True)
"""

from __future__ import annotations

import logging
import os
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import ops
from mindspore.train import Callback

from amct_bridge.calibration.options import check_output
from amct_bridge.errors import AmctBridgeError
from amct_bridge.mindspore import distributed
from amct_bridge.mindspore.graph import extract_graph
from amct_bridge.mindspore.prune import prune_record, selective_masks
from amct_bridge.mindspore.session import net_inputs
from amct_bridge.records import Record, save

__all__ = ["SelectivePruneCallback"]

log = logging.getLogger(__name__)


class SelectivePruneCallback(Callback):
    """Keeps 2:4 masks on the weights through ``Model.train`` and writes their record.

    Args:
        record_path: where the inner-flavor record with one ``selective_prune`` PruneRecord per
            eligible cell goes at the end of training (with its ``selective_mask``); checked
            writable now. None: no record.
        masks: cell name (``cells_and_names()``) -> bool mask of the cell's weight shape
            (OIHW for Conv2d, (out, in) for Dense, (in, out, kH, kW) for Conv2dTranspose).
            Default: computed from the weight magnitudes when the first step begins.
        update_freq: if > 0, recompute the masks from the current weights every
            ``update_freq`` steps (AMCT's ``l1_selective_prune.update_freq``); 0 keeps them.
        sample_input: the network's input for the MindIR export that finds the eligible cells
            (shape, array, Tensor); default: the first batch's leading columns.

    Example:
        >>> cb = SelectivePruneCallback(update_freq=0)
        >>> cb.masks is None, cb.record is None
        (True, True)
    """

    def __init__(
        self,
        record_path: str | os.PathLike | None = None,
        *,
        masks: dict[str, np.ndarray] | None = None,
        update_freq: int = 0,
        sample_input: Any = None,
    ) -> None:
        super().__init__()
        if int(update_freq) < 0:
            raise AmctBridgeError(f"update_freq must be >= 0, got {update_freq}")
        self.record_path = check_output(record_path) if record_path is not None else None
        self.masks = None if masks is None else {k: np.asarray(m, bool) for k, m in masks.items()}
        self.update_freq = int(update_freq)
        self.sample_input = sample_input
        self.record: Record | None = None  # the record written at the end
        self._net = None
        self._graph = None
        self._params: list[tuple[str, ms.Parameter, ms.Tensor]] = []
        self._steps = 0

    # ---- MindSpore hooks ----------------------------------------------------------------------

    def on_train_begin(self, run_context) -> None:
        """Check given masks against the weights (before any step); apply them."""
        args = run_context.original_args()
        self._net = args.get("network")
        if self._net is None:
            raise AmctBridgeError(
                "SelectivePruneCallback: the run context has no 'network' (use it with "
                "mindspore.train.Model.train / fit)"
            )
        if args.get("dataset_sink_mode"):
            log.warning(
                "SelectivePruneCallback with dataset_sink_mode=True: the masks are re-applied "
                "once per sink (every sink_size steps), not after every step"
            )
        self._steps = 0
        if self.masks is None:
            # the graph is read now, before any step: another callback's first step_begin
            # (QuantCalibration's probes) would put cells in the graph MindIR cannot export
            if self.sample_input is None:
                self.sample_input = _dataset_sample(self._net, args.get("train_dataset"))
            if self.sample_input is not None:
                self.masks = selective_masks(self._plain(), graph=self._graph_of())
        if self.masks is not None:
            self._bind(self.masks)
            self._apply()

    def on_train_step_begin(self, run_context) -> None:
        """First step: compute the masks from the batch (unless given) and apply them."""
        if self.masks is not None and self._params:
            return
        if self.sample_input is None:
            element = run_context.original_args().get("train_dataset_element")
            if element is None:
                raise AmctBridgeError(
                    "SelectivePruneCallback: no batch in the run context "
                    "('train_dataset_element'); give sample_input"
                )
            self.sample_input = net_inputs(self._net, element)
        self.masks = selective_masks(self._plain(), graph=self._graph_of())
        self._bind(self.masks)
        self._apply()

    def on_train_step_end(self, run_context) -> None:
        """Re-apply the masks after the optimizer's step (recompute every ``update_freq``)."""
        self._steps += 1
        if self.update_freq and self._steps % self.update_freq == 0:
            self.masks = selective_masks(self._plain(), graph=self._graph_of())
            self._bind(self.masks)
        self._apply()

    def on_train_end(self, run_context) -> None:
        """Write the selective_prune record of the final masks (atomically)."""
        if self.record_path is None or self.masks is None:
            return
        self.record = prune_record(
            self._plain(), channel=False, selective=True, masks=self.masks, graph=self._graph_of()
        )
        group = distributed.current()
        if group is None or group.rank == 0:  # data-parallel: the ranks' weights are the same
            save(self.record, self.record_path, flavor="inner")

    # ---- helpers ------------------------------------------------------------------------------

    def _graph_of(self):
        if self._graph is None:
            if self.sample_input is None:
                raise AmctBridgeError(
                    "SelectivePruneCallback: the eligible cells come from a MindIR export, "
                    "which needs an input: give sample_input"
                )
            self._graph = extract_graph(self._plain(), self.sample_input)
        return self._graph

    def _plain(self) -> ms.nn.Cell:
        """The network whose graph and cells give the masks: a ``quantize_aware`` network's
        QAT cells hide their convolutions from the graph (no eligible cell would be found), so
        its :func:`strip_qat` copy stands in: the same names, shapes and current weights."""
        if getattr(self._net, "amct_qat", None) is None:
            return self._net
        from amct_bridge.mindspore.qat.strip import strip_qat

        return strip_qat(self._net)

    def _bind(self, masks: dict[str, np.ndarray]) -> None:
        """Each mask with its cell's weight Parameter; a mask that does not fit is refused,
        naming the cell and its parameter."""
        if not masks:  # nothing would be pruned: say so instead of training on silently
            log.warning(
                "SelectivePruneCallback: %s has no cell eligible for 2:4 pruning (Conv2d with "
                "group 1, Dense, Conv2dTranspose, each called once): nothing is pruned",
                type(self._net).__name__,
            )
        cells = dict(self._plain().cells_and_names())
        own = {p.name: p for p in self._net.get_parameters()}  # a QAT net's are the same names
        params = []
        for name, mask in masks.items():
            cell = cells.get(name)
            weight = getattr(cell, "weight", None) if cell is not None else None
            if not isinstance(weight, ms.Parameter):
                known = [
                    n
                    for n, c in cells.items()
                    if isinstance(getattr(c, "weight", None), ms.Parameter)
                ]
                raise AmctBridgeError(
                    f"SelectivePruneCallback: mask {name!r} names no cell with a weight in "
                    f"{type(self._net).__name__}; cells with weights: {known}; nothing applied"
                )
            if tuple(mask.shape) != tuple(weight.shape):
                raise AmctBridgeError(
                    f"SelectivePruneCallback: the mask of cell {name!r} has shape "
                    f"{tuple(mask.shape)}, its parameter {weight.name!r} has shape "
                    f"{tuple(weight.shape)}; nothing applied"
                )
            weight = own.get(weight.name, weight)
            params.append((name, weight, ms.Tensor(mask.astype(np.float32)).astype(weight.dtype)))
        self._params = params

    def _apply(self) -> None:
        for _, weight, mask in self._params:
            ops.assign(weight, weight * mask)


def _dataset_sample(net: ms.nn.Cell, dataset: Any) -> Any:
    """Zeros shaped as the dataset's first batch (the columns ``net`` takes), or None when the
    dataset does not say (then the first step's batch is used)."""
    try:
        shapes, types = dataset.output_shapes(), dataset.output_types()
    except Exception:  # not a mindspore.dataset, or one that cannot tell without running
        return None
    columns = [np.zeros(shape, dtype) for shape, dtype in zip(shapes, types, strict=True)]
    return net_inputs(net, columns) if columns else None
