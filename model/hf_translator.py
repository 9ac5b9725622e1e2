"""A Hugging Face sequence-to-sequence checkpoint (Marian, M2M100, NLLB, T5, BART, ...) as a
translator: text in, text out, with transformers' generate or through CTranslate2.

The pipeline imports such a checkpoint as a teacher (pipeline/stages/import_teacher/build.py) and
uses it here to translate the KD corpus and the test sets. Both decoders take the same batches
(sorted by source length, cut by a token budget) and the same length limit, so their greedy
outputs agree (tests/training/test_hf_teacher.py). `transformers` is the `hf` extra. Every checkpoint is
opened through model/hf_checkpoint.py (checked first; no custom code, no pickle, no stdin), and
every text comes out on one line (mt_runtime/lines.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Sequence

from mt_runtime.lines import one_line

from .hf_checkpoint import LOAD, check_checkpoint, from_pretrained, narrow_permissions, stdin_closed

HF_EXTRA_HINT = "the imported teacher needs transformers: pip install -e '.[hf]'"


class NotSeq2Seq(ValueError):
    """The checkpoint is not an encoder-decoder model."""


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError(HF_EXTRA_HINT) from None
    return transformers


def checkpoint_config(folder: Path):
    """The checkpoint's transformers config; NotSeq2Seq where it has no decoder to translate with."""
    transformers = require_transformers()
    config = from_pretrained(transformers.AutoConfig, folder)
    if not getattr(config, "is_encoder_decoder", False):
        raise NotSeq2Seq(
            f"{folder}: model type '{config.model_type}' is not an encoder-decoder model: "
            "a teacher must translate (AutoModelForSeq2SeqLM)"
        )
    return config


