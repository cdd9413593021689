"""Framework-free half of ``simulate``: checking a record's factors and fake-quantizing kernels.

Shared by :mod:`amct_bridge.keras.simulate` and :mod:`amct_bridge.mindspore.simulate`; an
adapter only says where a layer's kernel is and in which layout (:mod:`amct_bridge.quant.
layouts`), and runs its input fake quantization with :func:`input_quant` / :func:`balance_of`.

The kernel a simulated layer computes with (:func:`simulated_kernel`) is AMCT's deployed one,
expressed back in the original network so the BatchNorm after it can stay:

* ``k``: the BN factor ``gamma / sqrt(var + eps)`` per output channel when AMCT folds that BN
  into the layer (calibration's Conv/Dense + BN rule, no ``skip_fusion``), else 1;
* ``f``: DMQ's ``tensor_balance_factor`` per input channel (else 1);
* ``W' = ARQ(W * k * f, scale_w) / k`` (where ``k == 0`` the float ``W * f``: the BN zeroes
  that channel anyway). The input is divided by ``f`` before its fake quantization, so the
  layer computes ``conv(fq(x / f), W')`` followed by the kept BN, as deployed.

Example:
    >>> import numpy as np
    >>> from amct_bridge.records import LayerFactors
    >>> f = LayerFactors(scale_d=0.5, offset_d=0, scale_w=[0.25], offset_w=[0])
    >>> input_quant(f), simulated_kernel(np.float32([[0.3, -1.1]]), "OI", f, None, "fc").tolist()
    ([0.5, 0, 8], [[0.25, -1.0]])
"""

from __future__ import annotations

import numpy as np

from amct_bridge.errors import RecordError
from amct_bridge.quant.arq import fake_quantize_weights
from amct_bridge.quant.factors import bits_of, quant_limits
from amct_bridge.quant.layouts import get_layout, out_channel_shape
from amct_bridge.records.model import LayerFactors, Record

__all__ = [
    "balance_of",
    "bn_factor",
    "check_factors",
    "factor_bits",
    "input_quant",
    "require_factors",
    "simulated_kernel",
]


def require_factors(record: Record) -> None:
    """RecordError when ``record`` has nothing to simulate (e.g. prune records only).

    Example:
        >>> require_factors(Record({}))
        Traceback (most recent call last):
        ...
        amct_bridge.errors.RecordError: the record has no quantization factors (no layers); \
simulate() needs scale_d/scale_w from a calibration or QAT record
    """
    if any(f.scale_d is not None or f.scale_w for f in record.layers.values()):
        return
    n, p = len(record.layers), len(record.prune_records)
    what = f"{n} layer entr{'y' if n == 1 else 'ies'} without scale_d/scale_w" if n else "no layers"
    if p:
        what += f" and {p} prune record{'' if p == 1 else 's'}"
    source = f"record {record.source}" if record.source else "the record"
    raise RecordError(
        f"{source} has no quantization factors ({what}); simulate() needs scale_d/scale_w "
        "from a calibration or QAT record"
    )


def factor_bits(factors: LayerFactors, field: str) -> int:
    """Bit width of the input (``field="act_type"``) or of the kernel (``"wts_type"``).

    ``dst_type`` (QAT records) wins; else ``act_type`` (INT8 default, INT16) for inputs and 8
    for kernels: ARQ scales of INT4..INT8 wts_type already map the kernel into the narrower
    range, so clipping at 8 bits is exact (AMCT stores INT6/INT7 results as INT8 too).

    Example:
        >>> factor_bits(LayerFactors(act_type="INT16"), "act_type")
        16
    """
    if factors.dst_type is not None:
        return bits_of(factors.dst_type)
    if field == "act_type":
        return bits_of(factors.act_type or "INT8")
    return 8


