"""PDL packs from damaged or hostile files: bounded work, names decoded safely (issue 32)."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from amct_bridge.espdl.v3 import EspdlError, read_espdl, read_espdl_pack
from amct_bridge.espdl.v3.reader import MAX_PACK_MODELS

DATA = Path(__file__).parent.parent / "data" / "espdl_v3"
GEMM = (DATA / "test_apps_c_Gemm_linear_ishap_1_16_kshap_16_16_relu_s8.espdl").read_bytes()


def pack(names: list[bytes], model: bytes = GEMM) -> bytes:
    """A PDL2 pack whose every entry points at one copy of ``model``."""
    table_end = 8 + 12 * len(names)
    blob = b"".join(names)
    model_at = table_end + len(blob)
    entries, at = [], table_end
    for name in names:
        entries.append(struct.pack("<III", model_at, at, len(name)))
        at += len(name)
    return b"PDL2" + struct.pack("<I", len(names)) + b"".join(entries) + blob + model


def test_many_names_for_one_model_parse_it_once(tmp_path):
    path = tmp_path / "many.espdl"
    path.write_bytes(pack([f"m{i}".encode() for i in range(MAX_PACK_MODELS)]))
    start = time.perf_counter()
    models = read_espdl_pack(path)
    assert len(models) == MAX_PACK_MODELS
    assert len({id(m) for m in models.values()}) == 1
    assert time.perf_counter() - start < 30  # a bound, not a benchmark: it took 300 s+ before
    assert read_espdl(path, "m7").nodes[0].op_type == "Gemm"


def test_a_table_beyond_the_bound_is_refused_before_parsing(tmp_path):
    path = tmp_path / "huge.espdl"
    path.write_bytes(pack([f"m{i}".encode() for i in range(20_000)]))
    with pytest.raises(EspdlError, match=r"huge.espdl: pack table lists 20000 models, at most"):
        read_espdl_pack(path)


def test_a_name_that_is_not_utf8_is_a_clean_error(tmp_path):
    path = tmp_path / "bad.espdl"
    path.write_bytes(pack([b"ok", b"\xff\xfe"]))
    with pytest.raises(EspdlError, match=r"bad.espdl: pack entry 1: model name b'\\xff\\xfe'"):
        read_espdl_pack(path)


def test_a_name_listed_twice_is_refused(tmp_path):
    path = tmp_path / "twice.espdl"
    path.write_bytes(pack([b"a", b"a"]))
    with pytest.raises(EspdlError, match="pack entry 1: model name 'a' is listed twice"):
        read_espdl(path, "a")


def test_choosing_a_missing_name_lists_a_bounded_few(tmp_path):
    path = tmp_path / "list.espdl"
    path.write_bytes(pack([f"m{i}".encode() for i in range(100)]))
    with pytest.raises(EspdlError) as err:
        read_espdl(path, "nope")
    assert "and 80 more; choose one by name (got 'nope')" in str(err.value)
    assert len(str(err.value)) < 600
