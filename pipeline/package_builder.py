"""From a PyTorch model to a shipped package: the one way the pipeline makes its ONNX graphs.

`build_package(model, precision, dest, ...)` is the whole path (prune's latency check and the
scripts use it). The export stage, which checks each variant against PyTorch before it
ships, uses its two steps: `float32_graphs` once, then `variant_graphs` per precision. The
quantize stage starts from the fp32 package's graphs instead (its guard chooses which weights
stay float) and writes its packages with `packaging.write_package`, as this module does.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from model.onnx_export import export_onnx, optimize_onnx, positions_as_formula, tie_decoder_embedding, to_fp16
from model.onnx_quantize import node_groups, quantize_blockwise
from model.search import GenerationConfig
from model.transformer import Transformer, TransformerConfig

from .packaging import write_package

PRECISIONS = ("fp32", "fp16", "int8_dynamic")


@dataclasses.dataclass(frozen=True)
class GraphOptions:
    """How the graphs are made; the defaults are the export and quantize stages' defaults."""

    opset: int = 17
    fused_attention: bool = True
    optimize: bool = True
    block_size: int = 32  # int8_dynamic: MatMulNBits block along the input dimension
    per_channel: bool = True  # int8_dynamic: the encoder's MatMulInteger scales


def float32_graphs(model: Transformer, work: Path, options: GraphOptions = GraphOptions()) -> tuple[dict, dict]:
    """The encoder and decoder step graphs: exported, optimised, the decoder's token lookup
    reading the output projection. The positional table is still a table: `variant_graphs`
    decides per precision. Returns ({graph: path}, what was done)."""
    graphs = export_onnx(model, work / "raw", opset=options.opset, fused=options.fused_attention)
    done: dict = {}
    if options.optimize:
        optimized = work / "optimized"
        optimized.mkdir(parents=True, exist_ok=True)
        done["optimizer"] = {name: optimize_onnx(path, optimized / path.name) for name, path in graphs.items()}
        graphs = {name: optimized / path.name for name, path in graphs.items()}
    done["tied_embedding"] = tie_decoder_embedding(graphs["decoder"])
    return graphs, done


def variant_graphs(graphs: dict[str, Path], precision: str, work: Path, d_model: int,
                   options: GraphOptions = GraphOptions()) -> tuple[dict[str, Path], dict]:
    """One precision's graphs, written under work/<precision>, from `float32_graphs`' output
    (left as it is, so every precision can be made from it). Returns ({graph: path}, what was done)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: one of {', '.join(PRECISIONS)}")
    folder = work / precision
    folder.mkdir(parents=True, exist_ok=True)
    if precision == "fp16":  # keeps the positional table: in float16 the formula's angles lose precision
        for path in graphs.values():
            to_fp16(path, folder / path.name)
        return {name: folder / path.name for name, path in graphs.items()}, {}
    fp32 = {name: folder / path.name for name, path in graphs.items()}
    for name, path in graphs.items():
        shutil.copyfile(path, fp32[name])
    done = {"positions_as_formula": {name: positions_as_formula(path, d_model) for name, path in fp32.items()}}
    if precision == "fp32":
        return fp32, done
    int8 = quantize_blockwise(fp32, folder / "int8", node_groups(fp32), (), options.block_size, options.per_channel)
    return int8, done


def generation_of(cfg: TransformerConfig, beam: int = 4) -> dict:
    """The package's generation.json for a model of this configuration."""
    return dataclasses.asdict(GenerationConfig(beam=beam, bos_id=cfg.bos_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id,
                                               max_positions=cfg.max_positions))


def build_package(model: Transformer, precision: str, dest: Path, *, tokenizer: Path, work: Path,
                  options: GraphOptions = GraphOptions(), about: dict | None = None, beam: int = 4) -> dict:
    """Export `model` at `precision` (fp32, fp16, or int8_dynamic with every weight int8 and no
    BLEU guard) into a package folder at `dest`; intermediate graphs go under `work`.
    Returns the package.json written."""
    graphs, _ = float32_graphs(model, work, options)
    graphs, _ = variant_graphs(graphs, precision, work, model.cfg.d_model, options)
    return write_package(dest, graphs["encoder"], graphs["decoder"], tokenizer, generation_of(model.cfg, beam),
                         about or {"variant": precision})
