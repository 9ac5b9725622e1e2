"""The decoder's self-attention cache: rows that continue their own need no reorder."""

from __future__ import annotations

import onnx
from mt_runtime.layout import CACHE_INDEX

from .edit import rename


def drop_cache_reorder(g: onnx.GraphProto) -> None:
    """Remove the Gathers by cache_index: each row's past_* is then its own row's."""
    for node in [n for n in g.node if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == CACHE_INDEX]:
        g.node.remove(node)
        rename(g, node.output[0], node.input[0])
