"""Which rows are worth a look: the Pareto front of BLEU against batch-1 latency (per device), and
the recommendation, the fastest row within a BLEU budget of the teacher."""

from __future__ import annotations

from .table import ratio, teacher_row


def points(rows: list[dict], mode: str) -> list[tuple[int, float, float]]:
    """(row index, latency p50 ms, BLEU) of measured rows with a BLEU. Greedy latency pairs with
    greedy BLEU, beam-4 latency with the main BLEU (the evaluate stage's beam)."""
    key, bleu_key = ("greedy_b1", "bleu_greedy") if mode == "greedy" else ("beam4_b1", "bleu")
    out = []
    for i, r in enumerate(rows):
        bleu = r.get(bleu_key)
        if r["skipped"] or not r.get("latency_ms") or bleu is None:
            continue
        out.append((i, r["latency_ms"][key]["p50"], bleu))
    return out


def pareto_front(pts: list[tuple[float, float]]) -> list[bool]:
    """For (latency, bleu) points: True where no other point is at least as fast and at least
    as good, and strictly better in one of the two."""
    flags = []
    for i, (x, y) in enumerate(pts):
        dominated = any(x2 <= x and y2 >= y and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(pts) if j != i)
        flags.append(not dominated)
    return flags


def mark_pareto(rows: list[dict]) -> None:
    """`pareto` (greedy latency vs greedy BLEU) and `pareto_beam4`, within each device: a GPU row
    does not push CPU rows off the front, since a user picks a device first."""
    for row in rows:
        row["pareto"], row["pareto_beam4"] = False, False
    for mode, flag in (("greedy", "pareto"), ("beam4", "pareto_beam4")):
        pts = points(rows, mode)
        for device in {rows[i]["device"] for i, _, _ in pts}:
            mine = [(i, x, y) for i, x, y in pts if rows[i]["device"] == device]
            for (i, _, _), on in zip(mine, pareto_front([(x, y) for _, x, y in mine])):
                rows[i][flag] = on


def label(row: dict) -> str:
    extra = "" if row["device"] == "cpu" else f", {row['device']}"
    return f"{row['variant']} ({row['runtime']} {row['compute_type']}{extra})"


def recommend(rows: list[dict], mode: str, max_loss: float, device: str = "cpu") -> str:
    """The fastest row on `device` whose BLEU is within `max_loss` of the teacher's (same decoding).
    Speed and size are compared with the teacher in PyTorch on the CPU."""
    t = teacher_row(rows)
    bleu_key, lat_key = ("bleu_greedy", "greedy_b1") if mode == "greedy" else ("bleu", "beam4_b1")
    what = f"batch-1 {'greedy' if mode == 'greedy' else 'beam 4'}, {device.upper()}"
    if t is None or t.get(bleu_key) is None:
        return f"no recommendation ({what}): the teacher has no measured row with a BLEU to compare against"
    ok = [
        r
        for r in rows
        if not r["skipped"]
        and r["device"] == device
        and r.get(bleu_key) is not None
        and r.get("latency_ms")
        and r[bleu_key] >= t[bleu_key] - max_loss
    ]
    if not ok:
        return f"no recommendation ({what}): no measured row within {max_loss:g} BLEU of the teacher"
    best = min(ok, key=lambda r: r["latency_ms"][lat_key]["p50"])
    speed = ratio(t["latency_ms"][lat_key]["mean"], best["latency_ms"][lat_key]["mean"])
    size = ratio(best.get("bytes"), t.get("bytes"))
    return (
        f"fastest variant within {max_loss:g} BLEU of the teacher ({what}): {label(best)}, "
        f"{best['threads']} thread(s): p50 {best['latency_ms'][lat_key]['p50']:.1f} ms, "
        f"{speed:.2f}x the teacher's sentences/s, BLEU {best[bleu_key]:.2f} vs {t[bleu_key]:.2f}"
        + (f", {size:.3f} of its bytes" if size is not None else "")
    )
