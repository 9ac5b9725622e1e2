"""Small edits of ONNX graphs that the export, quantization and the other passes share: renaming,
replacing and pruning nodes, compacting names, what a graph computes from its constants (onnx
and NumPy only: no torch, so the quantization code that uses them does not import it)."""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import onnx
from onnx import helper


def drop_unused_initializers(graph: onnx.GraphProto) -> None:
    used = {name for node in graph.node for name in node.input}
    keep = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)


def gathers_columns(node: onnx.NodeProto) -> bool:
    """A Gather along an axis other than 0: the decoder's tied token lookup, which reads columns
    of the output projection's [d, vocab] weight (tie_decoder_embedding)."""
    return node.op_type == "Gather" and any(a.name == "axis" and a.i != 0 for a in node.attribute)


def splice_and_save(
    proto: onnx.ModelProto, path, index: int, new_nodes: list[onnx.NodeProto], remove: list[onnx.NodeProto] = ()
) -> bool:
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


def unfuse_skip_layer_norm(graph: onnx.GraphProto) -> int:
    """Every com.microsoft SkipLayerNormalization as Sum (x, skip and the bias in one node) +
    LayerNormalization; returns how many. Measured on the CPU (onnxruntime 1.24, one thread,
    d_model 128): the fused kernel took 641 us at [32, 20, 128] and 132 at [128, 1, 128] against
    179 and 45 for the standard ops, and the same at one row (10 us).

    Sum, not Add: onnxruntime 1.31 fuses Add + LayerNormalization back into that kernel wherever
    it can infer both Add inputs' shapes, and the kernel is 4-6x slower from 4 rows on (five
    residual norms, d 256, one thread, us at 4 / 32 / 128 rows: 33 / 214 / 839 fused, 13 / 37 / 117
    Add + LayerNormalization, 14 / 38 / 122 Sum). Worse, whether it can infer them depends on the
    session: an int8 encoder's Add was fused in encoder.onnx's own session but not inside the
    search op's copy, so one sentence got other numbers alone than in a batch. Sum is never fused
    and adds to the bit as Add does."""
    # Readers of each value: node inputs (branches included) and the graph's outputs.
    uses = Counter(_inputs_everywhere(graph)) + Counter(o.name for o in graph.output)
    done = 0
    for node in [n for n in graph.node if n.op_type == "SkipLayerNormalization" and n.domain == "com.microsoft"]:
        outputs = list(node.output) + [""] * (4 - len(node.output))
        if any(name and name in uses for name in outputs[1:3]):
            continue  # its mean or inverse deviation is read: keep the kernel that gives them
        inputs = list(node.input) + [""] * (5 - len(node.input))
        x, skip, gamma, beta, bias = inputs[:5]
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)
        total = outputs[3] if outputs[3] else f"{node.output[0]}/sum"
        nodes = [onnx.helper.make_node("Sum", [x, skip] + ([bias] if bias else []), [total], name=f"{node.name}/add")]
        nodes.append(
            onnx.helper.make_node(
                "LayerNormalization",
                [total, gamma] + ([beta] if beta else []),
                [node.output[0]],
                axis=-1,
                epsilon=epsilon,
                name=f"{node.name}/norm",
            )
        )
        replace_node(graph, node, nodes)
        done += 1
    return done


def _inputs_everywhere(graph: onnx.GraphProto):
    """Every input name of every node, those inside subgraphs (If branches) included."""
    for node in graph.node:
        yield from node.input
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs):
                yield from _inputs_everywhere(sub)


def replace_node(graph: onnx.GraphProto, node: onnx.NodeProto, nodes: list[onnx.NodeProto]) -> None:
    """`nodes` where `node` was, in order (so the graph stays topologically sorted)."""
    index = list(graph.node).index(node)
    graph.node.remove(node)
    for offset, new in enumerate(nodes):
        graph.node.insert(index + offset, new)


def rename(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name == old:
                    field[i] = new


def shape(value: onnx.ValueInfoProto) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """A node's graph attributes: an If's branches."""
    return [g for attr in node.attribute for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs)]


