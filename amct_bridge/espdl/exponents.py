"""Input and output exponents of exported chains, from the calibration sidecar and the record.

ESP-DL v1 tensors are ``int * 2^e``; a layer's output exponent is a free choice (we take the
smallest one whose symmetric range covers the calibrated range), its input exponent is whatever
its producer wrote. Sources, first match wins (each result says which one it used):

output_exponent of a chain (range of the chain's last layer, after the fused activation):
  1. sidecar ``output`` range of that layer, or the ``input`` range of a single-input layer
     reading it (the same tensor: e.g. a skipped ReLU6 after a folded BN);
  2. sidecar ``input`` range of the next exported layer, when the chain output reaches it only
     through exponent-keeping layers (MaxPool, Reshape, Flatten, ReLU...);
  3. the record's ``scale_d``/``offset_d`` of that next layer (the range AMCT quantizes it to);
  4. for a chain ending in a folded BN: a bound from the conv's own output range pushed through
     the BN per channel (with a warning: coarser than a calibrated range);
  a range of exactly [0, 0] takes the chain's input exponent (with a warning); a runtime layer
  (Add2D, average pool) with a [0, 0] range takes its inputs' largest exponent
  (:meth:`ExponentFinder.zero_runtime`).
input_exponent of a chain:
  1. the output exponent of the exported chain feeding it (through exponent-keeping layers), or
     of an Add2D / average pool (:mod:`amct_bridge.espdl.v1.runtime` adds those to
     ``chain_outputs``): the runtime has exactly that tensor, anything else mis-scales the bias;
  2. sidecar ``input`` range of the layer; 3. the record's ``scale_d``/``offset_d`` of the layer.

Example:
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> stats = CalibrationStats(layers={"c": LayerStats("Conv2D", output=TensorRange(0.0, 6.0))})
    >>> ExponentFinder([], None, stats, bits=8).range_exponent("c", "output")
    (-4, "sidecar output range of 'c'", (0.0, 6.0))
"""

from __future__ import annotations

import numpy as np

from amct_bridge.errors import ExportError, QuantError
from amct_bridge.espdl.plan import Chain, consumers_map
from amct_bridge.espdl.source import WEIGHT_OPS, SourceLayer, keeps_exponent
from amct_bridge.quant.espdl import range_to_exponent, scale_offset_to_exponent
from amct_bridge.quant.fold import fold_batchnorm
from amct_bridge.records.calibration import CalibrationStats
from amct_bridge.records.model import Record

Found = tuple[int, str, tuple[float, float] | None]


