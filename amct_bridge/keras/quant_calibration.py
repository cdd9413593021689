"""``QuantCalibration``: a Keras callback that calibrates while evaluate / predict / fit run.

Example:
    >>> import keras, numpy as np, tempfile, os
    >>> from amct_bridge.keras import QuantCalibration
    >>> x = keras.Input((8,))
    >>> model = keras.Model(x, keras.layers.Dense(4, name="fc")(x))
    >>> path = os.path.join(tempfile.mkdtemp(), "record.txt")
    >>> _ = model.predict(np.random.rand(32, 8), verbose=0,
    ...                   callbacks=[QuantCalibration(path, algorithm="minmax")])
    >>> "fc" in open(path).read()
    True
"""

from __future__ import annotations

import os
from pathlib import Path

import keras

from amct_bridge.calibration.options import (
    check_choice,
    check_flavor,
    check_output,
    resolve_batch_num,
)
from amct_bridge.config import QuantConfig, resolve_config
from amct_bridge.errors import AmctBridgeError, CalibrationError
from amct_bridge.keras.session import Session
from amct_bridge.records.atomic import check_writable

_MODES = ("auto", "train", "validation")
_KEYS = ("keras", "tf_op")


class QuantCalibration(keras.callbacks.Callback):
    """Gather activation statistics inside the compiled step and write an AMCT record at the end.

    Add it to the calls you already make: ``model.evaluate(data, callbacks=[cb])`` or
    ``model.predict(...)`` (post-training calibration), or ``model.fit(..., callbacks=[cb])``
    (training batches, or the validation passes with ``on="validation"``). Statistics are
    computed in the graph (min/max, histograms, per-channel max); the model is left exactly as
    it was.

    Args:
        record_path: where the AMCT record (protobuf text) goes; checked writable now. The
            calibration sidecar ``<record_path>.calib.json`` (input/output ranges) goes next to it.
        config: an AMCT simple config file path (``create_quant_config`` style) or a
            :class:`~amct_bridge.config.QuantConfig`; explicit arguments below override its
            common settings. Default: AMCT's defaults.
        algorithm: "ifmr" (AMCT default), "hfmg", "minmax", "percentile" or "ema".
        algorithm_options: that algorithm's options, AMCT names (``num_of_bins``,
            ``max_percentile``, ``search_range_start``..., ``momentum``).
        batch_num: stop gathering after this many batches per run (then the step runs
            uninstrumented). Default: every batch of the run, or the config file's batch_num.
        activation_offset: asymmetric activations (AMCT default True).
        channel_wise: per-channel weight scales where AMCT allows them (default True).
        act_type: "INT8" (default) or "INT16".
        skip_layers: layer names (nested: "outer/inner") not to quantize.
        skip_fusion_layers: layers whose following BatchNormalization is not folded.
        migration_strength: enable DMQ with this strength (0.2..0.8), writes
            tensor_balance_factor.
        joint_quant: write shift_bit (see docs/keras.md for its definition).
        flavor: record flavor to write: "inner" (default) or "tf" (for convert_model).
        keys: "keras" (layer names, default) or "tf_op" (TF op names of the frozen graph).
        frozen_graph_path: also write the matching frozen GraphDef (.pb), BN folded.
        on: "auto" (the run the callback is attached to; in fit: training batches),
            "train" or "validation" (fit's validation passes).
        accumulate: keep statistics across runs (repeated fit/evaluate calls) instead of
            starting fresh each run (default False).
        save_every_epoch: in fit, also write the record at every epoch end.
        keep_step: keep the instrumented step function on the model for the next run with
            the same plan (another callback too), as Keras keeps its own step functions: a
            second run then traces nothing. A compile(), another distribution strategy, plan,
            ``steps_per_execution`` or ``jit_compile`` makes a new one; the steps of the last
            4 plans per mode are kept (``session.KEEP_PLANS``), so going back to an earlier
            algorithm traces nothing either. Each holds its buffers (with histograms: rings
            of at most 32 MiB plus 4 bytes per bin and tensor) until the model is deleted or
            4 other plans ran since; False neither uses nor keeps one, and drops the mode's.

    Example:
        >>> cb = QuantCalibration("/tmp/record.txt", algorithm="hfmg",
        ...                       algorithm_options={"num_of_bins": 1024}, batch_num=8)
        >>> cb.batch_num
        8
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
        flavor: str = "inner",
        keys: str = "keras",
        frozen_graph_path: str | os.PathLike | None = None,
        on: str = "auto",
        accumulate: bool = False,
        save_every_epoch: bool = False,
        keep_step: bool = True,
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
        check_choice("flavor", flavor, ("inner", "tf"))
        check_choice("keys", keys, _KEYS)
        check_choice("on", on, _MODES)
        check_flavor(self.config, flavor)
        self.record_path = check_output(record_path)
        self.frozen_graph_path = Path(frozen_graph_path) if frozen_graph_path else None
        if self.frozen_graph_path is not None:
            _check_writable(self.frozen_graph_path)
        self.flavor, self.keys, self.on = flavor, keys, on
        self.accumulate, self.save_every_epoch = accumulate, save_every_epoch
        self.keep_step = keep_step
        self._session: Session | None = None
        self._in_fit = False

    # ---- Keras hooks: short, the work is in Session ---------------------------------------

    def on_train_begin(self, logs=None):
        self._in_fit = True
        self._begin_run()
        if self.on in ("auto", "train"):
            self._guard(self._session.start_pass, "train")

    def on_train_batch_begin(self, batch, logs=None):
        self._guard(self._session.batch_begin, "train", batch)

    def on_train_batch_end(self, batch, logs=None):
        self._guard(self._session.batch_end, "train", batch)

    def on_epoch_end(self, epoch, logs=None):
        if self.save_every_epoch:
            self._guard(self._session.write, self._outputs())

    def on_train_end(self, logs=None):
        self._in_fit = False
        self._end_run("train")

    def on_test_begin(self, logs=None):
        if not self._in_fit:
            self._begin_run()
        if not self._in_fit or self.on == "validation":
            self._guard(self._session.start_pass, "test")

    def on_test_batch_begin(self, batch, logs=None):
        self._guard(self._session.batch_begin, "test", batch)

    def on_test_batch_end(self, batch, logs=None):
        self._guard(self._session.batch_end, "test", batch)

    def on_test_end(self, logs=None):
        if self._in_fit:
            self._guard(self._session.stop_pass, "test")
        else:
            self._end_run("test")

    def on_predict_begin(self, logs=None):
        self._begin_run()
        self._guard(self._session.start_pass, "predict")

    def on_predict_batch_begin(self, batch, logs=None):
        self._guard(self._session.batch_begin, "predict", batch)

    def on_predict_batch_end(self, batch, logs=None):
        self._guard(self._session.batch_end, "predict", batch)

    def on_predict_end(self, logs=None):
        self._end_run("predict")

    # ---- helpers ------------------------------------------------------------------------------

    def restore(self) -> None:
        """Remove any instrumentation now (e.g. after fit raised before on_train_end ran)."""
        if self._session is not None:
            self._session.stop_all()

    def _begin_run(self) -> None:
        if self._session is None or not self.accumulate or self._session.model is not self.model:
            self._session = Session(
                self.model, self.config, self.batch_num, keep_step=self.keep_step
            )
        self._session.new_run()

    def _end_run(self, mode: str) -> None:
        session = self._session
        self._guard(session.stop_pass, mode)
        self._guard(session.write, self._outputs(), require_batches=True)

    def _outputs(self) -> dict:
        return {
            "record_path": self.record_path,
            "flavor": self.flavor,
            "keys": self.keys,
            "frozen_graph_path": self.frozen_graph_path,
        }

    def _guard(self, fn, *args, **kwargs):
        """Run a session step; on any error remove the instrumentation before re-raising."""
        try:
            return fn(*args, **kwargs)
        except BaseException:
            if self._session is not None:
                self._session.stop_all()
            raise


def _check_writable(path: Path) -> None:
    try:
        check_writable(path)
    except AmctBridgeError as err:
        raise CalibrationError(f"cannot write output: {err}") from None
