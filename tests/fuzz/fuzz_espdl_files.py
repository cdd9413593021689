"""The ``.espdl`` file campaign: mutate real files, run ``amct-bridge espdl-run FILE --check``.

Seeds are the ``.espdl`` files the tests already hold (``tests/data/espdl_v3``: Espressif's
published models and the operator test suite subset, every op of the runtime). Each case is one
mutation of one seed, of one of eight kinds (:data:`KINDS`), run through the command's ``main``
in this process; the outcome is ``success`` (exit 0 or 1: it ran and compared), ``clean`` (exit 2,
one error line that names the file), or a failure: ``internal`` (exit 70), ``hang`` (no answer
within :data:`HANG_SECONDS`), ``memory`` (a MemoryError under the child's address-space limit),
``unnamed`` (a clean error that does not name the file) or ``long`` (an error line over 2,000
characters).

Run it as a child process with a memory limit (``tests/fuzz/test_fuzz_espdl_files.py`` does)::

    python tests/fuzz/fuzz_espdl_files.py --seed 1 --cases 40 --memory-gb 3

It prints one JSON object: counts per kind and outcome, and the first few failures with the
mutation that made them (``seed``, ``kind``, ``case``: rerun one with ``--only KIND:CASE``).

Example:
    >>> rng = random.Random(0)
    >>> len(truncate(rng, b"EDL2" + bytes(60))) < 64
    True
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import random
import resource
import signal
import struct
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from amct_bridge import cli
from amct_bridge.espdl.v3.model import EspdlModel
from amct_bridge.espdl.v3.reader import parse_espdl
from amct_bridge.espdl.v3.simulate import supported_ops
from amct_bridge.espdl.v3.writer import espdl_bytes

DATA = Path(__file__).resolve().parents[1] / "data" / "espdl_v3"
#: Seconds one case may run before it counts as a hang.
HANG_SECONDS = 20
#: Longest error line the command may print (cli.error_text's cap, with room for the prefix).
MAX_LINE = 2100
#: Files above this size are seeds for byte-level kinds only (a whole 224x224 model per case
#: would spend the campaign on one file).
BIG_SEED = 100_000

INTERESTING_INTS = [
    0,
    1,
    -1,
    2,
    3,
    7,
    -7,
    16,
    31,
    32,
    33,
    63,
    64,
    65,
    100,
    255,
    10_000,
    2**16,
    2**31 - 1,
    -(2**31),
    2**33,
    2**62,
    2**63 - 1,
    -(2**63),
]
INTERESTING_FLOATS = [0.0, -0.0, 1e-45, -1.0, 1e30, -1e30, math.inf, -math.inf, math.nan, 1e300]
INTERESTING_U32 = [0, 1, 2, 4, 8, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]


def seeds() -> list[Path]:
    """Every ``.espdl`` file under ``tests/data/espdl_v3`` (sorted: the same cases every run)."""
    return sorted(DATA.rglob("*.espdl"))


# --- byte-level kinds -------------------------------------------------------------------------


def truncate(rng: random.Random, data: bytes) -> bytes:
    """The file cut at a random point (the header, the FlatBuffer, the padding)."""
    return data[: rng.randrange(len(data))]


def header(rng: random.Random, data: bytes) -> bytes:
    """A damaged header: magic, mode (encryption), length, the EDL1/EDL2 framing."""
    out = bytearray(data)
    choice = rng.randrange(6)
    if choice == 0:
        out[:4] = rng.choice([b"EDL1", b"EDL3", b"PDL2", b"PDL1", b"\0\0\0\0", b"edl2"])
    elif choice == 1:
        struct.pack_into("<I", out, 4, rng.choice([1, 2, 3, 0xFFFFFFFF]))
    elif choice == 2:
        struct.pack_into("<I", out, 8, rng.choice(INTERESTING_U32))
    elif choice == 3:
        length = struct.unpack_from("<I", out, 8)[0]
        struct.pack_into("<I", out, 8, max(0, length + rng.randint(-64, 64)))
    elif choice == 4:
        struct.pack_into("<I", out, 12, rng.choice(INTERESTING_U32))
    else:
        out = out[:4] + out[8:] if rng.random() < 0.5 else out[:12] + bytes(4) + out[12:]
    return bytes(out)


def bit_flips(rng: random.Random, data: bytes) -> bytes:
    """One to eight flipped bits, or a run of 1-16 bytes overwritten (0x00, 0xFF, random)."""
    out = bytearray(data)
    if rng.random() < 0.6:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(16, len(out))
            out[i] ^= 1 << rng.randrange(8)
    else:
        start = rng.randrange(16, len(out))
        run = rng.randint(1, 16)
        fill = rng.choice([0x00, 0xFF, None])
        for i in range(start, min(len(out), start + run)):
            out[i] = rng.randrange(256) if fill is None else fill
    return bytes(out)


def words(rng: random.Random, data: bytes) -> bytes:
    """Aligned 32-bit words set to boundary values: FlatBuffer offsets, vtable entries, vector
    lengths and string lengths are such words."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        i = 16 + 4 * rng.randrange((len(out) - 16) // 4)
        value = rng.choice(INTERESTING_U32 + [struct.unpack_from("<I", out, i)[0] + 4])
        struct.pack_into("<I", out, i, value & 0xFFFFFFFF)
    return bytes(out)


