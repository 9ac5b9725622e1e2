"""The search op's decoder runs one row (greedy) or a beam's few: there, a wide int8 product is
faster as MatMulInteger, Cast and a Mul by the combined scale than as MatMulIntegerToFloat.

onnxruntime 1.31's MatMulIntegerToFloat scales each output of a product with few rows slowly; the
int32 products are the same. Measured alone, one thread, 2-core AMD EPYC (avx512_vnni), us a call,
one row / four rows: [128 x 8000] 28.1 / 31.4 against 17.6 / 23.1; [512 x 32000] 231.7 / 285.9
against 197.5 / 231.2; [512 x 2048] 18.2 / 19.6 against 16.0 / 17.9; up to 512 columns it gains
nothing (4.1 against 4.5 at [128 x 128]), and at 32 rows it loses ([128 x 8000] 109.9 against
121.7), so the step graphs for many rows keep the fused op. The numbers are the same to the bit:
the int32 sums are exact either way, the Cast is the kernel's conversion, and the scale it
multiplies by is the same float product a_scale x b_scale (here a constant, folded when the
session loads), bias added after as the kernel adds it (checked on every width above, with and
without a bias). That holds on any x86 CPU, not only the one measured: the kernel's output step
(MLAS's MLAS_QGEMM_SCALE_BIAS_OUTPUT_PROCESSOR) is the same portable code whatever the instruction
set, a multiply then an add, no fused multiply-add. Only where a_scale is a constant: a per-row
scale (int8_dynamic) would turn one rounding into two.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from .edit import computed_from_constants, replace_node

MIN_COLUMNS = 1024  # below this the fused op is as fast (see above)


def wide_products_as_integer(g: onnx.GraphProto, always: set[str] = frozenset()) -> int:
    """Every MatMulIntegerToFloat of g with a constant activation scale whose weight initializer
    has MIN_COLUMNS columns or more, or whose output is in `always` (the output projection,
    whose weight is computed from the token table), as MatMulInteger + Cast + Mul (+ Add of its
    bias). Returns how many."""
    initializers = {t.name: t for t in g.initializer}
    done = 0
    for node in [n for n in g.node if n.op_type == "MatMulIntegerToFloat" and n.domain == "com.microsoft"]:
        a, b, a_scale, b_scale, a_zero, b_zero, bias = (list(node.input) + [""] * 7)[:7]
        weight = initializers.get(b)
        wide = node.output[0] in always or (weight is not None and weight.dims[-1] >= MIN_COLUMNS)
        if not wide or not computed_from_constants(g, [a_scale, b_scale, a_zero, b_zero, bias]):
            continue
        p = node.name or node.output[0]
        zeros = [a_zero, b_zero] if b_zero else ([a_zero] if a_zero else [])
        nodes = [
            helper.make_node("MatMulInteger", [a, b, *zeros], [f"{p}/int32"], name=f"{p}/integer"),
            helper.make_node("Cast", [f"{p}/int32"], [f"{p}/float"], to=TensorProto.FLOAT, name=f"{p}/cast"),
            helper.make_node("Mul", [a_scale, b_scale], [f"{p}/scale"], name=f"{p}/scale"),
            helper.make_node(
                "Mul", [f"{p}/float", f"{p}/scale"], [node.output[0] if not bias else f"{p}/scaled"], name=f"{p}/mul"
            ),
        ]
        if bias:
            nodes.append(helper.make_node("Add", [f"{p}/scaled", bias], [node.output[0]], name=f"{p}/bias"))
        replace_node(g, node, nodes)
        done += 1
    return done


def logits_product(g: onnx.GraphProto) -> set[str]:
    """The output of the product that makes g's first output (the search op's logits), through
    the Unsqueeze that gives them the op's shape: {name}, or none."""
    producer = {o: n for n in g.node for o in n.output}
    name = g.output[0].name
    while name in producer and producer[name].op_type in ("Unsqueeze", "Reshape"):
        name = producer[name].input[0]
    node = producer.get(name)
    return {name} if node is not None and node.op_type == "MatMulIntegerToFloat" else set()
