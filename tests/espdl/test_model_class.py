"""The generated model class, app and coefficient files compile against ESP-DL v1.1's headers.

A Keras model with every supported layer kind is exported with ``cpp=``; the C++ files are
syntax-checked with the host g++ (``-fsyntax-only``, the vendored release/v1.1 headers and host
stubs of tests/data/espdl_v1_headers, see its README), and their content is checked against
export.json and against an independent reading of the graph.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import keras
import numpy as np
import pytest
from espdl_stats import layer_activations, sidecar_from

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1.cpp_coefficients import convert_set
from amct_bridge.espdl.v1.cpp_model import model_names
from amct_bridge.keras import export_espdl
from amct_bridge.quant.espdl import quantize_pow2

DATA = Path(__file__).resolve().parents[1] / "data"
HEADERS = DATA / "espdl_v1_headers"
L = keras.layers

#: chip layers of the model below, in execution order: member -> (ESP-DL class, inputs)
EXPECTED = {
    "c1": ("Conv2D", ["input"]),
    "dw": ("DepthwiseConv2D", ["c1"]),
    "c3": ("Conv2D", ["c1"]),
    "res": ("Add2D", ["dw", "c3"]),
    "c4": ("Conv2D", ["res"]),
    "c5": ("Conv2D", ["res"]),
    "cat": ("Concat", ["c4", "c5"]),
    "mp": ("MaxPool2D", ["cat"]),
    "mp_relu": ("Relu", ["mp"]),
    "ap": ("AvgPool2D", ["mp"]),
    "flat": ("Flatten", ["ap"]),
    "fc1": ("FullyConnected", ["flat"]),
    "gmp": ("GlobalMaxPool2D", ["mp_relu"]),
    "gmp_leaky": ("LeakyRelu", ["gmp"]),
    "gap": ("GlobalAveragePool2D", ["ap"]),
    "out1": ("FullyConnected", ["fc1"]),
    "out2": ("FullyConnected", ["gap"]),
    "out3": ("FullyConnected", ["gmp_leaky"]),
}
OUTPUTS = {"out1", "out2", "out3"}


def _all_kinds_model() -> keras.Model:
    keras.utils.set_random_seed(1)
    x = keras.Input((12, 12, 3), name="img")
    a = L.Conv2D(8, 3, padding="same", name="c1")(x)
    a = L.BatchNormalization(name="bn1")(a)
    a = L.ReLU(name="r1")(a)
    b = L.DepthwiseConv2D(3, padding="same", name="dw")(a)
    b = L.BatchNormalization(name="bn2")(b)
    b = L.PReLU(shared_axes=[1, 2], name="p2")(b)
    c = L.Conv2D(8, 1, name="c3", activation="relu")(a)
    s = L.Add(name="res")([b, c])
    d = L.Conv2D(8, 3, strides=1, padding="same", name="c4")(s)
    d = L.LeakyReLU(0.1, name="lr4")(d)
    e = L.Conv2D(8, 1, name="c5")(s)
    cat = L.Concatenate(name="cat")([d, e])
    m = L.MaxPooling2D(2, name="mp")(cat)
    ap = L.AveragePooling2D(2, name="ap")(m)
    m2 = L.ReLU(name="mp_relu")(m)  # standalone: MaxPool is no chain to fuse into
    g1 = L.GlobalAveragePooling2D(name="gap")(ap)
    g2 = L.GlobalMaxPooling2D(name="gmp")(m2)
    g2 = L.LeakyReLU(0.25, name="gmp_leaky")(g2)
    f = L.Flatten(name="flat")(ap)
    f = L.Dense(6, name="fc1")(f)
    f = L.ReLU(name="r_fc")(f)
    f = L.Dropout(0.2, name="drop")(f)  # not a chip layer: out1 reads fc1
    f = L.Activation("linear", name="lin")(f)
    out1 = L.Dense(4, name="out1")(f)
    out2 = L.Dense(4, name="out2")(g1)
    out3 = L.Dense(4, name="out3")(g2)
    return keras.Model(x, [out1, out2, out3])


@pytest.fixture(scope="module")
def all_kinds():
    model = _all_kinds_model()
    data = np.random.default_rng(0).uniform(-1, 1, (4, 12, 12, 3)).astype("float32")
    return model, sidecar_from(layer_activations(model, data))


def _gxx(workdir: Path, source: str) -> subprocess.CompletedProcess:
    """The headers README's compile check (x86-64 host, 32-bit-target headers: -fpermissive)."""
    includes = [f"-I{d}" for d in sorted(p for p in (HEADERS / "include").rglob("*") if p.is_dir())]
    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-fpermissive", "-w", "-include", "cstddef"]
    cmd += ["-I", str(HEADERS / "host_stubs"), f"-I{HEADERS / 'include'}", *includes]
    cmd += ["-I", str(workdir), str(workdir / source)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, check=False)


