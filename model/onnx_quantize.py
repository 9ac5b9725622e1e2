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
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import onnx

from .onnx_graph import drop_unused_initializers, gathers_columns, refer_to_bytes_in, splice_and_save

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
        elif node.op_type == "Gather" and node.input[0] in weights and node.input[1] in token_inputs \
                and not gathers_columns(node):  # (not the sinusoidal positions' row for a step)
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
        if any(n.op_type == "DequantizeLinear" and quantized in n.input for n in graph.node):
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
        new_nodes = [make("Gather", [quantized, tokens], [f"{name}/q"], name=f"{name}_int8", axis=1),
                     make("Cast", [f"{name}/q"], [f"{name}/qf"], name=f"{name}_cast", to=onnx.TensorProto.FLOAT)]
        value = f"{name}/qf"
        if zero_point is not None:
            zp_nodes, zp = per_token(zero_point)
            new_nodes += zp_nodes + [
                make("Cast", [zp], [f"{name}/zf"], name=f"{name}_zp_cast", to=onnx.TensorProto.FLOAT),
                make("Sub", [value, f"{name}/zf"], [f"{name}/centred"], name=f"{name}_sub")]
            value = f"{name}/centred"
        scale_nodes, picked_scale = per_token(scale)
        new_nodes += scale_nodes + [make("Mul", [value, picked_scale], [out], name=f"{name}_scale")]
        graph.node.remove(node)
        orphan = [dq] if dq is not None and not any(dq.output[0] in n.input for n in graph.node) else []
        if orphan and graph.node.index(dq) < index:
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


def quantize_dynamic(paths: dict[str, Path], out: Path, groups: dict, keep_float: Iterable[str] = (),
                     per_channel: bool = True) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for graph in GRAPHS:
        result[graph] = out / f"{graph}.onnx"
        _dynamic_graph(paths[graph], result[graph], nodes_for(groups, graph, keep_float), per_channel)
    return result


def _dynamic_graph(source: Path, dest: Path, nodes: list[str], per_channel: bool) -> None:
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    if not nodes:
        onnx.save(onnx.load(str(source)), str(dest))
        return
    with _Quiet():
        ort_quantize_dynamic(str(source), str(dest), weight_type=QuantType.QInt8, per_channel=per_channel,
                             nodes_to_quantize=nodes, op_types_to_quantize=["MatMul", "Gather"],
                             extra_options={"MatMulConstBOnly": True, **_FLOAT})
    retie_quantized_embedding(dest)


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


def quantize_static(paths: dict[str, Path], out: Path, groups: dict, feeds: dict[str, list[dict]],
                    method: str = "minmax", keep_float: Iterable[str] = (), per_channel: bool = True,
                    cache: Path | None = None) -> dict[str, Path]:
    """QDQ int8 with activation ranges calibrated on `feeds` (per graph: a list of input dicts).

    The ranges of every MatMul input are computed once and kept in `cache` (a folder), so that
    quantizing again with other groups kept in float does not calibrate again."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    calibrate = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                 "percentile": CalibrationMethod.Percentile}[method]
    out.mkdir(parents=True, exist_ok=True)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    result = {}
    for graph in GRAPHS:
        dest = out / f"{graph}.onnx"
        nodes = nodes_for(groups, graph, keep_float)
        if not nodes:
            onnx.save(onnx.load(str(paths[graph])), str(dest))
        else:
            with _Quiet():
                ort_quantize_static(
                    str(paths[graph]), str(dest), FeedReader(feeds[graph]), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=per_channel,
                    calibrate_method=calibrate, nodes_to_quantize=nodes, op_types_to_quantize=["MatMul", "Gather"],
                    calibration_providers=["CPUExecutionProvider"],
                    calibration_cache_path=str(cache / f"{graph}.{method}.json") if cache else None,
                    extra_options={"CalibStridedMinMax": 1, "ActivationSymmetric": True, "WeightSymmetric": True,
                                   "CalibTensorRangeSymmetric": True, **_FLOAT})
            retie_quantized_embedding(dest)
        result[graph] = dest
    return result


def onnx_bytes(paths: dict[str, Path]) -> int:
    return sum(Path(p).stat().st_size for p in paths.values())


class RecordingDecoder:
    """Wraps an OnnxDecoder (model/runtime.py) and keeps a copy of every graph input it feeds:
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


