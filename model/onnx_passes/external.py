"""Weight sharing through external data: a derived graph holds no copy of a weight; its larger
initializers point at the same bytes inside encoder.onnx or decoder.onnx (a protobuf keeps a
raw tensor's bytes verbatim), so a package grows by the graphs' structure only."""

from __future__ import annotations

import onnx
from onnx import TensorProto

EXTERNAL_MIN_BYTES = 128  # below this a tensor's bytes cost less than a reference to them


def refer_to_bytes_in(tensor: onnx.TensorProto, source: str, blob: bytes) -> bool:
    """Make `tensor` "external data" pointing at the same bytes inside the file `source` (whose
    content is `blob`; a protobuf keeps a raw tensor's bytes verbatim) instead of holding a copy.
    onnxruntime resolves `source` next to the graph file that names it. False, and the copy
    kept, where the bytes are not there verbatim."""
    raw = tensor.raw_data
    offset = blob.find(raw) if raw else -1
    if offset < 0:
        return False
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", source), ("offset", str(offset)), ("length", str(len(raw)))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return True


def share_weights(graph: onnx.GraphProto, source: str, blob: bytes) -> int:
    """Point the graph's larger initializers at the same bytes inside the file `source` (whose
    content is `blob`); returns how many. Tensors already stored elsewhere keep their reference."""
    return sum(
        refer_to_bytes_in(tensor, source, blob)
        for tensor in graph.initializer
        if len(tensor.raw_data) >= EXTERNAL_MIN_BYTES
    )
