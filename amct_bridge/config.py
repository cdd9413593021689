"""AMCT "simple config" files: read them into plain settings (framework-free).

AMCT users describe post-training calibration in protobuf text (``create_quant_config``'s
``config_file``)::

    batch_num : 1
    activation_offset : true
    common_config : {
        arq_quantize : { channel_wise : true }
        ifmr_quantize : { search_range_start : 0.7  search_range_end : 1.3 ... }
    }
    override_layer_configs : { layer_name : "conv1"
                               calibration_config : { hfmg_quantize : { num_of_bins : 1024 } } }

:func:`load_simple_config` parses that (schema: ``proto/amct_simple_config.proto``, AMCT's field
names; an unknown field is an error naming file, line and column) into a :class:`QuantConfig`
whose :meth:`QuantConfig.for_layer` resolves the effective :class:`LayerQuantConfig` of one layer
(override by name > override by type > common config). Retrain (QAT/pruning) configs are read by
:func:`load_retrain_config`.

Example:
    >>> text = "batch_num: 2\\ncommon_config { hfmg_quantize { num_of_bins: 1024 } }"
    >>> cfg = parse_simple_config(text)
    >>> cfg.batch_num, cfg.for_layer("conv1", ("Conv2D",)).algorithm
    (2, 'hfmg')
    >>> cfg.for_layer("conv1", ("Conv2D",)).options
    {'num_of_bins': 1024}
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from google.protobuf import text_format

from amct_bridge.errors import CalibrationError
from amct_bridge.records._pb import amct_simple_config_pb2 as pb

#: Activation algorithms the Keras callback knows (AMCT's ifmr/hfmg plus common extras).
ALGORITHMS = ("ifmr", "hfmg", "minmax", "percentile", "ema")

#: IFMR options and AMCT's defaults (``ifmr_quantize``).
IFMR_DEFAULTS = {
    "max_percentile": 0.999999,
    "min_percentile": 0.999999,
    "search_range_start": 0.7,
    "search_range_end": 1.3,
    "search_step": 0.01,
}
#: HFMG options and AMCT's default (``hfmg_quantize``); AMCT allows these bin counts only.
HFMG_DEFAULTS = {"num_of_bins": 4096}
HFMG_BINS = (1024, 2048, 4096, 8192)
#: DMQ migration strength range (``dmq_balancer``).
MIGRATION_RANGE = (0.2, 0.8)
ACT_TYPES = ("INT8", "INT16")


@dataclass(frozen=True)
class LayerQuantConfig:
    """Effective calibration settings of one layer.

    Args:
        algorithm: activation algorithm ("ifmr", "hfmg", "minmax", "percentile", "ema").
        options: that algorithm's options (AMCT names), e.g. ``{"num_of_bins": 4096}``.
        channel_wise: per-output-channel weight scales (ARQ) where the layer type allows it.
        act_type: "INT8" or "INT16" activations, in any case ("int8" is stored as "INT8", as
            AMCT's data type names are matched); anything else is a CalibrationError.
        migration_strength: DMQ balancer strength, or None when DMQ is off.

    Example:
        >>> LayerQuantConfig().algorithm, LayerQuantConfig(act_type="int16").act_type
        ('ifmr', 'INT16')
    """

    algorithm: str = "ifmr"
    options: dict = field(default_factory=lambda: dict(IFMR_DEFAULTS))
    channel_wise: bool = True
    act_type: str = "INT8"
    migration_strength: float | None = None

    def __post_init__(self) -> None:
        # Normalized here so that every way in (constructor, replace, config file, callback
        # argument) gives the record's spelling; a lower-case "int8" must not reach a record.
        name = str(self.act_type).upper()
        if name not in ACT_TYPES:
            raise CalibrationError(
                f"act_type must be {' or '.join(ACT_TYPES)} (any case), got {self.act_type!r}"
            )
        object.__setattr__(self, "act_type", name)


@dataclass
class QuantConfig:
    """A whole simple config: global settings plus per-type / per-name overrides.

    Example:
        >>> QuantConfig(skip_layers=["fc"]).is_skipped("fc", ("Dense", "MatMul"))
        True
    """

    #: batches to calibrate on, None when the config does not say (the caller's default: every
    #: batch for the callbacks; AMCT's own default is 1, and AMCT writes it into its configs)
    batch_num: int | None = None
    activation_offset: bool = True
    joint_quant: bool = False
    skip_layers: list[str] = field(default_factory=list)
    skip_layer_types: list[str] = field(default_factory=list)
    do_fusion: bool = True
    skip_fusion_layers: list[str] = field(default_factory=list)
    common: LayerQuantConfig = field(default_factory=LayerQuantConfig)
    by_type: dict[str, LayerQuantConfig] = field(default_factory=dict)
    by_name: dict[str, LayerQuantConfig] = field(default_factory=dict)

    def for_layer(self, name: str, types: tuple[str, ...]) -> LayerQuantConfig:
        """Settings of layer ``name`` with type names ``types`` (Keras class, TF op type)."""
        if name in self.by_name:
            return self.by_name[name]
        for type_name in types:
            if type_name in self.by_type:
                return self.by_type[type_name]
        return self.common

    def is_skipped(self, name: str, types: tuple[str, ...]) -> bool:
        """True if ``name`` or one of its ``types`` is listed in skip_layers/skip_layer_types."""
        return name in self.skip_layers or any(t in self.skip_layer_types for t in types)

    def skips_fusion(self, name: str) -> bool:
        """True if Conv+BN folding is off for ``name`` (do_fusion false or skip_fusion_layers)."""
        return not self.do_fusion or name in self.skip_fusion_layers


def parse_simple_config(text: str, source: str = "<string>") -> QuantConfig:
    """Parse simple-config protobuf text; errors name ``source``, line and column.

    Example:
        >>> parse_simple_config("skip_layers: 'fc'").skip_layers
        ['fc']
    """
    msg = pb.AMCTConfig()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as err:
        raise CalibrationError(
            f"{source}:{err}: not an AMCT quantization config (see proto/amct_simple_config.proto)"
        ) from None
    return _from_message(msg, source)


def load_simple_config(path: str | os.PathLike) -> QuantConfig:
    """Read an AMCT simple config file (e.g. ``tf_yolo_v3_quant.cfg``).

    Example:
        >>> import tempfile
        >>> p = tempfile.mktemp(suffix=".cfg")
        >>> _ = open(p, "w").write("batch_num : 4\\nactivation_offset : false\\n")
        >>> load_simple_config(p).activation_offset
        False
    """
    return parse_simple_config(_read(path), source=str(path))


def load_retrain_config(path: str | os.PathLike):
    """Read an AMCT retrain (QAT / pruning) config into its protobuf message.

    Returns an ``AMCTRetrainConfig`` message (fields as in AMCT: ``retrain_data_quant_config``,
    ``retrain_weight_quant_config``, ``prune_config``...); unknown fields are errors.

    Example:
        >>> import tempfile
        >>> p = tempfile.mktemp(suffix=".cfg")
        >>> _ = open(p, "w").write("retrain_weight_quant_config { arq_retrain { dst_type: INT4 } }")
        >>> cfg = load_retrain_config(p)
        >>> pb.DataType.Name(cfg.retrain_weight_quant_config.arq_retrain.dst_type)
        'INT4'
    """
    msg = pb.AMCTRetrainConfig()
    try:
        text_format.Parse(_read(path), msg)
    except text_format.ParseError as err:
        raise CalibrationError(f"{path}:{err}: not an AMCT retrain config") from None
    return msg


def _read(path: str | os.PathLike) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise CalibrationError(f"{path}: cannot read config file: {err}") from None


def _from_message(msg: pb.AMCTConfig, source: str) -> QuantConfig:
    if msg.batch_num < 1:
        raise CalibrationError(f"{source}: batch_num must be >= 1, got {msg.batch_num}")
    base = LayerQuantConfig()
    common = _layer_config(msg.common_config, base, f"{source}: common_config")
    by_type = {}
    for entry in msg.override_layer_types:
        where = f"{source}: override_layer_types {entry.layer_type!r}"
        by_type[entry.layer_type] = _layer_config(entry.calibration_config, common, where)
    by_name = {}
    for entry in msg.override_layer_configs:
        where = f"{source}: override_layer_configs {entry.layer_name!r}"
        by_name[entry.layer_name] = _layer_config(entry.calibration_config, common, where)
    return QuantConfig(
        batch_num=msg.batch_num if msg.HasField("batch_num") else None,
        activation_offset=msg.activation_offset,
        joint_quant=msg.joint_quant,
        skip_layers=list(msg.skip_layers),
        skip_layer_types=list(msg.skip_layer_types),
        do_fusion=msg.do_fusion,
        skip_fusion_layers=list(msg.skip_fusion_layers),
        common=common,
        by_type=by_type,
        by_name=by_name,
    )


def _layer_config(
    msg: pb.CalibrationConfig, inherit: LayerQuantConfig, where: str
) -> LayerQuantConfig:
    """Fields set in ``msg`` replace those of ``inherit`` (unset sections are inherited)."""
    out = inherit
    if msg.HasField("arq_quantize"):
        out = replace(out, channel_wise=msg.arq_quantize.channel_wise)
    if msg.HasField("ifmr_quantize"):
        algo = msg.ifmr_quantize
        opts = {k: float(getattr(algo, k)) for k in IFMR_DEFAULTS}
        # proto floats are float32: print with 7 digits so 0.999999 stays 0.999999
        opts = {k: float(f"{v:.7g}") for k, v in opts.items()}
        _check_ifmr(opts, where)
        out = replace(out, algorithm="ifmr", options=opts, act_type=_act_type(algo, where))
    if msg.HasField("hfmg_quantize"):
        algo = msg.hfmg_quantize
        if algo.num_of_bins not in HFMG_BINS:
            raise CalibrationError(
                f"{where}: hfmg_quantize.num_of_bins must be one of {HFMG_BINS}, "
                f"got {algo.num_of_bins}"
            )
        out = replace(
            out,
            algorithm="hfmg",
            options={"num_of_bins": algo.num_of_bins},
            act_type=_act_type(algo, where),
        )
    if msg.HasField("dmq_balancer"):
        strength = float(f"{msg.dmq_balancer.migration_strength:.7g}")
        check_migration_strength(strength, where)
        out = replace(out, migration_strength=strength)
    return out


def _act_type(algo, where: str) -> str:
    name = pb.DataType.Name(algo.dst_type)
    if name not in ACT_TYPES:
        raise CalibrationError(f"{where}: dst_type must be INT8 or INT16, got {name}")
    return name


def _check_ifmr(opts: dict, where: str) -> None:
    for key in ("max_percentile", "min_percentile"):
        if not 0.5 < opts[key] <= 1.0:
            raise CalibrationError(f"{where}: {key} must be in (0.5, 1], got {opts[key]}")
    start, end, step = opts["search_range_start"], opts["search_range_end"], opts["search_step"]
    if not 0 < start < end < math.inf or not 0 < step < math.inf:  # inf: an endless search
        raise CalibrationError(
            f"{where}: need 0 < search_range_start < search_range_end and search_step > 0, "
            f"got {start}, {end}, {step}"
        )


def check_migration_strength(value: float, where: str = "migration_strength") -> None:
    """Refuse a DMQ strength outside AMCT's [0.2, 0.8].

    Example:
        >>> check_migration_strength(0.5)
    """
    lo, hi = MIGRATION_RANGE
    if not lo <= value <= hi:
        raise CalibrationError(f"{where}: migration_strength must be in [{lo}, {hi}], got {value}")


#: Default options per algorithm (the ones AMCT's config does not cover use the observer's own).
DEFAULT_OPTIONS = {"ifmr": IFMR_DEFAULTS, "hfmg": HFMG_DEFAULTS}


def resolve_config(
    config: str | os.PathLike | QuantConfig | None = None,
    *,
    algorithm: str | None = None,
    algorithm_options: dict | None = None,
    activation_offset: bool | None = None,
    channel_wise: bool | None = None,
    act_type: str | None = None,
    skip_layers: list[str] | None = None,
    skip_fusion_layers: list[str] | None = None,
    migration_strength: float | None = None,
    joint_quant: bool | None = None,
) -> tuple[QuantConfig, bool]:
    """A config file / object (or AMCT defaults) with explicit arguments applied on top.

    Explicit arguments replace the common settings and the global flags; per-type / per-name
    overrides from the file keep winning for their layers. Returns ``(config, from_file)``.

    Example:
        >>> cfg, from_file = resolve_config(algorithm="minmax", act_type="INT16")
        >>> cfg.common.algorithm, cfg.common.act_type, cfg.common.options, from_file
        ('minmax', 'INT16', {}, False)
    """
    from_file = isinstance(config, (str, os.PathLike))
    if from_file:
        cfg = load_simple_config(config)
    elif config is None:
        cfg = QuantConfig()
    elif isinstance(config, QuantConfig):
        cfg = replace(config)
    else:
        raise CalibrationError(f"config must be a file path or QuantConfig, got {type(config)}")
    common = cfg.common
    if algorithm is not None:
        algo = str(algorithm).lower()
        if algo not in ALGORITHMS:
            raise CalibrationError(
                f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}"
            )
        common = replace(common, algorithm=algo, options=dict(DEFAULT_OPTIONS.get(algo, {})))
    if algorithm_options:
        common = replace(common, options={**common.options, **algorithm_options})
    if common.algorithm == "hfmg" and common.options.get("num_of_bins", 4096) not in HFMG_BINS:
        raise CalibrationError(
            f"hfmg num_of_bins must be one of {HFMG_BINS}, got {common.options['num_of_bins']}"
        )
    if channel_wise is not None:
        common = replace(common, channel_wise=bool(channel_wise))
    if act_type is not None:
        common = replace(common, act_type=act_type)  # checked and normalized by the class
    if migration_strength is not None:
        check_migration_strength(float(migration_strength))
        common = replace(common, migration_strength=float(migration_strength))
    cfg.common = common
    if activation_offset is not None:
        cfg.activation_offset = bool(activation_offset)
    if joint_quant is not None:
        cfg.joint_quant = bool(joint_quant)
    if skip_layers is not None:
        cfg.skip_layers = list(cfg.skip_layers) + list(skip_layers)
    if skip_fusion_layers is not None:
        cfg.skip_fusion_layers = list(cfg.skip_fusion_layers) + list(skip_fusion_layers)
    return cfg, from_file