def _compiles(workdir: Path, source: str) -> None:
    proc = _gxx(workdir, source)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _main_cpp(workdir: Path, header: str, cls: str, ctype: str) -> None:
    (workdir / "t.cpp").write_text(
        f'#include "{header}"\nint main()\n{{\n    dl::Tensor<{ctype}> x;\n    {cls} m;\n'
        "    m.build(x);\n    m.call(x);\n    return 0;\n}\n"
    )


def _members(text: str) -> dict[str, tuple[str, str, bool]]:
    """member -> (class, template args, public) from the class body."""
    body = text[text.index("class ") :]
    public_at = body.index("public:")
    found = {}
    for m in re.finditer(r"^    dl::layer::(\w+)<([^>]*)> (\w+);", body, re.M):
        found[m[3]] = (m[1], m[2], m.start() > public_at)
    return found


def _calls(text: str, method: str) -> list[tuple[str, list[str]]]:
    """(member, [producers]) per ``this->m.method(...)`` line, and ("free", [p]) per free."""
    body = text[text.index(f"void {method}(") :]
    body = body[: body.index("\n    }\n")]
    result = []
    for line in body.splitlines():
        m = re.match(rf"\s+this->(\w+)\.{method}\((.*)\);$", line)
        if m:
            result.append((m[1], re.findall(r"this->(\w+)\.get_output\(\)|\b(input)\b", m[2])))
            result[-1] = (m[1], [a or b for a, b in result[-1][1]])
        f = re.match(r"\s+(?:this->(\w+)\.get_output\(\)|(input))\.free_element\(\);$", line)
        if f:
            result.append(("free", [f[1] or f[2]]))
    return result


