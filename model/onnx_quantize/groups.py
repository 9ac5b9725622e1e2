"""The weights int8 quantizes, by name into groups (embeddings, output projection, each layer's
attention and FFN), so that the accuracy guard can keep the most sensitive groups in float."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

import onnx

from ..onnx_passes.edit import gathers_columns

GRAPHS = ("encoder", "decoder")
# Node names come from the exporter's module scopes (see model/onnx_export.py: name_nodes).
_GROUP_PATTERNS = [
    (re.compile(r"^/embed(?:_proj)?/"), "embeddings"),
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
