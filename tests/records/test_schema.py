"""The generated code matches proto/, and equals a schema compiled independently in the test."""

import filecmp
import importlib.util
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from amct_bridge.records import to_proto
from amct_bridge.records._pb import inner_scale_offset_record_pb2, scale_offset_record_pb2
from amct_bridge.records.io import loads

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto"
GENERATED = ROOT / "amct_bridge" / "records" / "_pb"
DATA = ROOT / "tests" / "data" / "amct"


def _generate_module():
    """proto/generate.py, loaded by path (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("proto_generate", PROTO / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_up_to_date_with_proto_dir(tmp_path):
    fresh = _generate_module().generate(tmp_path)
    names = sorted(p.name for p in fresh)
    assert names == sorted(p.name for p in GENERATED.glob("*.py")), "run `make proto`"
    for path in fresh:
        assert filecmp.cmp(path, GENERATED / path.name, shallow=False), (
            f"{path.name} differs from proto/: run `make proto`"
        )


def _independent_classes(tmp_path):
    """Compile proto/ with protoc into a descriptor set and build classes in a private pool."""
    out = tmp_path / "schema.desc"
    protos = sorted(p.name for p in PROTO.glob("*.proto"))
    _generate_module().run_protoc(["--include_imports", f"--descriptor_set_out={out}", *protos])
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file_proto in fds.file:
        pool.Add(file_proto)

    def get(name):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    return get("AMCTTensorflow.InnerScaleOffsetRecord"), get("AMCTTensorflow.ScaleOffsetRecord")


def test_records_parse_identically_with_an_independently_compiled_schema(tmp_path):
    inner_cls, tf_cls = _independent_classes(tmp_path)
    assert inner_cls is not inner_scale_offset_record_pb2.InnerScaleOffsetRecord
    assert tf_cls is not scale_offset_record_pb2.ScaleOffsetRecord
    cases = [
        (DATA / "tf_mobilenet_v2_record_quantized.txt", tf_cls, "tf"),
        (DATA / "prune_record_single_conv.txt", inner_cls, "inner"),
    ]
    for path, cls, flavor in cases:
        text = path.read_text()
        independent = text_format.Parse(text, cls())
        ours = to_proto(loads(text), flavor)
        assert ours.SerializeToString(deterministic=True) == independent.SerializeToString(
            deterministic=True
        )