@pytest.mark.parametrize(
    ("feature_type", "granularity"),
    [("s8", "per-tensor"), ("s8", "per-channel"), ("s16", "per-tensor")],
)
def test_all_layer_kinds_export_compile_and_match_export_json(
    all_kinds, tmp_path, feature_type, granularity
):
    model, stats = all_kinds
    out = tmp_path / "espdl"
    result = export_espdl(
        model,
        None,
        out,
        stats=stats,
        feature_type=feature_type,
        granularity=granularity,
        target="esp32s3",
        cpp="net_coefficient",
    )
    assert not [n for n in result.warnings if "not written" in n]
    header, cls = model_names("net_coefficient")
    assert (header, cls) == ("net_model.hpp", "NetModel")
    ctype = {"s8": "int8_t", "s16": "int16_t"}[feature_type]
    text = (out / header).read_text()

    # members: one per chip layer, outputs public; per-channel biased layers <int8_t, int16_t>
    members = _members(text)
    assert sorted(members) == sorted(EXPECTED)
    for name, (espdl_class, types, public) in members.items():
        assert espdl_class == EXPECTED[name][0]
        assert public == (name in OUTPUTS)
        wide = granularity == "per-channel" and espdl_class not in (
            "Add2D", "AvgPool2D", "GlobalAveragePool2D", "MaxPool2D", "GlobalMaxPool2D",
            "Concat", "Flatten", "Relu", "LeakyRelu",
        )  # fmt: skip
        assert types == (f"{ctype}, int16_t" if wide else ctype)

    # build(): every layer once, with the graph's edges, each after its producers
    built = _calls(text, "build")
    assert sorted(m for m, _ in built) == sorted(EXPECTED)
    seen = {"input"}
    for m, ins in built:
        assert ins == EXPECTED[m][1], m
        assert set(ins) <= seen, f"{m} built before its inputs"
        seen.add(m)
    # members are declared (and initialized) in that order, outputs last
    order = [m for m, _ in built]
    assert list(members) == [m for m in order if m not in OUTPUTS] + [
        m for m in order if m in OUTPUTS
    ]

    # call(): same order; each tensor freed once right after its last reader, outputs never
    calls = _calls(text, "call")
    assert [(m, ins) for m, ins in calls if m != "free"] == built
    freed = [p[0] for m, p in calls if m == "free"]
    assert sorted(freed) == sorted(["input", *(m for m in EXPECTED if m not in OUTPUTS)])
    for i, (m, ins) in enumerate(calls):
        if m == "free":
            later = [p for n, ps in calls[i + 1 :] if n != "free" for p in ps]
            assert ins[0] not in later, f"{ins[0]} read after it was freed"
            assert calls[i - 1][0] == "free" or ins[0] in calls[i - 1][1] + [calls[i - 1][0]]

    # constructors: the output exponents of export.json, qualified names only
    report = json.loads((out / "export.json").read_text())
    exps = {x["name"]: x["output_exponent"] for x in report["layers"] + report["runtime_layers"]}
    for name, exp in exps.items():
        m = re.search(rf"(?:^\s+|\(\) : ){name}\((-?\d+)[,)]", text, re.M)
        if EXPECTED[name][0] not in (
            "MaxPool2D", "GlobalMaxPool2D", "Concat", "Flatten", "Relu", "LeakyRelu"
        ):  # fmt: skip
            assert m is not None and int(m[1]) == exp, name
    assert "using namespace" not in text
    getters = re.findall(r"(\w*::)?get_\w+_(?:filter|bias|activation)\(\)", text)
    assert getters and set(getters) == {"net_coefficient::"}
    assert "(PADDING_" not in text and ", PADDING_" not in text

    # the input exponent: what the first conv was exported for
    first = report["layers"][0]
    assert first["name"] == "c1"
    assert f"static const int input_exponent = {first['input_exponent']};" in text
    assert f"exponent {first['input_exponent']} (NetModel::input_exponent)" in text

    # the coefficient files are exactly what espdl-convert writes from the exported set
    conv = tmp_path / "conv"
    convert_set(
        out, "net_coefficient", conv, target="esp32s3", per_channel=granularity == "per-channel"
    )
    for suffix in ("cpp", "hpp"):
        name = f"net_coefficient.{suffix}"
        assert (out / name).read_bytes() == (conv / name).read_bytes()

    # everything compiles with ESP-DL release/v1.1's headers
    _main_cpp(out, header, cls, ctype)
    _compiles(out, "t.cpp")
    _compiles(out, "app_main.cpp")
    _compiles(out, "net_coefficient.cpp")
    assert "set_shape({12, 12, 3})" in (out / "app_main.cpp").read_text()


def test_compile_check_catches_a_broken_header(all_kinds, tmp_path):
    # the harness can fail: one wrong argument count in build() is an error
    model, stats = all_kinds
    out = tmp_path / "espdl"
    export_espdl(model, None, out, stats=stats, cpp="net_coefficient")
    text = (out / "net_model.hpp").read_text()
    broken = text.replace("this->mp.build(this->cat.get_output());", "this->mp.build();")
    assert broken != text
    (out / "net_model.hpp").write_text(broken)
    _main_cpp(out, "net_model.hpp", "NetModel", "int8_t")
    proc = _gxx(out, "t.cpp")
    assert proc.returncode != 0 and "mp.build" in proc.stderr


