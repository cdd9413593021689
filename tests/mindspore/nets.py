"""Tiny MindSpore test networks (factories returning a fresh Cell; NCHW, a few channels).

Every factory takes no required argument, so ``tests.mindspore.nets:<name>`` works as the CLI's
``--mindspore module:factory``. ``INPUT_SHAPES`` gives each one's input shape.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops


def _seed() -> None:
    ms.set_seed(0)
    np.random.seed(0)


#: How a block adds its shortcut, as users write it (``+`` is the default).
ADD_SPELLINGS = ("+", "+=", "ops.add", "AddN")


class BasicBlock(nn.Cell):
    """ResNet basic block: conv-bn-relu-conv-bn, + identity or a 1x1 conv-bn downsample.

    ``add``: one of ADD_SPELLINGS; ``pad``: ``pad_mode='pad', padding=1`` 3x3 convs (the
    model-zoo spelling) instead of the default ``pad_mode='same'``."""

    def __init__(
        self, cin: int, cout: int, stride: int = 1, add: str = "+", pad: bool = False
    ) -> None:
        super().__init__()
        padding = {"pad_mode": "pad", "padding": 1} if pad else {}
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, **padding)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, **padding)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.SequentialCell(
                [nn.Conv2d(cin, cout, 1, stride=stride), nn.BatchNorm2d(cout)]
            )
        self.add = add
        self.addn = ops.AddN()

    def construct(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.down is not None:
            identity = self.down(x)
        if self.add == "+=":
            out += identity  # InplaceAddExt in MindIR
        elif self.add == "ops.add":
            out = ops.add(out, identity)
        elif self.add == "AddN":
            out = self.addn([out, identity])
        else:
            out = out + identity
        return self.relu(out)  # self.relu is called twice per block


class ResNetTiny(nn.Cell):
    """Stem, layer1 (2 identity blocks, 8 ch), layer2 (downsample block to 16 ch + identity).

    ``add`` and ``pad`` go to every :class:`BasicBlock`."""

    def __init__(self, num_classes: int = 3, add: str = "+", pad: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, has_bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        block = {"add": add, "pad": pad}
        self.layer1 = nn.SequentialCell([BasicBlock(8, 8, **block), BasicBlock(8, 8, **block)])
        self.layer2 = nn.SequentialCell(
            [BasicBlock(8, 16, 2, **block), BasicBlock(16, 16, **block)]
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(16, num_classes)

    def construct(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(self.flatten(self.pool(x)))


def resnet_tiny() -> nn.Cell:
    """ResNet-style network, input (1, 3, 16, 16)."""
    _seed()
    return ResNetTiny()


def resnet_user() -> nn.Cell:
    """ResNet as users write it: ``out += identity``, ``pad_mode='pad', padding=1``; input
    (1, 3, 16, 16)."""
    _seed()
    return ResNetTiny(add="+=", pad=True)


class ConcatNet(nn.Cell):
    """Two branches (4 + 6 ch) concatenated, then nested with a third (2 ch): offsets."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(3, 6, 3)
        self.bn_b = nn.BatchNorm2d(6)
        self.c = nn.Conv2d(3, 2, 1)
        self.head = nn.Conv2d(12, 5, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def construct(self, x):
        ab = ops.concat((self.a(x), self.bn_b(self.b(x))), axis=1)
        abc = ops.concat((ab, self.c(x)), 1)
        return self.pool(self.head(abc))


def concat_net() -> nn.Cell:
    """Nested channel concat, input (1, 3, 8, 8)."""
    _seed()
    return ConcatNet()


def depthwise_net() -> nn.Cell:
    """conv 3->8, depthwise group=8 with multiplier 2 (8->16), BN, ReLU6, conv 16->4."""
    _seed()
    return nn.SequentialCell(
        [
            nn.Conv2d(3, 8, 3),
            nn.Conv2d(8, 16, 3, group=8),
            nn.BatchNorm2d(16),
            nn.ReLU6(),
            nn.Conv2d(16, 4, 1),
        ]
    )


def group_conv_net() -> nn.Cell:
    """conv 3->8, group conv group=4 (8->16, weight (16, 2, 3, 3)), conv 16->4."""
    _seed()
    return nn.SequentialCell(
        [nn.Conv2d(3, 8, 3), nn.Conv2d(8, 16, 3, group=4), nn.Conv2d(16, 4, 1)]
    )


class FlattenDense(nn.Cell):
    """conv 3->4 (valid, 6x6 -> 4x4), max pool 2 -> 2x2, Flatten, Dense 16 -> 8, Dense 8 -> 2."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="valid")
        self.pool = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(16, 8, activation="relu")
        self.fc2 = nn.Dense(8, 2)

    def construct(self, x):
        return self.fc2(self.fc1(self.flatten(self.pool(self.conv(x)))))


def flatten_dense() -> nn.Cell:
    """Flatten of an NCHW map into a Dense, input (1, 3, 6, 6)."""
    _seed()
    return FlattenDense()


def sequential_net() -> nn.Cell:
    """A plain SequentialCell: conv-bn-relu-pool-conv-gap-flatten-dense, input (1, 3, 8, 8)."""
    _seed()
    return nn.SequentialCell(
        [
            nn.Conv2d(3, 6, 3),
            nn.BatchNorm2d(6),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
            nn.Conv2d(6, 4, 3),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dense(4, 2),
        ]
    )


class SharedRelu(nn.Cell):
    """conv-relu, conv2-relu through the same ReLU cell (sites relu, relu@1), Flatten of the
    NCHW map, Dense: conv 3->4 (pad 1, 6x6), conv2 4->4 (stride 2, pad 1, 3x3), Dense 36 -> 3."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.conv2 = nn.Conv2d(4, 4, 3, stride=2, pad_mode="pad", padding=1, has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 3 * 3, 3)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv2(self.relu(self.conv(x))))))


def shared_relu() -> nn.Cell:
    """One ReLU cell at two sites, then Flatten -> Dense; input (1, 3, 6, 6)."""
    _seed()
    return SharedRelu()


class CalledTwice(nn.Cell):
    """``shared`` conv called on two branches (couples a and b), ``act`` ReLU called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(3, 4, 3)
        self.shared = nn.Conv2d(4, 6, 1)
        self.act = nn.ReLU()
        self.out = nn.Conv2d(6, 2, 1)

    def construct(self, x):
        y = self.shared(self.act(self.a(x))) + self.shared(self.act(self.b(x)))
        return self.out(y)


def called_twice() -> nn.Cell:
    """A conv and a ReLU each called at two sites, input (1, 3, 8, 8)."""
    _seed()
    return CalledTwice()


class Functional(nn.Cell):
    """Functional ops: ``x + y``, ``ops.add``, ``ops.concat``, ``ops.relu`` between cells."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(3, 4, 1)
        self.c = nn.Conv2d(3, 4, 1)
        self.d = nn.Conv2d(3, 2, 1)
        self.head = nn.Conv2d(6, 2, 1)

    def construct(self, x):
        s = self.a(x) + self.b(x)
        s = ops.relu(ops.add(s, self.c(x)))
        return self.head(ops.concat((s, self.d(x)), 1))


def functional_net() -> nn.Cell:
    """Functional add/concat, input (1, 3, 8, 8)."""
    _seed()
    return Functional()


class LoopNet(nn.Cell):
    """``construct`` loops over a CellList and builds a list (rewrite loses this data flow)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 1)
        self.blocks = nn.CellList([nn.Conv2d(4, 4, 3) for _ in range(3)])
        self.head = nn.Conv2d(4, 2, 1)

    def construct(self, x):
        x = self.stem(x)
        feats = []
        for blk in self.blocks:
            x = blk(x)
            feats.append(x)
        return self.head(feats[-1] + feats[0])


def loop_net() -> nn.Cell:
    """A ``for`` loop in ``construct``, input (1, 3, 8, 8)."""
    _seed()
    return LoopNet()


INPUT_SHAPES = {
    "resnet_tiny": (1, 3, 16, 16),
    "resnet_user": (1, 3, 16, 16),
    "concat_net": (1, 3, 8, 8),
    "depthwise_net": (1, 3, 8, 8),
    "group_conv_net": (1, 3, 8, 8),
    "flatten_dense": (1, 3, 6, 6),
    "sequential_net": (1, 3, 8, 8),
    "called_twice": (1, 3, 8, 8),
    "shared_relu": (1, 3, 6, 6),
    "functional_net": (1, 3, 8, 8),
    "loop_net": (1, 3, 8, 8),
    "lenet5": (1, 1, 32, 32),
}


class LeNet5(nn.Cell):
    """The MindSpore tutorial's LeNet5: one ``self.relu`` and one ``self.max_pool2d`` called
    at four and two sites; input (1, 1, 32, 32)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.fc1 = nn.Dense(16 * 5 * 5, 120)
        self.fc2 = nn.Dense(120, 84)
        self.fc3 = nn.Dense(84, num_classes)
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()

    def construct(self, x):
        x = self.max_pool2d(self.relu(self.conv1(x)))
        x = self.max_pool2d(self.relu(self.conv2(x)))
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


def lenet5() -> nn.Cell:
    """LeNet5 (tutorial), input (1, 1, 32, 32)."""
    _seed()
    return LeNet5()


class SharedDense(nn.Cell):
    """One ``nn.Dense(6, 6)`` on ``x`` and on ``relu(x)``: two calls the compiler keeps apart
    (sites ``fc``, ``fc@1``); input (n, 6)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(6, 6)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.fc(x) + self.fc(self.relu(x))


class DenseBackToBack(nn.Cell):
    """One ``nn.Dense(6, 6)`` applied twice in a row, ``fc(fc(x))`` (sites ``fc``, ``fc@1``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(6, 6)

    def construct(self, x):
        return self.fc(self.fc(x))
