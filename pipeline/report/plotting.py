"""The report's figure: BLEU against batch-1 latency, one panel for greedy and one for beam 4."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window (servers, CI)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

RUNTIME_COLOURS = {"torch": "tab:blue", "onnxruntime": "tab:orange", "ctranslate2": "tab:green"}
DEVICE_MARKERS = {"cpu": "o", "cuda": "^"}
# Where a label may go relative to its point (offset in points, horizontal alignment), in order
# of preference: the first inside the axes that overlaps no label or point already drawn is
# taken (a cluster near an edge has only one side: hence the long ladder, with a leader line).
LABEL_PLACES = tuple(
    (dx, dy, "left" if dx > 0 else "right")
    for dy in (4, -12, 15, -23, 26, -34, 37, -45, 48, -56, 59, -67, 70)
    for dx in (6, -6)
)
PANELS = (("greedy_b1", "bleu_greedy", "pareto", "greedy"), ("beam4_b1", "bleu", "pareto_beam4", "beam 4"))


def plot_bleu_vs_latency(rows: list[dict], path: Path, title: str = "BLEU against latency") -> None:
    """Rows as report.json has them (latency_ms, bleu, bleu_greedy, pareto flags, skipped)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), constrained_layout=True)
    to_label = []
    for ax, (lat_key, bleu_key, flag, name) in zip(axes, PANELS):
        shown = [r for r in rows if not r["skipped"] and r.get("latency_ms") and r.get(bleu_key) is not None]
        shown.sort(key=lambda r: r["latency_ms"][lat_key]["p50"])
        for r in shown:
            ax.scatter(
                r["latency_ms"][lat_key]["p50"],
                r[bleu_key],
                s=60,
                c=RUNTIME_COLOURS.get(r["runtime"], "grey"),
                marker=DEVICE_MARKERS.get(r["device"], "s"),
                edgecolors="black" if r[flag] else "none",
                linewidths=1.5,
                zorder=3,
            )
        for device in {r["device"] for r in shown}:
            front = sorted(
                (r["latency_ms"][lat_key]["p50"], r[bleu_key]) for r in shown if r[flag] and r["device"] == device
            )
            if len(front) > 1:
                ax.step(
                    [p[0] for p in front],
                    [p[1] for p in front],
                    where="post",
                    linestyle="--",
                    color="black",
                    linewidth=0.8,
                    zorder=2,
                )
        if shown and min(r["latency_ms"][lat_key]["p50"] for r in shown) > 0:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.margins(x=0.2, y=0.12)  # room for the labels of the outermost points
        to_label.append(
            (
                ax,
                [
                    (
                        r["latency_ms"][lat_key]["p50"],
                        r[bleu_key],
                        f"{r['variant']}/{r['runtime']}/{r['compute_type']}"
                        + ("" if r["device"] == "cpu" else f" {r['device']}"),
                    )
                    for r in shown
                ],
            )
        )
        ax.set_xlabel(f"batch-1 latency, {name}, p50 (ms, log scale)")
        ax.set_ylabel("BLEU (greedy)" if bleu_key == "bleu_greedy" else "BLEU (evaluation beam)")
        ax.set_title(f"{name} (Pareto front per device: outlined points, dashed line)", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if not shown:
            ax.text(0.5, 0.5, "no measured row with a BLEU", ha="center", va="center", transform=ax.transAxes)
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=c, label=rt) for rt, c in RUNTIME_COLOURS.items()]
    handles += [plt.Line2D([], [], marker=m, linestyle="", color="grey", label=d) for d, m in DEVICE_MARKERS.items()]
    # Slow and worse is where no variant worth plotting sits.
    axes[1].legend(handles=handles, loc="lower right", fontsize=8)
    fig.suptitle(title)
    fig.canvas.draw()  # final limits and layout: label places are chosen in display space
    for ax, points in to_label:
        _label_points(fig, ax, points)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _label_points(fig, ax, points: list[tuple[float, float, str]]) -> list:
    """One label per point, each at the first place in LABEL_PLACES where its text stays inside
    the axes and overlaps no label placed before it, the legend or another point (else the
    least-overlapping place)."""
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    dots = [ax.transData.transform((x, y)) for x, y, _ in points]
    taken = [ax.get_legend().get_window_extent(renderer)] if ax.get_legend() is not None else []
    labels = []
    for i, (x, y, text) in enumerate(points):
        label = ax.annotate(
            text,
            (x, y),
            xytext=LABEL_PLACES[0][:2],
            textcoords="offset points",
            fontsize=7,
            arrowprops=dict(arrowstyle="-", color="grey", linewidth=0.5),
        )

        def move(place) -> Bbox:
            dx, dy, align = place
            label.xyann = (dx, dy)
            label.set_horizontalalignment(align)
            label.update_positions(renderer)
            return Text.get_window_extent(label, renderer).expanded(1.04, 1.1)  # the text's, not its line's

        tried = []
        for place in LABEL_PLACES:
            box = move(place)
            shared = (Bbox.intersection(box, other) for other in taken)
            inside = Bbox.intersection(box, frame)
            outside = box.width * box.height - (inside.width * inside.height if inside is not None else 0)
            clash = (
                sum(b.width * b.height for b in shared if b is not None)
                + outside
                + sum(1e4 for j, dot in enumerate(dots) if j != i and box.padded(4).contains(*dot))
            )
            if clash == 0:
                break
            tried.append((clash, place))
        else:
            box = move(min(tried)[1])
        taken.append(box)
        labels.append(label)
    return labels
