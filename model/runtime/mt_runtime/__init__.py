"""mt-runtime: translate with an mt-onnx-package (docs/package-format.md) using onnxruntime,
tokenizers and NumPy only, never torch.

    from mt_runtime import Translator
    Translator("path/to/package").translate(["A man is riding a bicycle."], beam=4)

`open_translator(folder)` opens any registered kind of model folder (mt_runtime/registry.py: an
ONNX package here; the pipeline registers its own kinds) as a TextTranslator.

`mt-runtime serve PACKAGE` serves one over HTTP (the `serve` extra). The names below load on first
use, so that `mt_runtime.layout` (the format's constants, standard library only) stays light.
"""

from __future__ import annotations

from ._version import __version__

__all__ = ["Translator", "PackageError", "verify_package", "open_translator", "TextTranslator", "__version__"]


def __getattr__(name: str):
    if name in ("Translator", "PackageError", "verify_package"):
        from . import translator

        return getattr(translator, name)
    if name in ("open_translator", "TextTranslator"):
        from . import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'mt_runtime' has no attribute {name!r}")
