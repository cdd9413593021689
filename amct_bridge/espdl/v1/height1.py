"""1-D models on ESP-DL v1: its layers are 2-D only, so 1-D tensors run at height 1.

The adapters give 1-D layers (Keras Conv1D & co., MindSpore ``nn.Conv1d``) as the 2-D layers
of height 1 they are (``attrs["rank"] = 1``, kernels ``[1, k, cin, cout]``, see
:mod:`amct_bridge.espdl.source`); the calibration quantized them so (AMCT's Conv2D rules). What
is left for v1 is the tensors: the runtime's are HWC, a 1-D model's ``(W, C)``. So
:func:`lift_1d` puts one ``Reshape`` to ``(1, W, C)`` right after a ``(W, C)`` model input
(same bytes: the chip's input stays what the model takes, and ``simulate_chip`` /
``espdl-eval`` feed it the model's own data) and adapts what reads tensors at height 1:

- ``Concatenate`` on a positive framework axis of an ``(N, W, C)`` tensor (1 = W, 2 = C) gets
  the axis of the ``(N, 1, W, C)`` tensor it now reads (2, 3); ``-1`` is unchanged;
- a ``Reshape`` to ``(W', C')`` that a 1-D layer reads gets ``(1, W', C')``;
- ``Permute`` of a height-1 tensor is refused (its axes are the 1-D tensor's).

Everything else is unchanged: Flatten gives the same order for ``(1, W, C)`` as for
``(W, C)``, a global pool ``(1, 1, C)`` the same values as ``(C,)``, and Dense flattens its
input. The Reshape is named ``<input>/height_1`` (no framework layer has a ``/`` in that
place): it appears in export.json, the chip graph and the C++ model class as such.

Example:
    >>> import numpy as np
    >>> layers = [SourceLayer("x", "input", attrs={"shape": (8, 2)}),
    ...           SourceLayer("c", "conv2d", ["x"], "Conv1D",
    ...                       {"kernel": np.ones((1, 3, 2, 4), np.float32)}, {"rank": 1})]
    >>> [(x.name, x.op, x.inputs, x.attrs.get("target_shape")) for x in lift_1d(layers)]
    [('x', 'input', [], None), ('x/height_1', 'runtime', ['x'], (1, 8, 2)), \
('c', 'conv2d', ['x/height_1'], None)]
"""

from __future__ import annotations

from dataclasses import replace

from amct_bridge.espdl.source import SourceLayer

__all__ = ["HEIGHT_1", "lift_1d"]

#: Name suffix of the Reshape put after a 1-D model input.
HEIGHT_1 = "height_1"

#: Layers after which a height-1 tensor is no longer one (flattened, pooled to a vector).
_ENDS = ("dense",)
_ENDING_KINDS = ("Flatten",)


def _one_d(layers: list[SourceLayer]) -> bool:
    return any(x.attrs.get("rank") == 1 for x in layers)


def lift_1d(layers: list[SourceLayer]) -> list[SourceLayer]:
    """``layers`` with 1-D tensors at height 1 (see the module docstring); unchanged when no
    layer is 1-D. The layers are copies: the caller's list is not modified.

    Example:
        >>> lift_1d([SourceLayer("x", "input", attrs={"shape": (4,)})])[0].name
        'x'
    """
    if not _one_d(layers):
        return layers
    renamed: dict[str, str] = {}  # model input -> its Reshape
    lifted: set[str] = set()  # layers whose output is a height-1 tensor
    out: list[SourceLayer] = []
    for layer in layers:
        inputs = [renamed.get(name, name) for name in layer.inputs]
        attrs = dict(layer.attrs)
        reads_lifted = any(name in lifted for name in inputs)
        if layer.op == "input":
            out.append(layer)
            shape = layer.attrs.get("shape")
            if shape is not None and len(shape) == 2:
                name = f"{layer.name}/{HEIGHT_1}"
                target = (1, *(int(s) for s in shape))
                reshape = SourceLayer(
                    name,
                    "runtime",
                    [layer.name],
                    "Reshape",
                    attrs={"keeps_exponent": True, "target_shape": target, "lifts": layer.name},
                )
                out.append(reshape)
                renamed[layer.name] = name
                lifted.add(name)
            continue
        if reads_lifted and layer.kind == "Concatenate":
            axis = int(attrs.get("axis", -1))
            if axis > 0:  # (N, W, C) axis -> (N, 1, W, C) axis
                attrs["axis"] = axis + 1
        if reads_lifted and layer.kind == "Permute":
            layer = replace(
                layer,
                op="unsupported",
                attrs={
                    **attrs,
                    "reason": "Permute of a 1-D tensor: ESP-DL v1 runs 1-D layers at height 1, "
                    "where the permuted axes are not the model's",
                },
            )
            out.append(replace(layer, inputs=inputs))
            continue
        if layer.kind == "Reshape" and layer.op == "runtime":
            target = attrs.get("target_shape")
            if target is not None and len(target) == 2 and _read_by_1d(layer.name, layers):
                attrs["target_shape"] = (1, *(int(s) for s in target))
                lifted.add(layer.name)
        elif layer.attrs.get("rank") == 1 or (
            reads_lifted and layer.op not in _ENDS and layer.kind not in _ENDING_KINDS
        ):
            lifted.add(layer.name)
        out.append(replace(layer, inputs=inputs, attrs=attrs))
    return out


def _read_by_1d(name: str, layers: list[SourceLayer]) -> bool:
    return any(name in x.inputs and x.attrs.get("rank") == 1 for x in layers)
