"""``QuantCalibration``: a MindSpore callback that calibrates while ``Model.eval`` / ``train`` run.

Example:
    >>> import os, tempfile, numpy as np, mindspore as ms
    >>> from mindspore import dataset as ds, nn
    >>> from mindspore.train import Model
    >>> net = nn.SequentialCell([nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Dense(64, 2)])
    >>> x = np.random.rand(8, 3, 4, 4).astype(np.float32)
    >>> y = np.zeros(8, np.int32)
    >>> data = ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(4)
    >>> model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True), metrics={"acc"})
    >>> path = os.path.join(tempfile.mkdtemp(), "record.txt")
    >>> _ = model.eval(data, callbacks=[QuantCalibration(path, algorithm="minmax")])
    >>> from amct_bridge.records import load
    >>> sorted(load(path).layers)
    ['0', '3']
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from mindspore.train import Callback

from amct_bridge.calibration.merge import agree
from amct_bridge.calibration.options import (
    check_choice,
    check_flavor,
    check_output,
    resolve_batch_num,
)
from amct_bridge.config import QuantConfig, resolve_config
from amct_bridge.errors import CalibrationError
from amct_bridge.mindspore import distributed
from amct_bridge.mindspore.session import FLAVORS, Session, net_inputs
from amct_bridge.records import Record

__all__ = ["QuantCalibration"]

_MODES = ("auto", "train", "validation")


class QuantCalibration(Callback):
    """Gather activation statistics inside the network's graph and write an AMCT record.

    Add it to the calls you already make: ``model.eval(data, callbacks=[cb])`` (post-training
    calibration) or ``model.train(epochs, data, callbacks=[cb])`` (training batches), or
    ``model.fit(epochs, data, valid_dataset, callbacks=[cb])`` with ``on="validation"`` (the
    validation passes only). Statistics are computed in the graph, in GRAPH_MODE and PyNative
    alike (wrapper cells updating Parameters, see :mod:`amct_bridge.mindspore.instrument`);
    the network is left exactly as it was (outputs, parameter names, checkpoint).

    The first batch of a run is also the input of the MindIR export that gives the graph (Conv /
    Dense + BatchNorm2d folding, calls per step); the probes go in before that batch runs.
    During ``fit`` with ``on="auto"``/``"train"``, the pass pauses for the validation passes
    (probes out, compiled graphs cleared) so validation batches are not counted.

    Args:
        record_path: where the AMCT record (protobuf text) goes; checked writable now. The
            sidecar ``<record_path>.calib.json`` (input/output ranges) goes next to it.
        config: an AMCT simple config file path (``create_quant_config`` style) or a
            :class:`~amct_bridge.config.QuantConfig`; explicit arguments below override its
            common settings. Default: AMCT's defaults.
        algorithm: "ifmr" (AMCT default), "hfmg", "minmax", "percentile" or "ema".
        algorithm_options: that algorithm's options, AMCT names (``num_of_bins``...).
        batch_num: stop gathering after this many batches per run (the rest runs without
            probes). Default: every batch, or the config file's batch_num.
        activation_offset: asymmetric activations (AMCT default True).
        channel_wise: per-channel weight scales where AMCT allows them (default True; Dense is
            always per tensor).
        act_type: "INT8" (default) or "INT16".
        skip_layers: ``cells_and_names()`` names not to quantize.
        skip_fusion_layers: cells whose following BatchNorm2d is not folded.
        migration_strength: enable DMQ with this strength (needs ``flavor="inner"``).
        joint_quant: compute shift_bit (kept by the "inner" flavor only).
        flavor: "mindspore" (AMCT for MindSpore, default) or "inner" (e.g. with prune records).
        on: "auto" (the run it is attached to: eval batches in ``eval``, training batches in
            ``train`` / ``fit``), "train", or "validation" (``fit``'s validation passes).
        accumulate: keep statistics across runs (repeated ``eval`` / ``train`` calls).
        save_every_epoch: in ``train`` / ``fit``, also write the record at every epoch end.
        sample_input: the network's input for the graph export (shape, array, Tensor, list);
            default: the first batch's leading columns (as many as ``construct`` takes).
        merge_ranks: in a data-parallel run, merge every rank's statistics (default; every
            rank must run the callback). False: this rank calibrates its own batches alone and
            writes its own record.

    Data-parallel runs (``msrun``, ``mindspore.communication.init()`` and
    ``ParallelMode.DATA_PARALLEL``): add the callback on every rank with the same arguments.
    The ranks' statistics are merged before the factors are computed (min/max gathered,
    histograms summed on a common grid, the IFMR/HFMG search on the merged histogram), rank 0
    alone writes record and sidecar, and every rank gets the same :attr:`written` record. Each
    step, the ranks agree that none failed (one small AllGather), so a NaN batch on one rank
    stops every rank at that step with the rank named. The data must be sharded
    (``num_shards=get_group_size(), shard_id=get_rank()``) into equal shards. A run on one rank
    only (e.g. ``model.eval`` on rank 0 alone) needs ``merge_ranks=False``: the merge waits for
    every rank. See docs/mindspore.md, "Data-parallel runs".

    Example:
        >>> cb = QuantCalibration("/tmp/record.txt", algorithm="hfmg", batch_num=8)
        >>> cb.batch_num, cb.flavor
        (8, 'mindspore')
    """

    def __init__(
        self,
        record_path: str | os.PathLike,
        *,
        config: str | os.PathLike | QuantConfig | None = None,
        algorithm: str | None = None,
        algorithm_options: dict | None = None,
        batch_num: int | None = None,
        activation_offset: bool | None = None,
        channel_wise: bool | None = None,
        act_type: str | None = None,
        skip_layers: list[str] | None = None,
        skip_fusion_layers: list[str] | None = None,
        migration_strength: float | None = None,
        joint_quant: bool | None = None,
        flavor: str = "mindspore",
        on: str = "auto",
        accumulate: bool = False,
        save_every_epoch: bool = False,
        sample_input: Any = None,
        merge_ranks: bool = True,
    ) -> None:
        super().__init__()
        self.config, from_file = resolve_config(
            config,
            algorithm=algorithm,
            algorithm_options=algorithm_options,
            activation_offset=activation_offset,
            channel_wise=channel_wise,
            act_type=act_type,
            skip_layers=skip_layers,
            skip_fusion_layers=skip_fusion_layers,
            migration_strength=migration_strength,
            joint_quant=joint_quant,
        )
        self.batch_num = resolve_batch_num(batch_num, self.config, from_file)
        check_choice("flavor", flavor, FLAVORS)
        check_choice("on", on, _MODES)
        check_flavor(self.config, flavor)
        self.record_path = check_output(record_path)
        self.flavor, self.on = flavor, on
        self.accumulate, self.save_every_epoch = accumulate, save_every_epoch
        self.sample_input = sample_input
        self.merge_ranks = bool(merge_ranks)
        self.written: Record | None = None  # the record last written, as its file holds it
        self._session: Session | None = None
        self._in_train = False
        self._started = False  # the current run has planned and started its first pass
        self._pending: str | None = None  # pass to start at the next step of that mode
        self._resume = False  # a training pass paused for validation

    # ---- MindSpore hooks: short, the work is in Session ---------------------------------------

    def on_train_begin(self, run_context) -> None:
        """Start a run; the training pass starts with the first step (``on`` auto / train).
        ``on="validation"`` in a run without validation data is refused here, before training."""
        if self.on == "validation" and _without_validation():
            raise CalibrationError(
                "QuantCalibration(on='validation'): this run has no validation data; use "
                "Model.fit(..., valid_dataset=...) (Model.train has no validation passes); "
                "nothing trained, no record written"
            )
        self._in_train = True
        self._begin_run(run_context)
        self._pending = "train" if self.on in ("auto", "train") else None

    def on_train_step_begin(self, run_context) -> None:
        """Install the probes before the first step (the batch is the export's input)."""
        self._step_begin(run_context, "train")

    def on_train_step_end(self, run_context) -> None:
        """Count the step; read the statistics every few steps, and at once after a step whose
        statistics are not finite: the run stops there (``request_stop``, then the error)."""
        self._step_end(run_context, "train")

    def on_train_epoch_end(self, run_context) -> None:
        """With ``save_every_epoch``: write what was gathered so far."""
        if self.save_every_epoch and self._started:
            self.written = self._guard(self._session.write, self.record_path, self.flavor) or (
                self.written
            )

    def on_train_end(self, run_context) -> None:
        """End the run: remove the probes, write record + sidecar."""
        self._in_train = False
        if self.on == "validation" and not self._started:
            raise CalibrationError(
                "QuantCalibration(on='validation') saw no validation batch: use "
                "Model.fit(..., valid_dataset=...) (Model.train has no validation passes); "
                "no record written"
            )
        self._end_run("train")

    def on_eval_begin(self, run_context) -> None:
        """``Model.eval``: start a run. Inside ``fit``: a validation pass (``on="validation"``),
        else pause the training pass so validation batches are not counted."""
        if not self._in_train:
            self._begin_run(run_context)
            self._pending = "eval"
        elif self.on == "validation":
            self._pending = "eval"
        elif self._session is not None and self._session.active:
            self._guard(self._session.stop_pass, "train")
            self._resume = True

    def on_eval_step_begin(self, run_context) -> None:
        """Install the probes before the first step (the batch is the export's input)."""
        self._step_begin(run_context, "eval")

    def on_eval_step_end(self, run_context) -> None:
        """Count the step; read the statistics every few steps (at once after a non-finite one)."""
        self._step_end(run_context, "eval")

    def on_eval_end(self, run_context) -> None:
        """End of ``Model.eval``: write. Inside ``fit``: end the validation pass / resume."""
        if not self._in_train:
            self._end_run("eval")
            return
        if self._session is not None:
            self._guard(self._session.stop_pass, "eval")
        self._pending = "train" if self._resume else None
        self._resume = False

    def __exit__(self, *err) -> None:
        """Model leaves the callback's context: on an exception, take the probes out."""
        if err and err[0] is not None:
            self.restore()

    # ---- helpers ------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once ``batch_num`` batches were gathered in this run (the probes are out)."""
        s = self._session
        return (
            s is not None
            and not s.active
            and s.batch_num is not None
            and s.batches >= (s.batch_num)
        )

    def restore(self) -> None:
        """Remove any probes now (e.g. after a step raised); the network is as before."""
        if self._session is not None:
            self._session.stop_all()

    def _begin_run(self, run_context) -> None:
        net = run_context.original_args().get("network")
        if net is None:
            raise CalibrationError(
                "QuantCalibration: the run context has no 'network' (use it with "
                "mindspore.train.Model.eval / train / fit)"
            )
        group = distributed.current() if self.merge_ranks else None
        if group is not None:
            args = run_context.original_args()
            data = args.get("train_dataset") if self._in_train else args.get("valid_dataset")
            distributed.check_dataset(data, group)
        session = self._session
        if session is None or not self.accumulate or session.net is not net:
            self._session = Session(
                net, self.config, self.batch_num, sample_input=self.sample_input, group=group
            )
        self._started, self._pending, self._resume = False, None, False

    def _step_begin(self, run_context, mode: str) -> None:
        session = self._session
        if session is None:
            return
        if self._pending == mode:
            self._pending = None
            if session.group is None:
                self._guard(self._start, run_context, mode)
            else:  # a rank failing to start must not leave the others waiting at the step end
                error = None
                try:
                    self._start(run_context, mode)
                except Exception as err:
                    error = err
                self._guard(agree, session.group.gather, error, "starting the calibration")
        if session.active:
            session.batch_begin(mode, 0)

    def _start(self, run_context, mode: str) -> None:
        args = run_context.original_args()
        session = self._session
        if session.plan is None and session.sample_input is None:
            element = args.get(f"{mode}_dataset_element")
            if element is None:
                raise CalibrationError(
                    f"QuantCalibration: no batch in the run context ('{mode}_dataset_element'); "
                    "give sample_input"
                )
            session.sample_input = net_inputs(session.net, element)
        if not self._started:
            session.new_run()
            self._started = True
        session.forget_graphs(args.get(f"{mode}_network"))
        session.start_pass(mode)

    def _step_end(self, run_context, mode: str) -> None:
        session = self._session
        if session is None or not session.active:
            return
        try:
            if session.group is None:
                self._guard(session.batch_end, mode, 0)
            else:  # every rank stops at the same step, none waits for a rank that failed
                error = None
                try:
                    session.batch_end(mode, 0)
                except Exception as err:
                    error = err
                step = run_context.original_args().get("cur_step_num")
                self._guard(agree, session.group.gather, error, f"calibration step {step}")
        except CalibrationError:
            run_context.request_stop()  # no further step: the optimizer would apply it
            raise

    def _end_run(self, mode: str) -> None:
        session = self._session
        if session is None:
            return
        self.written = self._guard(
            session.write, self.record_path, self.flavor, require_batches=True, stop=mode
        )

    def _guard(self, fn, *args, **kwargs):
        """Run a session step; on any error remove the probes before re-raising."""
        try:
            return fn(*args, **kwargs)
        except BaseException:
            self.restore()
            raise


def _without_validation() -> bool:
    """True when the ``Model._train`` running this callback was given no ``valid_dataset``.

    MindSpore passes the validation set to ``_train`` but not to the callbacks' run context, so
    its frame is the only place to learn it at the start; False when no such frame is found
    (then the end of the run says it)."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if frame.f_code.co_name == "_train" and "valid_dataset" in frame.f_locals:
                return frame.f_locals["valid_dataset"] is None
            frame = frame.f_back
        return False
    finally:
        del frame