# --------------------------------------------------------------------- block-wise int8 (CPUs)
def quantize_blockwise(paths: dict[str, Path], out: Path, groups: dict, keep_float: Iterable[str] = (),
                       block_size: int = 32, per_channel: bool = True) -> dict[str, Path]:
    """The decoder's weights as int8 blocks along the input dimension (one scale per block of
    each output column), run by onnxruntime's MatMulNBits with accuracy_level 4: activations
    are quantized to int8 per block at run time, products accumulate in int32. The encoder,
    which runs once per sentence on all its rows, gets quantize_dynamic's per-channel form,
    except its token lookup: it reads the decoder's packed table, whose bytes it refers to
    inside decoder.onnx (so the package stores the vocabulary table once; keep the files together).

    MatMulNBits is the kernel ORT tunes for one-row decoding; MatMulInteger, which
    quantize_dynamic writes, is a general GEMM, and at one row was barely faster than fp32
    here. The packing and scales come from ORT's own quantize_matmul_8bits. The tied token
    lookup reads the packed projection through GatherBlockQuantized: one table, no float copy.

    `block_size` is used where it divides a matrix's input dimension; elsewhere the block
    (16..128) that stores the fewest bytes (padding plus scales) is used instead."""
    out.mkdir(parents=True, exist_ok=True)
    result = {graph: out / f"{graph}.onnx" for graph in GRAPHS}
    proto = onnx.load(str(paths["decoder"]))
    chosen = set(nodes_for(groups, "decoder", keep_float))
    packed = {}
    if chosen:
        packed = _to_nbits(proto.graph, chosen, block_size)
        _import_contrib_ops(proto)
    onnx.save(proto, str(result["decoder"]))
    encoder_nodes = nodes_for(groups, "encoder", keep_float)
    shared = _lookups_of_packed_tables(paths["encoder"], encoder_nodes, packed)
    _dynamic_graph(paths["encoder"], result["encoder"], [n for n in encoder_nodes if n not in shared], per_channel)
    if shared:
        _read_tables_from_decoder(result["encoder"], result["decoder"], proto.graph, shared)
    return result


def _lookups_of_packed_tables(encoder: Path, nodes: list[str], packed: dict[str, "PackedTable"]
                              ) -> dict[str, "PackedTable"]:
    """{encoder lookup node: the decoder's packed matrix holding exactly its table}: the tied
    embedding, which the decoder already stores as int8 blocks for its output projection."""
    if not packed:
        return {}
    from onnx import numpy_helper

    proto = onnx.load(str(encoder))
    weights = {i.name: i for i in proto.graph.initializer}
    shared = {}
    for node in proto.graph.node:
        if node.name in nodes and node.op_type == "Gather" and node.input[0] in weights:
            table = numpy_helper.to_array(weights[node.input[0]])  # [vocab, d]
            shared.update({node.name: entry for entry in packed.values()
                           if entry.weight.shape == table.T.shape and np.array_equal(entry.weight, table.T)})
    return shared


