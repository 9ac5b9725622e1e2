"""What one test set can say about each BLEU difference the report shows: per step of the chain
(distillation, pruning, export, int8, the peer) and per row (greedy against beam), a paired
bootstrap interval beside what the step bought in speed and size."""

from __future__ import annotations

from ..measure.scoring import paired_bootstrap
from .table import ratio, teacher_row


def step_pairs(rows: list[dict]) -> list[tuple[str, dict, dict]]:
    """(step, from row, to row) along the recipe's chain, CPU rows only: distillation (teacher ->
    student), what it bought over the references (student_ref -> student), pruning (student, or the
    teacher without one -> pruned), ONNX export (a model in PyTorch -> its fp32 package), and each
    int8 variant (fp32 package -> int8 package of the same weights), and the peer (our package ->
    CTranslate2 on the same weights and compute type)."""
    measured = {r["name"]: r for r in rows if not r["skipped"] and r["device"] == "cpu"}
    pairs = [
        ("distillation", "teacher", "student"),
        ("distillation vs references only", "student_ref", "student"),
        ("head pruning", "student" if "student" in measured else "teacher", "pruned"),
    ]
    out = [(step, measured[a], measured[b]) for step, a, b in pairs if a in measured and b in measured]
    torch_rows = {r["source"]: r for r in measured.values() if r["runtime"] == "torch"}
    fp32_packages = {
        r["source"]: r for r in measured.values() if r["runtime"] == "onnxruntime" and r["compute_type"] == "float32"
    }
    for source, package in fp32_packages.items():
        if source in torch_rows:
            out.append(("ONNX export", torch_rows[source], package))
    for r in measured.values():
        if r["runtime"] == "onnxruntime" and r["compute_type"] == "int8" and r["source"] in fp32_packages:
            out.append((r["variant"].replace("_", " "), fp32_packages[r["source"]], r))
    for r in (r for r in measured.values() if r["runtime"] == "ctranslate2"):
        ours = next(
            (
                o
                for o in measured.values()
                if o["runtime"] == "onnxruntime"
                and o["compute_type"] == r["compute_type"]
                and o["source"] == r["source"]
            ),
            None,
        )
        if ours is not None:
            out.append((f"CTranslate2 instead of onnxruntime ({r['compute_type']})", ours, r))
    return out


def bleu_uncertainty(rows: list[dict], read) -> list[dict]:
    """What one test set can say about each BLEU difference the report shows (paired bootstrap,
    scoring.paired_bootstrap), written where the difference is: `vs_teacher` gains
    bleu_delta_ci95 / bleu_greedy_delta_ci95, each row `greedy_vs_beam` (its greedy BLEU minus its
    beam BLEU), and the returned steps say what each step of the chain cost in BLEU beside what it
    bought in speed and size. Rows without hypotheses get none."""
    done: dict[tuple, dict | None] = {}  # the student's distance from the teacher is also a step

    def compare(a: dict, b: dict, beam_a: int | None, beam_b: int | None) -> dict | None:
        if beam_a is None or beam_b is None:
            return None
        key = (a["name"], beam_a, b["name"], beam_b)
        if key not in done:
            ha, hb = read(a["name"], beam_a), read(b["name"], beam_b)
            done[key] = None if ha is None or hb is None or ha[1] != hb[1] else paired_bootstrap(ha[0], hb[0], ha[1])
        return done[key]

    teacher = teacher_row(rows)
    for row in rows:
        row["greedy_vs_beam"] = None
        if row["skipped"]:
            continue
        beam = row.get("bleu_beam")
        if row.get("bleu_greedy") is not None and beam not in (None, 1):
            row["greedy_vs_beam"] = compare(row, row, 1, beam)
        if teacher is not None and row.get("vs_teacher") is not None and row is not teacher:
            t_beam = teacher.get("bleu_beam")
            row["vs_teacher"]["bleu_delta_ci95"] = _ci(compare(row, teacher, beam, t_beam if t_beam == beam else None))
            row["vs_teacher"]["bleu_greedy_delta_ci95"] = _ci(compare(row, teacher, 1, 1))
    steps = []
    for step, a, b in step_pairs(rows):
        beam = b.get("bleu_beam") if b.get("bleu_beam") == a.get("bleu_beam") else None
        la, lb = a.get("latency_ms") or {}, b.get("latency_ms") or {}
        steps.append(
            {
                "step": step,
                "from": a["name"],
                "to": b["name"],
                "beam": beam,
                "bleu": compare(b, a, beam, beam),
                "bleu_greedy": compare(b, a, 1, 1),
                "greedy_b1_speedup": ratio(
                    (la.get("greedy_b1") or {}).get("mean"), (lb.get("greedy_b1") or {}).get("mean")
                ),
                "beam4_b1_speedup": ratio(
                    (la.get("beam4_b1") or {}).get("mean"), (lb.get("beam4_b1") or {}).get("mean")
                ),
                "bytes_ratio": ratio(b.get("bytes"), a.get("bytes")),
                "params_ratio": ratio(b.get("params"), a.get("params")),
            }
        )
    return steps


def _ci(result: dict | None) -> list[float] | None:
    return None if result is None else result["ci95"]
