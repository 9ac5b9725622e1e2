"""Export a Transformer to two ONNX graphs, an encoder and a one-step decoder with a KV cache.

    encoder.onnx  src_ids int64 [batch, src_len]
                  -> cross_k_i, cross_v_i float [batch, cross_heads_i, src_len, head_dim]  (per decoder layer i)
    decoder.onnx  tokens int64 [batch, 1], src_mask bool [batch, src_len] (true = real token),
                  cache_index int64 [batch] (row of past_* each row continues: arange, or the beam parents),
                  past_k_i, past_v_i float [past_batch, self_heads_i, past_len, head_dim] (past_len may be 0),
                  cross_k_i, cross_v_i float [batch, cross_heads_i, src_len, head_dim]
                  -> log_probs float [batch, vocab],
                     present_k_i, present_v_i [batch, self_heads_i, past_len + 1, head_dim]

The cross-attention keys/values are computed once per sentence by the encoder graph. The beam
reordering of the cache (a Gather by cache_index) is inside the decoder graph, so a runtime that
keeps the cache on a GPU never has to copy it back to reorder it. log_softmax is in the graph too:
the runtime does no vocabulary-sized work of its own. Heads may differ per layer (pruned models).

Attention is exported as onnxruntime's contrib op com.microsoft.MultiHeadAttention (fused=True,
the default): one node per attention instead of the ~15 the tracer spells out (split heads,
transposes, cache concat, two MatMuls, mask, softmax, merge heads). At batch 1 on a small model
ORT's time per node, not the arithmetic, is what a decoder step costs. fused=False writes
standard ONNX only, for runtimes that do not know onnxruntime's contrib ops (TensorRT's parser).
"""

from __future__ import annotations

import contextlib
import types
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import Tensor, nn

from .onnx_passes.edit import gathers_columns, splice_and_save
from .transformer import (
    CrossAttention,
    SelfAttention,
    Transformer,
    sinusoidal_frequencies,
    sinusoidal_positions,
)

OPSET = 17


def cache_names(model_or_layers) -> dict[str, list[str]]:
    """Graph input/output names per decoder layer, in the order the graphs use."""
    n = model_or_layers if isinstance(model_or_layers, int) else model_or_layers.cfg.decoder_layers
    return {
        "cross": [name for i in range(n) for name in (f"cross_k_{i}", f"cross_v_{i}")],
        "past": [name for i in range(n) for name in (f"past_k_{i}", f"past_v_{i}")],
        "present": [name for i in range(n) for name in (f"present_k_{i}", f"present_v_{i}")],
    }


# ------------------------------------------------------------------------ fused attention
# The tracer records each autograd.Function below as one node of a placeholder domain (its
# forward is the reference computation the trace runs on); fuse_attention_nodes() then turns
# the placeholders into MultiHeadAttention nodes, whose optional inputs are positional slots.
_PLACEHOLDER = "pipeline"
MHA_SLOTS = ("query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key", "past_value")


def _split_heads(x: Tensor, heads: int) -> Tensor:
    b, t, _ = x.shape
    return x.view(b, t, heads, -1).transpose(1, 2)


def _merge_heads(y: Tensor) -> Tensor:
    b, n, t, h = y.shape
    return y.transpose(1, 2).reshape(b, t, n * h)


class _SelfAttention(torch.autograd.Function):
    """Encoder self-attention: q, k, v [B,S,N*H] before their bias (bias [3*N*H], added inside);
    key_mask [B,S] int32, 1 for real tokens -> [B,S,N*H]."""

    SLOTS = ("query", "key", "value", "bias", "key_padding_mask")

    @staticmethod
    def forward(ctx, q, k, v, bias, key_mask, heads):
        q, k, v = (_split_heads(t + b, heads) for t, b in zip((q, k, v), bias.chunk(3)))
        mask = key_mask.bool()[:, None, None, :]
        return _merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))

    @staticmethod
    def symbolic(g, q, k, v, bias, key_mask, heads):
        return g.op(f"{_PLACEHOLDER}::SelfAttention", q, k, v, bias, key_mask, num_heads_i=heads).setType(q.type())


