"""``calibrate(model, data, record_path)``: post-training calibration in one call.

Example:
    >>> import keras, numpy as np, tempfile, os
    >>> x = keras.Input((8,))
    >>> model = keras.Model(x, keras.layers.Dense(4, name="fc")(x))
    >>> path = os.path.join(tempfile.mkdtemp(), "record.txt")
    >>> rec = calibrate(model, np.random.rand(64, 8).astype("float32"), path, algorithm="minmax")
    >>> list(rec.layers)
    ['fc']
"""

from __future__ import annotations

import contextlib
import copy
import math
import os

import numpy as np

from amct_bridge.errors import CalibrationError
from amct_bridge.keras.quant_calibration import QuantCalibration
from amct_bridge.keras.session import Session
from amct_bridge.records import Record, load


def calibrate(
    model,
    data,
    record_path: str | os.PathLike,
    *,
    batch_size: int | None = 32,
    steps: int | None = None,
    verbose: int | str = 0,
    callbacks: list | None = None,
    keep_step: bool = True,
    **options,
) -> Record:
    """Run ``model.predict(data)`` with a :class:`QuantCalibration` and return the record.

    Args:
        model: a built Keras model.
        data: anything ``model.predict`` accepts (numpy array, tf.data.Dataset, generator...).
        record_path: the AMCT record to write (sidecar ``<record_path>.calib.json`` too).
        batch_size: batch size for array data (ignored for datasets).
        steps: batches to run (default: ``batch_num`` if set, else all of ``data``).
        verbose: predict's progress bar (0 silent, 1 bar).
        callbacks: more callbacks for the predict call (e.g. a progress bar).
        keep_step: keep the traced observed step for the next ``calibrate()`` of this model
            object with the same plan (array data; other data: the callback's, see
            :class:`QuantCalibration`; like Keras' predict function: a layer
            changed in place later is not seen, weights are). The steps of the last 4 plans
            are kept, so switching back to an earlier algorithm traces nothing. Each holds its
            buffers (with histograms: rings of at most 32 MiB plus 4 bytes per bin and tensor)
            until the model is deleted or 4 other plans ran since; False drops them all.
        **options: :class:`QuantCalibration` options (algorithm, batch_num, config, keys...).

    Returns:
        The record as written (what ``load(record_path)`` gives, built without re-reading it).

    Example:
        >>> # see the module docstring
    """
    callback = QuantCalibration(record_path, keep_step=keep_step, **options)
    if steps is None and callback.batch_num is not None:
        steps = callback.batch_num  # do not run the rest of the data uninstrumented
    check_data_shapes(model, data)  # Keras' own ValueError is a traceback about 'functional'
    if not callbacks and not verbose and _direct_ok(model, data, batch_size):
        return _calibrate_direct(model, data, batch_size, steps, callback, keep_step)
    try:
        model.predict(
            data,
            batch_size=None if _is_dataset(data) else batch_size,
            steps=steps,
            verbose=verbose,
            callbacks=[callback, *(callbacks or [])],
        )
    finally:
        callback.restore()
    written = callback._session.written if callback._session is not None else None
    return written if written is not None else load(record_path, flavor=callback.flavor)


def check_data_shapes(model, data) -> None:
    """Refuse array data (one array, a list/tuple or a dict of arrays, or a ``tf.data.Dataset``
    of such batches) that does not fit the model's inputs, with the message the CLI gives.

    Other data (generators, ``keras.utils.PyDataset``) is left to Keras.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((8, 8, 3), name="img"), keras.layers.Flatten()])
        >>> check_data_shapes(m, np.zeros((4, 6, 8, 3), np.float32))
        Traceback (most recent call last):
        ...
        amct_bridge.errors.CalibrationError: data of shape (4, 6, 8, 3) does not fit model input 'img' of shape (N, 8, 8, 3)
    """  # noqa: E501
    inputs = list(getattr(model, "inputs", None) or [])
    given = _data_shapes(data, [t.name for t in inputs])
    if not inputs or given is None:
        return
    if len(given) != len(inputs):
        names = [t.name for t in inputs]
        raise CalibrationError(
            f"data holds {len(given)} array{'s' if len(given) != 1 else ''} for a model with "
            f"{len(inputs)} input{'s' if len(inputs) != 1 else ''} {names}: give one array per "
            "input (a list, or a dict by name)"
        )
    for (label, shape), tensor in zip(given, inputs, strict=True):
        expected = tuple(tensor.shape[1:])
        if shape is None:
            continue
        if len(shape) != len(expected) + 1 or any(
            e is not None and a is not None and e != a
            for e, a in zip(expected, shape[1:], strict=True)
        ):
            raise CalibrationError(
                f"{label} of shape {_shape_text(shape)} does not fit model input "
                f"{tensor.name!r} of shape (N, {', '.join(map(str, expected))})"
            )