# --- model-level kinds (through our writer) -------------------------------------------------


def _pick_node(rng: random.Random, model: EspdlModel):
    return rng.choice(model.nodes) if model.nodes else None


def _bad_value(rng: random.Random, like):
    """A value of another type or out of range, for an attribute holding ``like``."""
    choice = rng.randrange(8)
    if choice == 0:
        return rng.choice(INTERESTING_INTS)
    if choice == 1:
        return rng.choice(INTERESTING_FLOATS)
    if choice == 2:
        return rng.choice(["", "S8", "S32", "F32", "\x00", "nearest", "x" * 300, "Linear"])
    if choice == 3:
        return [rng.choice(INTERESTING_INTS) for _ in range(rng.randint(0, 6))]
    if choice == 4:
        return [rng.choice(INTERESTING_FLOATS) for _ in range(rng.randint(1, 4))]
    if choice == 5 and isinstance(like, list) and like:  # the same list, one element bad
        bad = list(like)
        bad[rng.randrange(len(bad))] = rng.choice(INTERESTING_INTS)
        return bad
    if choice == 6 and isinstance(like, list):  # a length the op does not expect
        return list(like) + [1] if rng.random() < 0.5 else list(like)[:-1]
    return ["a", "b"]


def attributes(rng: random.Random, model: EspdlModel) -> None:
    """An attribute of a node given a value of another type or out of its range, added or
    dropped."""
    node = _pick_node(rng, model)
    if node is None:
        return
    names = list(node.attributes)
    common = ["pads", "strides", "dilations", "group", "kernel_shape", "axis", "axes", "perm"]
    name = rng.choice(names + common + ["quant_type", "activation", "mode", "keepdims"])
    if name in node.attributes and rng.random() < 0.15:
        del node.attributes[name]
        node.attribute_types.pop(name, None)
        return
    node.attributes[name] = _bad_value(rng, node.attributes.get(name))
    node.attribute_types.pop(name, None)  # the writer infers the type of the new value


