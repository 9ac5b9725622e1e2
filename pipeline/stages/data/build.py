"""Data stage: find (or download) the parallel corpus, verify it, clean it, write plain text.

Output files: train.src/.tgt, valid.src/.tgt, test.<name>.src/.tgt (UTF-8, one sentence a line).
Only the training split is filtered and de-duplicated; valid and test keep every line, so that
scores stay comparable with published ones. One pass per split, streamed: memory does not grow
with the corpus (the de-duplication keeps 8 bytes per kept pair).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from ...corpora.splits import normalize, write_pairs
from ...corpora.user_files import aligned_pairs, tsv_pairs
from ...engine.context import StageContext
from ...engine.errors import DataError
from . import CleanConfig, DataConfig, FileSplit

# Digests of the files in multi30k/dataset data/task1/raw (the public download location).
MULTI30K_SHA256 = {
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}
MULTI30K_LANGS = ("en", "de", "fr")


def run(ctx: StageContext) -> dict:
    cfg: DataConfig = ctx.settings
    splits = _multi30k_splits(cfg, ctx) if cfg.source == "multi30k" else _user_splits(cfg)
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


class _Counted:
    """An iterator that counts what it hands out."""

    def __init__(self, items: Iterable):
        self._items, self.count = iter(items), 0

    def __iter__(self):
        for item in self._items:
            self.count += 1
            yield item


# ------------------------------------------------------------------- training corpora, weights
@dataclass
class TrainingCorpus:
    """One training corpus as the stage reads it, and what became of its pairs."""

    name: str
    weight: float
    pairs: Iterator[tuple[str, str]]
    origin: str  # what to call it in messages
    raw: int = 0  # pairs read (within max_train)
    kept: int = 0  # clean, and not seen before in this corpus or an earlier one
    written: int = 0  # lines written to train.src/.tgt: kept pairs times their copies
    dropped: Counter = field(default_factory=Counter)

    def metrics(self) -> dict:
        return {
            "name": self.name,
            "weight": self.weight,
            "raw_pairs": self.raw,
            "kept_pairs": self.kept,
            "written_pairs": self.written,
            "dropped": dict(self.dropped),
        }


def train_pairs(corpora: list[TrainingCorpus], cfg: CleanConfig, limit: int | None = None) -> Iterator[tuple[str, str]]:
    """The training split's lines: each corpus in order, cleaned and de-duplicated against every
    pair kept so far (one digest set for all), each kept pair written as many times as
    `copies` says for its corpus's weight, the copies adjacent. `limit`: the first N raw pairs
    over all the corpora. Fills in each corpus's counts as it goes."""
    seen: set[int] = set()
    for corpus in corpora:
        budget = None if limit is None else limit - sum(c.raw for c in corpora)
        raw = _Counted(itertools.islice(corpus.pairs, budget) if budget is not None else corpus.pairs)
        for s, t in clean_pairs(raw, cfg, corpus.dropped, seen):
            corpus.kept += 1
            n = copies(s, t, corpus.weight)
            corpus.written += n
            for _ in range(n):
                yield s, t
        corpus.raw = raw.count


# blake2b's salt (at most 16 bytes): a pair's fraction is independent of its de-duplication digest.
_WEIGHT_SALT = b"corpus-weight"


def copies(src: str, tgt: str, weight: float) -> int:
    """How many times a kept pair of a corpus of this weight is written: floor(weight), and once
    more if the pair's fraction, a blake2b digest of its text mapped to [0, 1), is below the
    rest. The same pair always gets the same count: a weight of 0.5 keeps the same half each run."""
    whole = math.floor(weight)
    rest = weight - whole
    if not rest:
        return whole
    digest = hashlib.blake2b(f"{src}\t{tgt}".encode("utf-8"), digest_size=8, salt=_WEIGHT_SALT).digest()
    return whole + (int.from_bytes(digest, "little") / 2**64 < rest)


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


# ---------------------------------------------------------------------------- cleaning
def clean_pairs(
    pairs: Iterable[tuple[str, str]], cfg: CleanConfig, dropped: Counter, seen: set[int] | None = None
) -> Iterator[tuple[str, str]]:
    """The pairs worth training on, normalized, in their order; `dropped` counts the others by
    reason. Duplicates are found by a 64-bit digest of the pair (8 bytes a pair, not the text:
    at 10 million pairs a collision is a few-in-a-million event, and costs one pair); `seen`,
    where given, holds the digests of pairs kept before (an earlier corpus), and gets these."""
    seen = set() if seen is None else seen
    for s, t in pairs:
        s, t = normalize(s, cfg.normalize_nfc), normalize(t, cfg.normalize_nfc)
        if not s or not t:
            dropped["empty"] += 1
            continue
        ns, nt = len(s.split()), len(t.split())
        if ns > cfg.max_words or nt > cfg.max_words:
            dropped["too_long"] += 1
            continue
        if max(ns, nt) > cfg.max_ratio * min(ns, nt) and max(ns, nt) > 3:
            dropped["length_ratio"] += 1
            continue
        if cfg.dedup:
            digest = int.from_bytes(hashlib.blake2b(f"{s}\t{t}".encode("utf-8"), digest_size=8).digest(), "little")
            if digest in seen:
                dropped["duplicate"] += 1
                continue
            seen.add(digest)
        yield s, t


