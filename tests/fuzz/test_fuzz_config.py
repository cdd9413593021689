"""Fuzz: AMCT simple configs (and retrain configs), valid and corrupted, through
parse_simple_config / load_simple_config / resolve_config / load_retrain_config. Each call gives
a config or a CalibrationError; a config that is accepted must be usable: every layer's settings
name a known algorithm, INT8/INT16, finite options, and IFMR options that give search ratios.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from fuzz_records import corrupt_text
from fuzz_support import attempt, fuzz_settings
from hypothesis import example, given
from hypothesis import strategies as st

from amct_bridge.config import (
    ACT_TYPES,
    ALGORITHMS,
    HFMG_BINS,
    LayerQuantConfig,
    QuantConfig,
    load_retrain_config,
    load_simple_config,
    parse_simple_config,
    resolve_config,
)
from amct_bridge.errors import CalibrationError
from amct_bridge.quant.ifmr import candidate_ratios

FLOATS = st.one_of(
    st.sampled_from(
        [
            "0.7",
            "1.3",
            "0.01",
            "0.999999",
            "0.5",
            "1",
            "0",
            "-1",
            "nan",
            "inf",
            "-inf",
            "1e-30",
            "1e30",
            "0.2",
            "0.8",
        ]
    ),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
INTS = st.one_of(
    st.sampled_from(["0", "1", "4096", "1024", "1000"]), st.integers(-5, 2**33).map(str)
)
DTYPES = st.sampled_from(["INT4", "INT8", "INT16", "INT32", "0", "1", "2", "7"])
NAMES = st.text(max_size=6).map(lambda s: '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"')


@st.composite
def section(draw, name: str, fields: dict) -> str:
    picked = draw(st.lists(st.sampled_from(sorted(fields)), max_size=len(fields), unique=True))
    body = " ".join(f"{f}: {draw(fields[f])}" for f in picked)
    return f"{name} {{ {body} }}"


@st.composite
def calibration_config(draw) -> str:
    parts = []
    if draw(st.booleans()):
        parts.append(
            draw(section("arq_quantize", {"channel_wise": st.sampled_from(["true", "false"])}))
        )
    algo = draw(st.sampled_from([None, "ifmr", "hfmg"]))
    if algo == "ifmr":
        parts.append(
            draw(
                section(
                    "ifmr_quantize",
                    {
                        "search_range_start": FLOATS,
                        "search_range_end": FLOATS,
                        "search_step": FLOATS,
                        "max_percentile": FLOATS,
                        "min_percentile": FLOATS,
                        "asymmetric": st.sampled_from(["true", "false"]),
                        "dst_type": DTYPES,
                    },
                )
            )
        )
    elif algo == "hfmg":
        parts.append(
            draw(
                section(
                    "hfmg_quantize",
                    {
                        "num_of_bins": INTS,
                        "asymmetric": st.sampled_from(["true", "false"]),
                        "dst_type": DTYPES,
                    },
                )
            )
        )
    if draw(st.booleans()):
        parts.append(draw(section("dmq_balancer", {"migration_strength": FLOATS})))
    return " ".join(parts)


@st.composite
def simple_configs(draw) -> str:
    lines = []
    for field, values in {
        "batch_num": INTS,
        "activation_offset": st.sampled_from(["true", "false"]),
        "joint_quant": st.sampled_from(["true", "false"]),
        "do_fusion": st.sampled_from(["true", "false"]),
    }.items():
        if draw(st.booleans()):
            lines.append(f"{field} : {draw(values)}")
    for field in ("skip_layers", "skip_layer_types", "skip_fusion_layers"):
        lines += [f"{field} : {n}" for n in draw(st.lists(NAMES, max_size=2))]
    if draw(st.booleans()):
        lines.append(f"common_config : {{ {draw(calibration_config())} }}")
    for _ in range(draw(st.integers(0, 2))):
        lines.append(
            f"override_layer_types : {{ layer_type : {draw(NAMES)} "
            f"calibration_config : {{ {draw(calibration_config())} }} }}"
        )
    for _ in range(draw(st.integers(0, 2))):
        lines.append(
            f"override_layer_configs : {{ layer_name : {draw(NAMES)} "
            f"calibration_config : {{ {draw(calibration_config())} }} }}"
        )
    return "\n".join(lines)


def check_usable(cfg: QuantConfig) -> None:
    """An accepted config must not fail (or hang) later, in calibration."""
    # None: the file leaves batch_num unset and the caller's data decides
    assert cfg.batch_num is None or cfg.batch_num >= 1
    for layer in [cfg.common, *cfg.by_type.values(), *cfg.by_name.values()]:
        assert isinstance(layer, LayerQuantConfig)
        assert layer.algorithm in ALGORITHMS and layer.act_type in ACT_TYPES
        assert all(math.isfinite(v) for v in layer.options.values()), layer.options
        if layer.algorithm == "hfmg":
            assert layer.options["num_of_bins"] in HFMG_BINS
        if layer.algorithm == "ifmr":
            o = layer.options
            count = (o["search_range_end"] - o["search_range_start"]) / o["search_step"]
            if count < 1e6:  # a search this long is slow, not wrong
                assert (
                    len(
                        candidate_ratios(
                            o["search_range_start"], o["search_range_end"], o["search_step"]
                        )
                    )
                    >= 1
                )
        if layer.migration_strength is not None:
            assert 0.2 <= layer.migration_strength <= 0.8


@fuzz_settings("fast")
@given(simple_configs())
@example("common_config : { ifmr_quantize { search_step: nan } }")
@example("common_config : { ifmr_quantize { search_range_end: inf } }")
def test_simple_configs_parse_or_are_refused(text):
    cfg, err = attempt("config.parse", parse_simple_config, text, "q.cfg")
    if err is None:
        check_usable(cfg)
        cfg2, err = attempt("config.resolve", resolve_config, cfg, act_type="int16")
        assert err is None, err
        check_usable(cfg2[0])
    else:
        assert isinstance(err, CalibrationError) and "q.cfg" in str(err)


@fuzz_settings("fast")
@given(st.data(), simple_configs())
def test_corrupted_configs_parse_or_are_refused(data, text):
    text = data.draw(corrupt_text(text))
    cfg, err = attempt("config.parse(corrupt)", parse_simple_config, text, "q.cfg")
    if err is None:
        check_usable(cfg)


@fuzz_settings("fast")
@given(st.binary(max_size=60) | simple_configs().map(str.encode), st.booleans())
def test_config_files_load_or_are_refused(raw, retrain):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "q.cfg"
        path.write_bytes(raw)
        load = load_retrain_config if retrain else load_simple_config
        got, err = attempt("config.load_file", load, path)
    if err is None and not retrain:
        check_usable(got)


ARGS = {
    "algorithm": st.sampled_from([*ALGORITHMS, "IFMR", "bogus", ""]),
    "algorithm_options": st.dictionaries(
        st.sampled_from(["num_of_bins", "search_step", "percentile", "x"]),
        st.sampled_from([1024, 7, 0.5, -1.0, float("nan")]),
        max_size=2,
    ),
    "activation_offset": st.booleans(),
    "channel_wise": st.booleans(),
    "act_type": st.sampled_from(["INT8", "int16", "INT4", "", "x"]),
    "migration_strength": st.sampled_from([0.2, 0.5, 0.8, 0.1, 1.0, float("nan")]),
    "skip_layers": st.lists(st.text(max_size=3), max_size=2),
}


@fuzz_settings("fast")
@given(st.fixed_dictionaries({}, optional=ARGS))
def test_resolve_config_arguments_resolve_or_are_refused(kwargs):
    got, err = attempt("config.resolve(args)", resolve_config, None, **kwargs)
    if err is None:
        cfg, from_file = got
        assert not from_file and cfg.common.algorithm in ALGORITHMS
