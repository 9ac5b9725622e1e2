"""From a PyTorch model to a shipped package, at any precision: `build_package(model, precision, dest)`.

The float graphs come from pipeline/export/float_graphs.py; int8_dynamic quantizes every weight of the
fp32 graphs as the quantize stage's default does, without its BLEU guard (for measurements
where the latency, not the BLEU, matters: the scripts, the tests). The quantize stage itself
starts from the fp32 package and writes the guard's graphs with `packaging.write_package`.
"""

from __future__ import annotations

from pathlib import Path

from model.onnx_quantize import RecordingDecoder, node_groups, quantize_rows, quantize_static
from model.transformer import Transformer

from .float_graphs import GraphOptions, float32_graphs, generation_of, variant_graphs
from .packages import write_package

PRECISIONS = ("fp32", "fp16", "int8_dynamic", "int8_static")


def build_package(
    model: Transformer,
    precision: str,
    dest: Path,
    *,
    tokenizer: Path,
    work: Path,
    options: GraphOptions = GraphOptions(),
    about: dict | None = None,
    beam: int = 4,
    shortlist: Path | None = None,
    calibration: list[list[int]] | None = None,
) -> dict:
    """Export `model` at `precision` into a package folder at `dest`; intermediate graphs go
    under `work`; `shortlist`: a shortlist.npz to ship (mt_runtime/shortlist.py); `calibration`:
    int8_static's sources (token ids + EOS), decoded greedily by the float32 graphs to record the
    activations its scales are calibrated on (minmax). Returns the package.json written."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: one of {', '.join(PRECISIONS)}")
    graphs, _ = float32_graphs(model, work, options)
    graphs, _ = variant_graphs(graphs, "fp16" if precision == "fp16" else "fp32", work, model.cfg.d_model)
    if precision == "int8_dynamic":
        graphs = quantize_rows(graphs, work / "int8_dynamic", node_groups(graphs))
    elif precision == "int8_static":
        if not calibration:
            raise ValueError("int8_static needs calibration sources")
        graphs = quantize_static(
            graphs,
            work / "int8_static",
            node_groups(graphs),
            _recorded_feeds(graphs, calibration, generation_of(model.cfg, 1)),
            "minmax",
        )
    return write_package(
        dest,
        graphs["encoder"],
        graphs["decoder"],
        tokenizer,
        generation_of(model.cfg, beam),
        about or {"variant": precision},
        shortlist=shortlist,
    )


def _recorded_feeds(graphs: dict[str, Path], sources: list[list[int]], generation: dict) -> dict[str, list[dict]]:
    """The float32 graphs' inputs while they decode `sources` greedily, 16 at a time."""
    import onnxruntime as ort
    from mt_runtime.search import GenerationConfig, greedy_search
    from mt_runtime.translator import OnnxDecoder

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    recorder = RecordingDecoder(
        OnnxDecoder(
            *(
                ort.InferenceSession(str(graphs[g]), options, providers=["CPUExecutionProvider"])
                for g in ("encoder", "decoder")
            ),
            pad_id=generation["pad_id"],
            max_positions=generation["max_positions"],
        )
    )
    gen = GenerationConfig(**generation)
    for start in range(0, len(sources), 16):
        greedy_search(recorder, sources[start : start + 16], gen)
    return recorder.feeds
