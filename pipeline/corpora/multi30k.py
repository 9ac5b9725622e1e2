"""The Multi30k corpus: found in a folder the recipe or $PIPELINE_DATA names, else downloaded into
the cache, every file checked against its published sha256 (a cut or different download never
counts). `cfg` is the recipe's data section (pipeline/stages/data: DataConfig); `progress` a
stage context's progress (ctx.progress)."""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from pathlib import Path

from ..engine.errors import DataError
from .cleaning import TrainingCorpus
from .user_files import aligned_pairs

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


def multi30k_splits(cfg, progress=None) -> dict:
    """{split: (pairs, origin)}: the training split as one corpus (TrainingCorpus), the others as streams."""
    for lang in (cfg.src_lang, cfg.tgt_lang):
        if lang not in MULTI30K_LANGS:
            raise DataError(f"multi30k has languages {', '.join(MULTI30K_LANGS)}; got '{lang}'")
    names = {"train": "train", "valid": "val", **{t: t for t in cfg.test_sets}}
    for test in cfg.test_sets:
        if f"{test}.en.gz" not in MULTI30K_SHA256:
            known = sorted({k.split(".")[0] for k in MULTI30K_SHA256} - {"train", "val"})
            raise DataError(f"multi30k has no test set '{test}' (known: {', '.join(known)})")
    wanted = [f"{names[s]}.{lang}.gz" for s in names for lang in (cfg.src_lang, cfg.tgt_lang)]
    folder = locate_multi30k(cfg, wanted, progress)
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


def candidate_dirs(cfg) -> list[Path]:
    dirs = []
    for base in (cfg.data_dir, os.environ.get("PIPELINE_DATA")):
        if base:
            dirs += [Path(base) / "multi30k", Path(base)]
    return dirs


def cache_dir() -> Path:
    base = os.environ.get("PIPELINE_CACHE") or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mt-pipeline" / "multi30k"


def locate_multi30k(cfg, wanted: list[str], progress=None) -> Path:
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
            download(f"{cfg.url.rstrip('/')}/{name}", cache / name, MULTI30K_SHA256[name], progress)
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


def download(url: str, dest: Path, sha256: str, progress=None, timeout: float = 30) -> None:
    """Fetch to a .part file, check size and digest, then rename: a cut download never counts."""
    part = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:
            total = resp.headers.get("Content-Length")
            total = int(total) if total and total.isdigit() else None
            got = 0
            desc = f"download {dest.name}"
            bar = progress(desc, total, "bytes") if progress else _null()
            with bar as meter:
                while block := resp.read(1 << 16):
                    out.write(block)
                    h.update(block)
                    got += len(block)
                    if meter:
                        meter.advance(len(block))
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
