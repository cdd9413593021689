"""What GRU and LSTM share: ``dl_module_gru.hpp`` / ``dl_module_lstm.hpp`` read the same node
layout, run the same gate matmuls (``dl_base_dotprod.cpp``), the same sigmoid / tanh tables
(``dl_math.hpp``'s ``SigmoidLUT`` / ``TanhLUT``) and the same direction walk.

**These ops rest on the runtime's sources alone** (esp-dl 12c0616d; esp-ppq 1.3.12 cannot
generate GRU / LSTM test files, so no file pins the arithmetic down). What is modelled:

- the node: inputs ``X, W, R[, B, sequence_lens, initial_h]`` (LSTM ``[, initial_c, P]``),
  attributes ``hidden_size``, ``direction``, ``layout``, ``gate_exponent`` (default -8;
  esp-ppq writes -9), ``quant_type`` S8 / S16; W ``[dirs, G·H, I]`` and R ``[dirs, G·H, H]`` in
  ONNX order and layout (esp-ppq's ``ResetParamLayoutPattern`` leaves them alone), B as int16
  ``[dirs, 2·G·H]`` at the gate exponent (``EspdlQuantizer.py``, ``parameters.py``);
- the gate matmuls ``W·x_t`` and ``R·h``: ``dotprod`` of ``dl_base_dotprod.cpp`` per row, the
  esp32s3 (``dl_tie728_dotprod.S``) / esp32p4 (``dl_esp32p4_dotprod.S``) integer kernels when the
  length is a multiple of 16 (int8) / 8 (int16) and the shift is >= 0 (an exact sum shifted with
  the target's rounding), else the C kernel (``float(sum) · 2^-shift`` rounded by
  ``tool::round``); the int16 result saturates; ``shift = gate_exponent − (e_x + e_W)`` and
  ``gate_exponent − (e_Y_h + e_R)``;
- the bias adds into the int16 caches, which wrap (C's conversion of an int to int16_t);
- the tables: ``SigmoidLUT(gate_exponent, ±6.3)``, ``TanhLUT(gate_exponent, ±3.5)`` of float
  entries for ``i · 2^gate_exponent``, i = 0 … q_max, mirrored for negative indices and clamped
  beyond; their entries use ``dl::math::sigmoid`` (``1.0 / (1.0 + expf(-x))`` in double) and
  ``tanh = 2 · sigmoid(2x) − 1`` in float32, with the simulator's one ``expf``
  (:func:`~._base.expf`, exp in double rounded to float32);
- the recurrence in float32 operation by operation, ``tool::round`` per target, ``truncate``
  (saturation) of h; directions ``forward`` and ``bidirectional`` (the second direction walks
  from the last step back); ``Y [seq, dirs, 1, H]`` (whatever the layout, as
  ``get_output_shape`` says), ``Y_h [dirs, 1, H]`` (LSTM ``Y_c [dirs, 1, H]`` int16).

What is not modelled (refused, or noted):

- float32 models (``quant_type`` F32) are refused, like every float op of this simulator;
- attributes the modules ignore or refuse: ``direction="reverse"`` (``direction_num`` is 1 and
  the only backward walk is the second direction of ``bidirectional``: the chip would run it
  forward), ``activations`` other than the ONNX defaults, ``clip``, ``layout`` other than 0 / 1,
  a batch other than 1 ("currently only support batch_size = 1"), ``sequence_lens`` other
  than the sequence length (the modules never read it), GRU ``linear_before_reset=0`` and LSTM
  ``input_forget=1`` (their ``deserialize()`` returns no module), LSTM peepholes ``P``;
- an empty optional input name is taken as absent (what the closed fbs loader returns for it
  is not in the sources);
- which ``expf`` the chip's libc has: espressif/newlib-esp32's ``machine/ieeefp.h`` sets
  ``__OBSOLETE_MATH_DEFAULT 1`` for Xtensa and RISC-V, which selects fdlibm's float
  ``libm/math/ef_exp.c``; that one is one ulp off the correctly rounded value for about 10 % of
  the table inputs and gives another entry for 48 of the 5021 entries at gate exponent -9
  (31 sigmoid, 17 tanh). A picolibc or new-math build is nearly correctly rounded. Without a
  test file, the simulator's shared ``expf`` is kept;
- the compiler may fuse ``a·b + c`` (GCC's ``-ffp-contract=fast``) in the recurrence and in
  ``expf``; that is not modelled;
- the 40-bit accumulators of the integer kernels: a sum beyond ±2^39 is refused.

Example:
    >>> sigmoid_lut(gate_tables(-9)[0], np.array([0, 512, -512, 99999])).tolist()
    [0.5, 0.7310585975646973, 0.26894140243530273, 0.9981684684753418]
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, shift_round, sigmoid

__all__ = [
    "RnnInputs",
    "gate_tables",
    "int_input",
    "mat_vec",
    "note_exponent",
    "present",
    "read_rnn",
    "sigmoid_lut",
    "steps",
    "tanh_lut",
    "wrap_int16",
]

_F32 = np.float32
#: The table bounds the modules pass to SigmoidLUT / TanhLUT (dl_module_gru.hpp, _lstm.hpp).
SIGMOID_BOUND = 6.3
TANH_BOUND = 3.5


def _table_bound(scale: np.float32, bound: float) -> int:
    # dl_math.hpp: q_min = (int)(min / scale) - 1, q_max = (int)(max / scale) + 1 (truncated),
    # then the larger magnitude on both sides
    q_min = int(_F32(-bound) / scale) - 1
    q_max = int(_F32(bound) / scale) + 1
    return max(-q_min, q_max)


@lru_cache(maxsize=8)
def gate_tables(exponent: int) -> tuple[np.ndarray, np.ndarray]:
    """The float32 entries of ``SigmoidLUT(exponent, -6.3, 6.3)`` and ``TanhLUT(exponent,
    -3.5, 3.5)`` (``dl_math.hpp``): ``f(i · 2^exponent)`` for ``i = 0 … q_max``.

    Example:
        >>> sig, tanh = gate_tables(-9)
        >>> sig.size, tanh.size, sig[0], tanh[0]
        (3227, 1794, 0.5, 0.0)
    """
    scale = _F32(2.0**exponent)
    q_sig = _table_bound(scale, SIGMOID_BOUND)
    q_tanh = _table_bound(scale, TANH_BOUND)
    sig = sigmoid(np.arange(q_sig + 1).astype(_F32) * scale)
    twice = _F32(2) * (np.arange(q_tanh + 1).astype(_F32) * scale)
    tanh = (_F32(2) * sigmoid(twice) - _F32(1)).astype(_F32)
    sig.setflags(write=False)
    tanh.setflags(write=False)
    return sig, tanh


def sigmoid_lut(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``SigmoidLUT::get``: ``table[min(i, q_max)]``, and ``1 − table[min(−i, q_max)]`` for a
    negative index (in float32).

    Example:
        >>> sigmoid_lut(np.float32([0.5, 0.75]), np.array([1, 5, -1])).tolist()
        [0.75, 0.75, 0.25]
    """
    index = np.asarray(index, np.int64)
    q_max = table.size - 1
    value = table[np.minimum(np.abs(index), q_max)]
    return np.where(index < 0, _F32(1) - value, value).astype(_F32)


