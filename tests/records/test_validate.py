"""Each of AMCT's rules has a failing example whose message is checked."""

import math

import pytest

from amct_bridge.records import Attr, LayerFactors, PruneNode, PruneRecord, Record, loads, validate


def _messages(record, flavor=None, **kw):
    return [str(p) for p in validate(record, flavor, **kw)]


def _one(factors, flavor="inner", **kw):
    problems = validate(Record({"conv1": factors}, flavor=flavor), **kw)
    assert len(problems) == 1, [str(p) for p in problems]
    return problems[0]


GOOD = dict(scale_d=0.1, offset_d=0, scale_w=[0.1, 0.2], offset_w=[0, 0])


def test_good_record_has_no_problem():
    assert validate(Record({"conv1": LayerFactors(**GOOD)})) == []


@pytest.mark.parametrize(
    "changes, field, text",
    [
        (
            dict(offset_d=128),
            "offset_d",
            "offset_d's value should be in [-128, 127] (INT8), got 128",
        ),
        (dict(offset_d=-129), "offset_d", "should be in [-128, 127]"),
        (
            dict(offset_d=40000, act_type="INT16"),
            "offset_d",
            "should be in [-32768, 32767] (INT16)",
        ),
        (dict(offset_d=8, dst_type="INT4"), "offset_d", "should be in [-8, 7] (INT4), got 8"),
        (dict(scale_d=0.0), "scale_d", "scale_d's value should be in the positive range"),
        (dict(scale_d=-1.0), "scale_d", "positive range of float32, got -1.0"),
        (dict(scale_d=math.inf), "scale_d", "positive range of float32, got inf"),
        (dict(scale_d=math.nan), "scale_d", "got nan"),
        (dict(scale_w=[0.1, 0.0]), "scale_w", "scale_w's value should be in the positive range"),
        (dict(scale_w=[0.1, math.inf]), "scale_w", "got inf"),
        (dict(offset_w=[0, 1]), "offset_w", "offset_w's value should be 0"),
        (
            dict(offset_w=[0]),
            "offset_w",
            "scale_w's length (2) and offset_w's length (1) should be equal",
        ),
        (
            dict(shift_bit=[3]),
            "shift_bit",
            "shift_bit's length (1) should equal scale_w's length (2)",
        ),
        (
            dict(shift_bit=[0, 17]),
            "shift_bit",
            "shift_bit's value should be in [1, 16] or all be 0",
        ),
        (dict(shift_bit=[0, 4]), "shift_bit", "in [1, 16] or all be 0"),
        (
            dict(tensor_balance_factor=[1.0, 1e-9]),
            "tensor_balance_factor",
            "should be in [FLT_EPSILON, 1/FLT_EPSILON], got 1e-09",
        ),
        (dict(tensor_balance_factor=[1e8]), "tensor_balance_factor", "got 100000000.0"),
        (
            dict(act_type="INT4"),
            "act_type",
            "act_type must be one of ['INT8', 'INT16'], got 'INT4'",
        ),
        (dict(wts_type="INT16"), "wts_type", "wts_type must be one of"),
        (dict(dst_type="INT16"), "dst_type", "dst_type must be one of ['INT8', 'INT4']"),
        (dict(cluster=[0] * 8), "cluster", "the length of cluster center is 16 or 32, but is 8"),
        (dict(cluster=[200] * 16), "cluster", "cluster center should be between [-128, 127]"),
        (dict(scale_d=None), "scale_d", "cannot find scale_d of the layer"),
    ],
)
def test_layer_rule(changes, field, text):
    problem = _one(LayerFactors(**{**GOOD, **changes}))
    assert problem.layer == "conv1" and problem.field == field
    assert text in problem.message


def test_valid_edge_values_pass():
    ok = [
        dict(offset_d=-128),
        dict(offset_d=127),
        dict(offset_d=-32768, act_type="INT16"),
        dict(offset_d=-8, dst_type="INT4"),
        dict(shift_bit=[0, 0]),
        dict(shift_bit=[1, 16]),
        dict(tensor_balance_factor=[1.1920929e-07, 8388608.0]),
        dict(wts_type="INT4"),
    ]
    for changes in ok:
        assert validate(Record({"c": LayerFactors(**{**GOOD, **changes})})) == [], changes


def test_tensor_balance_factor_length_against_cin():
    problem = _one(
        LayerFactors(**GOOD, tensor_balance_factor=[1.0, 1.0]), input_channels={"conv1": 3}
    )
    assert "tensor_balance_factor's length 2 should be equal to" in problem.message
    assert "conv1: 3 (Cin)" in problem.message


