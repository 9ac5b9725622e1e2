"""The tied token table after int8: the decoder's lookup reads the int8 projection weight
(retie_quantized_embedding), or both graphs read one int8 table stored once in decoder.onnx
(share_token_table); and which nodes each graph quantizes, since that decides whether the table
can be shared (plan_nodes, finish)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import onnx

from ..onnx_passes.edit import drop_unused_initializers, gathers_columns, replace_node, splice_and_save
from ..onnx_passes.external import refer_to_bytes_in
from .common import ROW_ZERO_POINT, import_contrib_ops
from .groups import GRAPHS, nodes_for


def retie_quantized_embedding(path: Path) -> bool:
    """Point the decoder's tied token lookup at the int8 output-projection weight.

    After quantization the projection reads `W_quantized` (int8, one scale and zero point per
    vocabulary column) while the lookup would still read the float `W`, keeping a float copy of
    the largest tensor in the file. The lookup becomes Gather(int8 columns) -> Cast -> minus the
    gathered zero points -> times the gathered scales: the same dequantized values the projection
    uses, computed only for the tokens of the step. Returns False, changing nothing, when there
    is no such lookup or its weight was left in float."""
    proto = onnx.load(str(path))
    graph = proto.graph
    weights = {i.name: i for i in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    for index, node in enumerate(graph.node):
        if not gathers_columns(node):
            continue
        source = node.input[0]
        dq = producers.get(source)
        if dq is not None and dq.op_type == "DequantizeLinear" and all(i in weights for i in dq.input):
            quantized, scale, zero_point = (list(dq.input) + [None])[:3]
        elif f"{source}_quantized" in weights and f"{source}_scale" in weights:
            quantized, scale, zero_point = f"{source}_quantized", f"{source}_scale", f"{source}_zero_point"
            zero_point = zero_point if zero_point in weights else None
        else:
            return False
        tokens, name, out = node.input[1], node.name, node.output[0]
        if any(n.op_type == "DequantizeLinear" and quantized in n.input and n is not dq for n in graph.node):
            # QDQ: ORT fuses DequantizeLinear + MatMul only while the weight has no other reader;
            # a second reader leaves a full-table DequantizeLinear on every step (measured: 6x
            # slower decoding). The lookup gets its own int8 copy: no float copy either way.
            for tensor in (t for t in (quantized, scale, zero_point) if t is not None):
                copy = onnx.TensorProto()
                copy.CopyFrom(weights[tensor])
                copy.name = f"{tensor}_lookup"
                graph.initializer.append(copy)
                weights[copy.name] = copy
            quantized, scale = f"{quantized}_lookup", f"{scale}_lookup"
            zero_point = f"{zero_point}_lookup" if zero_point is not None else None

        def per_token(tensor: str) -> tuple[list[onnx.NodeProto], str]:
            # A per-column scale or zero point is gathered for the step's tokens; a per-tensor one is used as is.
            if len(weights[tensor].dims) == 0:
                return [], tensor
            picked = f"{name}/{tensor}_picked"
            return [onnx.helper.make_node("Gather", [tensor, tokens], [picked], name=f"{name}_{tensor}_gather")], picked

        make = onnx.helper.make_node
        new_nodes = [
            make("Gather", [quantized, tokens], [f"{name}/q"], name=f"{name}_int8", axis=1),
            make("Cast", [f"{name}/q"], [f"{name}/qf"], name=f"{name}_cast", to=onnx.TensorProto.FLOAT),
        ]
        value = f"{name}/qf"
        if zero_point is not None:
            zp_nodes, zp = per_token(zero_point)
            new_nodes += zp_nodes + [
                make("Cast", [zp], [f"{name}/zf"], name=f"{name}_zp_cast", to=onnx.TensorProto.FLOAT),
                make("Sub", [value, f"{name}/zf"], [f"{name}/centred"], name=f"{name}_sub"),
            ]
            value = f"{name}/centred"
        scale_nodes, picked_scale = per_token(scale)
        new_nodes += scale_nodes + [make("Mul", [value, picked_scale], [out], name=f"{name}_scale")]
        graph.node.remove(node)
        orphan = [dq] if dq is not None and not any(dq.output[0] in n.input for n in graph.node) else []
        if orphan and list(graph.node).index(dq) < index:
            index -= 1
        return splice_and_save(proto, path, index, new_nodes, remove=orphan)
    return False


def token_lookups(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The encoder's token lookups: Gathers of a [vocab, d] initializer by the graph's input ids."""
    inputs = {i.name for i in graph.input}
    weights = {t.name: t for t in graph.initializer}
    return [
        n
        for n in graph.node
        if n.op_type == "Gather"
        and n.input[1] in inputs
        and n.input[0] in weights
        and len(weights[n.input[0]].dims) == 2
        and not gathers_columns(n)
    ]


