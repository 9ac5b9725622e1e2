"""Open any model the pipeline makes as "a translator": text in, text out.

A translator has `translate(sentences, beam=, length_penalty=, batch_tokens=, on_batch=)`, plus
`runtime`. PyTorch models are artifact folders with model.safetensors; ONNX packages are folders
with package.json, encoder.onnx and decoder.onnx (see mt_runtime/translator.py).
"""

from __future__ import annotations

from pathlib import Path

from ..engine.errors import IntegrityError, UserInputError


def is_torch_model(folder: Path) -> bool:
    return (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()


def is_onnx_package(folder: Path) -> bool:
    """A folder with package.json is a package even with graphs missing: the runtime then says
    which file package.json lists that is not there."""
    return (folder / "package.json").is_file() or (
        (folder / "encoder.onnx").is_file() and (folder / "decoder.onnx").is_file()
    )


def is_imported_teacher(folder: Path) -> bool:
    return (folder / "hf_import.json").is_file() and (folder / "checkpoint").is_dir()


def load_translator(folder: Path, package: str | None = None, device: str = "cpu", threads: int | None = None):
    folder = Path(folder)
    if package:
        folder = folder / package
    if is_imported_teacher(folder):  # before is_torch_model: a checkpoint has config.json too
        from model.hf_checkpoint import UnsafeCheckpoint
        from model.hf_translator import HFTranslator

        try:
            return HFTranslator(folder / "checkpoint", device=device, threads=threads)
        except UnsafeCheckpoint as exc:  # no link, custom code, pickle or oversized config is ever opened
            raise UserInputError(str(exc)) from None
    if is_torch_model(folder):
        from model.torch_decoder import TorchTranslator
        from model.transformer import ModelConfigError

        try:
            return TorchTranslator.load(folder, device=device, threads=threads)
        except ModelConfigError as exc:
            raise UserInputError(str(exc)) from None
    if is_onnx_package(folder):
        from mt_runtime.translator import PackageError, Translator

        # A package failing its checks (its files against package.json, or what they hold) is a
        # check that failed, exit 1, as `artifacts verify` on a damaged artifact.
        try:
            return Translator(folder, device=device, threads=threads)
        except PackageError as exc:
            raise IntegrityError(str(exc)) from None
    raise UserInputError(
        f"{folder}: neither a PyTorch model (model.safetensors + config.json) "
        "nor an ONNX package (package.json, encoder.onnx + decoder.onnx)"
    )