class _CachedSelfAttention(torch.autograd.Function):
    """One decoder step: q, k, v [B,1,N*H] before their bias (bias [3*N*H]), q and its bias
    already scaled by 1/sqrt(H); past_k, past_v [B,N,P,H] (P may be 0) -> (y [B,1,N*H],
    present_k, present_v [B,N,P+1,H])."""

    SLOTS = ("query", "key", "value", "bias", "past_key", "past_value")

    @staticmethod
    def forward(ctx, q, k, v, bias, past_k, past_v, heads):
        q, k, v = (_split_heads(t + b, heads) for t, b in zip((q, k, v), bias.chunk(3)))
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        return _merge_heads(F.scaled_dot_product_attention(q, k, v, scale=1.0)), k, v

    @staticmethod
    def symbolic(g, q, k, v, bias, past_k, past_v, heads):
        y, present_k, present_v = g.op(
            f"{_PLACEHOLDER}::CachedSelfAttention",
            *(q, k, v, bias, past_k, past_v),
            num_heads_i=heads,
            scale_f=1.0,
            outputs=3,
        )
        # Types for the exporter's shape inference (else it warns): y is shaped like q; the
        # presents like the pasts but one step longer, so their sizes are left open.
        y.setType(q.type())
        for present, past in ((present_k, past_k), (present_v, past_v)):
            present.setType(past.type().with_sizes([None] * 4))
        return y, present_k, present_v


class _CrossAttention(torch.autograd.Function):
    """q [B,T,N*H]; k, v the encoder's cache [B,N,S,H]; key_mask [B,S] int32 -> [B,T,N*H]."""

    SLOTS = ("query", "key", "value", "key_padding_mask")

    @staticmethod
    def forward(ctx, q, k, v, key_mask, heads):
        mask = key_mask.bool()[:, None, None, :]
        return _merge_heads(F.scaled_dot_product_attention(_split_heads(q, heads), k, v, attn_mask=mask))

    @staticmethod
    def symbolic(g, q, k, v, key_mask, heads):
        return g.op(f"{_PLACEHOLDER}::CrossAttention", q, k, v, key_mask, num_heads_i=heads).setType(q.type())


_FUNCTIONS = {f.__name__.lstrip("_"): f for f in (_SelfAttention, _CachedSelfAttention, _CrossAttention)}


def _key_mask(mask: Tensor) -> Tensor:
    # [B,1,1,S] bool -> [B,S] int32. Flatten has no shape operand, so ORT's common-subexpression
    # pass can merge the copies that every layer's trace makes into one.
    return mask.flatten(1).to(torch.int32)


def _fused_self_attention(
    m: SelfAttention,
    x: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    past: tuple[Tensor, Tensor] | None = None,
):
    if causal:  # a whole target prefix at once: training and scoring, never an exported graph
        raise NotImplementedError("fused attention is for the encoder and single decoder steps")
    width = m.heads * m.head_dim
    q, k, v = F.linear(x, m.qkv.weight).split(width, dim=-1)
    if past is None:
        return m.out(_SelfAttention.apply(q, k, v, m.qkv.bias, _key_mask(mask), m.heads)), None
    y, present_k, present_v = _CachedSelfAttention.apply(q, k, v, m.qkv.bias, past[0], past[1], m.heads)
    return m.out(y), (present_k, present_v)


