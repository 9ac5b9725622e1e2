"""From a PyTorch model to the float graphs a package ships: the one way the pipeline makes them.

`float32_graphs` once (export, optimise, tie), then `variant_graphs` per float precision. The
export stage uses them (and checks each variant against PyTorch), prune's latency check too; a
whole package, int8 included, is `package_builder.build_package`. int8 lives there, not here,
so that what only builds float graphs does not depend on the int8 code (a change to
model/onnx_quantize.py rebuilds quantize and what follows, not pruning).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import onnx
from mt_runtime.search import GenerationConfig

from model.onnx_export import export_onnx, optimize_onnx, positions_as_formula, tie_decoder_embedding, to_fp16
from model.onnx_passes.edit import unfuse_skip_layer_norm
from model.transformer import Transformer, TransformerConfig

FLOAT_PRECISIONS = ("fp32", "fp16")


@dataclasses.dataclass(frozen=True)
class GraphOptions:
    """How the graphs are made; the defaults are the export and quantize stages' defaults."""

    opset: int = 17
    fused_attention: bool = True
    optimize: bool = True


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


def variant_graphs(graphs: dict[str, Path], precision: str, work: Path, d_model: int) -> tuple[dict[str, Path], dict]:
    """One float precision's graphs, written under work/<precision>, from `float32_graphs`'
    output (left as it is, so every precision can be made from it). Returns ({graph: path}, what
    was done)."""
    if precision not in FLOAT_PRECISIONS:
        raise ValueError(f"unknown float precision {precision!r}: one of {', '.join(FLOAT_PRECISIONS)}")
    folder = work / precision
    folder.mkdir(parents=True, exist_ok=True)
    if precision == "fp16":  # keeps the positional table: in float16 the formula's angles lose precision
        for path in graphs.values():
            to_fp16(path, folder / path.name)
        return {name: folder / path.name for name, path in graphs.items()}, {}
    fp32 = {name: folder / path.name for name, path in graphs.items()}
    for name, path in graphs.items():
        shutil.copyfile(path, fp32[name])
    # Every residual norm as Sum + LayerNormalization (model/onnx_passes/edit.py): onnxruntime fuses
    # no Sum back, so one row and many rows, the step graphs and the search op's copies, run the
    # same nodes: the same numbers for a sentence alone and in a batch.
    unfused = {}
    for name in ("encoder", "decoder"):
        proto = onnx.load(str(fp32[name]))
        unfused[name] = unfuse_skip_layer_norm(proto.graph)
        onnx.save(proto, str(fp32[name]))
    return fp32, {
        "positions_as_formula": {name: positions_as_formula(path, d_model) for name, path in fp32.items()},
        "layer_norms_unfused": unfused,
    }


def generation_of(cfg: TransformerConfig, beam: int = 4) -> dict:
    """The package's generation.json for a model of this configuration."""
    return dataclasses.asdict(
        GenerationConfig(
            beam=beam, bos_id=cfg.bos_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id, max_positions=cfg.max_positions
        )
    )
