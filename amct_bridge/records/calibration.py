"""Calibration sidecar: per-layer activation ranges that AMCT records do not hold.

The Keras callback writes it next to the record (``record.txt`` -> ``record.txt.calib.json``);
the ESP-DL exporter reads OUTPUT ranges from it (ESP-DL needs each layer's output exponent).
JSON, one object per layer, in model execution order.

Example:
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> stats = CalibrationStats(algorithm="minmax", batches=2)
    >>> stats.layers["conv1"] = LayerStats("Conv2D", input=TensorRange(0.0, 1.0),
    ...                                    output=TensorRange(-2.0, 3.0))
    >>> CalibrationStats.from_json(stats.to_json()).layers["conv1"].output.max
    3.0
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from amct_bridge.errors import RecordError
from amct_bridge.records.atomic import atomic_write_bytes

FORMAT = "amct_bridge.calibration/1"


@dataclass
class TensorRange:
    """Range of one tensor: ``min``/``max`` = the clip range the algorithm chose (what the
    factors encode); ``observed_min``/``observed_max`` = raw extremes seen (None if unknown)."""

    min: float
    max: float
    observed_min: float | None = None
    observed_max: float | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class LayerStats:
    """Statistics of one layer: its Keras/MindSpore class name (``kind``), input and output.

    ``preactivation``: for a Conv/Dense with a fused non-linear activation
    (``Dense(activation="softmax")``, ``nn.Dense(..., activation="sigmoid")``), the range of
    its output *before* that activation (a classifier's logits), measured during calibration;
    ``output`` is after it. None: not such a layer, or a sidecar written before the field
    existed (the exports then estimate it, see docs/espdl-export.md).

    Example:
        >>> LayerStats("Dense", output=TensorRange(0.0, 1.0),
        ...            preactivation=TensorRange(-7.5, 9.0)).preactivation.max
        9.0
    """

    kind: str
    input: TensorRange | None = None
    output: TensorRange | None = None
    preactivation: TensorRange | None = None


@dataclass
class LayerShape:
    """What the calibration saw of one layer of the model (the sidecar's ``model``): its kind
    and, for a quantized part with weights, the kernel's shape in the framework's ``layout``
    (``HWIO``, ``OIHW``...). An export of another model is refused by these, by layer name.

    Example:
        >>> LayerShape("Conv2D", (3, 3, 1, 4), "HWIO").to_dict()
        {'kind': 'Conv2D', 'kernel': [3, 3, 1, 4], 'layout': 'HWIO'}
    """

    kind: str
    kernel: tuple[int, ...] | None = None
    layout: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict (no kernel: the kind alone)."""
        if self.kernel is None:
            return {"kind": self.kind}
        return {"kind": self.kind, "kernel": list(self.kernel), "layout": self.layout}


@dataclass
class CalibrationStats:
    """All layers' statistics plus how they were gathered.

    ``record_keys``: the keys of the record written with this sidecar (None: not known, e.g. a
    sidecar written before the field existed), so a record cut short or edited afterwards can
    be told from layers the calibration skipped. ``warnings``: every warning of the
    calibration, in full (the log folds a warning repeated for many layers into one line).
    ``flavor``: the flavor the record was written as (None: not known, an older sidecar), which
    ``inspect`` and ``validate`` lead with. ``model``: every layer of the calibrated model by key
    (and every quantized part with weights by record key) with its kind and kernel shape
    (:class:`LayerShape`; None: an older sidecar), so that the export refuses another model.
    ``source``: the file it was read from (not written).
    """

    algorithm: str = "ifmr"
    batches: int = 0
    layers: dict[str, LayerStats] = field(default_factory=dict)
    record_keys: list[str] | None = None
    warnings: list[str] = field(default_factory=list)
    flavor: str | None = None
    model: dict[str, LayerShape] | None = None
    source: str | None = field(default=None, compare=False)

    def to_json(self) -> str:
        """Deterministic JSON text (keys in execution order)."""
        doc = {
            "format": FORMAT,
            "algorithm": self.algorithm,
            "batches": self.batches,
            "layers": {
                name: {
                    "kind": s.kind,
                    **({"input": s.input.to_dict()} if s.input else {}),
                    **({"output": s.output.to_dict()} if s.output else {}),
                    **({"preactivation": s.preactivation.to_dict()} if s.preactivation else {}),
                }
                for name, s in self.layers.items()
            },
        }
        if self.record_keys is not None:
            doc["record_keys"] = list(self.record_keys)
        if self.warnings:
            doc["warnings"] = list(self.warnings)
        if self.flavor is not None:
            doc["flavor"] = self.flavor
        if self.model is not None:
            doc["model"] = {name: shape.to_dict() for name, shape in self.model.items()}
        return json.dumps(doc, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> CalibrationStats:
        """Parse :meth:`to_json` output; errors name ``source`` and the bad layer/field."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise RecordError(f"{source}:{err.lineno}:{err.colno}: not JSON: {err.msg}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise RecordError(f"{source}: not a calibration sidecar (expected format {FORMAT!r})")
        batches, layers = doc.get("batches", 0), doc.get("layers", {})
        # shapes checked here: a hand-edited sidecar must fail with its name, not a TypeError
        if not isinstance(batches, int) or isinstance(batches, bool):
            raise RecordError(f"{source}: batches: expected an integer, got {batches!r}")
        if not isinstance(layers, dict):
            raise RecordError(f"{source}: layers: expected an object of layers, got {layers!r}")
        named = source if source != "<string>" else None
        stats = cls(algorithm=str(doc.get("algorithm", "")), batches=batches, source=named)
        for key in ("record_keys", "warnings"):
            value = doc.get(key)
            if value is not None and not (
                isinstance(value, list) and all(isinstance(v, str) for v in value)
            ):
                raise RecordError(f"{source}: {key}: expected a list of strings, got {value!r}")
        stats.record_keys = doc.get("record_keys")
        stats.warnings = doc.get("warnings") or []
        flavor = doc.get("flavor")
        if flavor is not None and not isinstance(flavor, str):
            raise RecordError(f"{source}: flavor: expected a string, got {flavor!r}")
        stats.flavor = flavor
        if doc.get("model") is not None:
            stats.model = _model(doc["model"], source)
        for name, entry in layers.items():
            try:
                if not isinstance(entry, dict) or not isinstance(entry["kind"], str):
                    raise TypeError("expected an object with a string 'kind'")
                stats.layers[name] = LayerStats(
                    kind=entry["kind"],
                    input=_range(entry["input"]) if "input" in entry else None,
                    output=_range(entry["output"]) if "output" in entry else None,
                    preactivation=(
                        _range(entry["preactivation"]) if "preactivation" in entry else None
                    ),
                )
            except (KeyError, TypeError) as err:
                raise RecordError(f"{source}: layer {name!r}: bad entry ({err})") from None
        return stats


def _model(doc: object, source: str) -> dict[str, LayerShape]:
    """The sidecar's ``model`` object; a bad entry is named (a hand-edited sidecar)."""
    if not isinstance(doc, dict):
        raise RecordError(f"{source}: model: expected an object of layers, got {doc!r}")
    model = {}
    for name, entry in doc.items():
        kernel = entry.get("kernel") if isinstance(entry, dict) else None
        layout = entry.get("layout") if isinstance(entry, dict) else None
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("kind"), str)
            or (kernel is None) != (layout is None)
            or (layout is not None and not isinstance(layout, str))
            or (
                kernel is not None
                and not (
                    isinstance(kernel, list)
                    and all(isinstance(d, int) and not isinstance(d, bool) for d in kernel)
                )
            )
        ):
            raise RecordError(
                f"{source}: model: layer {name!r}: expected an object with a string 'kind' "
                f"and optionally 'kernel' (a list of integers) with its 'layout', got {entry!r}"
            )
        model[name] = LayerShape(entry["kind"], None if kernel is None else tuple(kernel), layout)
    return model


def _range(doc: object) -> TensorRange:
    if not isinstance(doc, dict):
        raise TypeError(f"a range must be an object, got {doc!r}")
    got = TensorRange(**doc)  # TypeError names a missing or unknown key
    for key, value in got.__dict__.items():
        if value is None and key in ("min", "max"):
            raise TypeError(f"range {key} must be a number, got null")
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise TypeError(f"range {key} must be a number, got {value!r}")
        if value is not None:
            setattr(got, key, float(value))
    return got


def sidecar_path(record_path: str | os.PathLike) -> Path:
    """Where the sidecar of ``record_path`` lives: ``<record_path>.calib.json``.

    Example:
        >>> sidecar_path("out/record.txt").name
        'record.txt.calib.json'
    """
    path = Path(record_path)
    return path.with_name(path.name + ".calib.json")


def record_lacks(lacking: list[str], record: str | None, sidecar: str | None) -> str:
    """The message on record entries the sidecar says were written and the record lacks.

    Example:
        >>> record_lacks(["fc"], "r.txt", None)  # doctest: +ELLIPSIS
        "r.txt: the record lacks 1 layer that the sidecar says were calibrated (truncated ...
    """
    where = f"{record}: " if record else ""
    side = f" ({sidecar})" if sidecar else ""
    shown = ", ".join(map(repr, lacking[:5])) + (
        f" and {len(lacking) - 5} more" if len(lacking) > 5 else ""
    )
    count = f"{len(lacking)} layer{'s' if len(lacking) != 1 else ''}"
    return (
        f"{where}the record lacks {count} that the sidecar{side} says were "
        f"calibrated (truncated or edited record?): {shown}; calibrate again, or restore the "
        "record written with this sidecar"
    )


def save_stats(stats: CalibrationStats, path: str | os.PathLike) -> None:
    """Write ``stats`` to ``path`` atomically."""
    atomic_write_bytes(path, stats.to_json().encode())


def load_stats(path: str | os.PathLike) -> CalibrationStats:
    """Read a sidecar written by :func:`save_stats`."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise RecordError(f"{path}: cannot read calibration sidecar: {err.strerror}") from None
    except UnicodeDecodeError:
        from amct_bridge.records.sniff import describe_file

        kind = describe_file(path) or "binary data (not UTF-8 text)"
        raise RecordError(
            f"{path}: not a calibration sidecar: it looks like {kind}; expected "
            "the JSON the calibration writes beside the record (<record>.calib.json)"
        ) from None
    return CalibrationStats.from_json(text, source=str(path))
