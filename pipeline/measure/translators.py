"""The pipeline's kinds of model folder, registered with mt-runtime's registry on import
(mt_runtime/registry.py), and `open_model`: the registry's open, its errors as the pipeline's.

mt-runtime registers the ONNX package itself; here: a PyTorch model folder (model.safetensors +
config.json: model/torch_decoder.py), an imported Hugging Face teacher (hf_import.json +
checkpoint/: model/hf_translator.py), and CTranslate2 folders (model.bin with our pipeline.json:
model/ctranslate2_export.py; with the checkpoint's tokenizer under hf/: model/hf_translator.py), and
Optimum's export of an imported teacher (optimum.json: model/optimum_translator.py).
Each opener imports its runtime when called, so registering costs no import of torch.
"""

from __future__ import annotations

from pathlib import Path

from mt_runtime.files import PackageError
from mt_runtime.registry import (
    ModelKind,
    NotAModel,
    TextTranslator,
    is_onnx_package,
    kind_of,
    open_translator,
    register,
)

from ..engine.errors import IntegrityError, UserInputError

__all__ = ["is_imported_teacher", "is_onnx_package", "is_torch_model", "kind_of", "open_model"]


def is_imported_teacher(folder: Path) -> bool:
    return (folder / "hf_import.json").is_file() and (folder / "checkpoint").is_dir()


def is_torch_model(folder: Path) -> bool:
    return (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()


def is_ctranslate2_model(folder: Path) -> bool:
    from model.ctranslate2_export import META

    return (folder / "model.bin").is_file() and (folder / META).is_file()


def is_ctranslate2_checkpoint(folder: Path) -> bool:
    """An imported teacher converted for CTranslate2 (model/hf_translator.py: convert_for_serving)."""
    return (folder / "model.bin").is_file() and (folder / "hf" / "config.json").is_file()


def _open_imported(folder: Path, device: str = "cpu", threads: int | None = None) -> TextTranslator:
    from model.hf_checkpoint import UnsafeCheckpoint
    from model.hf_translator import HFTranslator

    try:
        return HFTranslator(folder / "checkpoint", device=device, threads=threads)
    except UnsafeCheckpoint as exc:  # no link, custom code, pickle or oversized config is ever opened
        raise UserInputError(str(exc)) from None


def _open_torch(folder: Path, device: str = "cpu", threads: int | None = None) -> TextTranslator:
    from model.torch_decoder import TorchTranslator
    from model.transformer import ModelConfigError

    try:
        return TorchTranslator.load(folder, device=device, threads=threads)
    except ModelConfigError as exc:
        raise UserInputError(str(exc)) from None


def _open_ctranslate2(
    folder: Path, device: str = "cpu", threads: int | None = None, compute_type: str = "default"
) -> TextTranslator:
    from model.ctranslate2_export import PeerTranslator

    return PeerTranslator(folder, device=device, threads=threads, compute_type=compute_type)


def is_optimum_folder(folder: Path) -> bool:
    """A checkpoint exported by Optimum (model/optimum_translator.py), opened only in the Optimum
    environment (pipeline/measure/optimum_peer.py)."""
    from model.optimum_translator import MARKER

    return (folder / MARKER).is_file() and any(folder.glob("*.onnx"))


def _open_optimum(folder: Path, device: str = "cpu", threads: int | None = None) -> TextTranslator:
    from model.optimum_translator import OptimumTranslator

    return OptimumTranslator(folder, device=device, threads=threads)


def _open_ctranslate2_checkpoint(
    folder: Path, device: str = "cpu", threads: int | None = None, compute_type: str = "default"
) -> TextTranslator:
    from model.hf_translator import ImportedCT2Translator

    return ImportedCT2Translator(folder / "hf", folder, device=device, threads=threads, compute_type=compute_type)


# The imported teacher before the PyTorch model: a checkpoint holds config.json too.
for _kind in (
    ModelKind("hf-import", is_imported_teacher, _open_imported, "hf_import.json + checkpoint/"),
    ModelKind("torch", is_torch_model, _open_torch, "model.safetensors + config.json"),
    ModelKind("ctranslate2", is_ctranslate2_model, _open_ctranslate2, "model.bin + pipeline.json"),
    ModelKind("ctranslate2-hf", is_ctranslate2_checkpoint, _open_ctranslate2_checkpoint, "model.bin + hf/config.json"),
    ModelKind("optimum", is_optimum_folder, _open_optimum, "optimum.json + *.onnx (Optimum's export)"),
):
    register(_kind)


def open_model(folder: Path, device: str = "cpu", threads: int | None = None, **options) -> TextTranslator:
    """open_translator (mt_runtime/registry.py) with its errors as the pipeline's: a folder of no
    known kind is bad input (exit 2); a package failing its checks (its files against
    package.json, or what they hold) a check that failed (exit 1), as `artifacts verify` on a
    damaged artifact."""
    try:
        return open_translator(folder, device=device, threads=threads, **options)
    except NotAModel as exc:
        raise UserInputError(str(exc)) from None
    except PackageError as exc:
        raise IntegrityError(str(exc)) from None