def tensors(rng: random.Random, model: EspdlModel) -> None:
    """A tensor's dims, element type, exponents or values (NaN, inf) changed; or a value_info's
    shape or exponent."""
    choice = rng.randrange(6)
    pool = list(model.initializers.values()) + list(model.test_inputs)
    if choice <= 2 and pool:
        t = rng.choice(pool)
        if choice == 0:  # exponents: out of range, none, several
            t.exponents = rng.choice(
                [[rng.choice(INTERESTING_INTS)], [], [0, 1], [2**33], [-(2**63)]]
            )
        elif choice == 1:  # other element type, same bytes
            dtype = rng.choice([np.int8, np.int16, np.int32, np.int64, np.float32, np.uint8])
            raw = t.data.reshape(-1).view(np.uint8)
            n = raw.size // np.dtype(dtype).itemsize
            t.data = raw[: n * np.dtype(dtype).itemsize].view(dtype).copy()
        else:  # values: NaN / inf in floats, extremes in ints, other shapes
            data = t.data.copy()
            if data.size and np.issubdtype(data.dtype, np.floating):
                data.reshape(-1)[rng.randrange(data.size)] = rng.choice(INTERESTING_FLOATS)
            elif data.size:
                info = np.iinfo(data.dtype)
                data.reshape(-1)[rng.randrange(data.size)] = rng.choice([info.min, info.max])
            if rng.random() < 0.4:
                data = data.reshape(-1)[: rng.randrange(data.size + 1)] if data.size else data
            t.data = data
        return
    infos = list(model.inputs) + list(model.outputs) + list(model.value_info)
    if not infos:
        return
    info = rng.choice(infos)
    if choice == 3:
        info.exponents = rng.choice([[rng.choice(INTERESTING_INTS)], [], [0, 0]])
    elif choice == 4 and info.shape:
        shape = list(info.shape)
        shape[rng.randrange(len(shape))] = rng.choice([0, 1, 10_000, 2**31 - 1])
        info.shape = shape
    else:
        info.elem_type = rng.choice([0, 1, 2, 3, 5, 6, 7, 11, 99])


def graph(rng: random.Random, model: EspdlModel) -> None:
    """Node inputs retargeted (to a later output: a cycle; to nothing; to a constant), outputs
    duplicated, op types swapped for another runtime op or an unknown one, nodes removed."""
    node = _pick_node(rng, model)
    if node is None:
        return
    choice = rng.randrange(6)
    produced = [o for n in model.nodes for o in n.outputs]
    if choice == 0 and node.inputs:
        node.inputs[rng.randrange(len(node.inputs))] = rng.choice(
            produced + list(model.initializers) + ["", "missing"]
        )
    elif choice == 1:
        node.inputs = node.inputs[: rng.randrange(len(node.inputs) + 1)]
    elif choice == 2:
        node.op_type = rng.choice(supported_ops() + ["Bogus", "", "conv"])
    elif choice == 3 and len(model.nodes) > 1:
        model.nodes.remove(node)
    elif choice == 4:
        model.nodes.append(node)  # the same node twice: outputs written twice
    else:
        node.outputs = node.outputs + [rng.choice(produced)] if produced else []


MODEL_KINDS: dict[str, Callable[[random.Random, EspdlModel], None]] = {
    "attributes": attributes,
    "tensors": tensors,
    "graph": graph,
}


def pack(rng: random.Random, datas: list[bytes]) -> bytes:
    """A PDL1/PDL2 pack of seed models, its table damaged: names not UTF-8, repeated, many
    entries for one model, offsets beyond the end or into another model."""
    models = [rng.choice(datas) for _ in range(rng.randint(1, 3))]
    count = len(models)
    names = [f"m{i}".encode() for i in range(count)]
    choice = rng.randrange(6)
    if choice == 0:
        names[0] = bytes([0xFF, 0xFE, rng.randrange(256)])
    elif choice == 1 and count > 1:
        names[1] = names[0]
    elif choice == 2:  # many names on one model
        count = rng.choice([50, 1000, 1025, 20_000])
        models = models[:1]
        names = [f"n{i}".encode() for i in range(count)]
    magic = rng.choice([b"PDL2", b"PDL1"])
    table_end = 8 + 12 * count
    name_blob = b"".join(n + b"\0" for n in names)
    body_start = table_end + len(name_blob)
    body_start += -body_start % 16
    offsets, body = [], b""
    for data in models:
        offsets.append(body_start + len(body))
        body += data + bytes(-len(data) % 16)
    table, name_at = b"", table_end
    for i, name in enumerate(names):
        offset = offsets[min(i, len(offsets) - 1)]
        if choice == 3 and i == 0:
            offset = rng.choice([0, 8, 0xFFFFFFF0, body_start + len(body) + 16])
        length = len(name) if choice != 4 else 0xFFFF
        table += struct.pack("<III", offset, name_at, length)
        name_at += len(name) + 1
    out = magic + struct.pack("<I", count) + table + name_blob
    out += bytes(body_start - len(out)) + body
    if choice == 5:
        out = out[: rng.randrange(8, len(out))]
    return out


KINDS = ("truncation", "header", "bit_flips", "words", "attributes", "tensors", "graph", "pack")


