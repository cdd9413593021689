"""CLI helpers for MindSpore networks: ``--mindspore module:factory [--ckpt FILE]``.

A MindSpore network is Python code, so the CLI takes a factory: ``package.module:function``
(imported with the working directory on ``sys.path``, as ``python -m`` does) or
``path/to/file.py:function``; the callable takes no argument and returns the ``nn.Cell``.
``--ckpt`` loads a checkpoint into it; every parameter must fit (name and shape). What
``ModelCheckpoint`` saves beside the weights is ignored: optimizer state, the ``<cell>.qat.*``
ranges of a ``quantize_aware`` network (its weights are the trained, folded ones that
``strip_qat`` returns) and old ``amct_bridge.*`` calibration statistics.

Example:
    >>> parse_input_shape("1,3,16,16")
    (1, 3, 16, 16)
    >>> load_mindspore_net("x")
    Traceback (most recent call last):
    ...
    amct_bridge.errors.AmctBridgeError: --mindspore x: expected module:factory (e.g. my_nets:resnet)
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any

from amct_bridge.errors import AmctBridgeError

log = logging.getLogger(__name__)

#: scalar optimizer and training state that ModelCheckpoint saves beside the network's weights
TRAINING_STATE = frozenset(
    (
        "global_step",
        "learning_rate",
        "momentum",
        "beta1_power",
        "beta2_power",
        "epoch_num",
        "step_num",
        "loss_scale",
        "current_iterator_step",
        "last_overflow_iterator_step",
    )
)


def parse_input_shape(text: str) -> tuple[int, ...]:
    """``"1,3,16,16"`` -> ``(1, 3, 16, 16)`` (AmctBridgeError naming the bad value)."""
    try:
        shape = tuple(int(d) for d in text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise AmctBridgeError(
            f"--input-shape {text!r}: expected positive integers such as 1,3,16,16"
        )
    return shape


def _import(module: str, spec: str) -> Any:
    if module.endswith(".py") or os.sep in module:
        path = Path(module)
        if not path.is_file():
            raise AmctBridgeError(f"--mindspore {spec}: file {module} not found")
        # registered in sys.modules: GRAPH_MODE compiles a cell by importing its class's module
        name = f"amct_bridge_net_{path.stem}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = mod
        try:
            mod_spec.loader.exec_module(mod)
        except Exception as err:  # the user's file: its error, named, is not our bug
            sys.modules.pop(name, None)
            raise AmctBridgeError(f"--mindspore {spec}: {module} raised {_text(err)}") from None
        return mod
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise AmctBridgeError(f"--mindspore {spec}: cannot import {module!r}: {err}") from None
    except Exception as err:  # an error inside the user's module
        raise AmctBridgeError(
            f"--mindspore {spec}: importing {module} raised {_text(err)}"
        ) from None
    finally:
        if added:
            sys.path.remove(os.getcwd())


def _text(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def load_mindspore_net(spec: str, ckpt: str | None = None, *, weights_matter: bool = True) -> Any:
    """Import ``module:factory``, call the factory, load ``ckpt`` into the network.

    Args:
        spec: ``package.module:factory`` or ``path/file.py:factory``.
        ckpt: a MindSpore checkpoint (.ckpt) whose parameters must match the network's
            ``parameters_and_names()`` in names and shapes; None keeps the factory's weights
            (with a warning, unless ``weights_matter`` is False: prune groups read the graph).

    Returns:
        The ``mindspore.nn.Cell``. Errors are AmctBridgeError naming the spec, the file and the
        parameters that do not fit.

    Example:
        >>> net = load_mindspore_net("mindspore.nn:Identity")
        >>> type(net).__name__
        'Identity'
    """
    module, sep, factory = spec.rpartition(":")
    if not sep or not module or not factory:
        raise AmctBridgeError(f"--mindspore {spec}: expected module:factory (e.g. my_nets:resnet)")
    fn = getattr(_import(module, spec), factory, None)
    if not callable(fn):
        raise AmctBridgeError(f"--mindspore {spec}: {module} has no callable {factory!r}")
    import mindspore as ms  # heavy: only when a command needs a network

    try:
        net = fn()
    except Exception as err:  # the user's factory: its error, named, is not our bug
        raise AmctBridgeError(f"--mindspore {spec}: {factory}() raised {_text(err)}") from None
    if not isinstance(net, ms.nn.Cell):
        raise AmctBridgeError(
            f"--mindspore {spec}: the factory returned {type(net).__name__}, not an nn.Cell"
        )
    if ckpt is not None:
        load_checkpoint(net, ckpt)
    elif weights_matter:
        # a calibration and export of fresh random weights runs through without a hint
        # (chip accuracy 0.23 in a trial): say it once, loudly
        log.warning(
            "--mindspore %s without --ckpt: the network has the weights %s() gave it (random "
            "initial weights unless the factory loads trained ones); pass --ckpt FILE.ckpt",
            spec,
            factory,
        )
    return net


def load_checkpoint(net: Any, ckpt: str) -> None:
    """Load ``ckpt`` into ``net`` after checking every parameter fits (names and shapes).

    Example:
        >>> from mindspore import nn
        >>> load_checkpoint(nn.Dense(2, 3), "missing.ckpt")
        Traceback (most recent call last):
        ...
        amct_bridge.errors.AmctBridgeError: missing.ckpt: checkpoint file not found
    """
    if not Path(ckpt).is_file():
        raise AmctBridgeError(f"{ckpt}: checkpoint file not found")
    import mindspore as ms

    try:
        saved = ms.load_checkpoint(ckpt)
    except Exception as err:  # MindSpore raises ValueError/RuntimeError for a bad file
        raise AmctBridgeError(f"{ckpt}: cannot read checkpoint: {err}") from None
    own = {p.name: tuple(p.shape) for _, p in net.parameters_and_names()}
    ignored = _training_state(saved, own, {name for name, _ in net.cells_and_names()})
    if ignored["statistics"]:
        log.warning(
            "%s: ignoring %d amct_bridge.* entries (calibration statistics an older amct_bridge "
            "saved into checkpoints of a calibrated epoch; they are not weights)",
            ckpt,
            len(ignored["statistics"]),
        )
    if ignored["qat"]:
        # a quantize_aware network's checkpoint: its weights and BNs are what strip_qat gives
        log.info(
            "%s: a checkpoint of a quantize_aware network: ignoring its %d QAT range entries "
            "(<cell>.qat.*); its trained, folded weights load as strip_qat() returns them",
            ckpt,
            len(ignored["qat"]),
        )
    if ignored["optimizer"]:
        log.info("%s: ignoring %d optimizer entries", ckpt, len(ignored["optimizer"]))
    saved = {k: v for k, v in saved.items() if k not in ignored["all"]}
    # unexpected names and shape conflicts first: they tell which network a checkpoint is of
    problems = [f"{name} is not a parameter of the network" for name in saved if name not in own]
    problems += [
        f"{name} {tuple(saved[name].shape)} in the checkpoint, {shape} in the network"
        for name, shape in own.items()
        if name in saved and tuple(saved[name].shape) != shape
    ]
    problems += [f"{name} missing from the checkpoint" for name in own if name not in saved]
    if own and saved and not set(own) & set(saved):
        raise AmctBridgeError(
            f"{ckpt}: checkpoint does not fit {type(net).__name__}: none of its "
            f"{len(saved)} parameter names is one of the network's {len(own)} (first: "
            f"{next(iter(saved))!r} vs {next(iter(own))!r}): a checkpoint of another network?"
        )
    if problems:
        shown = "; ".join(problems[:8]) + (
            f"; ... {len(problems) - 8} more" if len(problems) > 8 else ""
        )
        raise AmctBridgeError(
            f"{ckpt}: checkpoint does not fit {type(net).__name__} ({len(problems)} "
            f"parameter(s)): {shown}"
        )
    ms.load_param_into_net(net, saved, strict_load=True)


def _training_state(saved: dict, own: dict, cells: set[str]) -> dict[str, set[str]]:
    """Checkpoint entries that are not the network's weights: amct_bridge statistics, the QAT
    ranges of a ``quantize_aware`` network (``<cell>.qat.<tensor>_min|max|seen`` of a cell of
    ``cells``), and what ModelCheckpoint saves of the optimizer (scalars, and slots named
    ``<slot>.<parameter>``, also of a learned QAT range)."""
    statistics = {k for k in saved if k.startswith("amct_bridge.") and k not in own}
    qat = {k for k in saved if k not in own and _qat_range(k, cells)}
    optimizer = {
        k
        for k in saved
        if k not in own
        and k not in qat
        and (
            k in TRAINING_STATE
            or ("." in k and (k.split(".", 1)[1] in own or _qat_range(k.split(".", 1)[1], cells)))
        )
    }
    return {
        "statistics": statistics,
        "qat": qat,
        "optimizer": optimizer,
        "all": statistics | qat | optimizer,
    }


def _qat_range(name: str, cells: set[str]) -> bool:
    """``conv1.qat.input_min`` (amct_bridge.mindspore.qat.cells' names) of a cell of ``cells``."""
    cell, sep, tail = name.rpartition(".qat.")
    tensor, _, end = tail.rpartition("_")
    return bool(sep) and cell in cells and tensor in ("input", "output") and end in _QAT_ENDS


_QAT_ENDS = ("min", "max", "seen")
