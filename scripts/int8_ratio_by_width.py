"""What int8 buys at batch-1 greedy, by model width: the fp32 package's latency against the
int8_dynamic package's, both built by the pipeline's own export and quantize code.

    python scripts/int8_ratio_by_width.py SENTENCES.txt TOKENIZER.json [--widths 112,176,256]
                                           [--models MODEL_DIR ...] [--steps 20] [--rounds 3]

Every sentence is decoded to exactly --steps tokens (the search's min_length and max_length), so
that the figure does not depend on what a model has learnt: widths without a trained model are
random-initialised 4+2-layer models shaped like the default student (4 heads, FFN 416/112 of
d_model). --models adds trained model folders (their own shape) for comparison. One thread,
the two packages interleaved sentence by sentence, so that machine load hits both.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from mt_runtime.subword import SubwordTokenizer
from onnx import numpy_helper

from model.transformer import Transformer, TransformerConfig, load_model
from pipeline.export.package_builder import build_package
from pipeline.measure.timing import interleaved


def student_shaped(d_model: int, vocab_size: int) -> Transformer:
    ffn = int(round(d_model * 416 / 112 / 16) * 16)
    torch.manual_seed(0)
    return Transformer(
        TransformerConfig(
            vocab_size=vocab_size,
            d_model=d_model,
            head_dim=d_model // 4,
            enc_heads=[4] * 4,
            dec_self_heads=[4] * 2,
            dec_cross_heads=[4] * 2,
            enc_ffn=[ffn] * 4,
            dec_ffn=[ffn] * 2,
            dropout=0.0,
        )
    ).eval()


def fp32_and_int8(model: Transformer, tokenizer: Path, work: Path) -> tuple[Path, Path]:
    """The export stage's fp32 package and the quantize stage's int8_dynamic one (no guard:
    the latency does not depend on the BLEU)."""
    for precision in ("fp32", "int8_dynamic"):
        build_package(model, precision, work / precision, tokenizer=tokenizer, work=work / "graphs")
    return work / "fp32", work / "int8_dynamic"


def forced_length_session(package: Path, steps: int) -> ort.InferenceSession:
    proto = onnx.load(str(package / "generate.onnx"))
    for init in proto.graph.initializer:
        if init.name == "min_length":  # end-of-sentence is masked until this length
            init.CopyFrom(numpy_helper.from_array(np.array([steps + 1], np.int32), "min_length"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def time_packages(
    packages: dict[str, Path], ids: list[list[int]], eos: int, pad: int, steps: int, rounds: int
) -> dict[str, float]:
    sessions = {name: forced_length_session(path, steps) for name, path in packages.items()}
    feeds = [
        {
            "input_ids": np.array([row + [eos]], np.int32),
            "max_length": np.array([steps + 1], np.int32),
            "num_beams": np.array([1], np.int32),
            "length_penalty": np.array([1.0], np.float32),
        }
        for row in ids
    ]

    def decode(session: ort.InferenceSession, name: str):
        def run(feed):
            tokens = session.run(None, feed)[0]
            decoded = int((tokens[0, 0] != pad).sum()) - 1  # less the start token
            if decoded != steps:
                raise RuntimeError(f"{name}: decoded {decoded} tokens, not {steps}")

        return run

    timed = interleaved(
        {name: decode(session, name) for name, session in sessions.items()}, feeds, repeats=rounds, warmup=3
    )
    return {name: 1000 * timed.median_s(name) for name in sessions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sentences", type=Path)
    parser.add_argument("tokenizer", type=Path, help="tokenizer.json of the models' vocabulary")
    parser.add_argument("--widths", default="112,144,176,208,256")
    parser.add_argument("--models", nargs="*", type=Path, default=[], help="trained model folders")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-sentences", type=int, default=40)
    args = parser.parse_args()

    tokenizer = SubwordTokenizer.load(args.tokenizer)
    lines = [s.strip() for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    ids = tokenizer.encode(lines[: args.max_sentences])
    models = [(f"d{w}, 4+2, random", student_shaped(int(w), tokenizer.vocab_size)) for w in args.widths.split(",") if w]
    models += [(str(folder), load_model(folder).eval()) for folder in args.models]
    print(f"{len(ids)} sentences x {args.rounds} rounds, {args.steps} tokens each, batch 1, greedy, 1 thread")
    print(f"{'model':40} {'d':>4} {'params':>11} {'fp32 ms':>8} {'int8 ms':>8} {'int8/fp32':>9}")
    for name, model in models:
        with tempfile.TemporaryDirectory() as work:
            fp32, int8 = fp32_and_int8(model, args.tokenizer, Path(work))
            ms = time_packages(
                {"fp32": fp32, "int8": int8}, ids, model.cfg.eos_id, model.cfg.pad_id, args.steps, args.rounds
            )
        print(
            f"{name:40} {model.cfg.d_model:>4} {model.num_parameters():>11,} {ms['fp32']:>8.2f} {ms['int8']:>8.2f} "
            f"{ms['int8'] / ms['fp32']:>9.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