def _batches(lengths: Sequence[int], batch_tokens: int, max_batch: int) -> list[list[int]]:
    """Indices by source length, cut where one more sentence would pass the token budget."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and len(batches[-1]) < max_batch and (len(batches[-1]) + 1) * lengths[i] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


class TokenCounter:
    """The checkpoint's tokenizer as the pipeline's tokenizers are used: `encode(sentences)` gives
    ids without special tokens (output lengths, sorting by length)."""

    def __init__(self, hf_tokenizer):
        self.hf = hf_tokenizer

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        return self.hf(list(sentences), add_special_tokens=False)["input_ids"] if sentences else []

    def encode_target(self, sentences: Sequence[str]) -> list[list[int]]:
        """As the checkpoint tokenizes targets (Marian: with its target-side model)."""
        return self.hf(text_target=list(sentences), add_special_tokens=False)["input_ids"] if sentences else []


def forces_eos(checkpoint: Path) -> bool:
    """Whether generate ends a sentence at its budget with a forced EOS (its generation config)."""
    transformers = require_transformers()
    try:
        generation = from_pretrained(transformers.GenerationConfig, checkpoint)
    except OSError:  # no generation_config.json: generate derives one from the model's config
        generation = transformers.GenerationConfig.from_model_config(
            from_pretrained(transformers.AutoConfig, checkpoint)
        )
    return getattr(generation, "forced_eos_token_id", None) is not None


def max_new_tokens(source_length: int, limit: int) -> int:
    """A sentence's output budget in tokens, its EOS included. generate ends a sentence that
    reaches it with a forced EOS where the model's config asks for one (Marian's does): the
    text then has one token less, which CTranslate2 is given to match."""
    return max(8, min(limit, int(1.5 * source_length) + 10))


class _ImportedTranslator:
    """What both decoders of a checkpoint share: text from output ids, and the teacher's
    distributions over its own outputs for word-level distillation."""

    hf = None  # the checkpoint's transformers tokenizer
    runtime = ""
    device = "cpu"
    threads: int | None = None
    _teacher_forced_model = None

    def describe(self) -> dict:
        """How it runs (mt_runtime/registry.py's TextTranslator): the checkpoint's own search."""
        return {"runtime": self.runtime, "device": self.device, "threads": self.threads}

    def translate(
        self,
        sentences: Sequence[str],
        beam: int = 4,
        length_penalty: float = 1.0,
        batch_tokens: int = 4000,
        max_batch: int = 256,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[str]:
        return [
            self._text(ids)
            for ids in self._output_ids(list(sentences), beam, length_penalty, batch_tokens, max_batch, on_batch)
        ]

    def translate_greedy_top_k(
        self,
        sentences: Sequence[str],
        k: int,
        batch_tokens: int = 4000,
        max_batch: int = 256,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[tuple]:
        """Greedy translations as (text, output ids, (top ids, their log-probabilities) [len + 1, k]),
        as mt_runtime.search.translate_greedy_top_k gives them for our models: the distributions come
        from one teacher-forced pass over each output (its EOS step included)."""
        sentences = list(sentences)
        written = self._output_ids(sentences, 1, 1.0, batch_tokens, max_batch, on_batch)
        tops = self._teacher_forced_top_k(sentences, written, k, batch_tokens, max_batch)
        return [
            (self._text(ids), ids, top) if sentence.strip() else ("", [], None)
            for sentence, ids, top in zip(sentences, written, tops)
        ]

    def _output_ids(self, sentences, beam, length_penalty, batch_tokens, max_batch, on_batch) -> list[list[int]]:
        raise NotImplementedError

    def _text(self, ids: list[int]) -> str:
        return one_line(self.hf.decode(ids, skip_special_tokens=True)).strip()

    def _content(self, row: list[int]) -> list[int]:
        """An output's ids up to its end (EOS or padding)."""
        ends = {self.hf.eos_token_id, self.hf.pad_token_id}
        return row[: next((j for j, t in enumerate(row) if t in ends), len(row))]

    def _teacher_forced_top_k(self, sentences, outputs, k, batch_tokens, max_batch) -> list[tuple]:
        import numpy as np
        import torch

        if self._teacher_forced_model is None:
            self._teacher_forced_model = (
                from_pretrained(require_transformers().AutoModelForSeq2SeqLM, self.checkpoint, weights=True)
                .to(self.device)
                .eval()
            )
        model = self._teacher_forced_model
        start, pad = model.config.decoder_start_token_id, self.hf.pad_token_id
        lengths = [len(ids) for ids in self.hf(sentences)["input_ids"]] if sentences else []
        tops: list = [None] * len(sentences)
        for index in _batches(lengths, batch_tokens, max_batch):
            batch = self.hf([sentences[i] for i in index], return_tensors="pt", padding=True).to(self.device)
            width = 1 + max(len(outputs[i]) for i in index)
            decoder_ids = torch.full((len(index), width), pad, dtype=torch.long)
            for row, i in enumerate(index):
                decoder_ids[row, : 1 + len(outputs[i])] = torch.tensor([start, *outputs[i]])
            with torch.no_grad():
                logits = model(
                    **batch,
                    decoder_input_ids=decoder_ids.to(self.device),
                    decoder_attention_mask=(
                        torch.arange(width)[None] <= torch.tensor([len(outputs[i]) for i in index])[:, None]
                    ).to(self.device),
                ).logits
            logp = torch.log_softmax(logits.float(), -1)
            logp[..., [t for t in {pad, start} if t is not None]] = float("-inf")  # never a target word
            values, ids = logp.topk(k, dim=-1)
            for row, i in enumerate(index):
                steps = len(outputs[i]) + 1
                tops[i] = (ids[row, :steps].cpu().numpy().astype(np.int64), values[row, :steps].cpu().numpy())
        return tops


class HFTranslator(_ImportedTranslator):
    """transformers' generate on the CPU or a GPU."""

    runtime = "transformers"

    def __init__(self, checkpoint: Path, device: str = "cpu", threads: int | None = None):
        transformers = require_transformers()
        import torch

        if threads:
            torch.set_num_threads(threads)
        checkpoint_config(checkpoint)
        self.checkpoint, self.device, self.threads = Path(checkpoint), device, threads
        self.hf = from_pretrained(transformers.AutoTokenizer, checkpoint)
        self.tokenizer = TokenCounter(self.hf)
        self.model = self._teacher_forced_model = (
            from_pretrained(transformers.AutoModelForSeq2SeqLM, checkpoint, weights=True).to(device).eval()
        )
        self.position_limit = int(getattr(self.model.config, "max_position_embeddings", 512) or 512)
        self.forced_eos = forces_eos(checkpoint)

    def source_lengths(self, sentences: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.hf(list(sentences))["input_ids"]]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def _output_ids(self, sentences, beam, length_penalty, batch_tokens, max_batch, on_batch) -> list[list[int]]:
        import torch

        lengths = self.source_lengths(sentences)
        out: list[list[int]] = [[] for _ in sentences]
        for index in _batches(lengths, batch_tokens, max_batch):
            batch = self.hf([sentences[i] for i in index], return_tensors="pt", padding=True).to(self.device)
            limits = [max_new_tokens(lengths[i], self.position_limit) for i in index]
            with torch.no_grad():
                generated = self.model.generate(
                    **batch, num_beams=beam, length_penalty=length_penalty, do_sample=False, max_new_tokens=max(limits)
                )
            for i, row, limit in zip(index, generated.tolist(), limits):
                # row[0] is the decoder's start token; each sentence keeps its own budget, so that
                # its output does not depend on the batch it was in (see max_new_tokens).
                out[i] = self._content(row[1:][: limit - self.forced_eos])
            if on_batch:
                on_batch(len(index))
        return out


def convert_to_ctranslate2(checkpoint: Path, dest: Path, quantization: str | None = None) -> Path:
    """The checkpoint in CTranslate2's format (its own converter), once: `dest` is reused. Each
    process converts into a folder of its own and renames it into place, so the ranks of a
    torchrun job may all ask at once."""
    if (dest / "model.bin").is_file():
        return dest
    from ctranslate2.converters import TransformersConverter

    class DataOnly(TransformersConverter):  # the converter's own loads, as ours: no code, no pickle
        def load_model(self, model_class, path, **kwargs):
            return model_class.from_pretrained(path, **{**kwargs, **LOAD, "use_safetensors": True})

        def load_tokenizer(self, tokenizer_class, path, **kwargs):
            return tokenizer_class.from_pretrained(path, **{**kwargs, **LOAD})

    check_checkpoint(checkpoint)
    tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
    with stdin_closed():
        DataOnly(str(checkpoint)).convert(str(tmp), quantization=quantization, force=True)
    narrow_permissions(tmp, checkpoint)  # private weights stay private in their converted copy
    try:
        os.rename(tmp, dest)
    except OSError:
        if not (dest / "model.bin").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process got there first
    return dest


# The checkpoint's files a ImportedCT2Translator reads beside CTranslate2's model: config and tokenizer.
_TOKENIZER_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "source.spm",
    "target.spm",
    "sentencepiece.bpe.model",
    "spiece.model",
    "tokenizer.json",
    "merges.txt",
)


