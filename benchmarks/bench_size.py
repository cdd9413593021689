"""Size: a 10,000-layer record, and a 1,000-layer Keras graph through discovery and export.

Run: ``.venv/bin/python benchmarks/bench_size.py [--quick]``.

Record part: records of 1,000 / 3,000 / 10,000 layers (per layer scale_d, offset_d and 32
channels of scale_w / offset_w, as a conv of a real network) are written as AMCT text, then
timed: ``records.load`` (protobuf parse + flavor detection + duplicate check + line map),
``records.validate`` and ``records.save``, each against protobuf's own ``text_format.Parse`` of
the same text (and ``text_format.MessageToString`` of the same message for save) in this run.
Peak memory of a load (tracemalloc, a separate run of it) is printed per byte of the file. The
time per layer at 3,000 and 10,000 layers against 1,000 layers tells whether anything is
superlinear (a ratio near 1 is linear).

Graph part: generated Keras functional models of 250 / 500 / 1,000 layers (blocks of Conv2D,
BatchNormalization, ReLU, with an Add skip and a Concatenate every few blocks, 8x8x8 tensors)
go through ``extract_graph``, ``prune_discovery`` and ``export_espdl`` (from a sidecar holding a
range for every layer, written to a directory); times per layer are printed for each size.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tracemalloc
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from _common import best_of  # noqa: E402
from google.protobuf import text_format  # noqa: E402

from amct_bridge.records import LayerFactors, Record, load, save, validate  # noqa: E402
from amct_bridge.records.codec import to_proto  # noqa: E402
from amct_bridge.records.flavors import get_flavor  # noqa: E402


def make_record(layers: int, channels: int = 32) -> Record:
    rng = np.random.default_rng(layers)
    record = Record(flavor="inner")
    for i in range(layers):
        record.layers[f"block{i // 3}/conv{i % 3}"] = LayerFactors(
            scale_d=float(rng.uniform(1e-3, 1e-1)),
            offset_d=int(rng.integers(-128, 128)),
            scale_w=[float(v) for v in rng.uniform(1e-4, 1e-2, channels)],
            offset_w=[0] * channels,
        )
    return record


def bench_record(layers: int, tmp: Path, repeat: int) -> dict[str, float]:
    path = tmp / f"record{layers}.txt"
    save(make_record(layers), path)
    text = path.read_text()
    flavor = get_flavor("inner")

    def proto_parse():
        text_format.Parse(text, flavor.new_message())

    record = load(path)
    message = to_proto(record, "inner")
    out = tmp / f"saved{layers}.txt"
    row = {
        "bytes": path.stat().st_size,
        "load": best_of(lambda: load(path), repeat),
        "parse": best_of(proto_parse, repeat),
        "validate": best_of(lambda: validate(record), repeat),
        "save": best_of(lambda: save(record, out), repeat),
        "print": best_of(lambda: text_format.MessageToString(message), repeat),
    }
    assert validate(record) == [] and len(record.layers) == layers
    assert load(out).layers == record.layers
    tracemalloc.start()
    load(path)
    row["peak_load"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    proto_parse()
    row["peak_parse"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    validate(record)
    row["peak_validate"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    save(record, out)
    row["peak_save"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return row


def records_part(sizes: list[int], repeat: int) -> None:
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            rows[n] = bench_record(n, Path(tmp), repeat)
    print("record files (32 channels per layer); times in s, best of", repeat)
    print(
        f"{'layers':>7} {'MB':>6} {'load':>7} {'pb parse':>8} {'ratio':>6} {'validate':>8} "
        f"{'save':>7} {'pb print':>8} {'ratio':>6}  peak/file: load parse validate save"
    )
    for n, r in rows.items():
        size = r["bytes"]
        print(
            f"{n:>7} {size / 1e6:>6.2f} {r['load']:>7.3f} {r['parse']:>8.3f} "
            f"{r['load'] / r['parse']:>6.2f} {r['validate']:>8.3f} {r['save']:>7.3f} "
            f"{r['print']:>8.3f} {r['save'] / r['print']:>6.2f}  "
            f"{r['peak_load'] / size:>14.1f} {r['peak_parse'] / size:>5.1f} "
            f"{r['peak_validate'] / size:>8.1f} {r['peak_save'] / size:>4.1f}"
        )
    small = min(rows)
    print(f"time per layer against {small} layers (1.0 = linear):")
    for n in rows:
        if n == small:
            continue
        ratios = "  ".join(
            f"{k} {rows[n][k] / n / (rows[small][k] / small):.2f}"
            for k in ("load", "parse", "validate", "save")
        )
        print(f"  {n:>6} layers: {ratios}")


def make_graph(layers: int):
    """A functional model of about ``layers`` layers: conv/BN/ReLU blocks with Add skips and
    Concatenates (then a 1x1 conv back to 8 channels)."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 8), name="img")
    x, count, block = inp, 1, 0
    while count < layers - 4:
        y = keras.layers.Conv2D(8, 3, padding="same", name=f"c{block}")(x)
        y = keras.layers.BatchNormalization(name=f"bn{block}")(y)
        y = keras.layers.ReLU(name=f"r{block}")(y)
        count += 3
        if block % 3 == 1:
            y = keras.layers.Add(name=f"add{block}")([x, y])
            count += 1
        elif block % 3 == 2:
            y = keras.layers.Concatenate(name=f"cat{block}")([x, y])
            y = keras.layers.Conv2D(8, 1, name=f"p{block}")(y)
            count += 2
        x, block = y, block + 1
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    out = keras.layers.Dense(10, name="fc")(x)
    return keras.Model(inp, out, name=f"net{layers}")


def graph_part(sizes: list[int], tmp: Path) -> None:
    from amct_bridge.keras import export_espdl, extract_graph, prune_discovery
    from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange

    rows = {}
    for n in sizes:
        start = time.perf_counter()
        model = make_graph(n)
        built = time.perf_counter() - start
        r = TensorRange(-4.0, 4.0)
        stats = CalibrationStats(
            layers={
                layer.name: LayerStats(type(layer).__name__, input=r, output=r)
                for layer in model.layers
            }
        )
        start = time.perf_counter()
        graph = extract_graph(model)
        t_graph = time.perf_counter() - start
        start = time.perf_counter()
        discovery = prune_discovery(model, graph)
        t_disc = time.perf_counter() - start
        start = time.perf_counter()
        result = export_espdl(model, None, tmp / f"espdl{n}", stats=stats, feature_type="s8")
        t_export = time.perf_counter() - start
        rows[n] = (len(model.layers), built, t_graph, t_disc, t_export)
        assert result.layers and len(graph.nodes) >= len(model.layers) - 1
        del discovery
    print("generated Keras graphs; times in s (one run each)")
    print(f"{'layers':>7} {'build':>7} {'extract':>8} {'discover':>9} {'export':>7}  ms/layer")
    for layers, built, t_graph, t_disc, t_export in rows.values():
        per = 1000 / layers
        print(
            f"{layers:>7} {built:>7.2f} {t_graph:>8.3f} {t_disc:>9.3f} {t_export:>7.3f}  "
            f"{t_graph * per:.2f} / {t_disc * per:.2f} / {t_export * per:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one repeat")
    args = parser.parse_args()
    if args.quick:
        records_part([1000, 5000], 1)
    else:
        records_part([1000, 3000, 10000], 2)
    with tempfile.TemporaryDirectory() as tmp:
        graph_part([100, 250] if args.quick else [250, 500, 1000], Path(tmp))


if __name__ == "__main__":
    main()
