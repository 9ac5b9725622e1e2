"""Our Transformer in CTranslate2's format (through its Python spec API), and a translator over it.

CTranslate2 is the production MT engine users would otherwise pick; the benchmark runs it on the
same weights as our runtimes. Conversion reads model.safetensors with NumPy: no torch needed.

How our layers map onto CTranslate2's TransformerSpec:
  embed.weight           the encoder's and decoder's embeddings and the output projection (tied;
                         CTranslate2 keeps one copy and aliases the others), scaled by sqrt(d_model);
                         a factorised table (embed_dim) enters as its product with embed_proj
  positions              an explicit sinusoidal table: ours interleaves sin/cos, CTranslate2's
                         built-in one concatenates them, so its default cannot be used
  attn.qkv (fused)       self_attention.linear[0], same row order (all Q, then all K, then all V)
  cross_attn.q / .kv     attention.linear[0] / attention.linear[1] (all K, then all V)
  *.out                  linear[-1] of the same attention
  ln1 / ln2 / ln3        post-LN: the layer_norm of the sub-layer they follow (pre_norm=False
                         applies it after the residual); pre-LN: of the sub-layer they precede
  enc_norm / dec_norm    the stacks' final layer_norm (pre-LN only)
CTranslate2 has one head count per stack, so a model whose layers have different head counts
(pruning leaves them so) is refused, unless `pad_heads` is asked for: then every attention gets
zero heads up to the stack's largest count. A zero head has zero values and a zero slice of the
output projection, so it adds exactly nothing: the function is the same, but CTranslate2 computes
the padded heads too. FFN widths may differ per layer as they are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
from mt_runtime.search import GenerationConfig
from mt_runtime.subword import SubwordTokenizer

# Weight types the benchmark stores: float32 and int8 on CPUs, float16 and int8_float16 on GPUs.
COMPUTE_TYPES = ("float32", "int8", "float16", "int8_float16")
META = "pipeline.json"  # our own note in a converted folder: where it came from, generation limits


class NotConvertible(ValueError):
    """The model has a shape CTranslate2 cannot express (uneven heads per layer)."""


def uniform_heads(config: dict) -> tuple[int, int]:
    """(encoder heads, decoder heads), or NotConvertible saying which layers differ."""
    enc, dec_self, dec_cross = config["enc_heads"], config["dec_self_heads"], config["dec_cross_heads"]
    problems = []
    if len(set(enc)) > 1:
        problems.append(f"encoder heads per layer {enc}")
    if len(set(dec_self + dec_cross)) > 1:
        problems.append(f"decoder self-attention heads {dec_self} and cross-attention heads {dec_cross}")
    if problems:
        raise NotConvertible(
            "CTranslate2 needs one head count for every layer of a stack; this model has "
            + " and ".join(problems)
            + " (e.g. after head pruning)"
        )
    return enc[0], dec_self[0]


def padded_heads(config: dict) -> tuple[int, int]:
    """(encoder heads, decoder heads) per layer after padding: each stack's largest count."""
    return max(config["enc_heads"]), max(config["dec_self_heads"] + config["dec_cross_heads"])


def pad_attention(w: dict, module: str, projections: dict, heads: int, target: int, head_dim: int) -> dict:
    """The weights of one attention `module` grown from `heads` to `target` heads with zero heads.
    `projections` maps each input projection to its number of blocks of heads x head_dim rows
    (qkv: 3; cross q: 1, kv: 2). Returns {parameter name: array} for what it changes."""
    if heads == target:
        return {}
    grow = (target - heads) * head_dim
    out = {}
    for name, blocks in projections.items():
        weight = w[f"{module}.{name}.weight"].reshape(blocks, heads * head_dim, -1)
        bias = w[f"{module}.{name}.bias"].reshape(blocks, heads * head_dim)
        weight = np.pad(weight, ((0, 0), (0, grow), (0, 0)))
        out[f"{module}.{name}.weight"] = weight.reshape(blocks * target * head_dim, -1)
        out[f"{module}.{name}.bias"] = np.pad(bias, ((0, 0), (0, grow))).reshape(-1)
    out[f"{module}.out.weight"] = np.pad(w[f"{module}.out.weight"], ((0, 0), (0, grow)))  # zero columns
    return out


