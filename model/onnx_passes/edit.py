"""Small edits of ONNX graphs shared by export and quantization (onnx only: no torch, so the
quantization code that uses them does not import it)."""

from __future__ import annotations

from collections import Counter

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


def unfuse_skip_layer_norm(graph: onnx.GraphProto, residual_op: str = "Add", fold_bias: bool = False) -> int:
    """Every com.microsoft SkipLayerNormalization as Add (+ Add bias) + LayerNormalization;
    returns how many. Measured on the CPU (onnxruntime 1.24, one thread, d_model 128): the fused
    kernel took 641 us at [32, 20, 128] and 132 at [128, 1, 128] against 179 and 45 for the three
    standard ops, and the same at one row (10 us), so graphs that run on many rows at once (the
    encoder, decoder_batch.onnx) take the standard form.

    onnxruntime 1.31 fuses Add + LayerNormalization back into that kernel on the CPU too, where
    both Add inputs are [rows, 1, d] (the decoder's residuals; not where the bias is a second Add
    after it), and the kernel is still 4-6x slower from 4 rows on (five residual norms, d 256, one
    thread, us at 4 / 32 / 128 rows: 33 / 214 / 839 fused, 13 / 37 / 117 Add + LayerNormalization
    unfused, 16 / 45 / 149 with the bias as a second Add). So `residual_op` "Sum" (which it does
    not fuse; 14 / 38 / 122) for the decoder's step graphs, and `fold_bias` puts the bias into the
    DynamicQuantizeMatMul that makes x or skip, where that product has none and feeds nothing
    else: one Add a residual less."""
    # Readers of each value: node inputs (branches included) and the graph's outputs.
    uses = Counter(_inputs_everywhere(graph)) + Counter(o.name for o in graph.output)
    producer = {out: node for node in graph.node for out in node.output}
    done = 0
    for node in [n for n in graph.node if n.op_type == "SkipLayerNormalization" and n.domain == "com.microsoft"]:
        outputs = list(node.output) + [""] * (4 - len(node.output))
        if any(name and name in uses for name in outputs[1:3]):
            continue  # its mean or inverse deviation is read: keep the kernel that gives them
        inputs = list(node.input) + [""] * (5 - len(node.input))
        x, skip, gamma, beta, bias = inputs[:5]
        if bias and fold_bias:
            for term in (x, skip):
                product = producer.get(term)
                if product is None or product.op_type != "DynamicQuantizeMatMul" or uses[term] != 1:
                    continue  # not an int8 product, or its output is read elsewhere too
                if len(product.input) > 4 and product.input[4]:
                    continue  # it has a bias of its own
                del product.input[4:]
                product.input.append(bias)
                bias = ""
                break
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)
        total = outputs[3] if outputs[3] else f"{node.output[0]}/sum"
        if residual_op == "Sum":  # Sum takes the bias as a third term: one node, one pass
            nodes = [onnx.helper.make_node("Sum", [x, skip] + ([bias] if bias else []), [total], name=f"{node.name}/add")]
        else:
            summed = f"{total}/no_bias" if bias else total
            nodes = [onnx.helper.make_node(residual_op, [x, skip], [summed], name=f"{node.name}/add")]
            if bias:
                nodes.append(onnx.helper.make_node("Add", [summed, bias], [total], name=f"{node.name}/bias"))
        nodes.append(onnx.helper.make_node("LayerNormalization", [total, gamma] + ([beta] if beta else []),
                                           [node.output[0]], axis=-1, epsilon=epsilon, name=f"{node.name}/norm"))
        replace_node(graph, node, nodes)
        done += 1
    return done


def _inputs_everywhere(graph: onnx.GraphProto):
    """Every input name of every node, those inside subgraphs (If branches) included."""
    for node in graph.node:
        yield from node.input
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)):
                yield from _inputs_everywhere(sub)


def replace_node(graph: onnx.GraphProto, node: onnx.NodeProto, nodes: list[onnx.NodeProto]) -> None:
    """`nodes` where `node` was, in order (so the graph stays topologically sorted)."""
    index = list(graph.node).index(node)
    graph.node.remove(node)
    for offset, new in enumerate(nodes):
        graph.node.insert(index + offset, new)
