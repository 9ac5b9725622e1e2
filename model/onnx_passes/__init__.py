"""ONNX graph passes: each edits a graph for one job and checks what it expects of its input."""