@pytest.mark.parametrize(
    "field, value",
    [
        ("tensor_balance_factor", [1.0]),
        ("cluster", [0] * 16),
        ("dst_type", "INT8"),
        ("prune_producer", ["x"]),
    ],
)
def test_tf_flavor_refuses_inner_only_fields(field, value):
    problem = _one(LayerFactors(**{**GOOD, field: value}), flavor="tf")
    assert problem.field == field and "not part of a 'tf' record" in problem.message


def test_tf_flavor_refuses_shift_bit():
    problem = _one(LayerFactors(**GOOD, shift_bit=[2, 2]), flavor="tf")
    assert problem.message == "shift_bit is not supported in a 'tf' record, please delete it"


@pytest.mark.parametrize("field", ["act_type", "wts_type"])
def test_mindspore_flavor_refuses_types(field):
    problem = _one(LayerFactors(**GOOD, **{field: "INT8"}), flavor="mindspore")
    assert problem.field == field and "not part of a 'mindspore' record" in problem.message


def test_prune_records_only_in_inner():
    record = Record(
        prune_records=[PruneRecord([PruneNode.channel("a", "Conv2D", 0, 4)])], flavor="tf"
    )
    assert _messages(record) == [
        "<record>: prune_record is not part of a 'tf' record (AMCT's parser would fail the file)"
    ]


@pytest.mark.parametrize(
    "node, text",
    [
        (
            PruneNode.channel("c", "Conv2D", 4, 4),
            "producer 'c': begin (4) must be >= 0 and < end (4)",
        ),
        (PruneNode.channel("c", "Conv2D", -1, 4), "begin (-1) must be >= 0"),
        (
            PruneNode("c", [Attr("type", "STRING", "Conv2D"), Attr("begin", "INT", 0)]),
            "attrs 'begin' and 'end' (INT) are required",
        ),
        (PruneNode("c", [Attr("begin", "INT", 0), Attr("end", "INT", 2)]), "attr 'type'"),
        (
            PruneNode(
                "c",
                [
                    Attr("type", "STRING", "Conv2D"),
                    Attr("begin", "INT", "0"),
                    Attr("end", "INT", 2),
                ],
            ),
            "attr 'begin': type INT does not match the filled field (value '0')",
        ),
        (
            PruneNode(
                "c",
                [Attr("type", "FLOAT", "Conv2D"), Attr("begin", "INT", 0), Attr("end", "INT", 2)],
            ),
            "attr 'type': type FLOAT does not match",
        ),
        (PruneNode("c", [Attr("type", "BOGUS", "x")]), "type must be one of"),
    ],
)
def test_prune_node_rules(node, text):
    record = Record(prune_records=[PruneRecord([node])])
    messages = _messages(record)
    assert any(text in m for m in messages), messages
    assert all(m.startswith("<record>: prune_record[0]: ") for m in messages)


def test_prune_record_without_producer_and_selective_mask_shape():
    record = Record(
        prune_records=[
            PruneRecord([], [PruneNode.channel("b", "Conv2D", 0, 2)]),
            PruneRecord(selective_prune=PruneNode("w", [Attr("mask_shape", "INTS", [])])),
        ]
    )
    messages = _messages(record)
    assert "prune_record[0]: a prune record needs at least one producer" in messages[0]
    assert "prune_record[1]: selective_prune 'w': attr 'mask_shape'" in messages[1]


def test_attr_type_mismatch_from_text_is_reported_with_line():
    text = """prune_record {
  producer {
    name: "conv"
    attr { name: "type" type: STRING s: "Conv2D" }
    attr { name: "begin" type: INT s: "zero" }
    attr { name: "end" type: INT i: 8 }
  }
}
"""
    messages = _messages(loads(text, source="p.txt"))
    assert any(
        "attr 'begin': type INT does not match the filled field (value 'zero')" in m
        for m in messages
    ), messages


def test_problems_carry_file_and_line():
    text = (
        'record {\n  key: "ok"\n  value {\n    scale_d: 0.5\n    offset_d: 0\n  }\n}\n'
        'record {\n  key: "bad"\n  value {\n    scale_d: 0.5\n    offset_d: 999\n  }\n}\n'
    )
    (problem,) = validate(loads(text, source="record.txt"))
    assert str(problem) == (
        "record.txt:12: layer 'bad': offset_d: offset_d's value should be in [-128, 127] "
        "(INT8), got 999"
    )