def test_tutorial_model_compiles_with_our_coefficient_text(tmp_path):
    # ESP-DL's own hand-written MNIST class + app, with espdl-convert's mnist_coefficient
    convert_set(DATA / "espdl_v1_tutorial", "mnist_coefficient", tmp_path, target="esp32s3")
    shutil.copy(HEADERS / "tutorial" / "mnist_model.hpp", tmp_path)
    _main_cpp(tmp_path, "mnist_model.hpp", "MNIST", "int16_t")
    _compiles(tmp_path, "t.cpp")  # (its app_main.cpp needs freertos/task.h: no host stub)
    _compiles(tmp_path, "mnist_coefficient.cpp")


def _quantize_block(app: str) -> str:
    m = re.search(r"static void quantize_input\(.*?\n}\n", app, re.S)
    assert m is not None
    return m[0]


@pytest.mark.parametrize("feature_type", ["s8", "s16"])
def test_app_quantizes_the_input_like_the_documented_rule(all_kinds, tmp_path, feature_type):
    # compile and run the app's own quantize_input on the host; compare with quantize_pow2
    model, stats = all_kinds
    result = export_espdl(model, None, None, stats=stats, feature_type=feature_type, cpp="n")
    assert result.out_dir is None
    from amct_bridge.espdl.v1.cpp_app import cpp_outputs

    files, notes = cpp_outputs(result, "n")
    assert notes == []
    app = files["app_main.cpp"].decode()
    e = int(
        re.search(r"static const int input_exponent = (-?\d+);", files["n_model.hpp"].decode())[1]
    )
    bits = 8 if feature_type == "s8" else 16
    step = 2.0**e
    x = np.array(
        [0.5 * step, 1.5 * step, 2.5 * step, -0.5 * step, -1.5 * step, 0.49 * step, 1e9, -1e9, 0.0],
        np.float32,
    )
    ctype = {"s8": "int8_t", "s16": "int16_t"}[feature_type]
    vals = ", ".join(f"{v!r}f" if np.isfinite(v) else "0" for v in x.tolist())
    (tmp_path / "q.cpp").write_text(
        "#include <math.h>\n#include <stdint.h>\n#include <stdio.h>\n"
        + _quantize_block(app)
        + f"int main() {{ const float x[] = {{{vals}}}; {ctype} q[{x.size}];"
        f" quantize_input(x, q, {x.size}, {e});"
        f' for (int i = 0; i < {x.size}; i++) printf("%d ", (int)q[i]); return 0; }}\n'
    )
    subprocess.run(["g++", "-O0", "-o", str(tmp_path / "q"), str(tmp_path / "q.cpp")], check=True)
    got = [
        int(v)
        for v in subprocess.run(
            [str(tmp_path / "q")], capture_output=True, text=True, check=True
        ).stdout.split()
    ]
    assert got == quantize_pow2(x.astype(np.float64), e, bits).astype(int).tolist()
    assert got[:5] == [0, 2, 2, 0, -2]  # half to even


def test_example_input_is_written_exactly(all_kinds):
    from amct_bridge.espdl.v1.cpp_app import cpp_outputs

    model, stats = all_kinds
    result = export_espdl(model, None, None, stats=stats)
    x = np.random.default_rng(3).normal(size=(12, 12, 3)).astype(np.float32)
    files, _ = cpp_outputs(result, "n", example=x)
    app = files["app_main.cpp"].decode()
    block = app[app.index("example_input[INPUT_SIZE] = {") : app.index("};")]
    values = np.array(
        [float(v.rstrip("f")) for v in re.findall(r"-?[\d.e+-]+f", block)], np.float32
    )
    assert np.array_equal(values, x.ravel())


