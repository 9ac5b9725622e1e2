"""The encoder-decoder Transformer of "Attention Is All You Need", written plainly.

Heads per layer and head size are explicit config fields, and so is each layer's FFN width,
so a pruned model (uneven heads, narrower FFNs) saves, loads, trains, decodes and exports like
any other. Incremental decoding keeps a key/value cache: the self-attention cache grows by one
position a step; cross-attention keys/values are computed once from the encoder output.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from mt_runtime.files import read_bounded
from torch import Tensor, nn

from .sizes import size_problem

MAX_CONFIG_BYTES = 1 << 20


class ModelConfigError(ValueError):
    """A model config (config.json, or one built from a recipe) that cannot be a model here."""


# A decoder cache: per layer (self_k, self_v), each [batch, heads, past_len, head_dim].
Cache = list[tuple[Tensor, Tensor]]


@dataclass
class TransformerConfig:
    vocab_size: int
    d_model: int = 256
    head_dim: int = 64
    enc_heads: list[int] = field(default_factory=lambda: [4, 4, 4])
    dec_self_heads: list[int] = field(default_factory=lambda: [4, 4, 4])
    dec_cross_heads: list[int] = field(default_factory=lambda: [4, 4, 4])
    enc_ffn: list[int] = field(default_factory=lambda: [1024, 1024, 1024])
    dec_ffn: list[int] = field(default_factory=lambda: [1024, 1024, 1024])
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: str = "relu"
    pre_ln: bool = False
    max_positions: int = 256
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    # A factorised token table (ALBERT's): vocab x embed_dim, then a projection to d_model,
    # tied both ways to the output layer. None: one vocab x d_model table.
    embed_dim: int | None = None

    def __post_init__(self):
        # Sizes first, before anything is allocated: a config.json comes with a model folder that
        # may be someone else's (model/sizes.py states the bounds).
        problem = size_problem(
            self.d_model,
            self.head_dim,
            self.enc_heads,
            self.dec_self_heads,
            self.dec_cross_heads,
            self.enc_ffn,
            self.dec_ffn,
            self.vocab_size,
            self.embed_dim,
            self.max_positions,
        )
        if problem:
            raise ModelConfigError(f"model config: {problem}")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < self.vocab_size:
                raise ModelConfigError(f"model config: {name} must be a token id below vocab_size, got {value!r}")
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
                raise ModelConfigError(f"model config: {name} must be a number in [0, 1), got {value!r}")
        if not (len(self.dec_self_heads) == len(self.dec_cross_heads) == len(self.dec_ffn)):
            raise ValueError("decoder per-layer lists differ in length")
        if len(self.enc_heads) != len(self.enc_ffn):
            raise ValueError("encoder per-layer lists differ in length")
        if min(self.enc_heads + self.dec_self_heads + self.dec_cross_heads) < 1:
            raise ValueError("every attention layer needs at least one head")
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be relu or gelu, got {self.activation!r}")
        if self.embed_dim is not None and not 0 < self.embed_dim < self.d_model:
            raise ValueError(f"embed_dim must be below d_model ({self.d_model}), got {self.embed_dim}")

    @classmethod
    def from_spec(cls, spec, vocab_size: int, special_ids: dict) -> "TransformerConfig":
        """From the recipe's ModelSpec (pipeline/training/settings.py: uniform layers, read by
        attribute) to the explicit per-layer form."""
        enc, dec = spec.encoder_layers, spec.decoder_layers
        return cls(
            vocab_size=vocab_size,
            d_model=spec.d_model,
            head_dim=spec.head_dim,
            enc_heads=[spec.heads] * enc,
            dec_self_heads=[spec.heads] * dec,
            dec_cross_heads=[spec.heads] * dec,
            enc_ffn=[spec.ffn_dim] * enc,
            dec_ffn=[spec.ffn_dim] * dec,
            dropout=spec.dropout,
            attention_dropout=spec.attention_dropout,
            activation=spec.activation,
            pre_ln=spec.pre_ln,
            max_positions=spec.max_positions,
            embed_dim=spec.embed_dim,
            pad_id=special_ids["pad"],
            bos_id=special_ids["bos"],
            eos_id=special_ids["eos"],
        )

    @property
    def encoder_layers(self) -> int:
        return len(self.enc_heads)

    @property
    def decoder_layers(self) -> int:
        return len(self.dec_self_heads)

    def total_heads(self) -> int:
        return sum(self.enc_heads) + sum(self.dec_self_heads) + sum(self.dec_cross_heads)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TransformerConfig":
        if not isinstance(data, dict):
            raise ModelConfigError("model config: must be a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ModelConfigError(f"unknown model config keys: {sorted(map(str, unknown))[:5]}")
        if "vocab_size" not in data:
            raise ModelConfigError("model config: vocab_size is missing")
        return cls(**data)


def sinusoidal_frequencies(d_model: int) -> Tensor:
    """10000^(-2i/d) for i < ceil(d/2): column 2i of the table is sin(position * it), 2i+1 cos."""
    return torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))


def sinusoidal_positions(length: int, d_model: int) -> Tensor:
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    div = sinusoidal_frequencies(d_model)
    pe = torch.zeros(length, d_model)
    pe[:, 0::2] = torch.sin(position * div)
    pe[:, 1::2] = torch.cos(position * div)[:, : d_model // 2]
    return pe


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection (rows: all Q heads, all K, all V)."""

    def __init__(self, d_model: int, heads: int, head_dim: int, dropout: float):
        super().__init__()
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        self.qkv = nn.Linear(d_model, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, d_model)
        self.head_gate: Tensor | None = None  # set by pruning to measure head importance

    def forward(
        self, x: Tensor, mask: Tensor | None = None, causal: bool = False, past: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=causal,
            scale=self.head_dim**-0.5,
            dropout_p=self.dropout if self.training else 0.0,
        )
        if self.head_gate is not None:
            y = y * self.head_gate.view(1, -1, 1, 1)
        return self.out(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)), (k, v)


