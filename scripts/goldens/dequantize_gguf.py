#!/usr/bin/env python3
"""Write a copy of a GGUF file in which every tensor is F32.

Usage: python3 dequantize_gguf.py IN.gguf OUT.gguf

- Tensor names, order and shapes are kept; data is dequantized with
  gguf.quants.dequantize (F32 tensors are copied bit for bit).
- Every metadata key/value is copied in file order with its exact GGUF value
  type (strings are copied as raw bytes, arrays keep their element type),
  including the tokenizer arrays. general.file_type is copied unchanged too
  (it still names the source quantization; llama.cpp only uses it for display).
- The output is read back and checked: same keys, types and values, same
  tensor names/shapes, all tensors F32 and equal to the dequantized input.

Needs the PyPI `gguf` package (tested with 0.19.0) and numpy.
"""
import sys

import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGUFValueType, GGMLQuantizationType

# Keys that GGUFReader synthesizes from the file header; they are not KV pairs.
HEADER_FIELDS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}


def scalar_value(vtype, part):
    """Python value of one scalar part (a 1-element numpy array or raw bytes)."""
    if vtype == GGUFValueType.STRING:
        return bytes(part.tobytes())
    v = part[0]
    if vtype == GGUFValueType.BOOL:
        return bool(v)
    if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        return float(v)
    return int(v)


def field_value(field):
    """(value, vtype, sub_type) of a ReaderField, strings as bytes."""
    vtype = GGUFValueType(field.types[0])
    if vtype == GGUFValueType.ARRAY:
        if len(field.types) != 2:
            raise NotImplementedError(f"nested arrays not supported: {field.name}")
        sub = GGUFValueType(field.types[1])
        vals = [scalar_value(sub, field.parts[i]) for i in field.data]
        return vals, vtype, sub
    return scalar_value(vtype, field.parts[field.data[0]]), vtype, None


def kv_items(reader):
    for name, field in reader.fields.items():
        if name in HEADER_FIELDS:
            continue
        yield name, field_value(field)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"]
    arch = bytes(arch.parts[arch.data[0]].tobytes()).decode("utf-8")

    writer = GGUFWriter(dst, arch)
    if "general.alignment" in reader.fields:
        f = reader.fields["general.alignment"]
        writer.data_alignment = int(f.parts[f.data[0]][0])
    # GGUFWriter pre-inserts general.architecture; re-adding it keeps its slot.
    for name, (val, vtype, sub) in kv_items(reader):
        writer.add_key_value(name, val, vtype, sub)

    expected = {}
    for t in reader.tensors:
        deq = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        # numpy shape is the GGUF shape reversed (ne0 is the last, fastest axis)
        np_shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        deq = np.ascontiguousarray(deq.reshape(np_shape))
        writer.add_tensor(t.name, deq)
        expected[t.name] = (np_shape, deq)
        print(f"{t.name:32s} {t.tensor_type.name:5s} -> F32 {[int(x) for x in t.shape]}", file=sys.stderr)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    # Read back and verify.
    out = GGUFReader(dst)
    src_kv = list(kv_items(reader))
    dst_kv = list(kv_items(out))
    assert [k for k, _ in src_kv] == [k for k, _ in dst_kv], "KV keys/order differ"
    for (k, a), (_, b) in zip(src_kv, dst_kv):
        assert a == b, f"KV {k} differs"
    assert [t.name for t in out.tensors] == [t.name for t in reader.tensors]
    for t in out.tensors:
        assert t.tensor_type == GGMLQuantizationType.F32, t.name
        np_shape, deq = expected[t.name]
        assert tuple(int(x) for x in reversed(t.shape.tolist())) == np_shape, t.name
        got = np.asarray(t.data).reshape(np_shape)
        assert np.array_equal(got.view(np.uint32), deq.view(np.uint32)), t.name
    print(f"wrote {dst}: {len(out.tensors)} F32 tensors, {len(dst_kv)} KV pairs (verified)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
