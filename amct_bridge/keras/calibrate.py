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

import os

from amct_bridge.keras.quant_calibration import QuantCalibration
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
        **options: :class:`QuantCalibration` options (algorithm, batch_num, config, keys...).

    Returns:
        The record as written (what ``load(record_path)`` gives, built without re-reading it).

    Example:
        >>> # see the module docstring
    """
    callback = QuantCalibration(record_path, **options)
    if steps is None and callback.batch_num is not None:
        steps = callback.batch_num  # do not run the rest of the data uninstrumented
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


def _is_dataset(data) -> bool:
    return not hasattr(data, "shape") and not isinstance(data, (list, tuple, dict))