def tanh_lut(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``TanhLUT::get``: ``table[min(|i|, q_max)]``, negated for a negative index.

    Example:
        >>> tanh_lut(np.float32([0.0, 0.5]), np.array([1, -7])).tolist()
        [0.5, -0.5]
    """
    index = np.asarray(index, np.int64)
    value = table[np.minimum(np.abs(index), table.size - 1)]
    return np.where(index < 0, -value, value).astype(_F32)


def wrap_int16(x: np.ndarray) -> np.ndarray:
    """An int stored into an ``int16_t`` (GCC keeps the low 16 bits), as int64.

    Example:
        >>> wrap_int16(np.array([32767, 32768, -32769])).tolist()
        [32767, -32768, 32767]
    """
    x = np.asarray(x, np.int64)
    return ((x + 32768) & 0xFFFF) - 32768


def mat_vec(
    ctx: Context, node: Node, matrix: np.ndarray, vectors: np.ndarray, shift: int
) -> np.ndarray:
    """``base::mat_vec_dotprod`` of ``dl_base_dotprod.hpp`` for each row of ``vectors``: one
    ``dotprod`` per matrix row, an int16 result (as int64) ``[n, rows]``.

    The esp32s3 / esp32p4 kernels take a length that is a multiple of 16 (int8) or 8 (int16)
    and a shift >= 0: the exact sum, plus 2^(shift-1) then shifted (esp32s3), or shifted half
    to even (esp32p4), saturated to int16. Otherwise (and on ``c``) the C kernel:
    ``round(float(sum) · 2^-shift)`` with ``tool::round``, saturated.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "c")
        >>> m = np.array([[3, 1], [-3, -1]], np.int8)
        >>> mat_vec(ctx, Node("n", "GRU", [], []), m, np.array([[1, 0]], np.int8), 1).tolist()
        [[2, -1]]
    """
    if abs(shift) > 30:
        raise ctx.refuse(node, f"a gate shift of {shift} overflows DL_RESCALE's 1 << n")
    itemsize = matrix.dtype.itemsize
    acc = vectors.astype(np.int64) @ matrix.astype(np.int64).T
    cols = matrix.shape[1]
    simd = ctx.target != "c" and cols % (16 if itemsize == 1 else 8) == 0 and shift >= 0
    if simd:
        if acc.size and int(np.abs(acc).max()) >= 1 << 39:
            raise ctx.refuse(
                node, "a gate sum reaches 2^39, beyond the 40-bit accumulator of the kernel"
            )
        out = shift_round(acc, shift, ctx.half_even)
    else:
        # dotprod_c: the int32 / int64 sum converted to float, times DL_RESCALE(shift)
        scaled = acc.astype(_F32) * _F32(2.0**-shift)
        out = round_float(scaled, ctx.half_even)
    return np.clip(out, -32768, 32767)


@dataclass
class RnnInputs:
    """A GRU / LSTM node as its module reads it: integers as int64, one row per direction.

    ``x`` is ``[seq, input]`` (batch 1); ``bias`` the int16 integers ``[dirs, 2·G·H]``;
    ``initial_h`` ``[dirs, H]`` or None.

    Example:
        >>> RnnInputs(1, 1, -9, np.dtype(np.int8), *(np.zeros(1),) * 3, None, None, 0, 0, -7,
        ...           -7).directions
        1
    """

    hidden: int
    directions: int
    gate_exponent: int
    dtype: np.dtype
    x: np.ndarray
    w: np.ndarray
    r: np.ndarray
    bias: np.ndarray | None
    initial_h: np.ndarray | None
    w_shift: int
    r_shift: int
    y_exponent: int
    h_exponent: int


def present(node: Node, index: int) -> bool:
    """Whether the node has a (non-empty) input ``index``; an empty name counts as absent.

    Example:
        >>> present(Node("n", "GRU", ["x", "w", "r", ""], []), 3)
        False
    """
    return len(node.inputs) > index and bool(node.inputs[index])


def int_input(ctx: Context, node: Node, index: int, what: str, dtype: np.dtype) -> np.ndarray:
    """The integers of input ``index``, refused unless they are ``dtype`` (the module reads
    the raw buffer as that type).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor
        >>> m = EspdlModel([], {"b": Tensor("b", np.zeros(2, np.int16))})
        >>> int_input(Context(m, "c"), Node("n", "GRU", ["b"], []), 0, "B", np.int16).tolist()
        [0, 0]
    """
    value = np.asarray(ctx.value(node.inputs[index], node))
    if value.dtype != dtype:
        raise ctx.refuse(
            node, f"{what} {node.inputs[index]!r} is {value.dtype}; the module reads it as {dtype}"
        )
    return value


def read_rnn(ctx: Context, node: Node, gates: int, activations: tuple[str, ...]) -> RnnInputs:
    """Read and check a GRU (``gates`` 3) or LSTM (4) node the way its module's
    ``deserialize()`` and ``forward_template`` read it; refuse what the runtime does not do.

    ``activations`` are the ONNX defaults for one direction (the modules hard-code them).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> n = Node("g", "GRU", ["x", "w", "r"], ["y", "yh"], {"direction": "reverse"})
        >>> read_rnn(Context(EspdlModel([], {}), "c"), n, 3, ("Sigmoid", "Tanh"))
        Traceback (most recent call last):
        ...
        amct_bridge.espdl.v3.model.EspdlError: <memory>: node 'g' (GRU): direction 'reverse' is \