def build_spec(folder: Path, pad_heads: bool = False):
    """A ctranslate2 TransformerSpec holding the weights of our model in `folder` (zero heads
    added where layers have fewer than their stack's largest count, if `pad_heads`)."""
    from ctranslate2.specs import common_spec, transformer_spec
    from safetensors.numpy import load_file

    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    enc_heads, dec_heads = padded_heads(cfg) if pad_heads else uniform_heads(cfg)
    w = load_file(str(folder / "model.safetensors"))
    if "embed_proj.weight" in w:  # a factorised table: CTranslate2 reads one [vocab, d] table
        w["embed.weight"] = w.pop("embed.weight") @ w.pop("embed_proj.weight").T
    pre_ln, head_dim = cfg["pre_ln"], cfg["head_dim"]
    for i, h in enumerate(cfg["enc_heads"]):
        w.update(pad_attention(w, f"encoder.{i}.attn", {"qkv": 3}, h, enc_heads, head_dim))
    for i, (hs, hc) in enumerate(zip(cfg["dec_self_heads"], cfg["dec_cross_heads"])):
        w.update(pad_attention(w, f"decoder.{i}.self_attn", {"qkv": 3}, hs, dec_heads, head_dim))
        w.update(pad_attention(w, f"decoder.{i}.cross_attn", {"q": 1, "kv": 2}, hc, dec_heads, head_dim))
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}[cfg["activation"]]
    encoder = transformer_spec.TransformerEncoderSpec(
        len(cfg["enc_heads"]), enc_heads, pre_norm=pre_ln, activation=activation, head_dim=head_dim
    )
    decoder = transformer_spec.TransformerDecoderSpec(
        len(cfg["dec_self_heads"]), dec_heads, pre_norm=pre_ln, activation=activation, head_dim=head_dim
    )

    def linear(spec, name):
        spec.weight = w[f"{name}.weight"]
        spec.bias = w[f"{name}.bias"]

    def norm(spec, name):
        spec.gamma = w[f"{name}.weight"]
        spec.beta = w[f"{name}.bias"]

    from .transformer import sinusoidal_positions  # the model's own table (torch: only where converting)

    positions = sinusoidal_positions(cfg["max_positions"], cfg["d_model"]).numpy()
    encoder.embeddings[0].weight = w["embed.weight"]
    encoder.position_encodings.encodings = positions
    for i, layer in enumerate(encoder.layer):
        p = f"encoder.{i}"
        linear(layer.self_attention.linear[0], f"{p}.attn.qkv")
        linear(layer.self_attention.linear[1], f"{p}.attn.out")
        linear(layer.ffn.linear_0, f"{p}.ffn.fc1")
        linear(layer.ffn.linear_1, f"{p}.ffn.fc2")
        norm(layer.self_attention.layer_norm, f"{p}.ln1")
        norm(layer.ffn.layer_norm, f"{p}.ln2")

    decoder.embeddings.weight = w["embed.weight"]
    decoder.position_encodings.encodings = positions
    decoder.projection.weight = w["embed.weight"]  # tied output projection, no bias
    for i, layer in enumerate(decoder.layer):
        p = f"decoder.{i}"
        linear(layer.self_attention.linear[0], f"{p}.self_attn.qkv")
        linear(layer.self_attention.linear[1], f"{p}.self_attn.out")
        linear(layer.attention.linear[0], f"{p}.cross_attn.q")
        linear(layer.attention.linear[1], f"{p}.cross_attn.kv")
        linear(layer.attention.linear[2], f"{p}.cross_attn.out")
        linear(layer.ffn.linear_0, f"{p}.ffn.fc1")
        linear(layer.ffn.linear_1, f"{p}.ffn.fc2")
        norm(layer.self_attention.layer_norm, f"{p}.ln1")
        norm(layer.attention.layer_norm, f"{p}.ln2")
        norm(layer.ffn.layer_norm, f"{p}.ln3")
    if pre_ln:
        norm(encoder.layer_norm, "enc_norm")
        norm(decoder.layer_norm, "dec_norm")

    spec = transformer_spec.TransformerSpec(encoder, decoder)
    tokenizer = SubwordTokenizer.load(folder / "tokenizer.json")
    vocab = tokenizer.tok.get_vocab()
    tokens = [None] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    if None in tokens or len(tokens) != cfg["vocab_size"]:
        raise NotConvertible(f"{folder}: tokenizer ids are not 0..{cfg['vocab_size'] - 1}")
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.config.unk_token = tokens[tokenizer.unk_id]
    spec.config.bos_token = tokens[cfg["bos_id"]]
    spec.config.eos_token = tokens[cfg["eos_id"]]
    spec.config.decoder_start_token = tokens[cfg["bos_id"]]  # our decoder starts from BOS
    spec.config.add_source_eos = True  # our encoder input ends with EOS
    spec.config.layer_norm_epsilon = 1e-5  # torch's LayerNorm default
    spec.register_file(str(folder / "tokenizer.json"))  # the translator tokenizes with ours
    return spec


