"""MindSpore graph extraction speed on a ResNet-50-sized network (random weights).

Times, best of N interleaved runs each (after one warm-up export), on the same network:

1. ``ms.export(net, x, file_format="MINDIR")`` alone into a temp dir (the baseline);
2. ``amct_bridge.mindspore.extract_graph(net, x)`` (export + parse + mapping to cells);
3. ``discover_groups`` on the extracted graph;

and prints the times and the ratio extract / export-alone (the cost of our own parsing and
mapping on top of MindSpore's compile and serialization).

Run: .venv/bin/python benchmarks/bench_mindspore_graph.py [--repeat 5] [--size 224]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def resnet50():
    """torchvision-style ResNet-50 (Bottleneck [3, 4, 6, 3], 25.6 M parameters) in MindSpore."""
    from mindspore import nn

    class Bottleneck(nn.Cell):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * 4
            self.conv1 = nn.Conv2d(cin, width, 1)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, cout, 1)
            self.bn3 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.SequentialCell(
                    [nn.Conv2d(cin, cout, 1, stride=stride), nn.BatchNorm2d(cout)]
                )

        def construct(self, x):
            identity = x if self.down is None else self.down(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            return self.relu(self.bn3(self.conv3(out)) + identity)

    class ResNet50(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, stride=2)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(3, 2, pad_mode="same")
            layers, cin = [], 64
            for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                seq = []
                for i in range(blocks):
                    seq.append(Bottleneck(cin, width, stride if i == 0 else 1))
                    cin = width * 4
                layers.append(nn.SequentialCell(seq))
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.flatten = nn.Flatten()
            self.fc = nn.Dense(2048, 1000)

        def construct(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.flatten(self.pool(x)))

    return ResNet50()


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--size", type=int, default=224, help="input height and width")
    args = parser.parse_args()

    import mindspore as ms
    import numpy as np

    from amct_bridge.graph import discover_groups
    from amct_bridge.mindspore import extract_graph

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    net = resnet50()
    net.set_train(False)
    x = ms.Tensor(np.zeros((1, 3, args.size, args.size), np.float32))
    params = sum(int(np.prod(p.shape)) for p in net.get_parameters())

    def export_only():
        old = os.getcwd()
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)  # MindSpore may write rank_0/ into the working directory
            try:
                ms.export(net, x, file_name=os.path.join(tmp, "net"), file_format="MINDIR")
            finally:
                os.chdir(old)

    t_cold, _ = best_of(export_only, 1)  # first compile of this network, outside the ratio
    t_export, t_extract, graph = float("inf"), float("inf"), None
    for _ in range(args.repeat):  # interleaved: load from other processes hits both alike
        t_export = min(t_export, best_of(export_only, 1)[0])
        t, graph = best_of(lambda: extract_graph(net, x), 1)
        t_extract = min(t_extract, t)
    t_disc, found = best_of(lambda: discover_groups(graph), args.repeat)
    print(f"ResNet-50 ({params / 1e6:.1f} M parameters), input 1x3x{args.size}x{args.size}")
    print(f"nodes {len(graph)}, groups {len(found.groups)}, refusals {len(found.refusals)}")
    print(f"{'first ms.export':<24}{t_cold:>9.3f} s   (compiles; later exports reuse it)")
    print(f"{'ms.export alone':<24}{t_export:>9.3f} s")
    print(f"{'extract_graph':<24}{t_extract:>9.3f} s   ratio {t_extract / t_export:.2f}x")
    print(f"{'discover_groups':<24}{t_disc:>9.3f} s")


if __name__ == "__main__":
    main()