class CrossAttention(nn.Module):
    """Decoder-to-encoder attention; K/V of the encoder output are computed once per sentence."""

    def __init__(self, d_model: int, heads: int, head_dim: int, dropout: float):
        super().__init__()
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        self.q = nn.Linear(d_model, heads * head_dim)
        self.kv = nn.Linear(d_model, 2 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, d_model)
        self.head_gate: Tensor | None = None

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        b, s, _ = memory.shape
        k, v = self.kv(memory).view(b, s, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return k, v

    def forward(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=self.head_dim**-0.5, dropout_p=self.dropout if self.training else 0.0
        )
        if self.head_gate is not None:
            y = y * self.head_gate.view(1, -1, 1, 1)
        return self.out(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class FeedForward(nn.Module):
    # No dropout inside the FFN (as in the paper): on a CPU its random mask over the wide
    # hidden layer costs more time than it buys regularisation.
    def __init__(self, d_model: int, hidden: int, activation: str):
        super().__init__()
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)
        self.act = nn.ReLU() if activation == "relu" else nn.GELU()
        self.neuron_gate: Tensor | None = None  # set by pruning to measure neuron importance

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.fc1(x))
        if self.neuron_gate is not None:
            h = h * self.neuron_gate
        return self.fc2(h)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, heads: int, ffn: int):
        super().__init__()
        self.pre_ln = cfg.pre_ln
        self.attn = SelfAttention(cfg.d_model, heads, cfg.head_dim, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, ffn, cfg.activation)
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        if self.pre_ln:
            x = x + self.drop(self.attn(self.ln1(x), mask)[0])
            return x + self.drop(self.ffn(self.ln2(x)))
        x = self.ln1(x + self.drop(self.attn(x, mask)[0]))
        return self.ln2(x + self.drop(self.ffn(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, self_heads: int, cross_heads: int, ffn: int):
        super().__init__()
        self.pre_ln = cfg.pre_ln
        self.self_attn = SelfAttention(cfg.d_model, self_heads, cfg.head_dim, cfg.attention_dropout)
        self.cross_attn = CrossAttention(cfg.d_model, cross_heads, cfg.head_dim, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, ffn, cfg.activation)
        self.ln1, self.ln2, self.ln3 = (nn.LayerNorm(cfg.d_model) for _ in range(3))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        src_mask: Tensor,
        past: tuple[Tensor, Tensor] | None = None,
        causal: bool = True,
    ):
        if self.pre_ln:
            h, present = self.self_attn(self.ln1(x), causal=causal, past=past)
            x = x + self.drop(h)
            x = x + self.drop(self.cross_attn(self.ln2(x), cross_k, cross_v, src_mask))
            return x + self.drop(self.ffn(self.ln3(x))), present
        h, present = self.self_attn(x, causal=causal, past=past)
        x = self.ln1(x + self.drop(h))
        x = self.ln2(x + self.drop(self.cross_attn(x, cross_k, cross_v, src_mask)))
        return self.ln3(x + self.drop(self.ffn(x))), present


class Transformer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim or cfg.d_model, padding_idx=cfg.pad_id)
        # Half of a small model's parameters are its token table; a narrower table and a
        # projection leave more of a parameter budget to the layers (and make the output layer
        # cheaper: [d, E] then [E, vocab]).
        self.embed_proj = nn.Linear(cfg.embed_dim, cfg.d_model, bias=False) if cfg.embed_dim else None
        self.register_buffer("positions", sinusoidal_positions(cfg.max_positions, cfg.d_model), persistent=False)
        self.embed_scale = math.sqrt(cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg, h, f) for h, f in zip(cfg.enc_heads, cfg.enc_ffn))
        self.decoder = nn.ModuleList(
            DecoderLayer(cfg, hs, hc, f) for hs, hc, f in zip(cfg.dec_self_heads, cfg.dec_cross_heads, cfg.dec_ffn)
        )
        # Pre-LN stacks end with a LayerNorm; post-LN ones are already normalised.
        self.enc_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_ln else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_ln else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        # Tied with the output projection, so the scale that suits logits: N(0, d^-1/2).
        nn.init.normal_(self.embed.weight, mean=0.0, std=self.cfg.d_model**-0.5)
        if self.embed_proj is not None:  # orthonormal columns: rows keep their norms both ways
            nn.init.orthogonal_(self.embed_proj.weight)
        with torch.no_grad():
            self.embed.weight[self.cfg.pad_id].zero_()

    # -------------------------------------------------------------------- pieces
    def _embed(self, tokens: Tensor, offset: Tensor | int = 0) -> Tensor:
        t = tokens.shape[1]
        if t == 1:  # one decoding step: a single row, which a traced graph reads with one Gather
            pos = self.positions[offset]
        elif isinstance(offset, int):
            pos = self.positions[offset : offset + t]
        else:
            pos = self.positions.narrow(0, offset, t)
        x = self.embed(tokens)
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        return self.drop(x * self.embed_scale + pos)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src [B, S] -> (memory [B, S, d], src_mask [B, 1, 1, S] bool, True for real tokens)."""
        src_mask = (src != self.cfg.pad_id)[:, None, None, :]
        x = self._embed(src)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.enc_norm(x), src_mask

    def cross_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        return [layer.cross_attn.project_memory(memory) for layer in self.decoder]

    def logits(self, hidden: Tensor) -> Tensor:
        if self.embed_proj is not None:
            hidden = hidden @ self.embed_proj.weight  # [.., d] -> [.., E]: the projection's transpose
        return F.linear(hidden, self.embed.weight)

    def token_table(self) -> Tensor:
        """The [vocab, d_model] table the model reads tokens from and scores them with: the
        factorised table times its projection, where it is factorised."""
        if self.embed_proj is None:
            return self.embed.weight
        return self.embed.weight @ self.embed_proj.weight.T

    # -------------------------------------------------------------------- training
    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor | None = None, keep: Tensor | None = None) -> Tensor:
        """Teacher-forced pass. With tgt_out, logits only at its non-pad positions ([N, V]); with
        keep, the same positions given as indices into the flattened [B * T] positions, in order
        (made on the host: on CUDA a boolean mask makes the host wait for the device); otherwise
        logits for every position ([B, T, V])."""
        memory, src_mask = self.encode(src)
        x = self._embed(tgt_in)
        for layer in self.decoder:
            k, v = layer.cross_attn.project_memory(memory)
            x, _ = layer(x, k, v, src_mask, causal=True)
        x = self.dec_norm(x)
        if keep is not None:
            x = x.reshape(-1, x.shape[-1]).index_select(0, keep)
        elif tgt_out is not None:
            x = x[tgt_out != self.cfg.pad_id]
        return self.logits(x)

    # -------------------------------------------------------------------- decoding
    def decode_step(
        self, tokens: Tensor, cross: list[tuple[Tensor, Tensor]], src_mask: Tensor, past: Cache | None = None
    ) -> tuple[Tensor, Cache]:
        """One or more new target positions given the cache: logits of the last, and the new cache."""
        offset = past[0][0].shape[2] if past else 0
        x = self._embed(tokens, offset)
        present: Cache = []
        for i, layer in enumerate(self.decoder):
            x, kv = layer(
                x,
                cross[i][0],
                cross[i][1],
                src_mask,
                past=past[i] if past else None,
                causal=past is None and tokens.shape[1] > 1,
            )
            present.append(kv)
        return self.logits(self.dec_norm(x[:, -1])), present

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def unfactorised(model: Transformer) -> Transformer:
    """The same function with one [vocab, d_model] token table (token_table()): what a runtime
    that knows no factorised table (CTranslate2) is given; our ONNX graphs keep the factorised
    form, whose output layer is half the work (docs/decisions.md). The model itself where its
    table is not factorised."""
    if model.embed_proj is None:
        return model
    plain = Transformer(replace(model.cfg, embed_dim=None)).to(model.embed.weight.device)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("embed")}
    state["embed.weight"] = model.token_table().detach()
    plain.load_state_dict(state)
    return plain.train(model.training)


# ------------------------------------------------------------------------ save / load
WEIGHTS, CONFIG = "model.safetensors", "config.json"


def save_model(model: Transformer, folder: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
    (folder / CONFIG).write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n", encoding="utf-8")


def load_model(folder: Path, device: str | torch.device = "cpu") -> Transformer:
    """Weights only through safetensors: loading a model never runs code from the file."""
    from safetensors.torch import load_file

    try:
        data = json.loads(read_bounded(folder / CONFIG, MAX_CONFIG_BYTES))
    except (ValueError, OSError) as exc:  # UnsafeFile, bad JSON or UTF-8, a 5000-digit number
        raise ModelConfigError(
            f"{folder / CONFIG}: unreadable model config ({str(exc).splitlines()[0][:200]})"
        ) from None
    try:
        cfg = TransformerConfig.from_dict(data)
    except ModelConfigError as exc:
        raise ModelConfigError(f"{folder / CONFIG}: {exc}") from None
    model = Transformer(cfg)
    state = load_file(str(folder / WEIGHTS), device=str(device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{folder / WEIGHTS}: weights do not fit the config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.to(device).eval()
