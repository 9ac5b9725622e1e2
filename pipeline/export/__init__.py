"""From a PyTorch model to shipped ONNX packages: the float graphs, the package folder and its
card."""
