"""What both int8 forms share: onnxruntime's quantizer kept quiet, the stored zero point of
uint8 rows, the contrib opset, and the graphs' bytes."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import onnx

ROW_ZERO_POINT = 128  # a row's int8 values are stored as uint8 + 128: onnxruntime's fast products take uint8

# Tensors next to the fused contrib ops (SkipLayerNormalization) have no inferred type in ONNX's
# shape inference; everything float in these graphs is float32.
FLOAT_DEFAULT = {"DefaultTensorType": onnx.TensorProto.FLOAT}


class Quiet:
    """onnxruntime.quantization logs (and its calibrators print) a line per step and warns
    about contrib ops it cannot shape-infer; keep the stage's output readable."""

    def __enter__(self):
        self.root = logging.getLogger()
        self.level = self.root.level
        self.root.setLevel(logging.ERROR)
        self.stdout = contextlib.redirect_stdout(io.StringIO())
        self.stdout.__enter__()

    def __exit__(self, *exc):
        self.stdout.__exit__(*exc)
        self.root.setLevel(self.level)


def onnx_bytes(paths: dict[str, Path]) -> int:
    return sum(Path(p).stat().st_size for p in paths.values())


def import_contrib_ops(proto: onnx.ModelProto) -> None:
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
