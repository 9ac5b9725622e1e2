"""int8 packages held to a BLEU guard: the guard (guard.py: each candidate written and opened as
it ships, scored on validation sentences; the search for the groups to keep in float), the
batch-1 latency of a package against fp32 (latency.py), and what a package's card says about its
precision (card.py). The graphs themselves are model/onnx_quantize/'s; the stage
(pipeline/stages/quantize/build.py) wires these together."""