def _fused_cross_attention(m: CrossAttention, x: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    return m.out(_CrossAttention.apply(m.q(x), k, v, _key_mask(mask), m.heads))


def _step_queries(model: Transformer) -> list[tuple[Tensor, int, float]]:
    """The decoder's self-attention projections as (weight or bias, query rows, factor).

    A decoder step's self-attention runs at scale 1 on queries already divided by sqrt(head_dim):
    there onnxruntime's CPU kernel multiplies Q by K' with MLAS's one-row product instead of
    packing K first (MLAS takes that path only at alpha 1), 1.1-1.3x faster at 32 rows
    (docs/decisions.md). Every path runs it one row at a time, so all sum alike. Not the
    cross-attention: it was tried, and its one-row gain, large with its keys in cache, was lost
    among a step's cache misses (whole searches 0.95-1.02x); a sentence's beams there are one
    product of several rows anyway (model/onnx_passes/many_rows.py). The encoder keeps the op's
    own scale: its products have many rows either way."""
    out = []
    for layer in model.decoder:
        attention = layer.self_attn
        for tensor in (attention.qkv.weight, attention.qkv.bias):
            out.append((tensor, attention.heads * attention.head_dim, attention.head_dim**-0.5))
    return out


@contextlib.contextmanager
def fused_attention(model: Transformer):
    """Within the block, the model's attention modules compute through the placeholder
    Functions (same results; a trace records one node per attention)."""
    modules = [(layer.attn, _fused_self_attention) for layer in model.encoder]
    for layer in model.decoder:
        modules += [(layer.self_attn, _fused_self_attention), (layer.cross_attn, _fused_cross_attention)]
    for module, forward in modules:
        module.forward = types.MethodType(forward, module)
    # The queries are scaled in the parameters themselves for the trace, so that the graph keeps
    # the parameters' names and nodes; the originals are put back, bit for bit, afterwards.
    originals = [(tensor, tensor.detach().clone()) for tensor, _, _ in _step_queries(model)]
    try:
        with torch.no_grad():
            for tensor, rows, factor in _step_queries(model):
                tensor[:rows] *= factor
        yield model
    finally:
        with torch.no_grad():
            for tensor, original in originals:
                tensor.copy_(original)
        for module, _ in modules:
            del module.forward  # the class's own forward again


def fuse_attention_nodes(path: Path) -> int:
    """Placeholder nodes -> com.microsoft.MultiHeadAttention; returns how many."""
    proto = onnx.load(str(path))
    count = 0
    for node in proto.graph.node:
        if node.domain != _PLACEHOLDER:
            continue
        given = dict(zip(_FUNCTIONS[node.op_type].SLOTS, node.input))
        last = max(MHA_SLOTS.index(s) for s in given)
        inputs = [given.get(slot, "") for slot in MHA_SLOTS[: last + 1]]
        del node.input[:]
        node.input.extend(inputs)
        node.op_type, node.domain = "MultiHeadAttention", "com.microsoft"
        count += 1
    opsets = [o for o in proto.opset_import if o.domain not in (_PLACEHOLDER, "com.microsoft")]
    del proto.opset_import[:]
    proto.opset_import.extend([*opsets, onnx.helper.make_opsetid("com.microsoft", 1)])
    onnx.save(proto, str(path))
    return count


# ---------------------------------------------------------------------------- the graphs
class EncoderGraph(nn.Module):
    # Wrappers start in eval mode: torch.onnx.export restores the wrapper's mode afterwards, and
    # a wrapper left in training mode would switch the model's dropout back on.
    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.eval()

    def forward(self, src_ids: Tensor) -> tuple[Tensor, ...]:
        memory, _ = self.model.encode(src_ids)
        return tuple(t for kv in self.model.cross_kv(memory) for t in kv)


class DecoderGraph(nn.Module):
    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.layers = model.cfg.decoder_layers
        self.eval()

    def forward(self, tokens: Tensor, src_mask: Tensor, cache_index: Tensor, *cache: Tensor) -> tuple[Tensor, ...]:
        n = self.layers
        past = [
            (cache[2 * i].index_select(0, cache_index), cache[2 * i + 1].index_select(0, cache_index)) for i in range(n)
        ]
        cross = [(cache[2 * n + 2 * i], cache[2 * n + 2 * i + 1]) for i in range(n)]
        logits, present = self.model.decode_step(tokens, cross, src_mask[:, None, None, :], past)
        return (torch.log_softmax(logits.float(), dim=-1), *(t for kv in present for t in kv))


def example_inputs(
    model: Transformer, batch: int, src_len: int, past_len: int, seed: int = 0, past_batch: int | None = None
) -> dict[str, Tensor]:
    """Random but valid decoder/encoder inputs (as torch tensors): used for tracing and parity.

    Rows are padded to different lengths so that masking is exercised."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    past_batch = batch if past_batch is None else past_batch
    src = torch.randint(4, cfg.vocab_size, (batch, src_len), generator=g)
    lengths = torch.randint(1, src_len + 1, (batch,), generator=g)
    lengths[0] = src_len
    for row, length in enumerate(lengths.tolist()):
        src[row, length - 1] = cfg.eos_id
        src[row, length:] = cfg.pad_id
    inputs = {
        "src_ids": src,
        "tokens": torch.randint(4, cfg.vocab_size, (batch, 1), generator=g),
        "src_mask": src != cfg.pad_id,
        "cache_index": torch.randint(0, past_batch, (batch,), generator=g),
    }
    names = cache_names(model)
    for i in range(cfg.decoder_layers):
        for kind in ("k", "v"):
            shape = (past_batch, cfg.dec_self_heads[i], past_len, cfg.head_dim)
            inputs[f"past_{kind}_{i}"] = torch.randn(shape, generator=g)
            shape = (batch, cfg.dec_cross_heads[i], src_len, cfg.head_dim)
            inputs[f"cross_{kind}_{i}"] = torch.randn(shape, generator=g)
    assert all(n in inputs for n in names["past"] + names["cross"])
    return inputs


def decoder_input_names(model: Transformer) -> list[str]:
    names = cache_names(model)
    return ["tokens", "src_mask", "cache_index", *names["past"], *names["cross"]]


def export_onnx(model: Transformer, folder: Path, opset: int = OPSET, fused: bool = True) -> dict[str, Path]:
    """Write folder/encoder.onnx and folder/decoder.onnx (fp32, unoptimised); attention as
    MultiHeadAttention nodes with `fused`, else in standard ONNX ops. A factorised token table
    stays factorised: the lookup reads the [vocab, embed_dim] table, then embed_proj; the output
    layer multiplies by embed_proj's [d_model, embed_dim] first, then by the table's transpose
    (at d_model 128, embed_dim 64, vocab 8000: 0.52M multiply-adds a token instead of 1.02M)."""
    model = model.float().cpu().eval()
    folder.mkdir(parents=True, exist_ok=True)
    names = cache_names(model)
    ex = example_inputs(model, batch=2, src_len=7, past_len=3)

    def cache_axes(prefix_names, length_axis):
        return {n: {0: "batch", 2: length_axis} for n in prefix_names}

    encoder_path, decoder_path = folder / "encoder.onnx", folder / "decoder.onnx"
    with torch.no_grad(), warnings.catch_warnings(), fused_attention(model) if fused else contextlib.nullcontext():
        # The tracer warns about Python ints taken from shapes; they are traced as shape ops.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            EncoderGraph(model),
            (ex["src_ids"],),
            str(encoder_path),
            dynamo=False,
            opset_version=opset,
            input_names=["src_ids"],
            output_names=names["cross"],
            dynamic_axes={"src_ids": {0: "batch", 1: "src_len"}, **cache_axes(names["cross"], "src_len")},
            do_constant_folding=True,
        )
        dec_inputs = decoder_input_names(model)
        past_axes = {n: {0: "past_batch", 2: "past_len"} for n in names["past"]}
        torch.onnx.export(
            DecoderGraph(model),
            tuple(ex[n] for n in dec_inputs),
            str(decoder_path),
            dynamo=False,
            opset_version=opset,
            input_names=dec_inputs,
            output_names=["log_probs", *names["present"]],
            dynamic_axes={
                "tokens": {0: "batch"},
                "src_mask": {0: "batch", 1: "src_len"},
                "cache_index": {0: "batch"},
                **past_axes,
                **cache_axes(names["cross"], "src_len"),
                "log_probs": {0: "batch"},
                **cache_axes(names["present"], "present_len"),
            },
            do_constant_folding=True,
        )
    for path in (encoder_path, decoder_path):
        if fused:
            fuse_attention_nodes(path)
        name_nodes(path, model)
        onnx.checker.check_model(str(path), full_check=True)
    return {"encoder": encoder_path, "decoder": decoder_path}


def name_nodes(path: Path, model: Transformer) -> None:
    """Give the two projections the tracer names without their module scope a name that says
    what they are: the output projection (tied to the embedding) and each decoder layer's
    cross-attention K/V projection (run by the encoder graph). Quantization groups nodes by name."""
    proto = onnx.load(str(path))
    weights = {i.name: i for i in proto.graph.initializer}
    targets = {"/logits/MatMul": model.embed.weight.detach().numpy().T}
    if model.embed_proj is not None:  # a factorised table: [d, E] first, then the table's [E, vocab]
        targets["/logits/embed_proj/MatMul"] = model.embed_proj.weight.detach().numpy()
    for i, layer in enumerate(model.decoder):
        targets[f"/decoder.{i}/cross_attn/kv/MatMul"] = layer.cross_attn.kv.weight.detach().numpy().T
    for node in proto.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in weights or not node.name.startswith(("/MatMul", "/kv")):
            continue
        w = numpy_helper.to_array(weights[node.input[1]])
        for name, target in targets.items():
            if w.shape == target.shape and np.array_equal(w, target):
                node.name = name
                break
    onnx.save(proto, str(path))


# --------------------------------------------------------------------------- tied embedding
OUTPUT_PROJECTION = "/logits/MatMul"


def tie_decoder_embedding(path: Path) -> bool:
    """Store the decoder's tied embedding table once instead of twice.

    The tracer writes the target embedding ([vocab, d]) for the token lookup and its transpose
    ([d, vocab]) for the output projection: two copies of the largest tensor in the model. This
    points the lookup at the projection's weight, as a Gather along axis 1 followed by a
    Transpose of the few gathered columns (cheap per step), so the file and the int8 form derived
    from it (see model/onnx_quantize.py: retie_quantized_embedding) hold one table.
    Returns False, changing nothing, when the graph does not have the expected shape."""
    proto = onnx.load(str(path))
    graph = proto.graph
    weights = {i.name: i for i in graph.initializer}
    projection = next((n for n in graph.node if n.name == OUTPUT_PROJECTION and n.op_type == "MatMul"), None)
    if projection is None or projection.input[1] not in weights:
        return False
    table_t = numpy_helper.to_array(weights[projection.input[1]])
    token_rank = {i.name: len(i.type.tensor_type.shape.dim) for i in graph.input}
    for index, node in enumerate(graph.node):
        if (
            node.op_type != "Gather"
            or gathers_columns(node)
            or node.input[0] not in weights
            or node.input[1] not in token_rank
        ):
            continue
        table = numpy_helper.to_array(weights[node.input[0]])
        if table.shape != table_t.shape[::-1] or not np.array_equal(table, table_t.T):
            continue
        rank = token_rank[node.input[1]]
        columns = f"{node.name}/tied_columns"
        gather = onnx.helper.make_node(
            "Gather", [projection.input[1], node.input[1]], [columns], name=f"{node.name}_tied", axis=1
        )
        # [d, *token_shape] -> [*token_shape, d]
        transpose = onnx.helper.make_node(
            "Transpose", [columns], list(node.output), name=f"{node.name}_tied_T", perm=[*range(1, rank + 1), 0]
        )
        return splice_and_save(proto, path, index, [gather, transpose], remove=[node])
    return False


# --------------------------------------------------------------------------- positions
def positions_as_formula(path: Path, d_model: int) -> bool:
    """Replace the sinusoidal position table the tracer stored ([max_positions, d] float32, about
    115 KB per graph at d 112) by the few nodes that compute it: angle = position * 10000^(-2i/d),
    sin and cos interleaved. Every input is a constant, so ORT folds them into the same table
    when a session loads: the file is smaller, the run is not slower. Returns False, changing
    nothing, when the graph holds no such table. Apply after offline optimisation (which would
    fold the table back in) and to float32 graphs (in float16 the angles lose their precision)."""
    proto = onnx.load(str(path))
    graph = proto.graph
    for index, init in enumerate(graph.initializer):
        if init.data_type != onnx.TensorProto.FLOAT or len(init.dims) != 2 or init.dims[1] != d_model:
            continue
        rows = int(init.dims[0])
        table = sinusoidal_positions(rows, d_model).numpy()
        if not np.array_equal(numpy_helper.to_array(init), table):
            continue
        name, prefix = init.name, "/positions"
        half = (d_model + 1) // 2  # sin columns; cos fills the odd ones (one fewer when d is odd)
        constants = {
            f"{prefix}/index": np.arange(rows, dtype=np.float32).reshape(rows, 1),
            f"{prefix}/div": sinusoidal_frequencies(d_model).numpy().reshape(1, half),
            f"{prefix}/axis": np.array([2], dtype=np.int64),
            f"{prefix}/shape": np.array([rows, 2 * half], dtype=np.int64),
            f"{prefix}/starts": np.array([0], dtype=np.int64),
            f"{prefix}/ends": np.array([d_model], dtype=np.int64),
            f"{prefix}/last": np.array([1], dtype=np.int64),
        }
        make = onnx.helper.make_node
        nodes = [
            make("Mul", [f"{prefix}/index", f"{prefix}/div"], [f"{prefix}/angles"], name=f"{prefix}/Mul"),
            make("Sin", [f"{prefix}/angles"], [f"{prefix}/sin"], name=f"{prefix}/Sin"),
            make("Cos", [f"{prefix}/angles"], [f"{prefix}/cos"], name=f"{prefix}/Cos"),
            make("Unsqueeze", [f"{prefix}/sin", f"{prefix}/axis"], [f"{prefix}/sin3"], name=f"{prefix}/U1"),
            make("Unsqueeze", [f"{prefix}/cos", f"{prefix}/axis"], [f"{prefix}/cos3"], name=f"{prefix}/U2"),
            make("Concat", [f"{prefix}/sin3", f"{prefix}/cos3"], [f"{prefix}/pairs"], name=f"{prefix}/Concat", axis=2),
            make(
                "Reshape",
                [f"{prefix}/pairs", f"{prefix}/shape"],
                [name if 2 * half == d_model else f"{prefix}/padded"],
                name=f"{prefix}/Reshape",
            ),
        ]
        if 2 * half != d_model:  # odd d: the last cos column is not part of the table
            nodes.append(
                make(
                    "Slice",
                    [f"{prefix}/padded", f"{prefix}/starts", f"{prefix}/ends", f"{prefix}/last"],
                    [name],
                    name=f"{prefix}/Slice",
                )
            )
        del graph.initializer[index]
        graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in constants.items())
        return splice_and_save(proto, path, 0, nodes)
    return False


# --------------------------------------------------------------------------- optimisation
def optimize_onnx(source: Path, dest: Path) -> dict:
    """ONNX Runtime's own graph optimiser, run offline: its basic passes (constant folding,
    redundant nodes) and the transformer fusions of onnxruntime.transformers (Add + LayerNorm ->
    SkipLayerNormalization, bias and activation fusions).

    What it writes runs on any execution provider: the provider-specific fusions (and the
    layout changes for the CPU it runs on) are left to ORT when a session loads the file."""
    import logging

    from onnxruntime.transformers.optimizer import optimize_model

    logger = logging.getLogger("onnxruntime.transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)  # it logs every fusion it did not find
    try:
        optimized = optimize_model(
            str(source), model_type="bart", num_heads=0, hidden_size=0, opt_level=1, use_gpu=False
        )
    finally:
        logger.setLevel(level)
    before = onnx.load(str(source))
    optimized.save_model_to_file(str(dest))
    after = optimized.model
    return {
        "nodes_before": len(before.graph.node),
        "nodes_after": len(after.graph.node),
        "fused_ops": sorted({n.op_type for n in after.graph.node} - {n.op_type for n in before.graph.node}),
    }


def to_fp16(source: Path, dest: Path) -> None:
    """fp16 weights and activations; the cache tensors are fp16 too (half the memory traffic),
    log_probs and the integer inputs keep their types so search code is unchanged. Ops whose
    fp16 form loses too much (the reductions in softmax / LayerNorm) stay fp32 per ORT's list."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(source))
    keep = [o.name for o in model.graph.output if o.name == "log_probs"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        half = convert_float_to_float16(model, keep_io_types=keep, op_block_list=None)
    onnx.save(half, str(dest))
