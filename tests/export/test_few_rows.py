"""Wide int8 products of the search op's decoder as MatMulInteger + Cast + Mul (few_rows.py): the
same numbers to the bit as MatMulIntegerToFloat, at any row count; only where the activation
scale is a constant and the product wide."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from model.onnx_passes.few_rows import MIN_COLUMNS, wide_products_as_integer


def _graph(fixed_scale: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    k, wide, narrow = 64, MIN_COLUMNS + 76, 96
    inits = [
        numpy_helper.from_array(rng.integers(-127, 128, (k, wide), dtype=np.int8), "w_wide"),
        numpy_helper.from_array(rng.integers(-127, 128, (k, narrow), dtype=np.int8), "w_narrow"),
        numpy_helper.from_array((rng.random(wide) * 0.01 + 1e-3).astype(np.float32), "s_wide"),
        numpy_helper.from_array((rng.random(narrow) * 0.01 + 1e-3).astype(np.float32), "s_narrow"),
        numpy_helper.from_array(rng.standard_normal(wide).astype(np.float32), "bias"),
        numpy_helper.from_array(np.array(128, dtype=np.uint8), "zero"),
    ]
    inputs = [helper.make_tensor_value_info("a", TensorProto.UINT8, ["rows", k])]
    if fixed_scale:
        inits.append(numpy_helper.from_array(np.array(0.0213, dtype=np.float32), "a_scale"))
    else:
        inputs.append(helper.make_tensor_value_info("a_scale", TensorProto.FLOAT, []))
    nodes = [
        helper.make_node(
            "MatMulIntegerToFloat",
            ["a", "w_wide", "a_scale", "s_wide", "zero", "", "bias"],
            ["y_wide"],
            domain="com.microsoft",
        ),
        helper.make_node(
            "MatMulIntegerToFloat",
            ["a", "w_narrow", "a_scale", "s_narrow", "zero"],
            ["y_narrow"],
            domain="com.microsoft",
        ),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y_wide", "y_narrow")]
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def _run(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


@pytest.mark.parametrize("rows", [1, 4, 32])
def test_wide_products_become_integer_ones_with_the_same_numbers(rows):
    fused = _graph()
    split = _graph()
    assert wide_products_as_integer(split.graph) == 1  # the wide product, its bias after the scale
    ops = [n.op_type for n in split.graph.node]
    assert ops == ["MatMulInteger", "Cast", "Mul", "Mul", "Add", "MatMulIntegerToFloat"]
    a = np.random.default_rng(rows).integers(0, 256, (rows, 64), dtype=np.uint8)
    for want, got in zip(_run(fused, {"a": a}), _run(split, {"a": a})):
        assert want.dtype == got.dtype and np.array_equal(want, got)


def test_a_scale_computed_per_call_keeps_the_fused_op():
    model = _graph(fixed_scale=False)
    assert wide_products_as_integer(model.graph, always={"y_narrow"}) == 0
    assert [n.op_type for n in model.graph.node] == ["MatMulIntegerToFloat"] * 2


def test_the_output_projection_is_taken_whatever_its_width():
    model = _graph()
    assert wide_products_as_integer(model.graph, always={"y_narrow"}) == 2