def _small(extra):
    x = keras.Input((6, 6, 2), name="x")
    a = L.Conv2D(4, 3, name="build")(x)  # a member named like Model::build
    y = extra(a) if extra else a
    return keras.Model(x, y)


def _stats(model):
    data = np.random.default_rng(0).uniform(-1, 1, (2, 6, 6, 2)).astype("float32")
    return sidecar_from(layer_activations(model, data))


def test_reserved_member_names_are_renamed_and_compile(tmp_path):
    model = _small(lambda a: L.Conv2D(3, 1, name="call")(a))
    out = tmp_path / "e"
    export_espdl(model, None, out, stats=_stats(model), cpp="m_coefficient")
    text = (out / "m_model.hpp").read_text()
    assert "dl::layer::Conv2D<int8_t> build_layer;" in text
    assert "dl::layer::Conv2D<int8_t> call_layer;" in text
    assert '"build")' in text  # the layer keeps its own name at run time
    _main_cpp(out, "m_model.hpp", "MModel", "int8_t")
    _compiles(out, "t.cpp")


def test_a_layer_without_espdl_equivalent_keeps_the_coefficients_and_says_why(tmp_path):
    def tail(a):
        b = L.Conv2D(4, 1, name="b")(a)
        return L.Subtract(name="sub")([a, b])

    model = _small(tail)
    out = tmp_path / "e"
    with pytest.raises(ExportError, match=r"layer 'sub' \(Subtract\): .*compute it on the host"):
        export_espdl(model, None, out, stats=_stats(model), cpp="m")
    assert not out.exists()
    result = export_espdl(model, None, out, stats=_stats(model), cpp="m", skip_unsupported=True)
    assert (out / "m.cpp").is_file() and (out / "m.hpp").is_file()
    assert not (out / "m_model.hpp").exists() and not (out / "app_main.cpp").exists()
    note = [n for n in result.warnings if "model class not written" in n]
    assert note and "'sub' (Subtract)" in note[0]
    report = json.loads((out / "export.json").read_text())
    assert note[0] in report["warnings"]


@pytest.mark.parametrize(
    ("name", "message"),
    [("bad name", "not a C identifier"), ("app_main", "overwrite app_main.cpp")],
)
def test_bad_cpp_names_are_refused_before_writing(tmp_path, name, message):
    model = _small(None)
    with pytest.raises(Exception, match=message):
        export_espdl(model, None, tmp_path / "e", stats=_stats(model), cpp=name)
    assert not (tmp_path / "e").exists()


