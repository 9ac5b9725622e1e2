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
    out = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            out.append(node)
        elif node.op_type == "Gather" and node.input[0] in weights:
            out.append(node)
    return out


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
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for graph in GRAPHS:
        dest = out / f"{graph}.onnx"
        nodes = nodes_for(groups, graph, keep_float)
        if not nodes:
            onnx.save(onnx.load(str(paths[graph])), str(dest))
        else:
            with _Quiet():
                ort_quantize_dynamic(str(paths[graph]), str(dest), weight_type=QuantType.QInt8,
                                     per_channel=per_channel, nodes_to_quantize=nodes,
                                     op_types_to_quantize=["MatMul", "Gather"],
                                     extra_options={"MatMulConstBOnly": True, **_FLOAT})
        result[graph] = dest
    return result


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