def convert_for_serving(checkpoint: Path, dest: Path, quantization: str | None = None) -> Path:
    """A self-contained CTranslate2 folder: the converted model, and under hf/ the checkpoint's
    config and tokenizer (ImportedCT2Translator(dest / "hf", dest) opens it)."""
    convert_to_ctranslate2(checkpoint, dest, quantization)
    (dest / "hf").mkdir(exist_ok=True)
    for name in _TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            shutil.copyfile(checkpoint / name, dest / "hf" / name)
    narrow_permissions(dest, checkpoint)
    return dest


def is_serving_folder(folder: Path) -> bool:
    return (Path(folder) / "model.bin").is_file() and (Path(folder) / "hf" / "config.json").is_file()


class ImportedCT2Translator(_ImportedTranslator):
    """The same checkpoint through CTranslate2: its tokenizer stays transformers'."""

    runtime = "ctranslate2"

    def __init__(
        self,
        checkpoint: Path,
        converted: Path,
        device: str = "cpu",
        threads: int | None = None,
        compute_type: str = "default",
    ):
        import ctranslate2

        transformers = require_transformers()
        config = checkpoint_config(checkpoint)
        self.checkpoint, self.device, self.threads = Path(checkpoint), device, threads
        self.hf = from_pretrained(transformers.AutoTokenizer, checkpoint)
        self.tokenizer = TokenCounter(self.hf)
        self.translator = ctranslate2.Translator(
            str(converted), device=device, compute_type=compute_type, intra_threads=threads or 0
        )
        self.position_limit = int(getattr(config, "max_position_embeddings", 512) or 512)
        self.forced_eos = forces_eos(checkpoint)

    def _output_ids(self, sentences, beam, length_penalty, batch_tokens, max_batch, on_batch) -> list[list[int]]:
        encoded = self.hf(sentences)["input_ids"] if sentences else []
        lengths = [len(ids) for ids in encoded]
        out: list[list[int]] = [[] for _ in sentences]
        for index in _batches(lengths, batch_tokens, max_batch):
            limits = [max_new_tokens(lengths[i], self.position_limit) - self.forced_eos for i in index]
            tokens = [self.hf.convert_ids_to_tokens(encoded[i]) for i in index]
            results = self.translator.translate_batch(
                tokens,
                beam_size=beam,
                length_penalty=length_penalty,
                max_decoding_length=max(limits),
                max_batch_size=max_batch,
            )
            for i, result, limit in zip(index, results, limits):
                out[i] = self._content(self.hf.convert_tokens_to_ids(result.hypotheses[0][:limit]))
            if on_batch:
                on_batch(len(index))
        return out
