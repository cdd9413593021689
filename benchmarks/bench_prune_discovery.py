"""Pruning discovery speed: graph extraction and group discovery on big keras.applications models.

Prints, per model, the node count, extraction time and discovery time (best of N runs,
model construction excluded; target < 1 s each for discovery), then the growth with graph
size on synthetic residual and dense-concat graphs of doubling size (time ratio vs the
smallest, next to the node-count ratio).

Run: .venv/bin/python benchmarks/bench_prune_discovery.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def real_models(repeat: int) -> None:
    import keras

    from amct_bridge.graph import discover_groups
    from amct_bridge.keras.graph import extract_graph

    print(
        f"{'model':<16}{'nodes':>7}{'extract s':>11}{'discover s':>12}{'groups':>8}{'refused':>9}"
    )
    for name, ctor in (
        ("ResNet152", keras.applications.ResNet152),
        ("DenseNet201", keras.applications.DenseNet201),
        ("EfficientNetB7", keras.applications.EfficientNetB7),
    ):
        model = ctor(input_shape=(96, 96, 3), weights=None)
        t_ext, graph = best_of(lambda m=model: extract_graph(m), repeat)
        t_disc, found = best_of(lambda g=graph: discover_groups(g), repeat)
        flag = "" if t_disc < 1.0 else "  (over the 1 s target)"
        print(
            f"{name:<16}{len(graph):>7}{t_ext:>11.3f}{t_disc:>12.3f}"
            f"{len(found.groups):>8}{len(found.refusals):>9}{flag}"
        )
        del model
        keras.backend.clear_session()


def synthetic(kind: str, blocks: int):
    """A framework-free graph: ``blocks`` residual (conv-bn-relu-conv-bn-add) or dense blocks."""
    from amct_bridge.graph import Graph, Node, TensorInfo

    g = Graph()
    g.tensors["x"] = TensorInfo((None, 8, 8, 3))
    g.inputs.append("x")
    count = 0

    def add(kind_, inputs, width, **params):
        nonlocal count
        count += 1
        name = f"n{count}"
        g.tensors[name] = TensorInfo((None, 8, 8, width))
        g.add_node(Node(name, name, kind_, kind_, inputs, [name], params))
        return name

    cur = add("Conv2D", ["x"], 32, filters=32, groups=1)
    width = 32
    for _ in range(blocks):
        if kind == "residual":
            h = add("Conv2D", [cur], 16, filters=16, groups=1)
            h = add("ReLU", [add("BatchNormalization", [h], 16)], 16)
            h = add("BatchNormalization", [add("Conv2D", [h], 32, filters=32, groups=1)], 32)
            cur = add("ReLU", [add("Add", [cur, h], 32)], 32)
        else:  # DenseNet-like: each block concatenates 8 new channels; transition every 16
            h = add(
                "Conv2D",
                [add("ReLU", [add("BatchNormalization", [cur], width)], width)],
                8,
                filters=8,
                groups=1,
            )
            width += 8
            cur = add("Concatenate", [cur, h], width, axis=-1)
            if width >= 32 + 8 * 16:
                cur = add("Conv2D", [cur], 32, filters=32, groups=1)
                width = 32
    g.outputs.append(add("Dense", [add("GlobalAveragePooling2D", [cur], width)], 10, units=10))
    return g


def growth(repeat: int) -> None:
    from amct_bridge.graph import discover_groups

    for kind in ("residual", "dense"):
        base = None
        print(f"\ngrowth, synthetic {kind} graphs (ratios vs the smallest):")
        print(f"{'blocks':>8}{'nodes':>8}{'discover s':>12}{'node ratio':>12}{'time ratio':>12}")
        for blocks in (64, 128, 256, 512, 1024):
            graph = synthetic(kind, blocks)
            t, _ = best_of(lambda g=graph: discover_groups(g), repeat)
            base = base or (len(graph), t)
            print(
                f"{blocks:>8}{len(graph):>8}{t:>12.4f}"
                f"{len(graph) / base[0]:>12.1f}{t / base[1]:>12.1f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-models", action="store_true", help="only the synthetic growth")
    args = parser.parse_args()
    if not args.skip_models:
        real_models(args.repeat)
    growth(args.repeat)


if __name__ == "__main__":
    main()
