"""The simulated ESP-DL v3 chip's accuracy next to float and fake-quant, and each tensor's error.

Framework-free, as :mod:`amct_bridge.espdl.evaluation` (whose :class:`Evaluation` and report
it fills): the adapter hands over the float and fake-quantized scores and the float outputs of
the layers the ``.espdl`` names its tensors after (the framework's own names, NHWC); this module
quantizes the inputs at the model's input exponent (the target's rounding), runs
:func:`~amct_bridge.espdl.v3.simulate.simulate_espdl` in batches and compares every named
tensor. Tensors the export made up (``conv/linear`` before a separate activation, requantize
copies) have no float counterpart and are not listed.

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.v3.model import EspdlModel, Node, Tensor, ValueInfo
    >>> w = Tensor("w", np.array([[[[64, 64], [-64, 64]]]], np.int8), [-6], "layout ==> NHWC")
    >>> m = EspdlModel([Node("fc", "Gemm", ["x", "w"], ["fc"], {"quant_type": "S8"})],
    ...                {"w": w}, inputs=[ValueInfo("x", [1, 2], 3, [-6])],
    ...                outputs=[ValueInfo("fc", [1, 2], 3, [-5])], metadata={"target": "c"})
    >>> x = np.float32([[1, 0], [0, 1]]); y = np.array([0, 1])
    >>> ref = x @ np.float32([[1, -1], [1, 1]])
    >>> ev = evaluate_espdl_model(m, x, y, float_scores=ref, floats={"fc": ref})
    >>> ev.float_acc, ev.chip_acc, ev.layers[0].snr_db
    (0.5, 0.5, inf)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.evaluation import (
    Evaluation,
    LayerError,
    as_reference,
    score_outputs,
    snr_db,
)
from amct_bridge.espdl.v3.model import EspdlModel
from amct_bridge.espdl.v3.reader import read_espdl
from amct_bridge.espdl.v3.simulate import infer_target, round_float, simulate_espdl

__all__ = ["computing_op", "evaluate_espdl_model", "quantize_input"]


def quantize_input(model: EspdlModel, x: np.ndarray, target: str) -> np.ndarray:
    """``x`` (float) as the model's integer input: ``round(x · 2^-e)`` with the target's
    rounding, saturated.

    Example:
        >>> from amct_bridge.espdl.v3.model import ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("x", [1, 2], 3, [-1])])
        >>> quantize_input(m, np.float32([[0.25, 100.0]]), "c").tolist()
        [[1, 127]]
    """
    info = model.inputs[0]
    dtype = np.dtype(np.int8 if info.elem_type == 3 else np.int16)
    scaled = np.asarray(x, np.float32) * np.float32(2.0**-info.exponent)
    bounds = np.iinfo(dtype)
    return np.clip(round_float(scaled, target == "esp32p4"), bounds.min, bounds.max).astype(dtype)


def evaluate_espdl_model(
    model: EspdlModel | str | os.PathLike,
    x: np.ndarray,
    y: np.ndarray,
    *,
    float_scores: np.ndarray,
    fake_quant_scores: np.ndarray | None = None,
    floats: dict[str, np.ndarray] | Callable[[list[str]], dict[str, np.ndarray]] | None = None,
    output: str | None = None,
    target: str | None = None,
    batch_size: int = 64,
    source_label: str = "keras layer",
    missing_reasons: dict[str, str] | None = None,
) -> Evaluation:
    """Float, fake-quant and simulated-v3-chip accuracy on ``(x, y)``, per-tensor errors.

    Args:
        model: the ``.espdl`` file (or its :class:`EspdlModel`).
        x, y: the chip's float inputs (NHWC, after any host-side preprocessing), the labels
            (class indices or one-hot; other labels: regression figures, no accuracy).
        float_scores, fake_quant_scores: the float and fake-quantized models' first output;
            the float one is also the reference of the file's output tensor when ``floats``
            has none by its name (a file another tool made, esp-ppq's ``4``).
        floats: float outputs by layer name, or a function of the names wanted giving them.
        output: the tensor whose scores give the chip accuracy (default: the first output).
        target: ``esp32s3``, ``esp32p4``, ``c`` (default: the file's).
        batch_size: samples per simulator call.
        source_label: header of the layer-name column.
        missing_reasons: why a tensor has no float counterpart, by name (e.g. a Flatten of an
            NCHW map); the others without one get "no float output of it was recorded".

    Example:
        >>> # see the module docstring
    """
    if not isinstance(model, EspdlModel):
        model = read_espdl(model)
    if len(model.inputs) != 1:
        raise ExportError(f"{model.source}: {len(model.inputs)} inputs; evaluation takes one")
    shape = model.inputs[0].shape or []
    if shape and all(isinstance(d, int) for d in shape) and tuple(x.shape[1:]) != tuple(shape[1:]):
        raise ExportError(
            f"{model.source}: the model takes inputs of shape {tuple(shape[1:])}, the data has "
            f"{tuple(x.shape[1:])}: is it the export of this model?"
        )
    target, _ = infer_target(model, target)
    producers = {out: node for node in model.nodes for out in node.outputs}
    infos = {v.name: v for v in (*model.value_info, *model.outputs)}
    names = [n for n in producers if n in infos and n == _layer(n)]
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    notes: list[str] = []
    for start in range(0, len(x), batch_size):
        ints = quantize_input(model, x[start : start + batch_size], target)
        res = simulate_espdl(model, ints, target)
        notes = res.notes
        for name in names:
            parts[name].append(res.values[name])
    values = {n: np.concatenate(v) for n, v in parts.items() if v}
    out = output if output in values else model.outputs[0].name

    def real(name: str) -> np.ndarray:
        info = infos[name]
        data = values[name].astype(np.float64)
        return data if info.elem_type == 1 else np.ldexp(data, info.exponent)

    refs = dict(floats(names) if callable(floats) else (floats or {}))
    sources = {name: name for name in names}
    if out not in refs and out in values:  # another tool's names (esp-ppq): the model output
        fitted = as_reference(np.asarray(real(out)), np.asarray(float_scores))
        if fitted is not None:
            refs[out], sources[out] = fitted, "(the model's output)"
    rows, missing = [], []
    for name in names:
        if name not in refs:
            why = (missing_reasons or {}).get(name, "no float output of it was recorded")
            missing.append(f"{name}: {why}")
            continue
        ref, got = np.asarray(refs[name], np.float64), real(name)
        if ref.size != got.size:
            missing.append(f"{name}: the chip has {got.size} values, the float model {ref.size}")
            continue
        got = got.reshape(ref.shape)
        info, raw = infos[name], values[name]
        saturated = 0.0
        if info.elem_type in (3, 5) and raw.size:
            bounds = np.iinfo(raw.dtype)
            saturated = float(np.mean((raw == bounds.max) | (raw == bounds.min)))
        rows.append(
            LayerError(
                name,
                sources[name],
                computing_op(name, producers),
                info.exponent if info.elem_type != 1 else None,  # float32: no exponent
                snr_db(ref, got),
                float(np.max(np.abs(ref - got))) if ref.size else 0.0,
                saturated,
                False,
            )
        )
    fields = score_outputs(y, float_scores, fake_quant_scores, real(out), output or out)
    return Evaluation(
        len(y),
        fields.pop("float_acc"),
        fields.pop("fake_quant_acc"),
        fields.pop("chip_acc"),
        target,
        rows,
        notes,
        source_label,
        missing,
        **fields,
    )


#: Operators that only move or reshape values: a tensor one of them makes from a tensor the
#: export made up (``gap/pool``) is computed by the operator before it.
LAYOUT_OPS = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity", "Transpose"})


def computing_op(name: str, producers: dict) -> str:
    """The operator that computes tensor ``name``: its producer, or, when that only reshapes
    a tensor the export made up (a GlobalAveragePooling2D is GlobalAveragePool, then Flatten),
    the operator before it. A Flatten layer of the model stays a Flatten.

    Example:
        >>> from amct_bridge.espdl.v3.model import Node
        >>> nodes = [Node("gap", "GlobalAveragePool", ["c1"], ["gap/pool"]),
        ...          Node("gap/flatten", "Flatten", ["gap/pool"], ["gap"])]
        >>> computing_op("gap", {o: n for n in nodes for o in n.outputs})
        'GlobalAveragePool'
    """
    node = producers[name]
    while node.op_type in LAYOUT_OPS and node.inputs and node.inputs[0] in producers:
        if _layer(node.inputs[0]):  # a tensor of the model's own: the reshape is the layer
            break
        node = producers[node.inputs[0]]
    return node.op_type


def _layer(name: str) -> str:
    """The framework layer a tensor is named after ('' for tensors the export made up)."""
    made_up = ("/linear", "/float", "/pool", "/partial_", "/requantize_", "/scaled")
    return "" if any(tag in name for tag in made_up) else name


def is_espdl_file(path: str | os.PathLike | object) -> bool:
    """True for a path naming an ``.espdl`` file (the v3 format), False for a v1 directory.

    Example:
        >>> is_espdl_file("model.espdl"), is_espdl_file("model_espdl")
        (True, False)
    """
    return isinstance(path, (str, os.PathLike)) and Path(path).suffix == ".espdl"
