"""The translations behind a report's rows, for BLEU's uncertainty: each row's hypotheses and the
references they are scored against, read back from the artifacts that made them."""

from __future__ import annotations

from pathlib import Path

from ..corpora.splits import misaligned, read_split
from ..engine.store import Artifact


def hypotheses_reader(data: Artifact | None, benchmark: Artifact | None, evaluations: dict[str, Artifact], bench: dict):
    """(row name, beam) -> (hypotheses, references), or None, given a report's inputs (the data,
    the benchmark and each variant's evaluation): from the row's evaluate artifact, or for the
    rows the benchmark scored itself (CTranslate2's), from the benchmark artifact (whose metrics
    are `bench`)."""
    scored_by_benchmark = {
        r["name"]: (benchmark.path / r["hypotheses"], bench.get("test_set"))
        for r in bench.get("results", [])
        if r.get("hypotheses") and benchmark is not None
    }
    references: dict[str, list[str]] = {}
    cache: dict[tuple[str, int], tuple[list[str], list[str]] | None] = {}

    def read(name: str, beam: int) -> tuple[list[str], list[str]] | None:
        if (name, beam) not in cache:  # each file is asked for by several comparisons
            cache[name, beam] = _read(name, beam)
        return cache[name, beam]

    def _read(name: str, beam: int) -> tuple[list[str], list[str]] | None:
        if name in scored_by_benchmark:
            folder, test = scored_by_benchmark[name]
        else:
            art = evaluations.get(name.removesuffix("_cuda"))
            if art is None:
                return None
            folder, test = art.path, art.metrics.get("test_set")
        path: Path = folder / f"{test}.beam{beam}.hyp"
        if data is None or not path.is_file():
            return None
        if test not in references:
            references[test] = read_split(data.path, f"test.{test}")[1]
        hypotheses = path.read_text(encoding="utf-8").split("\n")[:-1]
        if len(hypotheses) != len(references[test]):
            raise misaligned(path, len(hypotheses), data.path / f"test.{test}.tgt", len(references[test]))
        return hypotheses, references[test]

    return read