def _read_tables_from_decoder(encoder: Path, decoder: Path, decoder_graph: onnx.GraphProto,
                              shared: dict[str, "PackedTable"]) -> None:
    """Replace the encoder's float lookups by GatherBlockQuantized over the decoder's packed
    tables, stored as references to their bytes inside decoder.onnx: the package keeps the
    vocabulary table once (half of a small model's bytes), not once per graph."""
    proto = onnx.load(str(encoder))
    graph = proto.graph
    blob = decoder.read_bytes()  # as saved: the offsets of the tensors' bytes
    tensors = {t.name: t for t in decoder_graph.initializer}
    new_nodes: list[onnx.NodeProto] = []
    added: set[str] = set()
    for node in graph.node:
        entry = shared.get(node.name)
        if entry is None:
            new_nodes.append(node)
            continue
        for name in (entry.blocks, entry.scales):
            if name not in added:
                tensor = onnx.TensorProto()
                tensor.CopyFrom(tensors[name])
                if not refer_to_bytes_in(tensor, decoder.name, blob):
                    raise ValueError(f"{decoder}: the bytes of {name} are not stored verbatim")
                graph.initializer.append(tensor)
                added.add(name)
        new_nodes += block_lookup(graph, node.name, entry, node.input[1], node.output[0], entry.rows)
    del graph.node[:]
    graph.node.extend(new_nodes)
    _import_contrib_ops(proto)
    drop_unused_initializers(graph)
    onnx.save(proto, str(encoder))


def _import_contrib_ops(proto: onnx.ModelProto) -> None:
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))


BLOCK_SIZES = (16, 32, 64, 128)


