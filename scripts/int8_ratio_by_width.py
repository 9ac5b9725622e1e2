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
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper

from model.onnx_export import positions_as_formula
from model.onnx_quantize import node_groups, quantize_blockwise
from model.search import GenerationConfig
from model.tokenizer import SubwordTokenizer
from model.transformer import Transformer, TransformerConfig, load_model
from pipeline.packaging import write_package
from pipeline.stages.export import float32_graphs


def student_shaped(d_model: int, vocab_size: int) -> Transformer:
    ffn = int(round(d_model * 416 / 112 / 16) * 16)
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=vocab_size, d_model=d_model, head_dim=d_model // 4,
                                         enc_heads=[4] * 4, dec_self_heads=[4] * 2, dec_cross_heads=[4] * 2,
                                         enc_ffn=[ffn] * 4, dec_ffn=[ffn] * 2, dropout=0.0)).eval()


def fp32_and_int8(model: Transformer, tokenizer: Path, work: Path) -> tuple[Path, Path]:
    """The export stage's graph pipeline, then the quantize stage's int8_dynamic (no guard:
    the latency does not depend on the BLEU)."""
    graphs, _ = float32_graphs(model, work, opset=17, fused=True, optimize=True)
    for path in graphs.values():
        positions_as_formula(path, model.cfg.d_model)
    cfg = model.cfg
    generation = dataclasses.asdict(GenerationConfig(bos_id=cfg.bos_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id,
                                                     max_positions=cfg.max_positions))
    write_package(work / "fp32", graphs["encoder"], graphs["decoder"], tokenizer, generation, {"variant": "fp32"})
    int8 = quantize_blockwise(graphs, work / "int8_graphs", node_groups(graphs))
    write_package(work / "int8", int8["encoder"], int8["decoder"], tokenizer, generation, {"variant": "int8_dynamic"})
    return work / "fp32", work / "int8"


def forced_length_session(package: Path, steps: int) -> ort.InferenceSession:
    proto = onnx.load(str(package / "generate.onnx"))
    for init in proto.graph.initializer:
        if init.name == "min_length":  # end-of-sentence is masked until this length
            init.CopyFrom(numpy_helper.from_array(np.array([steps + 1], np.int32), "min_length"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def time_packages(packages: dict[str, Path], ids: list[list[int]], eos: int, pad: int, steps: int,
                  rounds: int) -> dict[str, float]:
    sessions = {name: forced_length_session(path, steps) for name, path in packages.items()}
    feeds = [{"input_ids": np.array([row + [eos]], np.int32), "max_length": np.array([steps + 1], np.int32),
              "num_beams": np.array([1], np.int32), "length_penalty": np.array([1.0], np.float32)} for row in ids]
    for session in sessions.values():  # warm-up
        for feed in feeds[:3]:
            session.run(None, feed)
    seconds = dict.fromkeys(sessions, 0.0)
    for _ in range(rounds):
        for feed in feeds:
            for name, session in sessions.items():
                start = time.perf_counter()
                tokens = session.run(None, feed)[0]
                seconds[name] += time.perf_counter() - start
                decoded = int((tokens[0, 0] != pad).sum()) - 1  # less the start token
                if decoded != steps:
                    raise RuntimeError(f"{name}: decoded {decoded} tokens, not {steps}")
    return {name: 1000 * s / (rounds * len(feeds)) for name, s in seconds.items()}


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
            ms = time_packages({"fp32": fp32, "int8": int8}, ids, model.cfg.eos_id, model.cfg.pad_id, args.steps,
                               args.rounds)
        print(f"{name:40} {model.cfg.d_model:>4} {model.num_parameters():>11,} {ms['fp32']:>8.2f} {ms['int8']:>8.2f} "
              f"{ms['int8'] / ms['fp32']:>9.3f}", flush=True)


if __name__ == "__main__":
    main()
