"""The quantize stage's accuracy guard.

A candidate (graphs with some weight groups left in float) is written as a package, exactly as
the stage writes the one it ships (pipeline/export/packages.py: the derived graphs, the fp32
package's tokenizer, generation.json and shortlist), then opened through the registry
(mt_runtime/registry.py), so that its validation BLEU is that of the Translator, search paths and
shortlist a user gets. If the drop from fp32 exceeds the tolerance, guarded_search measures each
group's sensitivity (that group alone in int8) and keeps the most sensitive groups in float, one
more at a time, until the drop is within it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from mt_runtime.layout import GENERATION, SHORTLIST_FILE, TOKENIZER

from ..engine.errors import StageFailed
from ..export.packages import write_package
from ..measure.scoring import bleu_only
from ..measure.translators import open_model


class GuardScorer:
    """Validation BLEU of packages on the guard's sentences, with the fp32 package's beam and
    length penalty. `progress(label, total=, unit=)`: a context giving a bar with advance(n)."""

    def __init__(self, fp32: Path, sources: list[str], references: list[str], progress):
        self.fp32 = Path(fp32)
        self.translator = open_model(self.fp32)  # verifies the package
        self.sources, self.references, self.progress = sources, references, progress
        self.generation = json.loads((self.fp32 / GENERATION).read_text(encoding="utf-8"))
        shortlist = self.fp32 / SHORTLIST_FILE
        self.shortlist = shortlist if shortlist.is_file() else None

    def candidate(self, graphs: dict[str, Path], variant: str, float_groups: tuple[str, ...]) -> Path:
        """The folder holding the graphs made a package, as the stage makes the one it ships."""
        folder = graphs["decoder"].parent
        about = {"variant": variant, "float_groups": list(float_groups), "purpose": "a quantize guard candidate"}
        write_package(
            folder,
            graphs["encoder"],
            graphs["decoder"],
            self.fp32 / TOKENIZER,
            self.generation,
            about,
            shortlist=self.shortlist,
        )
        return folder

    def bleu(self, package: Path, label: str) -> float:
        translator = self.translator if Path(package) == self.fp32 else open_model(package)
        gen = self.translator.generation
        with self.progress(f"guard: {label}", total=len(self.sources), unit="sentences") as bar:
            hyps = translator.translate(
                self.sources, beam=gen.beam, length_penalty=gen.length_penalty, on_batch=bar.advance
            )
        return bleu_only(hyps, self.references)


def guarded_search(
    groups: list[str],
    evaluate: Callable[[tuple[str, ...]], float],
    reference: float,
    max_drop: float,
    variant: str,
    log=print,
) -> dict:
    """Quantize everything; if BLEU drops too much, keep the most sensitive groups in float.

    `evaluate(float_groups)` returns the BLEU with those groups left in float. Sensitivity of a
    group = the BLEU drop when only that group is quantized. Raises StageFailed with the table
    of attempts when even all but one group in float is not within `max_drop`."""
    attempts = []

    def attempt(keep: tuple[str, ...]) -> bool:
        bleu = evaluate(keep)
        attempts.append({"float_groups": list(keep), "bleu": bleu, "drop": round(reference - bleu, 2)})
        return reference - bleu <= max_drop + 1e-9

    if attempt(()):
        return {"bleu": attempts[-1]["bleu"], "float_groups": [], "attempts": attempts, "sensitivity": {}}
    log(f"{variant}: BLEU drop {attempts[-1]['drop']:.2f} > {max_drop:g}; measuring each group's sensitivity")
    sensitivity = {}
    for group in groups:
        sensitivity[group] = round(reference - evaluate(tuple(g for g in groups if g != group)), 2)
    order = sorted(groups, key=lambda g: -sensitivity[g])  # stable: ties keep model order
    for k in range(1, len(groups)):
        if attempt(tuple(order[:k])):
            return {
                "bleu": attempts[-1]["bleu"],
                "float_groups": list(order[:k]),
                "attempts": attempts,
                "sensitivity": sensitivity,
            }
    table = "\n".join(
        f"  {a['bleu']:6.2f} {a['drop']:+6.2f}  float: {', '.join(a['float_groups']) or 'none'}" for a in attempts
    )
    raise StageFailed(
        f"{variant}: no configuration keeps the BLEU drop within {max_drop:g} of fp32 "
        f"({reference:.2f}); attempts (BLEU, drop, groups kept in float):\n{table}\n"
        f"  sensitivity (drop with only that group in int8): {sensitivity}"
    )
