"""One decoder step's attention as onnxruntime runs it: a single MultiHeadAttention node, timed at
the op's default scale and at scale 1 on queries already divided by sqrt(head_size) (what the
export writes for the self-attention, docs/decisions.md); then whether one row's output keeps its
bits when its keys are padded further, unpadded and padded to multiples of four (what the runtime
does, mt_runtime/search.py `source_width`).

    python scripts/attention_bench.py [--rows 32] [--heads 8] [--head-size 64] [--positions 2,15,30]

Self-attention: the cache bound in place as `decoder_greedy_inplace.onnx` runs it (capacity 64).
Cross-attention: keys and values [rows, heads, positions, head_size] with a key mask. One thread;
each figure is the best of 7 passes of 300 calls, in us a call. Random data, CPU only.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

CAPACITY = 64


def session(inputs: list[str], outputs: list[str], heads: int, scale: float | None) -> ort.InferenceSession:
    attributes = {"num_heads": heads} if scale is None else {"num_heads": heads, "scale": scale}
    node = helper.make_node("MultiHeadAttention", inputs, outputs, domain="com.microsoft", **attributes)
    types = {"mask": TensorProto.INT32, "past_sequence_length": TensorProto.INT32}
    graph = helper.make_graph(
        [node],
        "attention",
        [helper.make_tensor_value_info(n, types.get(n, TensorProto.FLOAT), None) for n in inputs if n],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def best_us(call, calls: int = 300, passes: int = 7) -> float:
    for _ in range(20):
        call()
    times = []
    for _ in range(passes):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - started) / calls)
    return 1e6 * min(times)


def self_attention_us(rows: int, heads: int, size: int, positions: int, scale: float | None) -> float:
    rng = np.random.default_rng(0)
    width = heads * size
    names = ["query", "key", "value", "", "", "", "past_key", "past_value", "past_sequence_length"]
    s = session(names, ["output", "present_key", "present_value"], heads, scale)
    binding = s.io_binding()
    for name in ("query", "key", "value"):
        binding.bind_cpu_input(name, rng.standard_normal((rows, 1, width), dtype=np.float32))
    for past, present in (("past_key", "present_key"), ("past_value", "present_value")):
        buffer = ort.OrtValue.ortvalue_from_numpy(rng.standard_normal((rows, heads, CAPACITY, size), dtype=np.float32))
        binding.bind_ortvalue_input(past, buffer)
        binding.bind_ortvalue_output(present, buffer)  # written in place, as the runtime binds it
    binding.bind_cpu_input("past_sequence_length", np.array([positions - 1], np.int32))
    binding.bind_output("output", "cpu")
    return best_us(lambda: s.run_with_iobinding(binding))


def cross_session(heads: int, scale: float | None) -> ort.InferenceSession:
    return session(["query", "key", "value", "", "mask"], ["output"], heads, scale)


def cross_feed(rng, rows: int, heads: int, size: int, positions: int, padded_to: int | None = None) -> dict:
    total = padded_to or positions
    mask = np.zeros((rows, total), np.int32)
    mask[:, :positions] = 1
    return {
        "query": rng.standard_normal((rows, 1, heads * size), dtype=np.float32),
        "key": rng.standard_normal((rows, heads, total, size), dtype=np.float32),
        "value": rng.standard_normal((rows, heads, total, size), dtype=np.float32),
        "mask": mask,
    }


def kept_bits(heads: int, size: int, scale: float | None, multiple: int) -> tuple[int, int]:
    """(lengths whose output changed, lengths tried): a row over 1-29 positions padded to the next
    multiple of `multiple`, against the same row padded 1-3 multiples further."""
    s, rng, changed, tried = cross_session(heads, scale), np.random.default_rng(1), 0, 0
    for positions in range(1, 30):
        first = -(-positions // multiple) * multiple
        for extra in range(1, 4):
            feed = cross_feed(rng, 1, heads, size, positions, first + extra * multiple)
            near = {
                **feed,
                "mask": np.ascontiguousarray(feed["mask"][:, :first]),
                "key": np.ascontiguousarray(feed["key"][:, :, :first]),
                "value": np.ascontiguousarray(feed["value"][:, :, :first]),
            }
            changed += not np.array_equal(s.run(None, near)[0], s.run(None, feed)[0])
            tried += 1
    return changed, tried


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--positions", default="2,15,30")
    args = ap.parse_args()
    rows, heads, size = args.rows, args.heads, args.head_size
    print(f"onnxruntime {ort.__version__}; {rows} rows, {heads} heads of {size}; us a call, 1 thread")
    print("| attention | positions | default scale | scale 1 | speed-up |")
    print("|---|---|---|---|---|")
    for positions in (int(p) for p in args.positions.split(",")):
        default, one = (self_attention_us(rows, heads, size, positions, scale) for scale in (None, 1.0))
        print(f"| self (in place) | {positions} | {default:.1f} | {one:.1f} | {default / one:.2f}x |")
        feed = cross_feed(np.random.default_rng(2), rows, heads, size, positions)
        default, one = (best_us(lambda s=cross_session(heads, scale): s.run(None, feed)) for scale in (None, 1.0))
        print(f"| cross (key mask) | {positions} | {default:.1f} | {one:.1f} | {default / one:.2f}x |")
    for scale in (None, 1.0):
        for multiple in (1, 4):
            changed, tried = kept_bits(heads, size, scale, multiple)
            padding = "unpadded" if multiple == 1 else f"padded to multiples of {multiple}"
            print(
                f"cross-attention at {'scale 1' if scale else 'the default scale'}, {padding}: "
                f"{changed} of {tried} lengths changed bits when padded further"
            )


if __name__ == "__main__":
    main()