TABLE, TABLE_SCALES = "token_table/int8", "token_table/scales"


def share_token_table(encoder: Path, decoder: Path, source: Path) -> bool:
    """Store the tied token table once, as uint8 rows (int8 + 128) with a scale per word, inside
    decoder.onnx: the decoder's lookup and the encoder's read it with GatherBlockQuantized (one
    node; the encoder refers to the decoder file's bytes), and the output projection's int8 weight
    [d, vocab] is made from it by nodes of constants that onnxruntime folds when the session
    loads. The values are the projection's own int8 weight and scales: the package stores the
    table once (half of a small model's bytes), and a step looks a token up in one node instead
    of seven. `source`: the float decoder both were quantized from, whose tied table the encoder's
    lookup must hold. Returns False, changing nothing, where the decoder's projection is not an
    int8 product of the tied table or the encoder's table is not that table."""
    from onnx import numpy_helper

    dec = onnx.load(str(decoder))
    g = dec.graph
    weights = {t.name: t for t in g.initializer}
    producer = {out: node for node in g.node for out in node.output}
    lookup = next((n for n in g.node if gathers_columns(n)), None)
    if lookup is None:
        return False
    dq = producer.get(lookup.input[0])
    if dq is not None and dq.op_type == "DequantizeLinear" and all(i in weights for i in dq.input if i):
        quantized, scale = dq.input[0], dq.input[1]  # the QDQ writer's form
    else:
        quantized, scale = f"{lookup.input[0]}_quantized", f"{lookup.input[0]}_scale"
    product = next(
        (n for n in g.node if n.op_type == "MatMulIntegerToFloat" and n.input[1] == quantized and n.input[3] == scale),
        None,
    )
    transpose = next((n for n in g.node if n.op_type == "Transpose" and lookup.output[0] in n.input), None)
    if product is None or transpose is None or quantized not in weights or scale not in weights:
        return False
    original = onnx.load(str(source))
    float_table = next(
        (
            numpy_helper.to_array(t)
            for t in original.graph.initializer
            for n in original.graph.node
            if gathers_columns(n) and n.input[0] == t.name
        ),
        None,
    )  # [d, vocab]
    enc = onnx.load(str(encoder))
    enc_lookups = [
        n
        for n in token_lookups(enc.graph)
        if float_table is not None
        and np.array_equal(
            numpy_helper.to_array(next(t for t in enc.graph.initializer if t.name == n.input[0])), float_table.T
        )
    ]
    if not enc_lookups:
        return False
    q = numpy_helper.to_array(weights[quantized])  # int8 [d, vocab]
    scales = numpy_helper.to_array(weights[scale]).astype(np.float32)  # [vocab]
    d, vocab = q.shape
    block = max(16, 1 << (d - 1).bit_length())  # GatherBlockQuantized: a power of two
    rows = np.full((vocab, block), ROW_ZERO_POINT, np.uint8)
    rows[:, :d] = (q.T.astype(np.int16) + ROW_ZERO_POINT).astype(np.uint8)
    make = onnx.helper.make_node
    g.initializer.extend(
        [numpy_helper.from_array(rows, TABLE), numpy_helper.from_array(scales.reshape(vocab, 1), TABLE_SCALES)]
    )
    p = "token_table/projection"
    g.initializer.extend(
        numpy_helper.from_array(np.array(v, dtype), f"{p}/{name}")
        for name, v, dtype in (
            ("starts", [0], np.int64),
            ("ends", [d], np.int64),
            ("axes", [1], np.int64),
            ("zero", ROW_ZERO_POINT, np.int32),
            ("flat", [vocab], np.int64),
        )
    )
    # The product's weight and scales from the table's constants (folded at load, then prepacked).
    replace_node(
        g,
        product,
        [
            make("Slice", [TABLE, f"{p}/starts", f"{p}/ends", f"{p}/axes"], [f"{p}/rows"], name=f"{p}/rows"),
            make("Cast", [f"{p}/rows"], [f"{p}/wide"], to=onnx.TensorProto.INT32, name=f"{p}/wide"),
            make("Sub", [f"{p}/wide", f"{p}/zero"], [f"{p}/centred"], name=f"{p}/centred"),
            make("Cast", [f"{p}/centred"], [f"{p}/int8"], to=onnx.TensorProto.INT8, name=f"{p}/int8"),
            make("Transpose", [f"{p}/int8"], [f"{p}/weight"], perm=[1, 0], name=f"{p}/weight"),
            make("Reshape", [TABLE_SCALES, f"{p}/flat"], [f"{p}/scales"], name=f"{p}/scales"),
            _with_inputs(product, {1: f"{p}/weight", 3: f"{p}/scales"}),
        ],
    )
    replace_node(g, lookup, _table_lookup(g, lookup.name, lookup.input[1], transpose.output[0], d, block))
    g.node.remove(transpose)
    if dq is not None and not any(dq.output[0] in n.input for n in g.node if n is not dq):
        g.node.remove(dq)
    drop_unused_initializers(g)
    import_contrib_ops(dec)
    onnx.save(dec, str(decoder))
    # The encoder: the same rows, by reference to decoder.onnx's bytes.
    blob = decoder.read_bytes()
    for name in (TABLE, TABLE_SCALES):
        tensor = onnx.TensorProto()
        tensor.CopyFrom(next(t for t in dec.graph.initializer if t.name == name))
        if not refer_to_bytes_in(tensor, decoder.name, blob):
            raise ValueError(f"{decoder}: the bytes of {name} are not stored verbatim")
        enc.graph.initializer.append(tensor)
    for node in enc_lookups:
        replace_node(enc.graph, node, _table_lookup(enc.graph, node.name, node.input[1], node.output[0], d, block))
    drop_unused_initializers(enc.graph)
    import_contrib_ops(enc)
    onnx.save(enc, str(encoder))
    return True


