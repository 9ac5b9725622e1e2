"""mt-runtime: translate with an mt-onnx-package (docs/package-format.md) using onnxruntime,
tokenizers and NumPy only, never torch.

    from mt_runtime import Translator
    Translator("path/to/package").translate(["A man is riding a bicycle."], beam=4)

`mt-runtime serve PACKAGE` serves one over HTTP (the `serve` extra). The names below load on first
use, so that `mt_runtime.layout` (the format's constants, standard library only) stays light.
"""

from __future__ import annotations

from ._version import __version__

__all__ = ["Translator", "PackageError", "verify_package", "__version__"]


def __getattr__(name: str):
    if name in ("Translator", "PackageError", "verify_package"):
        from . import translator

        return getattr(translator, name)
    raise AttributeError(f"module 'mt_runtime' has no attribute {name!r}")
