"""The report's figure: BLEU against batch-1 latency, one panel for greedy and one for beam 4."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window (servers, CI)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter  # noqa: E402

RUNTIME_COLOURS = {"torch": "tab:blue", "onnxruntime": "tab:orange", "ctranslate2": "tab:green"}
DEVICE_MARKERS = {"cpu": "o", "cuda": "^"}
# Label offsets (points) cycled left to right, so that labels of nearby points do not overlap.
LABEL_OFFSETS = ((5, 4), (5, 15), (5, -12), (5, 26), (5, -23))
PANELS = (("greedy_b1", "bleu_greedy", "pareto", "greedy"), ("beam4_b1", "bleu", "pareto_beam4", "beam 4"))


def plot_bleu_vs_latency(rows: list[dict], path: Path, title: str = "BLEU against latency") -> None:
    """Rows as report.json has them (latency_ms, bleu, bleu_greedy, pareto flags, skipped)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), constrained_layout=True)
    for ax, (lat_key, bleu_key, flag, name) in zip(axes, PANELS):
        shown = [r for r in rows if not r["skipped"] and r.get("latency_ms") and r.get(bleu_key) is not None]
        for k, r in enumerate(sorted(shown, key=lambda r: r["latency_ms"][lat_key]["p50"])):
            x, y = r["latency_ms"][lat_key]["p50"], r[bleu_key]
            ax.scatter(x, y, s=60, c=RUNTIME_COLOURS.get(r["runtime"], "grey"),
                       marker=DEVICE_MARKERS.get(r["device"], "s"),
                       edgecolors="black" if r[flag] else "none", linewidths=1.5, zorder=3)
            device = "" if r["device"] == "cpu" else f" {r['device']}"
            ax.annotate(f"{r['variant']}/{r['runtime']}/{r['compute_type']}{device}", (x, y),
                        textcoords="offset points", xytext=LABEL_OFFSETS[k % len(LABEL_OFFSETS)], fontsize=7,
                        arrowprops=dict(arrowstyle="-", color="grey", linewidth=0.5))
        for device in {r["device"] for r in shown}:
            front = sorted((r["latency_ms"][lat_key]["p50"], r[bleu_key])
                           for r in shown if r[flag] and r["device"] == device)
            if len(front) > 1:
                ax.step([p[0] for p in front], [p[1] for p in front], where="post", linestyle="--", color="black",
                        linewidth=0.8, zorder=2)
        if shown and min(r["latency_ms"][lat_key]["p50"] for r in shown) > 0:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.margins(x=0.2, y=0.12)  # room for the labels of the outermost points
        ax.set_xlabel(f"batch-1 latency, {name}, p50 (ms, log scale)")
        ax.set_ylabel("BLEU (greedy)" if bleu_key == "bleu_greedy" else "BLEU (evaluation beam)")
        ax.set_title(f"{name} (Pareto front per device: outlined points, dashed line)", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if not shown:
            ax.text(0.5, 0.5, "no measured row with a BLEU", ha="center", va="center", transform=ax.transAxes)
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=c, label=rt) for rt, c in RUNTIME_COLOURS.items()]
    handles += [plt.Line2D([], [], marker=m, linestyle="", color="grey", label=d) for d, m in DEVICE_MARKERS.items()]
    axes[1].legend(handles=handles, loc="best", fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