run forward by the runtime (direction_num is 1 unless 'bidirectional', and only the second \
direction walks backwards): not simulated
    """
    attrs = node.attributes
    dtype = ctx.out_dtype(node)
    direction = attrs.get("direction", "forward")
    if direction == "reverse":
        raise ctx.refuse(
            node,
            "direction 'reverse' is run forward by the runtime (direction_num is 1 unless "
            "'bidirectional', and only the second direction walks backwards): not simulated",
        )
    if direction not in ("forward", "bidirectional"):
        raise ctx.refuse(node, f"direction {direction!r} (forward and bidirectional run)")
    dirs = 2 if direction == "bidirectional" else 1
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise ctx.refuse(node, f"layout {layout} (ONNX has 0 and 1)")
    if "clip" in attrs:
        raise ctx.refuse(node, "'clip' is ignored by the runtime (it never clips): not simulated")
    acts = attrs.get("activations")
    if acts is not None:
        names = [str(a).lower() for a in acts]
        default = [a.lower() for a in activations]
        if names not in (default, default * dirs):
            raise ctx.refuse(
                node,
                f"activations {list(acts)} are not the defaults {list(activations)}; the "
                "runtime always uses its sigmoid and tanh tables",
            )
    hidden = int(attrs.get("hidden_size", 0))
    if hidden <= 0:
        raise ctx.refuse(node, "no hidden_size (the module reads it; 0 gives no output)")
    gate_exponent = int(attrs.get("gate_exponent", -8))
    if len(node.inputs) < 3:
        raise ctx.refuse(node, "needs the inputs X, W and R")
    x = int_input(ctx, node, 0, "X", dtype)
    if x.ndim != 3:
        raise ctx.refuse(node, f"X has shape {list(x.shape)}, expected 3 dimensions")
    seq, batch = (x.shape[0], x.shape[1]) if layout == 0 else (x.shape[1], x.shape[0])
    if batch != 1:
        raise ctx.refuse(node, f"batch {batch}: the runtime computes batch 1 only")
    size = x.shape[2]
    w = int_input(ctx, node, 1, "W", dtype)
    r = int_input(ctx, node, 2, "R", dtype)
    if list(w.shape) != [dirs, gates * hidden, size]:
        raise ctx.refuse(
            node, f"W has shape {list(w.shape)}, expected {[dirs, gates * hidden, size]}"
        )
    if list(r.shape) != [dirs, gates * hidden, hidden]:
        raise ctx.refuse(
            node, f"R has shape {list(r.shape)}, expected {[dirs, gates * hidden, hidden]}"
        )
    outputs = 2 if gates == 3 else 3
    if len(node.outputs) < outputs or not all(node.outputs[:outputs]):
        raise ctx.refuse(node, f"the module writes {outputs} outputs and reads their exponents")
    for index in (0, 1):
        if ctx.value_dtype(node.outputs[index], node) != dtype:
            raise ctx.refuse(node, f"output {node.outputs[index]!r} is not {dtype}")
    e_y = ctx.exponent(node.outputs[0], node)
    e_h = ctx.exponent(node.outputs[1], node)
    if e_y != e_h:
        ctx.notes.append(
            f"node {node.name!r} ({node.op_type}): Y and Y_h have exponents {e_y} and {e_h}; the "
            "runtime rounds h at Y's and multiplies it by R as if at Y_h's, and so does this "
            "simulation"
        )
    bias = None
    if present(node, 3):
        b = int_input(ctx, node, 3, "B", np.dtype(np.int16))
        if b.size != dirs * 2 * gates * hidden:
            raise ctx.refuse(node, f"B has {b.size} values, expected {dirs * 2 * gates * hidden}")
        note_exponent(ctx, node, 3, gate_exponent, "the gate exponent")
        bias = b.reshape(dirs, 2 * gates * hidden).astype(np.int64)
    if present(node, 4):
        lens = np.asarray(ctx.value(node.inputs[4], node)).reshape(-1)
        if np.any(lens != seq):
            raise ctx.refuse(
                node,
                f"sequence_lens {lens.tolist()} differ from the sequence length {seq}; the "
                "runtime ignores sequence_lens",
            )
    initial_h = None
    if present(node, 5):
        h0 = int_input(ctx, node, 5, "initial_h", dtype)
        if h0.size != dirs * hidden:
            raise ctx.refuse(node, f"initial_h has {h0.size} values, expected {dirs * hidden}")
        note_exponent(ctx, node, 5, e_h, "Y_h's exponent")
        initial_h = h0.reshape(dirs, hidden).astype(np.int64)
    e_x = ctx.exponent(node.inputs[0], node)
    w_shift = gate_exponent - (e_x + ctx.exponent(node.inputs[1], node))
    r_shift = gate_exponent - (e_h + ctx.exponent(node.inputs[2], node))
    return RnnInputs(
        hidden,
        dirs,
        gate_exponent,
        dtype,
        x.reshape(seq, size).astype(np.int64),
        w.astype(np.int64),
        r.astype(np.int64),
        bias,
        initial_h,
        w_shift,
        r_shift,
        e_y,
        e_h,
    )


def note_exponent(ctx: Context, node: Node, index: int, expected: int, what: str) -> None:
    """Note (in ``ctx.notes``) an input whose exponent is not the one the module assumes.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor
        >>> ctx = Context(EspdlModel([], {"b": Tensor("b", np.zeros(1, np.int16), [-8])}), "c")
        >>> note_exponent(ctx, Node("n", "GRU", ["b"], []), 0, -9, "the gate exponent")
        >>> ctx.notes[0][:44]
        "node 'n' (GRU): 'b' has exponent -8, not the"
    """
    name = node.inputs[index]
    exponent = ctx.exponent(name, node)
    if exponent != expected:
        ctx.notes.append(
            f"node {node.name!r} ({node.op_type}): {name!r} has exponent {exponent}, not "
            f"{what} {expected}; the runtime uses its integers as they are, and so does this "
            "simulation"
        )


def steps(seq: int, direction: int) -> range:
    """The time steps a direction walks: forward for the first, backward for the second.

    Example:
        >>> list(steps(3, 0)), list(steps(3, 1))
        ([0, 1, 2], [2, 1, 0])
    """
    return range(seq) if direction == 0 else range(seq - 1, -1, -1)
