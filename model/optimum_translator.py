"""A Hugging Face seq2seq checkpoint as Optimum runs it: the peer a Hugging Face user would reach
for. Exported by Optimum's own exporter (what `optimum-cli export onnx` does), int8 by Optimum's
own ORTQuantizer (dynamic), and translated by ORTModelForSeq2SeqLM's generate (transformers'
search in Python, onnxruntime for each step).

Runs only in the Optimum environment (scripts/optimum_env.sh: optimum-onnx pins transformers<4.58,
which this project's environment does not), as a process of its own:

    python -m model.optimum_translator export CHECKPOINT DEST float32|int8   # prints DEST's facts

and, in the benchmark's measurement processes (pipeline/measure/optimum_peer.py), through the
registry (pipeline/measure/translators.py: a folder with optimum.json). Never imported by the
project's own environment.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from .hf_checkpoint import check_checkpoint, narrow_permissions, stdin_closed
from .hf_translator import HFTranslator, TokenCounter, forces_eos, require_transformers

MARKER = "optimum.json"  # what the registry tells an Optimum folder by: these facts
ENCODER, DECODER = "encoder_model.onnx", "decoder_model_merged.onnx"  # what from_pretrained loads by default
COMPUTE_TYPES = ("float32", "int8")
COUNT_SENTENCES = ("A man is riding a bicycle.", "Two dogs play in the snow near a red house.")
VERSIONED = ("optimum", "optimum-onnx", "transformers", "onnxruntime", "torch")


def versions() -> dict[str, str]:
    import importlib.metadata as metadata

    return {name: metadata.version(name) for name in VERSIONED}


def quantization_config_name(flags: set[str] | None = None) -> str:
    """Which of Optimum's AutoQuantizationConfig presets fits this CPU: the widest integer
    instructions it has. At is_static=False, avx512_vnni and avx512 are the same config (uint8
    activations, int8 weights per channel: the u8s8 kernels VNNI runs in one instruction a dot
    product); avx2 has uint8 weights (u8u8); arm64 where the CPU is an ARM one."""
    if flags is None:
        flags = cpu_flags()
    if "asimd" in flags or os.uname().machine in ("aarch64", "arm64"):
        return "arm64"
    for name in ("avx512_vnni", "avx512f", "avx2"):
        if name in flags:
            return name.removesuffix("f")
    return "avx2"


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def export(checkpoint: Path, dest: Path, compute_type: str) -> dict:
    """DEST: the checkpoint exported by Optimum (and quantized by it for int8), holding what
    ORTModelForSeq2SeqLM loads by default (the encoder and the merged decoder) with the
    checkpoint's tokenizer, and optimum.json: what was done, the bytes Optimum's export wrote in
    all, and how many onnxruntime calls a sentence takes. Reused where it exists."""
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"compute type {compute_type!r}: Optimum's peer has {', '.join(COMPUTE_TYPES)}")
    if (dest / MARKER).is_file():
        return json.loads((dest / MARKER).read_text(encoding="utf-8"))
    from optimum.exporters.onnx import main_export

    check_checkpoint(checkpoint)
    tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.perf_counter()
    with stdin_closed():
        # optimum-cli export onnx's defaults: the task from the model, decoders with a KV cache,
        # and the post-processing that adds a merged decoder beside the two it exported.
        main_export(str(checkpoint), output=str(tmp), task="text2text-generation-with-past", do_validation=False)
    exported = {p.name: p.stat().st_size for p in sorted(tmp.glob("*.onnx*"))}
    facts: dict = {
        "compute_type": compute_type,
        "export_s": round(time.perf_counter() - start, 2),
        "export_files": exported,  # everything Optimum's export wrote: three decoders, each with its weights
        "export_bytes": sum(exported.values()),
        "checkpoint_bytes": sum(p.stat().st_size for p in checkpoint.glob("*.safetensors")),
        "versions": versions(),
    }
    for name in exported:  # kept: what from_pretrained loads; the two unmerged decoders are not
        if name not in (ENCODER, DECODER):
            (tmp / name).unlink()
    if compute_type == "int8":
        facts["quantization"] = quantize(tmp)
    narrow_permissions(tmp, checkpoint)
    (tmp / MARKER).write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    facts["session_runs"] = count_session_runs(tmp)
    (tmp / MARKER).write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    return facts


def quantize(folder: Path) -> dict:
    """The encoder and the merged decoder through ORTQuantizer, dynamic int8, with the preset
    for this CPU (quantization_config_name), each written over its float32 file."""
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    preset = quantization_config_name()
    config = getattr(AutoQuantizationConfig, preset)(is_static=False)
    for name in (ENCODER, DECODER):
        quantizer = ORTQuantizer.from_pretrained(folder, file_name=name)
        quantizer.quantize(save_dir=folder / "int8", quantization_config=config)
        os.replace(folder / "int8" / name.replace(".onnx", "_quantized.onnx"), folder / name)
        shutil.rmtree(folder / "int8")
    return {
        "preset": preset,
        "is_static": False,
        "per_channel": config.per_channel,
        "weights": str(config.weights_dtype),
    }


def count_session_runs(folder: Path) -> dict:
    """onnxruntime calls a sentence takes (every InferenceSession.run, counted), greedy and beam
    4, with the output tokens they made: generate's search is Python, one decoder call a step."""
    import onnxruntime

    translator = OptimumTranslator(folder, threads=1)
    calls = [0]
    run = onnxruntime.InferenceSession.run

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return run(self, *args, **kwargs)

    onnxruntime.InferenceSession.run = counted
    try:
        out = {}
        for beam in (1, 4):
            calls[0], tokens = 0, 0
            for sentence in COUNT_SENTENCES:
                tokens += len(translator._output_ids([sentence], beam, 1.0, 4000, 1, None)[0])
            out[f"beam{beam}"] = {
                "calls_per_sentence": calls[0] / len(COUNT_SENTENCES),
                "tokens_per_sentence": tokens / len(COUNT_SENTENCES),
            }
        return out
    finally:
        onnxruntime.InferenceSession.run = run


class OptimumTranslator(HFTranslator):
    """ORTModelForSeq2SeqLM on an export() folder, through HFTranslator's generate call (the same
    budgets and ends of sentences as the transformers row), its sessions on `threads` threads."""

    runtime = "optimum"

    def __init__(self, folder: Path, device: str = "cpu", threads: int | None = None):
        import onnxruntime
        from optimum.onnxruntime import ORTModelForSeq2SeqLM

        transformers = require_transformers()
        if device != "cpu":
            raise ValueError("the Optimum peer runs on the CPU only here")
        folder = Path(folder)
        self.facts = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self.checkpoint, self.device, self.threads = folder, device, threads
        with stdin_closed():
            self.hf = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            self.model = ORTModelForSeq2SeqLM.from_pretrained(
                str(folder), session_options=options, provider="CPUExecutionProvider", local_files_only=True
            )
        self.tokenizer = TokenCounter(self.hf)
        self.position_limit = int(getattr(self.model.config, "max_position_embeddings", 512) or 512)
        self.forced_eos = forces_eos(folder)

    def describe(self) -> dict:
        return {**super().describe(), "compute_type": self.facts["compute_type"]}

    def num_parameters(self) -> int | None:
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] != "export":
        print("usage: python -m model.optimum_translator export CHECKPOINT DEST float32|int8", file=sys.stderr)
        return 2
    facts = export(Path(argv[1]), Path(argv[2]), argv[3])
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