def _with_inputs(node: onnx.NodeProto, inputs: dict[int, str]) -> onnx.NodeProto:
    new = onnx.NodeProto()
    new.CopyFrom(node)
    for slot, name in inputs.items():
        new.input[slot] = name
    return new


def _table_lookup(
    graph: onnx.GraphProto, name: str, tokens: str, output: str, d: int, block: int
) -> list[onnx.NodeProto]:
    """Nodes looking `tokens` up in the shared table into `output` (the rows, unpadded to d)."""
    from onnx import numpy_helper

    make = onnx.helper.make_node
    gathered = output if block == d else f"{name}/padded"
    nodes = [
        make(
            "GatherBlockQuantized",
            [TABLE, tokens, TABLE_SCALES],
            [gathered],
            name=name,
            domain="com.microsoft",
            gather_axis=0,
            quantize_axis=1,
            block_size=block,
            bits=8,
        )
    ]
    if block != d:
        bounds = [f"{name}/{k}" for k in ("starts", "ends", "axes")]
        graph.initializer.extend(
            numpy_helper.from_array(np.array([v], np.int64), n) for n, v in zip(bounds, (0, d, -1))
        )
        nodes.append(make("Slice", [gathered, *bounds], [output], name=f"{name}/unpad"))
    return nodes


def plan_nodes(paths: dict[str, Path], groups: dict, keep_float: Iterable[str]) -> tuple[dict[str, list[str]], bool]:
    """The nodes to quantize per graph, and whether the token table is to be shared
    (share_token_table: the output projection and the embeddings both in int8; the encoder's
    lookup is then left out here and reads the decoder's int8 table instead)."""
    keep = set(keep_float)
    nodes = {graph: nodes_for(groups, graph, keep) for graph in GRAPHS}
    share = "output_projection" in groups and not {"output_projection", "embeddings"} & keep
    if share:
        lookups = {n.name for n in token_lookups(onnx.load(str(paths["encoder"]), load_external_data=False).graph)}
        nodes["encoder"] = [n for n in nodes["encoder"] if n not in lookups]
    return nodes, share


def finish(result: dict[str, Path], share: bool, source: Path) -> None:
    """The tied token table once, read by both lookups and the projection (share_token_table);
    where the embeddings stay in float, the decoder's lookup still reads the int8 projection."""
    if not (share and share_token_table(result["encoder"], result["decoder"], source)):
        retie_quantized_embedding(result["decoder"])
