"""int8 with calibrated activation scales (QDQ from onnxruntime's quantizer, then run as
MatMulIntegerToFloat): quantize_static."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import onnx

from ..onnx_passes.edit import drop_unused_initializers, replace_node
from .common import FLOAT_DEFAULT, ROW_ZERO_POINT, Quiet, import_contrib_ops
from .groups import GRAPHS
from .token_table import finish, plan_nodes


class FeedReader:
    """onnxruntime's CalibrationDataReader over recorded graph inputs. With set_range, ORT
    calibrates one feed at a time (CalibStridedMinMax=1): the decoder's inputs grow step by
    step, and the histogram calibrators cannot stack outputs of different shapes."""

    def __init__(self, feeds: list[dict]):
        self.feeds = feeds
        self.start, self.end = 0, len(feeds)

    def __len__(self) -> int:
        return len(self.feeds)

    def set_range(self, start_index: int, end_index: int) -> None:
        self.start, self.end = start_index, end_index

    def get_next(self) -> dict | None:
        if self.start >= self.end:
            return None
        self.start += 1
        return self.feeds[self.start - 1]


def quantize_static(
    paths: dict[str, Path],
    out: Path,
    groups: dict,
    feeds: dict[str, list[dict]],
    method: str = "minmax",
    keep_float: Iterable[str] = (),
    per_channel: bool = True,
    cache: Path | None = None,
) -> dict[str, Path]:
    """int8 with activation scales calibrated on `feeds` (per graph: a list of input dicts): one
    fixed scale per product input, symmetric, and int8 weights per output column. A number's
    int8 value depends on that number alone, so a sentence's translation does not depend on its
    batch, and the products cost what onnxruntime's dynamic ones do (no range to find per call).
    onnxruntime's calibration and QDQ writer make the scales and weights; static_int8_products
    then runs each product as QuantizeLinear (uint8, + 128) and MatMulIntegerToFloat, and leaves
    the products' outputs in float.

    The ranges of every MatMul input are computed once and kept in `cache` (a folder), so that
    quantizing again with other groups kept in float does not calibrate again."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    calibrate = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[method]
    out.mkdir(parents=True, exist_ok=True)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    plan, share = plan_nodes(paths, groups, keep_float)
    result = {}
    for graph in GRAPHS:
        dest = out / f"{graph}.onnx"
        if not plan[graph]:
            onnx.save(onnx.load(str(paths[graph])), str(dest))
        else:
            with Quiet():
                ort_quantize_static(
                    with_value_types(onnx.load(str(paths[graph]))),
                    str(dest),
                    FeedReader(feeds[graph]),
                    quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8,
                    per_channel=per_channel,
                    calibrate_method=calibrate,
                    nodes_to_quantize=plan[graph],
                    op_types_to_quantize=["MatMul", "Gather"],
                    calibration_providers=["CPUExecutionProvider"],
                    calibration_cache_path=str(cache / f"{graph}.{method}.json") if cache else None,
                    extra_options={
                        "CalibStridedMinMax": 1,
                        "ActivationSymmetric": True,
                        "WeightSymmetric": True,
                        "CalibTensorRangeSymmetric": True,
                        **FLOAT_DEFAULT,
                    },
                )
            proto = onnx.load(str(dest))
            static_int8_products(proto.graph)
            import_contrib_ops(proto)
            onnx.save(proto, str(dest))
        result[graph] = dest
    finish(result, share, paths["decoder"])
    return result


