"""A package's batch-1 greedy latency against the fp32 package's, for the quantize stage's card."""

from __future__ import annotations

from pathlib import Path

from ..measure.timing import interleaved
from ..measure.translators import open_model


def latency_vs_fp32(fp32_package: Path, package: Path, sentences: list[str], variant: str, progress) -> dict:
    """Batch-1 greedy, text to text, on one thread: the fp32 package and the variant's, each as a
    user opens it (the registry: mt_runtime/registry.py), interleaved sentence by sentence so that
    machine load hits both. `progress(label, total=, unit=)`: a context giving a bar."""
    translators = {"fp32": open_model(fp32_package, threads=1), variant: open_model(package, threads=1)}
    sentences = [s for s in sentences if s.strip()]
    contestants = {
        name: (lambda sentence, t=t: t.translate([sentence], beam=1, max_batch=1)) for name, t in translators.items()
    }
    with progress(f"{variant} batch-1 latency", total=len(sentences), unit="sentences") as bar:
        timed = interleaved(contestants, sentences, on_item=bar.advance)
    return {
        "latency_ms_fp32": timed.median_ms("fp32", 2),
        "latency_ms": timed.median_ms(variant, 2),
        "latency_ratio": timed.ratio(variant, "fp32"),
        "latency_threads": 1,
        "latency_sentences": len(sentences),
        "latency_search": translators[variant].describe()["search"],
    }
