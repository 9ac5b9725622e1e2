"""int8 per row: weights per output column, each row of a product's input quantized by its own
scale, so that a sentence's translation does not depend on its batch (quantize_rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import onnx

from ..onnx_passes.edit import drop_unused_initializers, replace_node, unfuse_skip_layer_norm
from .common import FLOAT_DEFAULT, ROW_ZERO_POINT, Quiet, import_contrib_ops
from .groups import GRAPHS
from .token_table import finish, plan_nodes

INT8_MAX = 127.0


def _ort_dynamic(source: Path, dest: Path, nodes: list[str]) -> None:
    """onnxruntime's quantize_dynamic of `nodes`: int8 weights per output column (symmetric), each
    product as DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul (rows_int8_products takes it
    from there)."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    if not nodes:
        onnx.save(onnx.load(str(source)), str(dest))
        return
    with Quiet():
        ort_quantize_dynamic(
            str(source),
            str(dest),
            weight_type=QuantType.QInt8,
            per_channel=True,
            nodes_to_quantize=nodes,
            op_types_to_quantize=["MatMul", "Gather"],
            extra_options={"MatMulConstBOnly": True, **FLOAT_DEFAULT},
        )


def quantize_rows(paths: dict[str, Path], out: Path, groups: dict, keep_float: Iterable[str] = ()) -> dict[str, Path]:
    """int8 that gives a sentence the same translation in any batch: weights per output column
    (symmetric, as quantize_dynamic writes them), activations per row, i.e. per token: each row
    x of a product's input gets scale max|x| / 127 and int8 values round(x / scale), stored +128
    as uint8; the product is exact in int32 (onnxruntime's MatMulIntegerToFloat), then scaled by
    the row's and the column's scales. Every graph of the package (the step graphs, the search
    graphs, the graphs for many rows) runs these same nodes, so no kernel or batch changes a
    number: a row's result depends on that row alone.

    onnxruntime's own int8 forms quantize a whole call at once (DynamicQuantizeLinear,
    DynamicQuantizeMatMul: one scale for every row of a batch, padding included) or blocks with a
    floating-point block sum (MatMulNBits: 19% of outputs identical to the exact product), so a
    sentence's translation depended on its neighbours (843 of 1000 greedy translations identical
    alone and in batches, issue 52). Layer norms are unfused (Sum + LayerNormalization) in both
    graphs for the same reason: one formulation on every path (model/onnx_passes/edit.py)."""
    out.mkdir(parents=True, exist_ok=True)
    plan, share = plan_nodes(paths, groups, keep_float)
    result = {graph: out / f"{graph}.onnx" for graph in GRAPHS}
    for graph in GRAPHS:
        _ort_dynamic(paths[graph], result[graph], plan[graph])
        proto = onnx.load(str(result[graph]))
        rows_int8_products(proto.graph)
        unfuse_skip_layer_norm(proto.graph)
        import_contrib_ops(proto)
        onnx.save(proto, str(result[graph]))
    finish(result, share, paths["decoder"])
    return result


def rows_int8_products(graph: onnx.GraphProto) -> int:
    """Every DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul chain (quantize_dynamic's form,
    which onnxruntime fuses into DynamicQuantizeMatMul when it loads) as the per-row form of
    quantize_rows: one row quantizer per input value, shared by the products that read it, and a
    MatMulIntegerToFloat per product. Returns how many products."""
    from onnx import numpy_helper

    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    weights = {t.name: t for t in graph.initializer}
    make = onnx.helper.make_node
    constants = {
        "row_int8/axes": np.array([-1], np.int64),
        "row_int8/tiny": np.array(1e-30, np.float32),
        "row_int8/int8_max": np.array(INT8_MAX, np.float32),
        "row_int8/zero_point_float": np.array(ROW_ZERO_POINT, np.float32),
        "row_int8/zero_point": np.array(ROW_ZERO_POINT, np.uint8),
    }
    quantizers: dict[str, tuple[str, str]] = {}  # input value -> (its uint8 rows, their scales)
    converted = 0
    for product in [n for n in graph.node if n.op_type == "MatMulInteger"]:
        dql = producer.get(product.input[0])
        cast = _only_reader(readers, product.output[0], "Cast")
        scale = _only_reader(readers, cast.output[0], "Mul") if cast is not None else None
        if dql is None or dql.op_type != "DynamicQuantizeLinear" or scale is None:
            continue
        combined = next(i for i in scale.input if i != cast.output[0])
        scales_mul = producer.get(combined)
        column_scale = next((i for i in scales_mul.input if i in weights), None) if scales_mul is not None else None
        zero_point = product.input[3] if len(product.input) > 3 else ""
        if column_scale is None or (zero_point and np.any(numpy_helper.to_array(weights[zero_point]))):
            raise ValueError(f"{product.name}: not quantize_dynamic's symmetric per-column form")
        x = dql.input[0]
        if x not in quantizers:
            p = f"row_int8/{len(quantizers)}"
            quantizers[x] = (f"{p}/q", f"{p}/scale")
            at = list(graph.node).index(dql)
            for offset, node in enumerate(
                [  # unnamed: a graph has a dozen of these, names are bytes
                    make("Abs", [x], [f"{p}/abs"]),
                    make("ReduceMax", [f"{p}/abs"], [f"{p}/max"], axes=[-1], keepdims=1),
                    make("Max", [f"{p}/max", "row_int8/tiny"], [f"{p}/max_safe"]),
                    make("Div", [f"{p}/max_safe", "row_int8/int8_max"], [f"{p}/scale"]),
                    make("Div", [x, f"{p}/scale"], [f"{p}/steps"]),
                    make("Round", [f"{p}/steps"], [f"{p}/rounded"]),  # half to even
                    make("Add", [f"{p}/rounded", "row_int8/zero_point_float"], [f"{p}/shifted"]),
                    make("Cast", [f"{p}/shifted"], [f"{p}/q"], to=onnx.TensorProto.UINT8),
                ]
            ):
                graph.node.insert(at + offset, node)
        q, row_scale = quantizers[x]
        replace_node(
            graph,
            product,
            [
                make(
                    "MatMulIntegerToFloat",
                    [q, product.input[1], row_scale, column_scale, "row_int8/zero_point"],
                    list(scale.output),
                    name=product.name,
                    domain="com.microsoft",
                )
            ],
        )
        for node in (cast, scale, scales_mul):
            graph.node.remove(node)
        converted += 1
    for dql in [n for n in graph.node if n.op_type == "DynamicQuantizeLinear"]:
        if not any(name in node.input for node in graph.node for name in dql.output):
            graph.node.remove(dql)
    if converted:
        graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in constants.items())
    drop_unused_initializers(graph)
    return converted


def _only_reader(readers: dict, value: str, op_type: str) -> onnx.NodeProto | None:
    nodes = readers.get(value, [])
    return nodes[0] if len(nodes) == 1 and nodes[0].op_type == op_type else None