def with_value_types(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The graph with a type for every value, from onnxruntime's symbolic shape inference, which
    knows its own fused ops. onnxruntime's calibrator measures only values whose type it knows,
    and its quantizer leaves a product whose input was not measured with float activations
    (DequantizeLinear + MatMul, run as a slow MatMulNBits). ONNX's own shape inference stops at
    a com.microsoft op it has no schema for (a GELU model's BiasGelu) and types nothing after it:
    13 of the 34 products of a pre-LN GELU model at the teacher's shape were left so."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    return SymbolicShapeInference.infer_shapes(proto, auto_merge=True, guess_output_rank=True)


def static_int8_products(graph: onnx.GraphProto) -> int:
    """onnxruntime's QDQ products (MatMul over DequantizeLinear(QuantizeLinear(x)) and a constant
    DequantizeLinear(int8 weight)) as QuantizeLinear(x) to uint8 (its int8 value + 128, the
    activations onnxruntime's fast int8 kernels take: signed ones ran 20x slower here) and
    MatMulIntegerToFloat, the bias of an Add that follows taken in; the QDQ writer's fake
    quantization of the products' outputs is dropped (one rounding less, and a node pair).
    Returns how many products."""
    from onnx import numpy_helper

    producer = {out: node for node in graph.node for out in node.output}
    weights = {t.name: t for t in graph.initializer}
    make = onnx.helper.make_node
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    quantizers: dict[str, str] = {}  # activation value -> its uint8 form
    converted = 0

    def constant_dq(name: str) -> onnx.NodeProto | None:
        node = producer.get(name)
        return (
            node
            if node is not None and node.op_type == "DequantizeLinear" and all(i in weights for i in node.input if i)
            else None
        )

    for product in [n for n in graph.node if n.op_type == "MatMul"]:
        dq_a, dq_b = producer.get(product.input[0]), constant_dq(product.input[1])
        q_a = producer.get(dq_a.input[0]) if dq_a is not None and dq_a.op_type == "DequantizeLinear" else None
        if q_a is None or q_a.op_type != "QuantizeLinear" or dq_b is None:
            continue
        x, scale = q_a.input[0], q_a.input[1]
        weight, column_scale = dq_b.input[0], dq_b.input[1]
        zero = dq_b.input[2] if len(dq_b.input) > 2 else ""
        if np.ndim(numpy_helper.to_array(weights[scale])) or (zero and np.any(numpy_helper.to_array(weights[zero]))):
            raise ValueError(f"{product.name}: not a per-tensor activation scale and symmetric weights")
        if x not in quantizers:
            quantizers[x] = f"{x}/static_int8/q"
            graph.node.insert(
                list(graph.node).index(q_a),
                make("QuantizeLinear", [x, scale, "static_int8/zero_point"], [quantizers[x]], name=f"{x}/static_int8"),
            )
        replace_node(
            graph,
            product,
            [
                make(
                    "MatMulIntegerToFloat",
                    [quantizers[x], weight, scale, column_scale, "static_int8/zero_point"],
                    list(product.output),
                    name=product.name,
                    domain="com.microsoft",
                )
            ],
        )
        converted += 1
    # The QDQ writer's fake quantization of values (Q -> DQ, both made for an activation): gone.
    for dq in [n for n in graph.node if n.op_type == "DequantizeLinear"]:
        q = producer.get(dq.input[0])
        if q is not None and q.op_type == "QuantizeLinear" and constant_dq(dq.output[0]) is None:
            for node in graph.node:
                for field in (node.input,):
                    for i, name in enumerate(field):
                        if name == dq.output[0]:
                            field[i] = q.input[0]
            graph.node.remove(dq)
    for node in [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]:
        if not any(node.output[0] in other.input for other in graph.node):
            graph.node.remove(node)  # what only the products read
    if converted:
        graph.initializer.append(numpy_helper.from_array(np.array(ROW_ZERO_POINT, np.uint8), "static_int8/zero_point"))
        _fold_biases(graph)
    drop_unused_initializers(graph)
    return converted


def _fold_biases(graph: onnx.GraphProto) -> int:
    """MatMulIntegerToFloat (a scalar activation scale) -> Add(its output, a constant [N]) as the
    product's bias input: one node and one pass less (with a per-row scale onnxruntime 1.31 would
    scale the bias too, so quantize_rows' products keep their Adds)."""
    from onnx import numpy_helper

    weights = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    folded = 0
    for product in [n for n in graph.node if n.op_type == "MatMulIntegerToFloat" and len(n.input) < 7]:
        readers = [n for n in graph.node if product.output[0] in n.input]
        if len(readers) != 1 or readers[0].op_type != "Add" or product.output[0] in outputs:
            continue
        add, a_scale, b_scale = readers[0], product.input[2], product.input[3]
        bias = next(i for i in add.input if i != product.output[0])
        if (
            a_scale not in weights
            or np.ndim(numpy_helper.to_array(weights[a_scale]))
            or bias not in weights
            or b_scale not in weights
            or list(weights[bias].dims) != list(weights[b_scale].dims)
        ):
            continue
        product.input.extend([""] * (6 - len(product.input)) + [bias])
        product.output[0] = add.output[0]
        graph.node.remove(add)
        folded += 1
    return folded
