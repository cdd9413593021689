"""Runtime layers (Add2D, pools, Concat): exponents from hand-made sidecars, and the fallbacks."""

from __future__ import annotations

import math

import numpy as np

from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v1.export import export_layers
from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange

RNG = np.random.default_rng(5)
REQUANT = {"keeps_exponent": False}
KEEP = {"keeps_exponent": True}


def ref_exponent(absmax: float, bits: int = 8) -> int:
    top = 2 ** (bits - 1) - 1
    e = math.ceil(math.log2(absmax / top))
    return e + 1 if absmax > top * 2.0**e else e


def conv(name, inputs):
    w = {"kernel": RNG.normal(size=(1, 1, 3, 3)).astype(np.float32)}
    return SourceLayer(name, "conv2d", inputs, "Conv2D", w, {"activation": None})


def stats(**ranges):
    st = CalibrationStats(algorithm="minmax", batches=1)
    for name, (inp, out) in ranges.items():
        st.layers[name] = LayerStats(
            "X", TensorRange(*inp) if inp else None, TensorRange(*out) if out else None
        )
    return st


def _layers(add_kind="Add"):
    return [
        SourceLayer("in", "input"),
        conv("a", ["in"]),
        conv("b", ["in"]),
        SourceLayer("add", "runtime", ["a", "b"], add_kind, attrs=REQUANT),
        SourceLayer("gap", "runtime", ["add"], "GlobalAveragePooling2D", attrs=REQUANT),
        conv("c", ["add"]),
    ]


def test_add_takes_its_range_raised_to_the_inputs_exponent():
    # a: |x| <= 1 -> -6; b: |x| <= 3 -> -5; sum range 0.1 -> -10, raised to e_hi = -5
    st = stats(a=((0, 1), (-1, 1)), b=((0, 1), (-3, 3)), add=(None, (-0.1, 0.1)), c=(None, (0, 1)))
    res = export_layers(_layers(), None, stats=st)
    add = res.runtime[0]
    assert add.input_exponents == [ref_exponent(1), ref_exponent(3)]
    assert add.output_exponent == max(ref_exponent(0.1), *add.input_exponents) == -5
    assert "raised from -10 to the inputs' exponent -5" in add.exponent_source
    # a wide sum keeps its own exponent
    st.layers["add"].output = TensorRange(-20.0, 9.0)
    res = export_layers(_layers(), None, stats=st)
    assert res.runtime[0].output_exponent == ref_exponent(20.0)
    assert res.config["c"]["input_exponent"] == ref_exponent(20.0)  # the tensor the chip has


def test_fallbacks_without_runtime_ranges_an_older_sidecar():
    st = stats(a=((0, 1), (-1, 1)), b=((0, 1), (-3, 3)), c=(None, (0, 1)))
    res = export_layers(_layers(), None, stats=st)
    add, gap = res.runtime
    bound = 127 * 2.0 ** ref_exponent(1) + 127 * 2.0 ** ref_exponent(3)
    assert add.output_exponent == ref_exponent(bound)
    assert add.exponent_source.startswith("bound from the input exponents")
    assert gap.output_exponent == add.output_exponent  # an average keeps its input's range
    assert res.warnings == []


def test_no_exponent_at_all_is_null_with_a_warning():
    layers = [
        SourceLayer("in", "input"),
        SourceLayer("gap", "runtime", ["in"], "GlobalAveragePooling2D", attrs=REQUANT),
        SourceLayer("fl", "runtime", ["gap"], "Flatten", attrs=KEEP),
        SourceLayer("fc", "dense", ["fl"], "Dense", {"kernel": np.ones((3, 2), np.float32)}),
    ]
    res = export_layers(layers, None, stats=stats(fc=((0, 1), (0, 2))))
    gap, fl = res.runtime
    assert gap.output_exponent is None and gap.cpp is None
    assert fl.espdl_class == "Flatten" and fl.output_exponent is None
    assert any("'gap' (GlobalAveragePool2D): no output exponent" in w for w in res.warnings)


def test_average_pool_feeding_a_concat_is_raised_to_the_shared_exponent():
    pool = {"keeps_exponent": False, "pool_size": (2, 2), "strides": (2, 2), "padding": "same"}
    layers = [
        SourceLayer("in", "input"),
        conv("a", ["in"]),
        SourceLayer("mp", "runtime", ["a"], "MaxPooling2D", attrs={**KEEP, "pool_size": (2, 2)}),
        SourceLayer("ap", "runtime", ["a"], "AveragePooling2D", attrs=pool),
        SourceLayer("cat", "runtime", ["mp", "ap"], "Concatenate", attrs={**KEEP, "axis": -1}),
    ]
    st = stats(a=((0, 1), (-4, 4)), ap=(None, (-0.5, 0.5)))
    res = export_layers(layers, None, stats=st)
    mp, ap, cat = res.runtime
    assert mp.output_exponent == ref_exponent(4) == cat.output_exponent
    assert ap.output_exponent == ref_exponent(4)  # not ref_exponent(0.5): Concat asserts
    assert "to match the inputs of 'cat'" in ap.exponent_source
    assert cat.input_exponents == [ref_exponent(4)] * 2
    assert ap.cpp == (
        f"dl::layer::AvgPool2D<int8_t>({ref_exponent(4)}, {{2, 2}}, dl::PADDING_SAME_END, {{}}, "
        '2, 2, "ap")'
    )
    assert res.warnings == []


def test_chain_feeding_a_concat_is_raised_to_an_add_input():
    layers = [
        SourceLayer("in", "input"),
        conv("a", ["in"]),
        conv("b", ["in"]),
        SourceLayer("add", "runtime", ["a", "b"], "Add", attrs=REQUANT),
        conv("d", ["in"]),
        SourceLayer("cat", "runtime", ["add", "d"], "Concatenate", attrs={**KEEP, "axis": -1}),
        conv("e", ["cat"]),
    ]
    st = stats(
        a=((0, 1), (-1, 1)),
        b=((0, 1), (-1, 1)),
        add=(None, (-9, 9)),
        d=(None, (-0.2, 0.2)),
        e=(None, (0, 1)),
    )
    res = export_layers(layers, None, stats=st)
    add, cat = res.runtime
    assert add.output_exponent == ref_exponent(9)
    d = res.config["d"]
    assert d["output_exponent"] == ref_exponent(9)  # not ref_exponent(0.2): Concat asserts
    assert (
        res.layers[2]
        .sources["output_exponent"]
        .endswith(
            f"raised from {ref_exponent(0.2)} to {ref_exponent(9)} to match the inputs of 'cat'"
        )
    )
    assert cat.input_exponents == [ref_exponent(9)] * 2
    assert res.config["e"]["input_exponent"] == ref_exponent(9)
    assert res.warnings == []
