"""8-bit quantization of the exported graphs with onnxruntime's quantization tools.

Two forms:
- dynamic: int8 weights (per output channel), activations quantized at run time by ORT
  (DynamicQuantizeLinear + MatMulInteger): what CPUs run fastest, no calibration needed.
- static QDQ: QuantizeLinear/DequantizeLinear pairs around every quantized MatMul, with
  activation ranges calibrated on real decoder inputs (min-max, entropy or percentile),
  symmetric int8 for weights and activations: the form TensorRT and other int8 runtimes read.

Only the weight matrices are quantized (the MatMuls whose second input is a weight, and the
embedding tables); attention scores, softmax, LayerNorm and the residual adds stay in float.
The weights are split into named groups (embeddings, output projection, each layer's attention
and FFN) so that an accuracy guard can keep the most sensitive groups in float.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from pathlib import Path
from typing import Iterable

import numpy as np
import onnx

from .onnx_passes.edit import (
    drop_unused_initializers,
    gathers_columns,
    replace_node,
    splice_and_save,
    unfuse_skip_layer_norm,
)
from .onnx_passes.external import refer_to_bytes_in

GRAPHS = ("encoder", "decoder")
# Node names come from the exporter's module scopes (see model/onnx_export.py: name_nodes).
_GROUP_PATTERNS = [
    (re.compile(r"^/embed/"), "embeddings"),
    (re.compile(r"^/logits/"), "output_projection"),
    (re.compile(r"^/encoder\.(\d+)/attn/"), "encoder.{}.attention"),
    (re.compile(r"^/encoder\.(\d+)/ffn/"), "encoder.{}.ffn"),
    (re.compile(r"^/decoder\.(\d+)/self_attn/"), "decoder.{}.self_attention"),
    (re.compile(r"^/decoder\.(\d+)/cross_attn/"), "decoder.{}.cross_attention"),
    (re.compile(r"^/decoder\.(\d+)/ffn/"), "decoder.{}.ffn"),
]


def weight_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """MatMuls by a weight matrix and Gathers from an embedding table: what gets quantized."""
    weights = {i.name for i in model.graph.initializer}
    token_inputs = {i.name for i in model.graph.input}  # a lookup reads ids the caller gives
    out = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            out.append(node)
        elif (
            node.op_type == "Gather"
            and node.input[0] in weights
            and node.input[1] in token_inputs
            and not gathers_columns(node)
        ):  # (not the sinusoidal positions' row for a step)
            out.append(node)  # the tied lookup is left to retie_quantized_embedding
    return out


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


def group_of(node_name: str) -> str | None:
    for pattern, group in _GROUP_PATTERNS:
        match = pattern.match(node_name)
        if match:
            return group.format(*match.groups())
    return None


def node_groups(paths: dict[str, Path]) -> dict[str, dict[str, list[str]]]:
    """{group: {graph: [node names]}} over both graphs, groups in model order."""
    groups: dict[str, dict[str, list[str]]] = {}
    for graph in GRAPHS:
        model = onnx.load(str(paths[graph]), load_external_data=False)
        for node in weight_nodes(model):
            group = group_of(node.name)
            if group is None:
                raise ValueError(f"{paths[graph]}: weight node {node.name!r} belongs to no known group")
            groups.setdefault(group, {}).setdefault(graph, []).append(node.name)
    return groups


def nodes_for(groups: dict, graph: str, keep_float: Iterable[str]) -> list[str]:
    keep = set(keep_float)
    return [n for g, by_graph in groups.items() if g not in keep for n in by_graph.get(graph, [])]


# Tensors next to the fused contrib ops (SkipLayerNormalization) have no inferred type in ONNX's
# shape inference; everything float in these graphs is float32.
_FLOAT = {"DefaultTensorType": onnx.TensorProto.FLOAT}


class _Quiet:
    """onnxruntime.quantization logs (and its calibrators print) a line per step and warns
    about contrib ops it cannot shape-infer; keep the stage's output readable."""

    def __enter__(self):
        self.root = logging.getLogger()
        self.level = self.root.level
        self.root.setLevel(logging.ERROR)
        self.stdout = contextlib.redirect_stdout(io.StringIO())
        self.stdout.__enter__()

    def __exit__(self, *exc):
        self.stdout.__exit__(*exc)
        self.root.setLevel(self.level)


