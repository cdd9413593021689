"""AMCT simple-config reader: the real yolo config, overrides, and precise errors."""

import pytest

from amct_bridge.config import (
    load_retrain_config,
    load_simple_config,
    parse_simple_config,
    resolve_config,
)
from amct_bridge.errors import CalibrationError
from amct_bridge.records._pb import amct_simple_config_pb2 as pb


def test_real_yolo_config_loads(data_dir):
    cfg = load_simple_config(data_dir / "amct" / "tf_yolo_v3_quant.cfg")
    assert cfg.batch_num == 1
    assert cfg.activation_offset is True
    assert cfg.common.channel_wise is True
    assert cfg.common.algorithm == "ifmr"
    assert cfg.common.options == {
        "max_percentile": 0.999999,
        "min_percentile": 0.999999,
        "search_range_start": 0.7,
        "search_range_end": 1.3,
        "search_step": 0.01,
    }


@pytest.mark.parametrize("name", ["int8", "prune", "selective_prune"])
def test_real_retrain_configs_load(data_dir, name):
    msg = load_retrain_config(data_dir / "amct" / f"tf_resnet50_sample_{name}.cfg")
    if name == "int8":
        assert msg.batch_num == 2
        assert pb.DataType.Name(msg.retrain_weight_quant_config.arq_retrain.dst_type) == "INT8"
    elif name == "prune":
        filt = msg.prune_config.filter_pruner.balanced_l2_norm_filter_prune
        assert filt.prune_ratio == pytest.approx(0.3) and filt.ascend_optimized
    else:
        assert msg.prune_config.n_out_of_m_pruner.l1_selective_prune.update_freq == 0


def test_overrides_by_type_and_name_win_over_common():
    cfg = parse_simple_config(
        """
        batch_num: 3
        joint_quant: true
        skip_layers: "fc"
        skip_fusion_layers: "c2"
        common_config { arq_quantize { channel_wise: false } }
        override_layer_types {
            layer_type: "DepthwiseConv2dNative"
            calibration_config { hfmg_quantize { num_of_bins: 1024 dst_type: INT16 } }
        }
        override_layer_configs {
            layer_name: "c1"
            calibration_config { dmq_balancer { migration_strength: 0.3 } }
        }
        """
    )
    assert (cfg.batch_num, cfg.joint_quant, cfg.skip_layers) == (3, True, ["fc"])
    assert cfg.skips_fusion("c2") and not cfg.skips_fusion("c1")
    dw = cfg.for_layer("dw", ("DepthwiseConv2D", "DepthwiseConv2dNative"))
    assert (dw.algorithm, dw.options, dw.act_type) == ("hfmg", {"num_of_bins": 1024}, "INT16")
    assert dw.channel_wise is False  # inherited from common_config
    c1 = cfg.for_layer("c1", ("Conv2D", "Conv2D"))
    assert c1.migration_strength == pytest.approx(0.3) and c1.algorithm == "ifmr"
    other = cfg.for_layer("c9", ("Conv2D",))
    assert other.migration_strength is None and other.channel_wise is False


def test_unknown_field_names_file_line_and_field(tmp_path):
    path = tmp_path / "bad.cfg"
    path.write_text("batch_num: 1\nactivation_ofset: true\n")
    with pytest.raises(CalibrationError, match=r"bad\.cfg:2:1.*activation_ofset"):
        load_simple_config(path)


@pytest.mark.parametrize(
    "text, message",
    [
        ("common_config { hfmg_quantize { num_of_bins: 1000 } }", "num_of_bins must be one of"),
        ("common_config { ifmr_quantize { dst_type: INT4 } }", "INT8 or INT16, got INT4"),
        ("common_config { dmq_balancer { migration_strength: 0.9 } }", r"\[0.2, 0.8\], got 0.9"),
        ("common_config { ifmr_quantize { search_range_start: 1.5 } }", "search_range_start"),
        ("batch_num: 0", "batch_num must be >= 1"),
    ],
)
def test_bad_values_are_refused(text, message):
    with pytest.raises(CalibrationError, match=message):
        parse_simple_config(text, source="x.cfg")


def test_explicit_arguments_override_file_common_settings(data_dir):
    cfg, from_file = resolve_config(
        data_dir / "amct" / "tf_yolo_v3_quant.cfg",
        algorithm="hfmg",
        algorithm_options={"num_of_bins": 2048},
        activation_offset=False,
        skip_layers=["c1"],
    )
    assert from_file and cfg.batch_num == 1
    assert cfg.common.algorithm == "hfmg" and cfg.common.options == {"num_of_bins": 2048}
    assert cfg.activation_offset is False and cfg.skip_layers == ["c1"]


def test_resolve_refuses_unknown_algorithm():
    with pytest.raises(CalibrationError, match="algorithm must be one of"):
        resolve_config(algorithm="kl")


@pytest.mark.parametrize("given, stored", [("int8", "INT8"), ("Int16", "INT16"), ("INT8", "INT8")])
def test_act_type_is_case_insensitive_and_stored_upper(given, stored):
    """Issue 14: a lower-case act_type was kept as given and reached records as "int8"."""
    from amct_bridge.config import LayerQuantConfig, QuantConfig

    assert LayerQuantConfig(act_type=given).act_type == stored
    assert resolve_config(act_type=given)[0].common.act_type == stored
    assert (
        resolve_config(QuantConfig(common=LayerQuantConfig(act_type=given)))[0].common.act_type
        == stored
    )


@pytest.mark.parametrize("bad", ["int4", "INT32", "", None])
def test_other_act_types_are_refused(bad):
    from amct_bridge.config import LayerQuantConfig

    with pytest.raises(CalibrationError, match=f"act_type must be INT8 or INT16 .*got {bad!r}"):
        LayerQuantConfig(act_type=bad)


def test_batch_num_only_where_the_file_sets_it(tmp_path):
    """A config without batch_num (e.g. the report's skip_layers fragment saved as a file)
    leaves the caller's default (every batch); one that sets it, even to AMCT's 1, applies."""
    from amct_bridge.calibration.options import resolve_batch_num

    bare = tmp_path / "fragment.cfg"
    bare.write_text('skip_layers: "fc"\n')
    cfg, from_file = resolve_config(bare)
    assert from_file and cfg.batch_num is None and cfg.skip_layers == ["fc"]
    assert resolve_batch_num(None, cfg, from_file) is None
    one = tmp_path / "one.cfg"
    one.write_text('batch_num: 1\nskip_layers: "fc"\n')
    cfg, from_file = resolve_config(one)
    assert resolve_batch_num(None, cfg, from_file) == 1
    assert resolve_batch_num(3, cfg, from_file) == 3
