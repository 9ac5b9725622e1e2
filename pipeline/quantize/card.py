"""What an int8 package's card and package.json say about it: its precision, the kernel, the
groups kept in float, the calibration; and the figures the guard measured."""

from __future__ import annotations

PRECISION = {
    "int8_dynamic": "int8 weights per output column, activations quantized per row (per token) at run time, "
    "exact int32 products (MatMulIntegerToFloat): a sentence's translation does not depend on "
    "its batch; for CPUs",
    "int8_static": "int8 QDQ (symmetric weights and activations, calibrated); for TensorRT and other int8 runtimes",
}


def package_about(fp32_package: dict, variant: str, float_groups: list[str], calibration: dict | None) -> dict:
    """What the int8 package says it is: the fp32 package's description, and its own precision."""
    keep = ("title", "description", "source_artifact", "src_lang", "tgt_lang", "model", "onnxruntime")
    about = {k: fp32_package[k] for k in keep if k in fp32_package}
    precision = PRECISION[variant]
    if variant == "int8_dynamic":
        about["kernel"] = {
            "op": "com.microsoft.MatMulIntegerToFloat",
            "weights": "int8 per output column",
            "activations": "int8 per row, scale max|x| / 127, stored + 128",
        }
    about.update(variant=variant, precision=precision, float_groups=float_groups)
    if variant == "int8_static" and calibration:
        about["calibration"] = calibration
    return about


def package_figures(report: dict, fp32_bleu: float, n_guard: int) -> dict:
    """The guard's and the latency check's numbers, as the card shows them."""
    figures = {
        f"validation BLEU ({n_guard} sentences)": f"{report['bleu']:.2f} (fp32 package: {fp32_bleu:.2f})",
        "weight groups kept in float": ", ".join(report["float_groups"]) or "none",
        "ONNX bytes vs fp32": f"{report['bytes_ratio']:.0%}",
    }
    if "latency_ratio" in report:
        figures["CPU batch-1 greedy latency vs fp32 (1 thread)"] = (
            f"{report['latency_ms']} ms vs {report['latency_ms_fp32']} ms per sentence ({report['latency_ratio']}x)"
        )
    return figures
