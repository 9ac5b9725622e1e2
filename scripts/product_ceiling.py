"""The int8 share of the peak a shape could reach if its int8 products were all that took time.

    python scripts/product_ceiling.py [--shape default-student] [--batch 32] [--src-len 20] [--steps 30]

For each of issue 58's shapes (scripts/shape_bench.py's SHAPES) and greedy and beam 4 batches: every
int8 matrix product a batch runs (the encoder's over batch x src-len rows, the cross-attention's
keys and values once, each decoder step's over batch x beam rows, the output layer over the whole
vocabulary), each timed alone in onnxruntime as the packages run it (MatMulIntegerToFloat, u8
activations x s8 weights, the weight a constant, warm, one thread); their sum is what a batch
would take if attention, normalization, quantization, the search and memory traffic between
nodes cost nothing. The shape's multiply-adds (shape_bench.macs, attention's included) over that
time, against one core's int8 peak measured here as shape_bench measures it, is the ceiling on
the share shape_bench reports; the three slowest products per multiply-add are named.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from shape_bench import SHAPES, macs, model_config, peaks

_timed: dict[tuple[int, int, int], float] = {}


def product_seconds(rows: int, k: int, n: int) -> float:
    """One MatMulIntegerToFloat [rows x k] x [k x n], alone, warm: the median of its runs."""
    if (rows, k, n) not in _timed:
        rng = np.random.default_rng(0)
        graph = helper.make_graph(
            [helper.make_node("MatMulIntegerToFloat", ["x", "w", "sx", "sw", "zx"], ["y"], domain="com.microsoft")],
            "product",
            [helper.make_tensor_value_info("x", TensorProto.UINT8, [rows, k])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
            [
                numpy_helper.from_array(rng.integers(-127, 127, (k, n), dtype=np.int8), "w"),
                numpy_helper.from_array(np.array(128, np.uint8), "zx"),
                numpy_helper.from_array(np.array(0.01, np.float32), "sx"),
                numpy_helper.from_array(np.full(n, 0.02, np.float32), "sw"),
            ],
        )
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feed = {"x": rng.integers(0, 255, (rows, k), dtype=np.uint8)}
        for _ in range(5):
            session.run(None, feed)
        times = []
        for _ in range(max(5, min(200, int(2e8 / (rows * k * n)) + 5))):
            started = time.perf_counter()
            session.run(None, feed)
            times.append(time.perf_counter() - started)
        _timed[rows, k, n] = float(np.median(times))
    return _timed[rows, k, n]


def products(cfg: dict, batch: int, beam: int, src_len: int, steps: int) -> list[tuple[int, int, int, int]]:
    """(rows, k, n, times a batch) of every int8 product, as shape_bench.macs counts them."""
    d, hd, vocab, embed = cfg["d_model"], cfg["head_dim"], cfg["vocab_size"], cfg.get("embed_dim")
    src, rows = batch * src_len, batch * beam
    out = []
    for heads, ffn in zip(cfg["enc_heads"], cfg["enc_ffn"]):
        out += [(src, d, 3 * heads * hd, 1), (src, heads * hd, d, 1), (src, d, ffn, 1), (src, ffn, d, 1)]
    if embed:
        out.append((src, embed, d, 1))
    for self_heads, cross_heads, ffn in zip(cfg["dec_self_heads"], cfg["dec_cross_heads"], cfg["dec_ffn"]):
        out.append((src, d, 2 * cross_heads * hd, 1))  # the cross-attention's keys and values, once
        out += [
            (rows, d, 3 * self_heads * hd, steps),
            (rows, self_heads * hd, d, steps),
            (rows, d, cross_heads * hd, steps),
            (rows, cross_heads * hd, d, steps),
            (rows, d, ffn, steps),
            (rows, ffn, d, steps),
        ]
    out += [(rows, d, embed, steps), (rows, embed, vocab, steps)] if embed else [(rows, d, vocab, steps)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), help="one shape (default: all)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--src-len", type=int, default=20)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    peak = max(peaks()["int8"] for _ in range(3))
    print(f"one core's int8 peak (MatMulInteger u8 x s8 at 1024^3, best of 3): {peak:.0f} GMAC/s")
    for name in [args.shape] if args.shape else list(SHAPES):
        spec, vocab = SHAPES[name]
        cfg = model_config(spec, vocab).to_dict()
        for beam in (1, 4):
            listed = products(cfg, args.batch, beam, args.src_len, args.steps)
            seconds = sum(product_seconds(r, k, n) * times for r, k, n, times in listed)
            multiply_adds = sum(r * k * n * times for r, k, n, times in listed)
            share = macs(cfg, args.batch, beam, args.src_len, args.steps) / seconds / 1e9 / peak

            def speed(p: tuple[int, int, int]) -> float:
                return p[0] * p[1] * p[2] / product_seconds(*p) / 1e9

            slowest = sorted({(r, k, n) for r, k, n, _ in listed}, key=speed)[:3]
            named = ", ".join(f"[{r} x {k}] x [{k} x {n}] {speed((r, k, n)):.0f}" for r, k, n in slowest)
            print(
                f"{name}, {'greedy' if beam == 1 else 'beam 4'} batch {args.batch}: the int8 products alone "
                f"{seconds * 1e3:.1f} ms a batch ({multiply_adds / seconds / 1e9:.0f} GMAC/s); ceiling on the share: "
                f"{share:.0%}; slowest (GMAC/s): {named}"
            )


if __name__ == "__main__":
    main()
