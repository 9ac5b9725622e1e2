"""ONNX export, quantization, the package builder and format, the CTranslate2 peer."""
