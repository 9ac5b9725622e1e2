"""What every runtime's translator is (the TextTranslator protocol), and the one place that opens
a model folder as one: `open_translator(path, device=, threads=, ...)`.

A model kind is registered once, with what a folder of that kind holds and how to open it (as
CTranslate2 registers its converters). mt-runtime registers the kind it runs itself, an ONNX
package (mt_runtime/translator.py); the pipeline registers its own kinds (a PyTorch model
folder, a CTranslate2 folder, an imported Hugging Face checkpoint) when
pipeline/measure/translators.py is imported, so that this module, like the rest of mt-runtime,
imports no torch. Standard library only: the openers import their runtime when called.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence, runtime_checkable

from .layout import DECODER, ENCODER, PACKAGE_JSON


@runtime_checkable
class TextTranslator(Protocol):
    """Text in, text out. `runtime` names the engine ("onnxruntime", "torch", "ctranslate2",
    "transformers"), `device` where it runs ("cpu", "cuda"); describe() says how it runs, as
    plain data (at least "runtime", "device" and "threads"; ONNX packages add their search paths,
    providers and shortlist). (Not named Translator: that is the ONNX package's class, the name
    every package's card tells its users to import.)"""

    runtime: str
    device: str

    def translate(
        self,
        sentences: Sequence[str],
        beam: int = 4,
        length_penalty: float = 1.0,
        batch_tokens: int = 4000,
        max_batch: int = 256,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[str]: ...

    def describe(self) -> dict: ...


@dataclass(frozen=True)
class ModelKind:
    """A kind of model folder: `holds(folder)` says whether a folder is one (from the names of
    its files alone, nothing opened), `open(folder, device, threads, **options)` opens it, and
    `looks_like` says what such a folder holds, for the error that names the kinds."""

    name: str
    holds: Callable[[Path], bool]
    open: Callable[..., TextTranslator]
    looks_like: str


class NotAModel(ValueError):
    """A folder of no registered kind."""


_KINDS: dict[str, ModelKind] = {}


def register(kind: ModelKind) -> None:
    """Add a kind (again under the same name: replace it). Folders are matched in the order the
    kinds were registered, the first that holds the folder wins: a kind whose folders also hold
    another's files (an imported checkpoint has config.json) says so in its own `holds`."""
    _KINDS[kind.name] = kind


def kinds() -> list[ModelKind]:
    return list(_KINDS.values())


def kind_of(folder: str | Path) -> ModelKind | None:
    folder = Path(folder)
    return next((kind for kind in _KINDS.values() if kind.holds(folder)), None)


def open_translator(path: str | Path, device: str = "cpu", threads: int | None = None, **options) -> TextTranslator:
    """The translator of a model folder, whichever kind it is; `options` go to the kind's opener
    (an ONNX package's `search` and `shortlist`, a CTranslate2 folder's `compute_type`). Raises
    NotAModel, one line naming the folder and the kinds, for a folder of no known kind; a
    package that fails its checks raises PackageError (mt_runtime/files.py)."""
    folder = Path(path)
    kind = kind_of(folder)
    if kind is None:
        known = "; ".join(f"{k.name} ({k.looks_like})" for k in _KINDS.values())
        raise NotAModel(f"{folder}: not a model folder of any known kind: {known}")
    return kind.open(folder, device=device, threads=threads, **options)


def is_onnx_package(folder: Path) -> bool:
    """A folder with package.json is a package even with graphs missing: the runtime then says
    which file package.json lists that is not there."""
    return (folder / PACKAGE_JSON).is_file() or ((folder / ENCODER).is_file() and (folder / DECODER).is_file())


def _open_package(folder: Path, device: str = "cpu", threads: int | None = None, **options) -> TextTranslator:
    from .translator import Translator

    return Translator(folder, device=device, threads=threads, **options)


register(ModelKind("onnx-package", is_onnx_package, _open_package, "package.json, encoder.onnx + decoder.onnx"))
