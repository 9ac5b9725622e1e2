"""Small edits of ONNX graphs shared by export and quantization (onnx only: no torch, so the
quantization code that uses them does not import it)."""

from __future__ import annotations

import onnx
from onnx import TensorProto


def drop_unused_initializers(graph: onnx.GraphProto) -> None:
    used = {name for node in graph.node for name in node.input}
    keep = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)


def gathers_columns(node: onnx.NodeProto) -> bool:
    """A Gather along an axis other than 0: the decoder's tied token lookup, which reads columns
    of the output projection's [d, vocab] weight (tie_decoder_embedding)."""
    return node.op_type == "Gather" and any(a.name == "axis" and a.i != 0 for a in node.attribute)


def splice_and_save(proto: onnx.ModelProto, path, index: int, new_nodes: list[onnx.NodeProto],
                    remove: list[onnx.NodeProto] = ()) -> bool:
    """Remove `remove`, insert `new_nodes` at `index` (counted after the removal), drop the
    initializers no node reads any more and save to `path`. Returns True: the graph changed."""
    graph = proto.graph
    for node in remove:
        graph.node.remove(node)
    for offset, node in enumerate(new_nodes):
        graph.node.insert(index + offset, node)
    drop_unused_initializers(graph)
    onnx.save(proto, str(path))
    return True


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