def make_case(kind: str, rng: random.Random, files: list[Path], cache: dict) -> bytes:
    """The bytes of one mutated file of ``kind``."""

    def data(path: Path) -> bytes:
        if path not in cache:
            cache[path] = path.read_bytes()
        return cache[path]

    small = [p for p in files if p.stat().st_size < BIG_SEED]
    if kind == "pack":
        return pack(rng, [data(rng.choice(small)) for _ in range(3)])
    if kind in MODEL_KINDS:
        source = rng.choice(small)
        model = parse_espdl(data(source), str(source))
        try:
            with warnings.catch_warnings():  # a mutated value beyond its field's type wraps
                warnings.simplefilter("ignore", RuntimeWarning)
                for _ in range(rng.choice([1, 1, 1, 2, 3])):
                    MODEL_KINDS[kind](rng, model)
                return espdl_bytes(model)
        except Exception:  # the writer refuses what it cannot write: a byte-level case instead
            return bit_flips(rng, data(source))
    source = rng.choice(files if rng.random() < 0.05 else small)
    return {"truncation": truncate, "header": header, "bit_flips": bit_flips, "words": words}[kind](
        rng, data(source)
    )


class _Hang(Exception):
    pass


def run_case(path: Path) -> tuple[str, str]:
    """``(outcome, first error line)`` of ``amct-bridge espdl-run PATH --check``."""
    out, err = io.StringIO(), io.StringIO()

    def alarm(signum, frame):
        raise _Hang

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["espdl-run", str(path), "--check"])
    except _Hang:
        return "hang", f"no answer in {HANG_SECONDS} s"
    except MemoryError:
        return "memory", "MemoryError"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    text = err.getvalue()
    line = text.strip().splitlines()[0] if text.strip() else ""
    if any(len(x) > MAX_LINE for x in (out.getvalue() + text).splitlines()):
        return "long", line[:300]
    if code in (0, 1):
        return "success", ""
    if code == 70:
        return ("memory" if "MemoryError" in text else "internal"), line
    if code == 2 and path.name not in text:
        return "unnamed", line
    if code == 2:
        return "clean", ""
    return "internal", f"exit {code}: {line}"


def _where(path: Path) -> str:
    """The innermost frames of an internal error, from a ``--debug`` rerun."""
    import traceback

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli.main(["--debug", "espdl-run", str(path), "--check"])
    except Exception as err:
        frames = traceback.extract_tb(err.__traceback__)[-3:]
        return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.line}" for f in reversed(frames))
    return ""


def campaign(
    seed: int, cases: int, kinds=KINDS, only: str | None = None, explain: bool = False
) -> dict:
    """Run ``cases`` mutations of every kind; counts per kind and outcome, first failures."""
    files = seeds()
    cache: dict[Path, bytes] = {}
    counts: dict[str, Counter] = defaultdict(Counter)
    failures: list[dict] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            for case in range(cases):
                if only and only != f"{kind}:{case}":
                    continue
                rng = random.Random(f"{seed}:{kind}:{case}")
                data = make_case(kind, rng, files, cache)
                path = Path(tmp) / f"case_{kind}_{case}.espdl"
                path.write_bytes(data)
                outcome, line = run_case(path)
                counts[kind][outcome] += 1
                if outcome not in ("success", "clean") and len(failures) < 40:
                    failure = {"kind": kind, "case": case, "outcome": outcome, "line": line}
                    if explain and outcome == "internal":
                        failure["where"] = _where(path)
                    failures.append(failure)
                path.unlink()
    return {
        "seed": seed,
        "seconds": round(time.perf_counter() - started, 1),
        "counts": {k: dict(v) for k, v in counts.items()},
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the campaign under an address-space limit; print its JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", type=int, default=20, help="cases per kind")
    parser.add_argument("--memory-gb", type=float, default=3.0, help="0: no limit")
    parser.add_argument("--only", help="KIND:CASE, to rerun one case")
    parser.add_argument("--explain", action="store_true", help="where internal errors arise")
    args = parser.parse_args(argv)
    if args.memory_gb > 0:
        limit = int(args.memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    result = campaign(args.seed, args.cases, only=args.only, explain=args.explain)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