def check_factors(
    where: str,
    key: str,
    f: LayerFactors,
    kernel_shape: tuple[int, ...] | None,
    layout: str | None,
) -> None:
    """RecordError naming ``where`` when ``f`` does not fit the layer part.

    Args:
        where: how messages name the entry (``"record key 'fc' (Dense)"``).
        key: the record key (DMQ message, as AMCT words it).
        f: the entry's factors.
        kernel_shape, layout: the part's kernel shape and layout; None for a part without
            weights (average pooling: data factors only).

    Example:
        >>> check_factors("record key 'fc'", "fc", LayerFactors(scale_w=[1.0, 2.0]), (3, 4), "OI")
        Traceback (most recent call last):
        ...
        amct_bridge.errors.RecordError: record key 'fc': scale_w has 2 values, expected 1 or 3
    """
    if (f.scale_d is None) != (f.offset_d is None):
        raise RecordError(f"{where}: scale_d and offset_d must be given together")
    if f.scale_d is not None:
        qmin, qmax = quant_limits(factor_bits(f, "act_type"))
        if not (np.isfinite(f.scale_d) and f.scale_d > 0):
            raise RecordError(f"{where}: scale_d {f.scale_d} must be finite and > 0")
        if not qmin <= f.offset_d <= qmax:
            raise RecordError(f"{where}: offset_d's value should be in [{qmin}, {qmax}]")
    if layout is None:
        if f.scale_w:
            raise RecordError(f"{where}: average pooling has no weights, but scale_w is set")
        if f.tensor_balance_factor:
            raise RecordError(f"{where}: tensor_balance_factor is not allowed on average pooling")
        return
    shape = tuple(int(d) for d in kernel_shape)
    if f.tensor_balance_factor:
        cin = int(shape[get_layout(np.empty(shape), layout, key).in_axis])
        if len(f.tensor_balance_factor) != cin:
            raise RecordError(
                f"{where}: tensor_balance_factor's length {len(f.tensor_balance_factor)} should "
                f"be equal to the channel length of inputs of layer {key}: {cin} (Cin)"
            )
        if not all(np.isfinite(v) and v > 0 for v in f.tensor_balance_factor):
            raise RecordError(f"{where}: every tensor_balance_factor must be finite and > 0")
    if not f.scale_w:
        return
    channels = int(np.prod(out_channel_shape(np.empty(shape), layout)))
    if len(f.scale_w) not in (1, channels):
        raise RecordError(f"{where}: scale_w has {len(f.scale_w)} values, expected 1 or {channels}")
    if f.offset_w and len(f.offset_w) != len(f.scale_w):
        raise RecordError(
            f"{where}: offset_w has {len(f.offset_w)} values, scale_w {len(f.scale_w)}"
        )
    if any(o != 0 for o in f.offset_w):
        raise RecordError(f"{where}: offset_w's value should be 0")
    if not all(np.isfinite(s) and s > 0 for s in f.scale_w):
        raise RecordError(f"{where}: every scale_w must be finite and > 0")


def input_quant(f: LayerFactors) -> list | None:
    """``[scale, offset, bits]`` of the part's input (scale as float32), None without scale_d.

    Example:
        >>> input_quant(LayerFactors(scale_d=0.1, offset_d=-3))
        [0.10000000149011612, -3, 8]
    """
    if f.scale_d is None:
        return None
    return [float(np.float32(f.scale_d)), int(f.offset_d), factor_bits(f, "act_type")]


def balance_of(f: LayerFactors | None) -> list[float] | None:
    """The DMQ factors of a part as float32 values (the record's precision), or None.

    Example:
        >>> balance_of(LayerFactors(tensor_balance_factor=[0.1, 2.0]))
        [0.10000000149011612, 2.0]
    """
    if f is None or not f.tensor_balance_factor:
        return None
    return [float(v) for v in np.float32(f.tensor_balance_factor)]


def bn_factor(gamma: np.ndarray | None, var: np.ndarray, eps: float) -> np.ndarray:
    """Per-channel factor ``gamma / sqrt(var + eps)`` (float64) a BatchNorm multiplies by.

    Example:
        >>> bn_factor(None, np.array([3.0]), 1.0).tolist()
        [0.5]
    """
    var = np.asarray(var, dtype=np.float64)
    g = np.ones_like(var) if gamma is None else np.asarray(gamma, dtype=np.float64)
    return g / np.sqrt(var + eps)


def simulated_kernel(
    w: np.ndarray, layout: str, f: LayerFactors, bn: np.ndarray | None, key: str
) -> np.ndarray:
    """The kernel a simulated layer computes with (module docstring), float32, ``w``'s layout.

    Args:
        w: the float kernel in ``layout``.
        layout: :data:`amct_bridge.quant.layouts.LAYOUTS` name.
        f: the part's factors (scale_w and/or tensor_balance_factor; neither: ``w`` as is).
        bn: :func:`bn_factor` of the BatchNorm folded into the layer (ignored when
            ``f.skip_fusion``), or None.
        key: record key (messages).

    Example:
        >>> f = LayerFactors(scale_w=[0.5], offset_w=[0])
        >>> simulated_kernel(np.float32([[0.3, 1.0]]), "OI", f, np.array([2.0]), "fc").tolist()
        [[0.25, 1.0]]
    """
    w = np.asarray(w, dtype=np.float32)
    shape = out_channel_shape(w, layout, key)
    fold = bn is not None and not f.skip_fusion
    k = np.asarray(bn).reshape(shape) if fold else np.ones(shape)
    # DMQ: AMCT multiplies the BN-fused kernel per input channel before ARQ; the simulated
    # input is divided by the same factors, so the kernel stays balanced.
    in_shape = [1] * w.ndim
    in_shape[get_layout(w, layout, key).in_axis] = -1
    balance = np.float32(f.tensor_balance_factor or 1.0).reshape(in_shape)
    fused = (w * k).astype(np.float32) * balance
    wq = (
        fake_quantize_weights(
            fused, layout, f.scale_w, num_bits=factor_bits(f, "wts_type"), name=key
        )
        if f.scale_w
        else fused
    )
    # Divide the BN factor back out: the kept BN multiplies it in again. A zero factor makes
    # the kernel irrelevant, so keep the float one there.
    wq = np.where(k == 0, w * balance, wq / np.where(k == 0, 1.0, k))
    return wq.astype(np.float32)