def graph_nodes(graph: onnx.GraphProto):
    """A graph's nodes and those of its subgraphs (If branches, the BeamSearch op's graphs)."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from graph_nodes(sub)


def subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """The names a node's subgraphs read, outer-scope values among them."""
    names: set[str] = set()
    for graph in subgraphs(node):
        for inner in graph.node:
            names.update(inner.input)
            names |= subgraph_inputs(inner)
    return names


def prune_dead_nodes(graph: onnx.GraphProto) -> None:
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(node.input)
            needed |= subgraph_inputs(node)
    del graph.node[:]
    graph.node.extend(reversed(keep))
    inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)


def outer_names(graph: onnx.GraphProto) -> set[str]:
    """The names `graph`'s nodes (and their branches) read that it neither takes nor makes: values
    of the graph around it."""
    made = (
        {v.name for v in graph.input} | {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    )
    read = set().union(*(set(n.input) | subgraph_inputs(n) for n in graph.node)) if graph.node else set()
    return read - made - {""}


def compact_names(graph: onnx.GraphProto) -> None:
    """Internal value and node names -> short ones (the op's contract fixes only the graph's
    inputs and outputs, and values it reads from the graph around it): the generate files are
    all structure, and names were half of it."""
    keep = {v.name for v in (*graph.input, *graph.output)} | {""} | outer_names(graph)
    mapping: dict[str, str] = {}

    def short(name: str) -> str:
        if name in keep:
            return name
        if name not in mapping:
            mapping[name] = np.base_repr(len(mapping), 36).lower()
        return mapping[name]

    def rename(g: onnx.GraphProto) -> None:
        for node in g.node:
            node.name = ""
            node.doc_string = ""
            for field in (node.input, node.output):
                for i, name in enumerate(field):
                    field[i] = short(name)
            for sub in subgraphs(node):  # a branch reads outer values by name: rename it alike
                rename(sub)
                for value in sub.output:
                    value.name = short(value.name)

    for tensor in graph.initializer:
        tensor.name = short(tensor.name)
    rename(graph)


def computed_from_constants(g: onnx.GraphProto, names: list[str]) -> bool:
    """Whether every one of `names` is computed from g's initializers alone."""
    producer = {o: n for n in g.node for o in n.output}
    initializers = {t.name for t in g.initializer}
    known: dict[str, bool] = {}

    def constant(name: str) -> bool:
        if name in initializers or name == "":
            return True
        if name not in known:
            source = producer.get(name)  # None: a graph input; an If: something chosen per call
            known[name] = source is not None and source.op_type != "If" and all(constant(i) for i in source.input)
        return known[name]

    return all(constant(name) for name in names)


def constant_nodes(g: onnx.GraphProto, values: list[str], prefix: str) -> tuple[onnx.GraphProto, list[str]]:
    """The nodes of g that compute `values` from its initializers, and those initializers, renamed
    under `prefix` (a graph holding both), with the new names of `values`."""
    producer = {o: n for n in g.node for o in n.output}
    initializers = {t.name: t for t in g.initializer}
    nodes, inits, seen = [], [], set()

    def visit(name: str) -> None:
        if name in seen or name == "":
            return
        seen.add(name)
        if name in initializers:
            inits.append(copy.deepcopy(initializers[name]))
            return
        node = producer[name]
        for i in node.input:
            visit(i)
        nodes.append(copy.deepcopy(node))

    for value in values:
        visit(value)
    part = helper.make_graph(nodes, "constants", [], [], initializer=inits)
    names = {name: f"{prefix}/{name}" for name in seen if name}
    for tensor in part.initializer:
        tensor.name = names[tensor.name]
    for node in part.node:
        node.name = ""
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                field[i] = names.get(name, name)
    return part, [names[v] for v in values]


class GraphContractError(ValueError):
    """A pass was handed a graph without what it works on."""


def expect(graph: onnx.GraphProto, what: str, inputs=(), outputs=()) -> None:
    """Check that `graph` has the inputs and outputs a pass works on; GraphContractError naming the
    pass (`what`) and what is missing."""
    missing = sorted(set(inputs) - {v.name for v in graph.input}) + sorted(
        set(outputs) - {v.name for v in graph.output}
    )
    if missing:
        raise GraphContractError(f"{what}: the graph has no {', '.join(missing)}")
