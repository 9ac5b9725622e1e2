"""The stage registry: every stage's declaration (pipeline/stages/<kind>/__init__.py), in the order
they plan their nodes, and the recipe schema their sections make.

A stage's fingerprint takes the digest of the code it runs (pipeline/engine/code_digest.py), so a
code change rebuilds what it affects by itself. Declarations import no torch: a stage's code
(its build.py) is imported only when one of its nodes is built. Adding a stage is a folder
(its declaration and its build.py) and a line here (docs/architecture.md walks through one).
"""

from __future__ import annotations

from ..engine.recipe import recipe_schema
from . import benchmark, data, evaluate, export, import_teacher, kd_corpus, prune, quantize, report, tokenizer, train

STAGES = (
    data.STAGE,
    tokenizer.STAGE,
    import_teacher.STAGE,
    train.STAGE,
    kd_corpus.STAGE,
    prune.STAGE,
    export.STAGE,
    quantize.STAGE,
    evaluate.STAGE,
    benchmark.STAGE,
    report.STAGE,
)
Recipe = recipe_schema(section for stage in STAGES for section in stage.sections)
BY_KIND = {stage.kind: stage for stage in STAGES}