def export_ctranslate2(model_folder: Path, out: Path, compute_type: str = "float32", pad_heads: bool = False) -> dict:
    """Convert our model artifact folder to a CTranslate2 model folder `out`, with weights
    stored as `compute_type` (one of COMPUTE_TYPES). A model with uneven heads per layer raises
    NotConvertible unless `pad_heads` (see the module's docstring). Returns a short description."""
    import ctranslate2
    from ctranslate2.converters.converter import Converter

    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"compute_type must be one of {COMPUTE_TYPES}, got {compute_type!r}")
    model_folder, out = Path(model_folder), Path(out)

    class _OurConverter(Converter):
        def _load(self):
            return build_spec(model_folder, pad_heads)

    _OurConverter().convert(str(out), quantization=compute_type, force=True)
    cfg = json.loads((model_folder / "config.json").read_text(encoding="utf-8"))
    enc, dec = padded_heads(cfg)
    meta = {
        "source": str(model_folder),
        "compute_type": compute_type,
        "ctranslate2": ctranslate2.__version__,
        "max_positions": cfg["max_positions"],
        "heads": sum(cfg["enc_heads"] + cfg["dec_self_heads"] + cfg["dec_cross_heads"]),
        "heads_computed": enc * len(cfg["enc_heads"]) + 2 * dec * len(cfg["dec_self_heads"]),
        "model_bytes": (out / "model.bin").stat().st_size,
    }
    (out / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


class PeerTranslator:
    """Our model as CTranslate2 runs it (converted by export_ctranslate2): the production peer the
    benchmark times ours against. Text in, text out; same interface as our translators.

    Tokenization is ours (CTranslate2 takes the tokenizer's pieces), so timings compare engines
    doing the same work. Batches are formed as mt_runtime/search.py forms them (length-sorted, at most
    `max_batch` sentences and `batch_tokens` source tokens x beam), with the same length limit."""

    runtime = "ctranslate2"

    def __init__(
        self, folder: str | Path, device: str = "cpu", threads: int | None = None, compute_type: str = "default"
    ):
        import ctranslate2

        self.folder = Path(folder)
        meta = json.loads((self.folder / META).read_text(encoding="utf-8"))
        self.max_positions = meta["max_positions"]
        self.tokenizer = SubwordTokenizer.load(self.folder / "tokenizer.json")
        self.vocab = self.tokenizer.tok.get_vocab()
        self.device, self.threads, self.compute_type = device, threads, compute_type
        # intra_threads 0 lets CTranslate2 pick (all cores); inter_threads 1: one batch at a time.
        self.model = ctranslate2.Translator(
            str(self.folder), device=device, compute_type=compute_type, intra_threads=threads or 0, inter_threads=1
        )

    def pieces(self, sentences: Sequence[str]) -> list[list[str]]:
        limit = self.max_positions - 1  # room for the EOS CTranslate2 appends
        return [e.tokens[:limit] for e in self.tokenizer.tok.encode_batch(list(sentences), add_special_tokens=False)]

    def search_ids(self, pieces: list[list[str]], beam: int, length_penalty: float = 1.0) -> list[list[int]]:
        """One batch of piece lists to output ids (no EOS), with mt_runtime/search.py's length limit:
        at most max_len(source + EOS) steps, the last of which can only be EOS. CTranslate2 takes
        one limit per batch (the longest sentence's); shorter sentences are cut to their own."""
        gen = GenerationConfig(beam=beam, max_positions=self.max_positions)
        limits = [gen.max_len(len(p) + 1) - 1 for p in pieces]
        results = self.model.translate_batch(
            pieces,
            beam_size=beam,
            length_penalty=length_penalty,
            max_decoding_length=max(1, max(limits)),
            min_decoding_length=0,
            max_batch_size=0,
            return_scores=False,
        )
        unk = self.tokenizer.unk_id
        return [[self.vocab.get(t, unk) for t in r.hypotheses[0][:limit]] for r, limit in zip(results, limits)]

    def describe(self) -> dict:
        import ctranslate2

        return {
            "runtime": self.runtime,
            "device": self.device,
            "threads": self.threads,
            "compute_type": self.compute_type,
            "ctranslate2": ctranslate2.__version__,
        }

    def translate(
        self,
        sentences: Sequence[str],
        beam: int = 4,
        length_penalty: float = 1.0,
        batch_tokens: int = 4000,
        max_batch: int = 256,
        on_batch=None,
    ) -> list[str]:
        sentences = list(sentences)
        results = [""] * len(sentences)
        todo = [i for i, s in enumerate(sentences) if s.strip()]
        src = self.pieces([sentences[i] for i in todo])
        order = sorted(range(len(todo)), key=lambda j: len(src[j]))
        start = 0
        while start < len(order):
            end, longest = start, 0
            while end < len(order) and end - start < max_batch:
                longest = max(longest, len(src[order[end]]) + 1)
                if (end - start + 1) * longest * beam > batch_tokens and end > start:
                    break
                end += 1
            ids = self.search_ids([src[order[j]] for j in range(start, end)], beam, length_penalty)
            for j, text in zip(range(start, end), self.tokenizer.decode(ids)):
                results[todo[order[j]]] = text
            if on_batch:
                on_batch(end - start)
            start = end
        return results


def compare_greedy(model_folder: Path, ct2_folder: Path, sentences: Sequence[str], threads: int = 1) -> dict:
    """Greedy output ids of our PyTorch model and of the converted one, sentence by sentence.
    Returns {"sentences", "identical", "mismatches": [first few differing sentences]}."""
    import torch
    from mt_runtime.search import greedy_search, prepare_sources

    from .torch_decoder import TorchDecoder
    from .transformer import load_model

    torch.set_num_threads(threads)
    model = load_model(Path(model_folder))
    ours_decoder = TorchDecoder(model)
    peer = PeerTranslator(ct2_folder, threads=threads)
    tokenizer = peer.tokenizer
    cfg = model.cfg
    gen = GenerationConfig(
        beam=1, bos_id=cfg.bos_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id, max_positions=cfg.max_positions
    )
    sentences = [s for s in sentences if s.strip()]
    identical, mismatches = 0, []
    for sentence, src, pieces in zip(
        sentences, prepare_sources(tokenizer, sentences, cfg.max_positions), peer.pieces(sentences)
    ):
        ours = greedy_search(ours_decoder, [src], gen)[0]
        theirs = peer.search_ids([pieces], beam=1)[0]
        if ours == theirs:
            identical += 1
        elif len(mismatches) < 3:
            # The first ids where they part are enough to see how.
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            mismatches.append(
                {"source": sentence, "from_token": at, "ours": ours[at : at + 8], "ctranslate2": theirs[at : at + 8]}
            )
    return {"sentences": len(sentences), "identical": identical, "mismatches": mismatches}
