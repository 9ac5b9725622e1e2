"""8-bit quantization of the exported graphs, in two forms that both run every product as
onnxruntime's MatMulIntegerToFloat (exact int32 products, then scaled), so that a sentence's
translation does not depend on its batch:

- int8 per row (rows.py, quantize_rows; the int8_dynamic package): int8 weights per output
  column, each row of a product's input (a token) quantized at run time by its own scale;
  no calibration.
- int8 static (static.py, quantize_static; the int8_static package): onnxruntime's QDQ
  quantizer calibrates one fixed scale per product input on recorded decoding
  (calibration.py: min-max, entropy or percentile), symmetric int8 weights and activations;
  the QDQ pairs are then rewritten into the same integer products.

Only the weight matrices are quantized (the MatMuls whose second input is a weight, and the
embedding tables); attention scores, softmax, LayerNorm and the residual adds stay in float.
The weights are split into named groups (groups.py: embeddings, output projection, each layer's
attention and FFN) so that an accuracy guard can keep the most sensitive groups in float. The
tied token table is stored once, in int8, for both graphs where it can be (token_table.py).
"""

from .calibration import RecordingDecoder, calibration_feeds
from .common import ROW_ZERO_POINT, onnx_bytes
from .groups import GRAPHS, group_of, node_groups, nodes_for, weight_nodes
from .rows import quantize_rows, rows_int8_products
from .static import FeedReader, quantize_static, static_int8_products
from .token_table import TABLE, retie_quantized_embedding, share_token_table

__all__ = [
    "GRAPHS",
    "ROW_ZERO_POINT",
    "TABLE",
    "FeedReader",
    "RecordingDecoder",
    "calibration_feeds",
    "group_of",
    "node_groups",
    "nodes_for",
    "onnx_bytes",
    "quantize_rows",
    "quantize_static",
    "retie_quantized_embedding",
    "rows_int8_products",
    "share_token_table",
    "static_int8_products",
    "weight_nodes",
]