def _shape_text(shape: tuple) -> str:
    return (
        "("
        + ", ".join("N" if d is None else str(d) for d in shape)
        + (",)" if len(shape) == 1 else ")")
    )


def _data_shapes(data, names: list[str]) -> list[tuple[str, tuple | None]] | None:
    """(label, shape with the batch axis) per array of ``data``; None when not array data."""
    import tensorflow as tf

    if isinstance(data, tf.data.Dataset):
        spec = data.element_spec
        if isinstance(spec, tuple) and spec:  # (x, y) or (x, y, weights): x is the input
            spec = spec[0]
        return _spec_shapes(spec, names)
    if isinstance(data, np.ndarray):
        return [("data", data.shape)]
    if isinstance(data, (list, tuple)) and data and all(isinstance(a, np.ndarray) for a in data):
        return [(f"data[{i}]", a.shape) for i, a in enumerate(data)]
    if isinstance(data, dict) and data and all(isinstance(a, np.ndarray) for a in data.values()):
        if set(data) != set(names):
            return None  # Keras names the keys it misses
        return [(f"data[{name!r}]", data[name].shape) for name in names]
    return None


def _spec_shapes(spec, names: list[str]) -> list[tuple[str, tuple | None]] | None:
    import tensorflow as tf

    def shape(s) -> tuple | None:
        return tuple(s.shape) if s.shape.rank is not None else None

    if isinstance(spec, tf.TensorSpec):
        return [("dataset element", shape(spec))]
    if isinstance(spec, (list, tuple)) and all(isinstance(s, tf.TensorSpec) for s in spec):
        return [(f"dataset element[{i}]", shape(s)) for i, s in enumerate(spec)]
    if isinstance(spec, dict) and set(spec) == set(names):
        if all(isinstance(s, tf.TensorSpec) for s in spec.values()):
            return [(f"dataset element[{n!r}]", shape(spec[n])) for n in names]
    return None


def _direct_ok(model, data, batch_size: int | None) -> bool:
    """Arrays for a single-input model in its own dtype, nothing predict() would add: the
    batches can go to an observed forward function of our own (see Session.direct_step)."""
    import tensorflow as tf

    if not isinstance(data, np.ndarray) or not batch_size or batch_size < 1 or data.ndim < 1:
        return False
    inputs = getattr(model, "inputs", None)
    if not inputs or len(inputs) != 1 or getattr(model, "jit_compile", False):
        return False
    if (
        tf.distribute.has_strategy()
        or model.distribute_strategy is not tf.distribute.get_strategy()
    ):
        return False
    shape = tuple(inputs[0].shape)
    return (
        np.dtype(inputs[0].dtype) == data.dtype
        and len(shape) == data.ndim
        and all(s is None or s == d for s, d in zip(shape[1:], data.shape[1:], strict=True))
    )


def _calibrate_direct(
    model, data: np.ndarray, batch_size: int, steps, callback, keep_step: bool
) -> Record:
    """The batches of ``data`` through the session's own observed step, then the write."""
    import tensorflow as tf

    count = math.ceil(len(data) / batch_size)
    if steps is not None:
        count = min(count, int(steps))
    spec = tf.TensorSpec((None, *data.shape[1:]), data.dtype)
    session = Session(
        model, callback.config, callback.batch_num, direct_spec=spec, keep_step=keep_step
    )
    callback._session = session
    try:
        session.new_run()
        session.start_pass("predict")
        with _plain_calls():
            for i in range(count):
                if not session.active:
                    break
                session.batch_begin("predict", i)
                session.step_function(tf.constant(data[i * batch_size : (i + 1) * batch_size]))
                session.batch_end("predict", i)
        session.stop_pass("predict")
        session.write(callback._outputs(), require_batches=True)
    finally:
        session.stop_all()
    return session.written


_SKIP_GRAPPLER = True


@contextlib.contextmanager
def _plain_calls():
    if not _SKIP_GRAPPLER:
        yield
        return
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context

    ctx = context.context()
    old = ctx.function_call_options
    new = copy.copy(old)
    config = config_pb2.ConfigProto.FromString(old.config_proto_serialized)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    new.config_proto_serialized = config
    ctx.function_call_options = new
    try:
        yield
    finally:
        ctx.function_call_options = old


def _is_dataset(data) -> bool:
    return not hasattr(data, "shape") and not isinstance(data, (list, tuple, dict))