# ------------------------------------------------------------------------------ reading
def pairs_of(split: FileSplit) -> tuple[Iterator[tuple[str, str]], str]:
    """A split of the user's corpus as a stream of pairs, and what to call it in messages. The
    files are checked for existence now, so a typo fails before any work."""
    paths = [Path(split.tsv)] if split.tsv is not None else [Path(split.src), Path(split.tgt)]
    for path in paths:
        if not path.exists():
            raise DataError(f"{path}: file not found")
    if split.tsv is not None:
        return tsv_pairs(paths[0]), str(paths[0])
    return aligned_pairs(*paths), f"{paths[0]} / {paths[1]}"


def _user_splits(cfg: DataConfig) -> dict:
    files = cfg.files
    corpora = [TrainingCorpus(spec.label, spec.weight, *pairs_of(spec)) for spec in files.train_corpora]
    return {
        "train": (corpora, ", ".join(c.origin for c in corpora)),
        "valid": pairs_of(files.valid),
        **{name: pairs_of(spec) for name, spec in files.test.items()},
    }


# ----------------------------------------------------------------------------- multi30k
def _multi30k_splits(cfg: DataConfig, ctx: StageContext) -> dict:
    for lang in (cfg.src_lang, cfg.tgt_lang):
        if lang not in MULTI30K_LANGS:
            raise DataError(f"multi30k has languages {', '.join(MULTI30K_LANGS)}; got '{lang}'")
    names = {"train": "train", "valid": "val", **{t: t for t in cfg.test_sets}}
    for test in cfg.test_sets:
        if f"{test}.en.gz" not in MULTI30K_SHA256:
            known = sorted({k.split(".")[0] for k in MULTI30K_SHA256} - {"train", "val"})
            raise DataError(f"multi30k has no test set '{test}' (known: {', '.join(known)})")
    wanted = [f"{names[s]}.{lang}.gz" for s in names for lang in (cfg.src_lang, cfg.tgt_lang)]
    folder = locate_multi30k(cfg, wanted, ctx)
    splits = {
        split: (
            aligned_pairs(folder / f"{stem}.{cfg.src_lang}.gz", folder / f"{stem}.{cfg.tgt_lang}.gz"),
            str(folder / f"{stem}.{cfg.src_lang}.gz"),
        )
        for split, stem in names.items()
    }
    pairs, origin = splits["train"]
    splits["train"] = ([TrainingCorpus("train", 1.0, pairs, origin)], origin)
    return splits


def candidate_dirs(cfg: DataConfig) -> list[Path]:
    dirs = []
    for base in (cfg.data_dir, os.environ.get("PIPELINE_DATA")):
        if base:
            dirs += [Path(base) / "multi30k", Path(base)]
    return dirs


def cache_dir() -> Path:
    base = os.environ.get("PIPELINE_CACHE") or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mt-pipeline" / "multi30k"


def locate_multi30k(cfg: DataConfig, wanted: list[str], ctx: StageContext | None = None) -> Path:
    """A folder holding every wanted file with the right digest; downloads into the cache if needed."""
    problems = []
    for folder in candidate_dirs(cfg):
        if all((folder / name).is_file() for name in wanted):
            for name in wanted:
                _check_digest(folder / name)
            return folder
    cache = cache_dir()
    missing = [n for n in wanted if not _digest_ok(cache / n)]
    if not missing:
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    for name in missing:
        try:
            download(f"{cfg.url.rstrip('/')}/{name}", cache / name, MULTI30K_SHA256[name], ctx)
        except DataError:
            raise
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            problems.append(f"{name}: {getattr(exc, 'reason', exc)}")
            break
    if problems:
        looked = ", ".join(str(d) for d in candidate_dirs(cfg)) or "(no data_dir, PIPELINE_DATA unset)"
        raise DataError(
            f"Multi30k not found and the download failed ({problems[0]}). Put the files "
            f"({', '.join(wanted[:2])}, ...) in a folder and set PIPELINE_DATA=<folder> or data.data_dir; "
            f"looked in: {looked}"
        )
    return cache


def _digest_ok(path: Path) -> bool:
    return path.is_file() and _sha256(path) == MULTI30K_SHA256[path.name]


def _check_digest(path: Path) -> None:
    if not _digest_ok(path):
        raise DataError(
            f"{path}: sha256 does not match the published Multi30k file "
            f"(expected {MULTI30K_SHA256[path.name][:16]}...): the file is damaged or different"
        )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def download(url: str, dest: Path, sha256: str, ctx: StageContext | None = None, timeout: float = 30) -> None:
    """Fetch to a .part file, check size and digest, then rename: a cut download never counts."""
    part = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:
            total = resp.headers.get("Content-Length")
            total = int(total) if total and total.isdigit() else None
            got = 0
            desc = f"download {dest.name}"
            bar = ctx.progress(desc, total, "bytes") if ctx else _null()
            with bar as progress:
                while block := resp.read(1 << 16):
                    out.write(block)
                    h.update(block)
                    got += len(block)
                    if progress:
                        progress.advance(len(block))
        if total is not None and got != total:
            raise DataError(f"{url}: download truncated ({got} of {total} bytes)")
        if h.hexdigest() != sha256:
            raise DataError(
                f"{url}: sha256 mismatch after download (got {h.hexdigest()[:16]}..., expected "
                f"{sha256[:16]}...); not using it"
            )
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
