"""Each graph a package holds, checked against the format's layout (mt_runtime/layout.py) as soon as
onnxruntime has opened it, before anything is fed to it.

The runtime feeds a graph by the layout's names and reads its outputs by position (`log_probs`
first, then the caches): a graph whose input was renamed, retyped or dropped would otherwise
fail at the first sentence with onnxruntime's own message, which names neither the file nor the
input. So every input and output is compared with the layout: the same names (one per decoder
layer for `_i`, the layer count taken from the encoder's outputs), the layout's element type
("float" is float32 or float16) and number of dimensions, a fixed size where the layout fixes
one, and the layout's first output first; a difference is one PackageError line naming the file
and the tensor. Inputs only some packages have (the layout's `where`, and LATER_INPUTS) may be
absent.

Shipped inside every package (mt_runtime/): the standard library and this package only.
"""

from __future__ import annotations

from pathlib import Path

from .files import PackageError
from .layout import BY_FILE, ENCODER, FORMAT, LATER_INPUTS, Tensor, cross_k

_SPEC = "docs/package-format.md"


def decoder_layers(encoder_outputs: list, graph: Path) -> int:
    """The decoder layers a package has: the encoder's cross_k_0, cross_k_1, ... outputs."""
    names = {output.name for output in encoder_outputs}
    layers = 0
    while cross_k(layers) in names:
        layers += 1
    if not layers:
        raise PackageError(f"{graph}: has no output {cross_k(0)!r}; not a {FORMAT} {ENCODER} ({_SPEC})")
    return layers


def check_graph(path: Path, inputs: list, outputs: list, layers: int) -> None:
    """A graph's inputs and outputs (onnxruntime's NodeArgs: name, type, shape) against the layout
    of the graph file named like `path`, for a package of `layers` decoder layers."""
    graph = BY_FILE[path.name]
    optional = set(LATER_INPUTS.get(graph.file, ()))
    for side, declared, found in (("input", graph.inputs, inputs), ("output", graph.outputs, outputs)):
        expected: dict[str, Tensor] = {name: tensor for tensor in declared for name in tensor.names(layers)}
        have = {arg.name: arg for arg in found}
        unknown = [name for name in have if name not in expected]
        for name, tensor in expected.items():
            if name not in have and not tensor.where and name not in optional:
                instead = f" (it has {', '.join(map(repr, unknown))} instead)" if unknown else ""
                raise PackageError(f"{path}: has no {side} {name!r}{instead}; not a {FORMAT} graph ({_SPEC})")
        if unknown:
            names = ", ".join(t.name for t in declared)
            raise PackageError(
                f"{path}: {side} {unknown[0]!r} is not one of {graph.file}'s in {FORMAT} ({names}; {_SPEC})"
            )
        for name, arg in have.items():
            problem = _problem(arg, expected[name])
            if problem:
                raise PackageError(f"{path}: {side} {name!r} {problem}, where {FORMAT} has {_show(expected[name])}")
        first = declared[0].names(layers)[0]
        if side == "output" and found[0].name != first:
            raise PackageError(f"{path}: its first output is {found[0].name!r}, where {FORMAT} has {first!r} ({_SPEC})")


def _problem(arg, tensor: Tensor) -> str | None:
    allowed = ("tensor(float)", "tensor(float16)") if tensor.dtype == "float" else (f"tensor({tensor.dtype})",)
    if arg.type not in allowed:
        return f"is {arg.type}"
    shape = arg.shape
    if shape is None:  # unknown rank: onnxruntime checks what is fed
        return None
    if len(shape) != len(tensor.shape):
        return f"has {len(shape)} dimensions {list(shape)}"
    for dim, declared in zip(shape, tensor.shape):
        if declared.isdigit() and isinstance(dim, int) and dim != int(declared):
            return f"has shape {list(shape)}"
    return None


def _show(tensor: Tensor) -> str:
    return ("float or float16" if tensor.dtype == "float" else tensor.dtype) + f" [{', '.join(tensor.shape)}]"