def _ort_dynamic(source: Path, dest: Path, nodes: list[str]) -> None:
    """onnxruntime's quantize_dynamic of `nodes`: int8 weights per output column (symmetric), each
    product as DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul (rows_int8_products takes it
    from there)."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    if not nodes:
        onnx.save(onnx.load(str(source)), str(dest))
        return
    with _Quiet():
        ort_quantize_dynamic(
            str(source),
            str(dest),
            weight_type=QuantType.QInt8,
            per_channel=True,
            nodes_to_quantize=nodes,
            op_types_to_quantize=["MatMul", "Gather"],
            extra_options={"MatMulConstBOnly": True, **_FLOAT},
        )


def _plan(paths: dict[str, Path], groups: dict, keep_float: Iterable[str]) -> tuple[dict[str, list[str]], bool]:
    """The nodes to quantize per graph, and whether the token table is to be shared
    (share_token_table: the output projection and the embeddings both in int8; the encoder's
    lookup is then left out here and reads the decoder's int8 table instead)."""
    keep = set(keep_float)
    nodes = {graph: nodes_for(groups, graph, keep) for graph in GRAPHS}
    share = "output_projection" in groups and not {"output_projection", "embeddings"} & keep
    if share:
        lookups = {n.name for n in _token_lookups(onnx.load(str(paths["encoder"]), load_external_data=False).graph)}
        nodes["encoder"] = [n for n in nodes["encoder"] if n not in lookups]
    return nodes, share


def _finish(result: dict[str, Path], share: bool, source: Path) -> None:
    """The tied token table once, read by both lookups and the projection (share_token_table);
    where the embeddings stay in float, the decoder's lookup still reads the int8 projection."""
    if not (share and share_token_table(result["encoder"], result["decoder"], source)):
        retie_quantized_embedding(result["decoder"])


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
    plan, share = _plan(paths, groups, keep_float)
    result = {}
    for graph in GRAPHS:
        dest = out / f"{graph}.onnx"
        if not plan[graph]:
            onnx.save(onnx.load(str(paths[graph])), str(dest))
        else:
            with _Quiet():
                ort_quantize_static(
                    str(paths[graph]),
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
                        **_FLOAT,
                    },
                )
            proto = onnx.load(str(dest))
            static_int8_products(proto.graph)
            _import_contrib_ops(proto)
            onnx.save(proto, str(dest))
        result[graph] = dest
    _finish(result, share, paths["decoder"])
    return result


def onnx_bytes(paths: dict[str, Path]) -> int:
    return sum(Path(p).stat().st_size for p in paths.values())


class RecordingDecoder:
    """Wraps an OnnxDecoder (mt_runtime/translator.py) and keeps a copy of every graph input it feeds:
    real encoder and decoder inputs, from real decoding, for calibration."""

    def __init__(self, inner):
        self.inner = inner
        self.feeds: dict[str, list[dict]] = {"encoder": [], "decoder": []}

    def encode(self, src: list[list[int]], beam: int) -> None:
        self.inner.encode(src, beam)
        self.feeds["encoder"].append({"src_ids": self.inner.src_ids})

    def step(self, tokens: np.ndarray, parents: np.ndarray | None) -> np.ndarray:
        feed = dict(self.inner.feed)  # arrays are replaced each step, never changed: a shallow copy is a snapshot
        # First steps (empty cache) are left out: ORT's histogram calibrators fail on empty tensors.
        if feed[self.inner.past_names[0]].shape[2] > 0:
            feed["tokens"] = np.ascontiguousarray(tokens.reshape(-1, 1))
            feed["cache_index"] = self.inner.arange if parents is None else np.array(parents)
            self.feeds["decoder"].append(feed)
        return self.inner.step(tokens, parents)


# --------------------------------------------------------------------- int8 per row (CPUs)
ROW_ZERO_POINT = 128  # a row's int8 values are stored as uint8 + 128: onnxruntime's fast products take uint8
INT8_MAX = 127.0


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
    plan, share = _plan(paths, groups, keep_float)
    result = {graph: out / f"{graph}.onnx" for graph in GRAPHS}
    for graph in GRAPHS:
        _ort_dynamic(paths[graph], result[graph], plan[graph])
        proto = onnx.load(str(result[graph]))
        rows_int8_products(proto.graph)
        unfuse_skip_layer_norm(proto.graph, residual_op="Sum")
        _import_contrib_ops(proto)
        onnx.save(proto, str(result[graph]))
    _finish(result, share, paths["decoder"])
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


# --------------------------------------------------------------------- the token table, once
def _token_lookups(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
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
        for n in _token_lookups(enc.graph)
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
    _import_contrib_ops(dec)
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
    _import_contrib_ops(enc)
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


def _import_contrib_ops(proto: onnx.ModelProto) -> None:
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