def block_for(rows: int, preferred: int) -> int:
    if rows % preferred == 0:
        return preferred
    def stored(b: int) -> int:  # bytes per column: padded int8 blocks + a float32 scale each
        blocks = -(-rows // b)
        return blocks * b + 4 * blocks
    return min(BLOCK_SIZES, key=lambda b: (stored(b), -b))


def _pack_int8_blocks(weight: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """[K, N] float -> (packed uint8 [N, K_blocks, block_size], scales float32 [N, K_blocks]):
    symmetric, stored with the implicit zero point 128 that MatMulNBits and GatherBlockQuantized
    assume when none is given."""
    from onnxruntime.capi._pybind_state import quantize_matmul_8bits

    rows, cols = weight.shape
    blocks = -(-rows // block_size)
    padded = np.zeros((blocks * block_size, cols), dtype=np.float32)
    padded[:rows] = weight
    packed = np.zeros((cols, blocks, block_size), dtype=np.uint8)
    scales = np.zeros((cols, blocks), dtype=np.float32)
    zero_points = np.zeros((cols, blocks), dtype=np.uint8)  # unused when symmetric
    quantize_matmul_8bits(packed, padded, scales, zero_points, block_size, cols, blocks * block_size, True)
    return packed, scales


@dataclass(frozen=True, eq=False)
class PackedTable:
    """A float weight [K, N] stored as int8 blocks: `blocks` uint8 [N, K blocks, block] and
    `scales` float [N, K blocks] (initializer names), K rows before padding."""

    blocks: str
    scales: str
    rows: int
    block: int
    shape: tuple[int, ...]
    weight: np.ndarray  # the float [K, N] it was packed from


def block_lookup(graph: onnx.GraphProto, node_name: str, table: PackedTable, indices: str, output: str,
                 d: int) -> list[onnx.NodeProto]:
    """Nodes reading rows `indices` of a packed [vocab, d] table (dequantized) into `output`."""
    from onnx import numpy_helper

    make = onnx.helper.make_node
    rows, blocks, block = table.shape
    width = blocks * block
    # The table as [rows, blocks * block_size]: a Reshape of an initializer, which ORT folds
    # when the session loads (the file keeps one copy).
    shape = f"{node_name}/table_shape"
    graph.initializer.append(numpy_helper.from_array(np.array([rows, width], dtype=np.int64), shape))
    gathered = output if width == d else f"{node_name}/padded"
    nodes = [make("Reshape", [table.blocks, shape], [f"{node_name}/table"], name=f"{node_name}_table"),
             make("GatherBlockQuantized", [f"{node_name}/table", indices, table.scales], [gathered], name=node_name,
                  domain="com.microsoft", gather_axis=0, quantize_axis=1, block_size=block, bits=8)]
    if width != d:  # K was padded to whole blocks
        bounds = [f"{node_name}/{k}" for k in ("starts", "ends", "axes")]
        graph.initializer.extend(numpy_helper.from_array(np.array([v], dtype=np.int64), n)
                                 for n, v in zip(bounds, (0, d, -1)))
        nodes.append(make("Slice", [gathered, *bounds], [output], name=f"{node_name}_unpad"))
    return nodes


def _to_nbits(graph: onnx.GraphProto, chosen: set[str], block_size: int) -> dict[str, PackedTable]:
    """The chosen MatMuls as MatMulNBits and lookups as GatherBlockQuantized, in place; returns
    {float weight name: its packed form}."""
    from onnx import numpy_helper

    make = onnx.helper.make_node
    weights = {i.name: i for i in graph.initializer}
    packed: dict[str, PackedTable] = {}

    def pack(name: str, matrix: np.ndarray) -> PackedTable:
        if name not in packed:
            block = block_for(matrix.shape[0], block_size)
            q, s = _pack_int8_blocks(matrix, block)
            graph.initializer.extend([numpy_helper.from_array(q, f"{name}_int8_blocks"),
                                      numpy_helper.from_array(s, f"{name}_block_scales")])
            packed[name] = PackedTable(f"{name}_int8_blocks", f"{name}_block_scales", matrix.shape[0], block,
                                       q.shape, matrix)
        return packed[name]

    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.name in chosen and node.op_type == "MatMul":
            w = numpy_helper.to_array(weights[node.input[1]])
            table = pack(node.input[1], w)
            new_nodes.append(make("MatMulNBits", [node.input[0], table.blocks, table.scales], list(node.output),
                                  name=node.name, domain="com.microsoft", K=table.rows, N=w.shape[1], bits=8,
                                  block_size=table.block, accuracy_level=4))
        elif node.name in chosen and node.op_type == "Gather":  # a [vocab, d] table, rows gathered
            rows = numpy_helper.to_array(weights[node.input[0]])
            table = pack(node.input[0], rows.T)
            new_nodes += block_lookup(graph, node.name, table, node.input[1], node.output[0], rows.shape[1])
        else:
            new_nodes.append(node)
    # The decoder's tied lookup (Gather of [d, vocab] columns + Transpose) reads the packed
    # output projection when that was quantized: its packed rows are the vocabulary entries.
    for node in list(new_nodes):
        if not gathers_columns(node) or node.input[0] not in packed:
            continue
        transpose = next(n for n in new_nodes if n.op_type == "Transpose" and node.output[0] in n.input)
        index = new_nodes.index(node)
        replacement = block_lookup(graph, node.name, packed[node.input[0]], node.input[1], transpose.output[0],
                                   packed[node.input[0]].rows)
        new_nodes[index: index + 1] = replacement
        new_nodes.remove(transpose)
    del graph.node[:]
    graph.node.extend(new_nodes)
    fold_bias_adds(graph)
    drop_unused_initializers(graph)
    return packed


MATMUL_NBITS_BIAS = 5  # MatMulNBits' inputs: A, B, scales, zero_points, g_idx, bias


def fold_bias_adds(graph: onnx.GraphProto) -> int:
    """MatMulNBits -> Add(bias [N]) pairs as one MatMulNBits with its bias input; returns how many.

    onnxruntime does this itself when it loads a MatMulNBits graph, but not for the
    DynamicQuantizeMatMul that the many-rows search graph turns these nodes into
    (onnx_generate._many_rows_matmuls), where the bias then rides along instead of costing a
    node per matrix and decoder step."""
    weights = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    folded = 0
    for node in [n for n in graph.node if n.op_type == "MatMulNBits" and len(n.input) <= 3]:
        users = consumers.get(node.output[0], [])
        if len(users) != 1 or users[0].op_type != "Add" or node.output[0] in outputs:
            continue
        add = users[0]
        bias = next((name for name in add.input if name != node.output[0]), None)
        columns = next(a.i for a in node.attribute if a.name == "N")
        if bias not in weights or list(weights[bias].dims) != [columns] or \
                weights[bias].data_type != onnx.TensorProto.FLOAT:
            continue
        node.input.extend([""] * (MATMUL_NBITS_BIAS - len(node.input)) + [bias])
        node.output[0] = add.output[0]
        graph.node.remove(add)
        folded += 1
    return folded