class ExponentFinder:
    """Looks exponents up for chains, in execution order (see the module docstring).

    Example:
        >>> ExponentFinder([], None, None, bits=16).bits
        16
    """

    def __init__(
        self,
        layers: list[SourceLayer],
        record: Record | None,
        stats: CalibrationStats | None,
        *,
        bits: int,
        overrides: dict[tuple[str, str], int] | None = None,
    ) -> None:
        self.layers = {layer.name: layer for layer in layers}
        self.consumers = consumers_map(layers)
        self.record = record
        self.stats = stats
        self.bits = bits
        self.chain_outputs: dict[str, int] = {}
        self.warnings: list[str] = []
        #: chosen exponents that replace the range rule: ``(layer, "input" / "output")`` for
        #: a range lookup, ``(conv, "filter")`` for a per-tensor filter (exponent_search)
        self.overrides: dict[tuple[str, str], int] = dict(overrides or {})

    def range_exponent(self, name: str, side: str) -> Found | None:
        """Exponent from the sidecar's ``side`` ("input"/"output", or "preactivation": a
        conv/dense's output before its fused activation) range of layer ``name`` (an entry of
        ``overrides`` first: a searched exponent)."""
        entry = self.stats.layers.get(name) if self.stats else None
        if entry is None and self.stats and name in self.layers:  # a shared layer's call
            entry = self.stats.layers.get(self.layers[name].attrs.get("record_key", name))
        rng = getattr(entry, side, None) if entry else None
        if (name, side) in self.overrides:
            exp = int(self.overrides[(name, side)])
            span = None if rng is None else (float(rng.min), float(rng.max))
            return exp, f"searched on the calibration data ({side} of {name!r})", span
        if rng is None:
            return None
        try:
            exp = range_to_exponent(rng.min, rng.max, self.bits)
        except QuantError as err:
            raise ExportError(f"calibration sidecar, layer {name!r}, {side}: {err}") from None
        return exp, f"sidecar {side} range of {name!r}", (float(rng.min), float(rng.max))

    def record_exponent(self, name: str) -> Found | None:
        """Exponent covering the range the record's scale_d/offset_d of ``name`` encode."""
        key = self.layers[name].attrs.get("record_key", name) if name in self.layers else name
        factors = self.record.layers.get(key) if self.record else None
        if factors is None or factors.scale_d is None or factors.offset_d is None:
            return None
        act_bits = 16 if (factors.act_type or "INT8").upper() == "INT16" else 8
        if (factors.dst_type or "").upper() == "INT4":  # a QAT record: INT4 activations
            act_bits = 4
        try:
            exp = scale_offset_to_exponent(factors.scale_d, factors.offset_d, act_bits, self.bits)
        except QuantError as err:
            raise ExportError(f"record, layer {name!r}: scale_d/offset_d: {err}") from None
        qmin, qmax = -(2 ** (act_bits - 1)), 2 ** (act_bits - 1) - 1
        lo = (qmin - factors.offset_d) * factors.scale_d
        hi = (qmax - factors.offset_d) * factors.scale_d
        return exp, f"record scale_d/offset_d of {name!r}", (float(lo), float(hi))

    def _next_weight_layer(self, name: str) -> SourceLayer | None:
        """The conv/dense that alone reads ``name``'s output through exponent-keeping layers."""
        current = self.layers.get(name)
        while current is not None:
            users = self.consumers.get(current.name, [])
            if len(users) != 1 or current.attrs.get("model_output"):
                return None
            user = users[0]
            if user.op in WEIGHT_OPS and user.inputs == [current.name]:
                return user
            if not (keeps_exponent(user) and len(user.inputs) == 1):
                return None
            current = user
        return None

    def _feeding_chain(self, head: SourceLayer) -> Found | None:
        if len(head.inputs) != 1:
            return None
        current = self.layers.get(head.inputs[0])
        while current is not None:
            if current.name in self.chain_outputs:
                exp = self.chain_outputs[current.name]
                return exp, f"output exponent of {current.name!r}", None
            # Multi-input exponent-keeping layers (Concat) have one exponent on all inputs.
            if not (keeps_exponent(current) and current.inputs):
                return None
            current = self.layers.get(current.inputs[0])
        return None

    def _reader_input(self, name: str) -> Found | None:
        """Sidecar input range of a single-input layer reading ``name`` (the same tensor)."""
        for user in self.consumers.get(name, []):
            if user.inputs == [name]:
                found = self.range_exponent(user.name, "input")
                if found is not None:
                    return found
        return None

    def _bn_bound(self, chain: Chain) -> Found | None:
        """Bound of a chain ending in a folded BN from the conv's own output range.

        Each channel of the BN output is ``s_c * x + t_c`` with x in the conv's range, so the
        union over channels bounds it (coarser than a calibrated BN range, never saturating).
        """
        if chain.bn is None or chain.last != chain.bn.name:
            return None
        found = self.range_exponent(chain.head.name, "output")
        if found is None or found[2] is None:
            return None
        lo, hi = found[2]
        channels = chain.head.out_channels or 1
        ones = np.ones((1, 1, 1, channels))
        w = chain.bn.weights
        try:
            scale, shift = fold_batchnorm(
                ones,
                None,
                w.get("gamma"),
                w.get("beta"),
                w["mean"],
                w["variance"],
                float(chain.bn.attrs.get("epsilon", 1e-3)),
                "HWIO",
                name=chain.bn.name,
            )
        except (KeyError, QuantError):
            return None  # the coefficients step reports the bad BN precisely
        ends = np.stack([scale.ravel() * lo + shift, scale.ravel() * hi + shift])
        bound = (float(ends.min()), float(ends.max()))
        exp = range_to_exponent(bound[0], bound[1], self.bits)
        self.warnings.append(
            f"layer {chain.head.name!r}: no calibrated range for {chain.last!r}; output_exponent "
            f"{exp} bounds it from the output range of {chain.head.name!r} through the BN (may be "
            "coarser than needed: calibrate with BatchNormalization outputs in the sidecar)"
        )
        source = (
            f"bound from the sidecar output range of {chain.head.name!r} through {chain.last!r}"
        )
        return exp, source, bound

    def output_exponent(self, chain: Chain) -> Found:
        """The chain's output exponent and where it came from; ExportError if none."""
        found = self.range_exponent(chain.last, "output") or self._reader_input(chain.last)
        nxt = self._next_weight_layer(chain.last)
        if found is None and nxt is not None:
            found = self.range_exponent(nxt.name, "input") or self.record_exponent(nxt.name)
        if found is None:
            found = self._bn_bound(chain)
        if found is None:
            hint = f" nor an input range / scale_d for its reader {nxt.name!r}" if nxt else ""
            if self.stats is None or not self.stats.layers:
                fix = (
                    "pass the sidecar the calibration wrote beside the record "
                    "(<record>.calib.json): give the record's path, or stats= / --stats (a "
                    "Record object carries no sidecar)"
                )
            else:  # a sidecar was read: telling the user to pass one misleads
                fix = (
                    f"the sidecar has {len(self.stats.layers)} entries but none for "
                    f"{chain.last!r}: was it made for this model, or by an amct_bridge that "
                    "did not observe that layer (QAT skip_layers before 2026-12)? Calibrate or "
                    "save the QAT record again"
                )
            raise ExportError(
                f"layer {chain.head.name!r}: cannot choose output_exponent: no calibrated output "
                f"range for {chain.last!r} in the calibration sidecar{self._sidecar_hint(chain)}"
                f"{hint}; {fix}"
            )
        if found[2] is not None and found[2][0] == found[2][1] == 0.0:
            found = self._zero_output(chain, found)
        self.chain_outputs[chain.last] = found[0]
        return found

    def _sidecar_hint(self, chain: Chain) -> str:
        """The sidecar's file, and whether it was written with another record."""
        if self.stats is None:
            return " (none given)"
        text = f" {self.stats.source}" if self.stats.source else ""
        written = self.stats.record_keys
        keys = set(self.record.layers) if self.record is not None else set()
        if written is not None and chain.head.name in keys and chain.head.name not in written:
            text += (
                f" (written with a record that has no {chain.head.name!r}, unlike this record: "
                "the sidecar of another calibration?)"
            )
        return text

    def _zero_output(self, chain: Chain, found: Found) -> Found:
        """A chain whose output was exactly 0 on every calibration batch (a zero-initialised BN
        gamma, a dead branch): any exponent holds it, and exponent 0 would make an Add2D after
        it drop the other input's fraction bits (the sum takes the larger exponent). Take the
        chain's input exponent instead, with a warning."""
        source = self.input_exponent(chain)
        exp = source[0] if source is not None else found[0]
        self.warnings.append(
            f"layer {chain.head.name!r}: the output of {chain.last!r} was 0 on every calibration "
            f"batch ({found[1]} is [0, 0], e.g. a zero-initialised BatchNormalization gamma); "
            f"output_exponent {exp} is its input's: recalibrate once it computes something"
        )
        if source is None:
            return found
        return exp, f"{found[1]} is [0, 0]: the input's exponent ({source[1]})", found[2]

    @staticmethod
    def is_zero_range(found: Found | None) -> bool:
        """True for a calibrated range of exactly [0, 0] (not a searched exponent).

        Example:
            >>> ExponentFinder.is_zero_range((0, "sidecar output range of 'a'", (0.0, 0.0)))
            True
        """
        return (
            found is not None
            and found[2] is not None
            and found[2][0] == found[2][1] == 0.0
            and not found[1].startswith("searched")
        )

    def zero_runtime(self, name: str, found: Found, exp: int, why: str) -> Found:
        """A runtime layer (Add2D, average pool, activation) whose calibrated output was 0 on
        every batch: its exponent ``exp`` comes from its inputs (``why``), not 0, which would
        floor every later value to whole numbers (a MobileNetV2 block whose branch died
        in QAT: -122 dB after its Add2D). Warns like a chain's zero output."""
        self.warnings.append(
            f"layer {name!r}: the output of {name!r} was 0 on every calibration batch "
            f"({found[1]} is [0, 0]); output_exponent {exp} is {why}: recalibrate once it "
            "computes something"
        )
        return exp, f"{found[1]} is [0, 0]: {why}", found[2]

    def input_exponent(self, chain: Chain) -> Found | None:
        """The chain's input exponent and its source, or None when nothing gives one."""
        name = chain.head.name
        return (
            self._feeding_chain(chain.head)
            or self.range_exponent(name, "input")
            or self.record_exponent(name)
        )
