"""Data stage: find (or download) the parallel corpus, verify it, clean it, write plain text.

Output files: train.src/.tgt, valid.src/.tgt, test.<name>.src/.tgt (UTF-8, one sentence a line).
Only the training split is filtered and de-duplicated; valid and test keep every line, so that
scores stay comparable with published ones. One pass per split, streamed: memory does not grow
with the corpus. The reading, checking and cleaning are pipeline/corpora's (multi30k.py,
user_files.py, cleaning.py); this module wires them.
"""

from __future__ import annotations

import itertools
from collections import Counter

from mt_runtime.lines import normalize

from ...corpora.cleaning import TrainingCorpus, train_pairs
from ...corpora.multi30k import multi30k_splits
from ...corpora.splits import write_pairs
from ...corpora.user_files import user_splits
from ...engine.context import StageContext
from ...engine.errors import DataError
from . import DataConfig


def run(ctx: StageContext) -> dict:
    cfg: DataConfig = ctx.settings
    splits = multi30k_splits(cfg, ctx.progress) if cfg.source == "multi30k" else user_splits(cfg.files)
    weighted = cfg.source == "files" and isinstance(cfg.files.train, list)
    metrics: dict = {
        "src_lang": cfg.src_lang,
        "tgt_lang": cfg.tgt_lang,
        "source": cfg.source,
        "test_sets": [],
        "dropped": {},
    }
    for split, (pairs, origin) in splits.items():
        limit = {"train": cfg.max_train, "valid": cfg.max_valid}.get(split, cfg.max_test)
        if split == "train":
            corpora = pairs  # the training corpora, in order (one, for a single split)
            kept = train_pairs(corpora, cfg.clean, limit)
        else:
            raw = itertools.islice(pairs, limit) if limit is not None else pairs
            kept = ((normalize(s, cfg.clean.normalize_nfc), normalize(t, cfg.clean.normalize_nfc)) for s, t in raw)
        name = split if split in ("train", "valid") else f"test.{split}"
        with ctx.progress(f"data: {split}", total=None, unit="pairs") as bar:
            written = write_pairs(ctx.out / f"{name}.src", ctx.out / f"{name}.tgt", kept, on_pair=bar.advance)
        if split == "train" and weighted:
            _log_corpora(ctx, corpora, limit)
        if not written:
            raise DataError(f"{origin}: no sentence pairs left in split '{split}' after cleaning")
        if split == "train":
            dropped: Counter = Counter()
            for corpus in corpora:
                dropped.update(corpus.dropped)
            metrics["dropped"] = dict(dropped)
            metrics["train_raw_pairs"] = sum(corpus.raw for corpus in corpora)
            if weighted:
                metrics["train_corpora"] = [corpus.metrics() for corpus in corpora]
        if name.startswith("test."):
            metrics["test_sets"].append(split)
        metrics[f"{split}_pairs"] = written
    ctx.log(
        f"{metrics['train_pairs']} training pairs {'written' if weighted else 'kept'} of "
        f"{metrics['train_raw_pairs']} "
        f"(dropped: {metrics['dropped'] or 'none'}); valid {metrics['valid_pairs']}; "
        f"test {', '.join(metrics['test_sets']) or 'none'}"
    )
    return metrics


def _log_corpora(ctx: StageContext, corpora: list[TrainingCorpus], limit: int | None) -> None:
    for corpus in corpora:
        ctx.log(
            f"{corpus.name} (weight {corpus.weight:g}): {corpus.raw} pairs read, {corpus.kept} kept, "
            f"{corpus.written} written (dropped: {dict(corpus.dropped) or 'none'})",
            markup=False,
        )
        if not corpus.kept:
            why = (
                f"max_train ({limit}) was reached before it"
                if limit is not None and not corpus.raw
                else "no pair survived cleaning and de-duplication"
            )
            ctx.log(f"warning: training corpus {corpus.name} ({corpus.origin}) adds no pairs: {why}", markup=False)
