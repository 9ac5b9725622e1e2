"""The PyTorch model as an incremental decoder for mt_runtime/search.py, and a text translator."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from mt_runtime.search import GenerationConfig, translate_greedy_top_k, translate_nbest, translate_sentences
from mt_runtime.subword import SubwordTokenizer

from .transformer import Cache, Transformer, load_model


class TorchDecoder:
    def __init__(self, model: Transformer, device: str | torch.device = "cpu"):
        self.model = model.eval()
        self.device = torch.device(device)
        self.cross: list = []
        self.src_mask = None
        self.past: Cache | None = None

    @torch.inference_mode()
    def encode(self, src: list[list[int]], beam: int) -> None:
        pad = self.model.cfg.pad_id
        width = max(len(s) for s in src)
        batch = torch.full((len(src), width), pad, dtype=torch.long)
        for i, s in enumerate(src):
            batch[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        memory, src_mask = self.model.encode(batch.to(self.device))
        cross = self.model.cross_kv(memory)
        if beam > 1:
            cross = [(k.repeat_interleave(beam, 0), v.repeat_interleave(beam, 0)) for k, v in cross]
            src_mask = src_mask.repeat_interleave(beam, 0)
        self.cross, self.src_mask, self.past = cross, src_mask, None

    def _step(self, tokens: np.ndarray, parents: np.ndarray | None) -> torch.Tensor:
        if parents is not None and self.past is not None:
            index = torch.from_numpy(parents).to(self.device)
            self.past = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.past]
        x = torch.from_numpy(tokens).to(self.device).view(-1, 1)
        logits, self.past = self.model.decode_step(x, self.cross, self.src_mask, self.past)
        return F.log_softmax(logits.float(), dim=-1)

    @torch.inference_mode()
    def step(self, tokens: np.ndarray, parents: np.ndarray | None) -> np.ndarray:
        return self._step(tokens, parents).cpu().numpy()

    @torch.inference_mode()
    def step_top_k(
        self, tokens: np.ndarray, parents: np.ndarray | None, m: int, scores: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """The m best words per row, best first: only [rows, m] leaves the device (always
        log-probabilities: the model's step normalizes)."""
        logp = self._step(tokens, parents)
        values, ids = logp.topk(min(m, logp.shape[-1]), dim=-1)
        return values.cpu().numpy(), ids.cpu().numpy()

    @torch.inference_mode()
    def keep(self, rows: np.ndarray) -> None:
        """Only these rows of the encoder state from now on (the searches drop finished sentences)."""
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)
        self.cross = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.cross]
        self.src_mask = self.src_mask.index_select(0, index)


class TorchTranslator:
    """Text in, text out, with a PyTorch model. `translate` is what the evaluate stage calls."""

    runtime = "torch"

    def __init__(
        self, model: Transformer, tokenizer: SubwordTokenizer, device: str = "cpu", threads: int | None = None
    ):
        if threads:
            torch.set_num_threads(threads)
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device, self.threads = device, threads
        self.decoder = TorchDecoder(self.model, device)

    @classmethod
    def load(cls, folder: Path, device: str = "cpu", threads: int | None = None) -> "TorchTranslator":
        return cls(load_model(folder, device), SubwordTokenizer.load(folder / "tokenizer.json"), device, threads)

    def generation(self, beam: int, length_penalty: float = 1.0) -> GenerationConfig:
        cfg = self.model.cfg
        return GenerationConfig(
            beam=beam,
            length_penalty=length_penalty,
            bos_id=cfg.bos_id,
            eos_id=cfg.eos_id,
            pad_id=cfg.pad_id,
            max_positions=cfg.max_positions,
        )

    def translate(
        self,
        sentences: Sequence[str],
        beam: int = 4,
        length_penalty: float = 1.0,
        batch_tokens: int = 4000,
        max_batch: int = 256,
        on_batch=None,
    ) -> list[str]:
        return translate_sentences(
            self.decoder,
            self.tokenizer,
            sentences,
            self.generation(beam, length_penalty),
            batch_tokens=batch_tokens,
            max_batch=max_batch,
            on_batch=on_batch,
        )

    def describe(self) -> dict:
        """How it runs (mt_runtime/registry.py's TextTranslator); its search is always
        mt_runtime/search.py's loop, so it names none (ONNX packages name theirs)."""
        return {
            "runtime": self.runtime,
            "device": str(self.device),
            "threads": self.threads,
            "torch": torch.__version__,
        }

    def translate_nbest(
        self,
        sentences: Sequence[str],
        beam: int = 4,
        length_penalty: float = 1.0,
        batch_tokens: int = 4000,
        max_batch: int = 256,
        on_batch=None,
    ) -> list[list[str]]:
        """Each sentence's beam hypotheses, best first."""
        return translate_nbest(
            self.decoder,
            self.tokenizer,
            sentences,
            self.generation(beam, length_penalty),
            batch_tokens=batch_tokens,
            max_batch=max_batch,
            on_batch=on_batch,
        )

    def translate_greedy_top_k(
        self, sentences: Sequence[str], k: int, batch_tokens: int = 4000, max_batch: int = 256, on_batch=None
    ) -> list[tuple[str, list[int], tuple[np.ndarray, np.ndarray] | None]]:
        """Greedy translations with the model's k most likely words at each output step (see
        mt_runtime.search.greedy_search_top_k): what word-level distillation learns from."""
        return translate_greedy_top_k(
            self.decoder,
            self.tokenizer,
            sentences,
            self.generation(1),
            k,
            batch_tokens=batch_tokens,
            max_batch=max_batch,
            on_batch=on_batch,
        )
