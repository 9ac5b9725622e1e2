"""The recipe's targets, measured: each int8 package against the teacher (speed, BLEU, bytes) and
against CTranslate2 int8 (paired rounds, one process and each alone, each side at its best
thread count), with the verdicts the report states."""

from __future__ import annotations

from typing import Protocol

from .table import ratio, teacher_row


class Goals(Protocol):
    """What the recipe's `report.targets` holds each int8 student to (ReportTargets)."""

    speedup: float
    bleu_delta: float
    bytes_ratio: float


def targets(rows: list[dict], goals: Goals) -> dict:
    """The recipe's targets, measured: int8 (pruned) student in onnxruntime vs the teacher in
    PyTorch, and vs CTranslate2 int8 at batch 1 (ours / theirs, lower is better for us)."""
    out = {}
    t = teacher_row(rows)
    peer = next(
        (
            r
            for r in rows
            if r["runtime"] == "ctranslate2"
            and r["compute_type"] == "int8"
            and r["device"] == "cpu"
            and not r["skipped"]
            and r.get("source") != "teacher"
        ),
        None,
    )
    for r in rows:
        if r["runtime"] != "onnxruntime" or r["compute_type"] != "int8" or r["skipped"]:
            continue
        vs = r.get("vs_teacher") or {}
        entry = {
            "greedy_b1_speedup": vs.get("greedy_b1_speedup"),
            "speedup_target": goals.speedup,
            "bleu_delta": vs.get("bleu_delta"),
            "bleu_delta_target": goals.bleu_delta,
            "bytes_ratio": vs.get("bytes_ratio"),
            "bytes_ratio_target": goals.bytes_ratio,
        }
        if t is None:
            entry["note"] = "no teacher row to compare against"
        if peer is not None:
            ours, theirs = r["latency_ms"], peer["latency_ms"]
            entry["vs_ctranslate2_int8"] = {
                "greedy_b1_p50_ratio": ratio(ours["greedy_b1"]["p50"], theirs["greedy_b1"]["p50"]),
                "beam4_b1_p50_ratio": ratio(ours["beam4_b1"]["p50"], theirs["beam4_b1"]["p50"]),
                "goal": "<= 1.0 (ours no slower)",
                "peer_variant": peer["variant"],
                "same_weights": peer.get("source") == r.get("source"),
                "ours_breakdown": r.get("breakdown"),
            }
            paired = r.get("paired")
            if paired and paired["peer"] == peer["name"]:
                entry["vs_ctranslate2_int8"]["paired"] = {
                    k: paired[k] for k in ("greedy_b1_p50_ratio", "beam4_b1_p50_ratio", "threads")
                }
                entry["vs_ctranslate2_int8"]["paired"]["rounds"] = len(paired["rounds"])
            entry["vs_ctranslate2_int8"]["verdict"] = peer_verdict(entry["vs_ctranslate2_int8"])
        if r.get("versus"):
            entry["vs_ctranslate2_one_process"] = versus_summary(r["versus"])
        out[r["name"]] = entry
    return out


def versus_summary(versus: dict) -> dict:
    """The comparison's verdict. `met`: ours at least as fast as CTranslate2 (throughput ours /
    theirs >= 1) at every point with each side at its own best thread count, both taking turns in
    one process and each alone in a process of its own (None where either was not measured, or
    left a point out, and none fell short). `points`, `ours_faster` and `lowest_ratio` count the
    one-process points at the same thread count on both sides (`same_threads_met`: all won); on a
    machine where one side is slow at some count, those flatter the other."""
    points = [{"threads": int(n), **p} for n, result in versus["by_threads"].items() for p in result.get("points", [])]
    won = sum(1 for p in points if p["met"])
    expected = len({(p["batch"], p["beam"]) for p in points})
    best = versus.get("best") or {}
    out = {
        "peer": versus["peer"],
        "points": len(points),
        "ours_faster": won,
        "same_threads_met": None if not points else won == len(points),
        "lowest_ratio": min((p["ratio"] for p in points if p["ratio"] is not None), default=None),
        "separate_rounds": (versus.get("separate") or {}).get("rounds"),
    }
    for how in ("interleaved", "separate"):
        mine = best.get(how) or []
        lowest = min((p for p in mine if p["ratio"] is not None), key=lambda p: p["ratio"], default=None)
        met = False if any(p["met"] is False for p in mine) else True if mine and len(mine) == expected else None
        out[f"best_{how}"] = {
            "points": len(mine),
            "ours_faster": sum(1 for p in mine if p["met"]),
            "met": met,
            "lowest_ratio": lowest and lowest["ratio"],
            "lowest_point": lowest and lowest["verdict"].partition(":")[0],
            "ctranslate2_threads": sorted({p["ctranslate2_threads"] for p in mine}),
            "ours_threads": sorted({p["ours_threads"] for p in mine}),
        }
    verdicts = [out["best_interleaved"]["met"], out["best_separate"]["met"]]
    out["met"] = False if False in verdicts else None if None in verdicts else True
    out["goal"] = (
        ">= 1.0 at every point, each side at its own best thread count, taking turns in one process "
        "and each alone in its own"
    )
    return out


def peer_verdict(peer: dict) -> dict:
    """Which ratios decide the goal: the paired rounds where there are some (ours and theirs
    timed process after process, so the machine's drift between two rows measured minutes apart
    cannot make the ratio), else the rows."""
    basis = "paired" if peer.get("paired") else "rows"
    source = peer["paired"] if basis == "paired" else peer
    ratios = [source.get("greedy_b1_p50_ratio"), source.get("beam4_b1_p50_ratio")]
    met = None if None in ratios else all(x <= 1.0 for x in ratios)
    return {"basis": basis, "greedy_b1_p50_ratio": ratios[0], "beam4_b1_p50_ratio": ratios[1], "met": met}