def test_public_api_and_cli_write_the_same_cpp_files(all_kinds, tmp_path, capsys):
    from amct_bridge.cli import main
    from amct_bridge.records.calibration import save_stats

    model, stats = all_kinds
    api = tmp_path / "api"
    export_espdl(model, None, api, stats=stats, target="esp32s3", cpp="net_coefficient")
    model.save(tmp_path / "m.keras")
    save_stats(stats, tmp_path / "s.json")
    argv = [
        "export-espdl",
        "--model",
        str(tmp_path / "m.keras"),
        "--stats",
        str(tmp_path / "s.json"),
    ]
    argv += ["--out", str(tmp_path / "cli"), "--target", "esp32s3", "--cpp", "net_coefficient"]
    assert main(argv) == 0, capsys.readouterr().err
    names = ["net_coefficient.cpp", "net_coefficient.hpp", "net_model.hpp", "app_main.cpp"]
    for name in names:
        assert (api / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    _compiles(tmp_path / "cli", "app_main.cpp")


def test_concat_axis_counts_without_the_batch_axis(tmp_path):
    # Keras axis 3 of (N, H, W, C) is the channel axis: ESP-DL tensors are HWC (no batch axis),
    # so a positive Keras axis would be off by one; the graph gives it counted from the end
    def tail(a):
        b = L.Conv2D(4, 1, name="b")(a)
        return L.Concatenate(axis=3, name="cat")([a, b])

    model = _small(tail)
    out = tmp_path / "e"
    export_espdl(model, None, out, stats=_stats(model), cpp="m")
    text = (out / "m_model.hpp").read_text()
    assert 'cat(-1, "cat")' in text
    _compiles(out, "app_main.cpp")


def _inits(text: str) -> dict[str, str]:
    """member -> constructor arguments, both spellings (``m(Conv2D<int16_t>(args))``, ``m(args)``),
    with the ``dl::`` / namespace qualifications removed."""
    start = text.index("() : ") + len("() : ")
    body = text[start : text.index(") {}\n", start) + 1]
    found = {}
    for line in body.splitlines():
        m = re.fullmatch(r"\s*(\w+)\((.*)\),?", line)
        assert m is not None, line
        args = m[2]
        wrapped = re.fullmatch(r"\w+<[^>]*>\((.*)\)", args)
        args = wrapped[1] if wrapped else args
        found[m[1]] = args.replace("mnist_coefficient::", "").replace("dl::", "")
    return found


def _layer_calls(text: str, method: str) -> list[tuple[str, str]]:
    body = text[text.index(f"void {method}(") :]
    body = body[: body.index("\n    }")]
    calls = re.findall(rf"^\s+this->(\w+)\.{method}\((.*?)(?:, true)?\);$", body, re.M)
    return [(m, re.sub(r"\s+", "", args)) for m, args in calls]


def test_tutorial_graph_gives_espressifs_own_model_class(tmp_path, capsys):
    # espdl-convert --model-class on ESP-DL's tutorial set + its chip graph writes the class
    # ESP-DL's tutorial wrote by hand: same members, constructor arguments, order and inputs
    from amct_bridge.cli import main

    tutorial = DATA / "espdl_v1_tutorial_app"
    argv = ["espdl-convert", "-t", "esp32", "-i", str(DATA / "espdl_v1_tutorial")]
    argv += ["-n", "mnist_coefficient", "-o", str(tmp_path), "--model-class"]
    argv += ["--graph", str(tutorial / "mnist_graph.json")]
    assert main(argv) == 0, capsys.readouterr().err
    ours = (tmp_path / "mnist_model.hpp").read_text()
    theirs = (HEADERS / "tutorial" / "mnist_model.hpp").read_text()
    their_members = re.findall(r"^\s+(\w+<int16_t>) (\w+);", theirs, re.M)
    our_members = [
        (c.replace("dl::layer::", ""), m)
        for c, m in re.findall(r"^\s+([\w:]+<int16_t>) (\w+);", ours, re.M)
    ]
    assert our_members == their_members
    assert _inits(ours) == _inits(theirs)
    assert len(_inits(ours)) == len(their_members)
    assert _layer_calls(ours, "build") == _layer_calls(theirs, "build")
    assert _layer_calls(ours, "call") == _layer_calls(theirs, "call")
    assert "static const int input_exponent = 0;" in ours  # the tutorial app's exponent
    assert (tmp_path / "mnist_coefficient.cpp").read_bytes() == (
        DATA / "espdl_v1_golden" / "text" / "tutorial.esp32.q0" / "mnist_coefficient.cpp"
    ).read_bytes()
    _compiles(tmp_path, "app_main.cpp")
    assert "set_shape({28, 28, 3})" in (tmp_path / "app_main.cpp").read_text()


def test_model_class_needs_a_graph(tmp_path, capsys):
    from amct_bridge.cli import main

    argv = ["espdl-convert", "-t", "esp32", "-i", str(DATA / "espdl_v1_tutorial")]
    argv += ["-n", "mnist_coefficient", "-o", str(tmp_path), "--model-class"]
    assert main(argv) == 2
    assert "export.json: cannot read" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written, not even the coefficients
