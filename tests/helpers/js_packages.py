"""What the JavaScript clients' tests share (examples/js in Node, examples/web in Chromium): their
npm dependencies installed with `npm ci` (or the test skipped where npm or its registry is
missing), packages of a tiny model trained for a few seconds, and the lines they translate."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mt_runtime.shortlist import build_shortlist

from model.subword_training import train_subword
from model.transformer import Transformer
from tests.helpers import multi30k_head, pruned_shape_config
from tests.helpers.packages import build_packages

NETWORK_ERRORS = (
    "ENOTFOUND",
    "EAI_AGAIN",
    "ECONNREFUSED",
    "ECONNRESET",
    "ETIMEDOUT",
    "ENETUNREACH",
    "EHOSTUNREACH",
    "network request",
)

# Lines at the edges of the spec's "Text in and out": empty and blank ones (blank as Python's
# str.isspace has it: U+001C and U+0085 are, U+FEFF and U+200B are not), line breaks inside a
# line, special tokens' text (the tokenizer reads them as their ids, pad_id mid-source
# included), characters the vocabulary lacks (<unk> in and out), a carriage return.
EDGE_LINES = [
    "",
    "   ",
    "\t\u3000",
    "\x1c",
    "\x85",
    "\ufeff",
    "\u200b",
    "A dog\x0b runs\u2028 fast.",
    "<unk> </s> <s> <pad> dog",
    "Ein Hund läuft 東京 ☃.",
    "carriage\rreturn",
    "two  spaces ",
]


def npm_ci(folder: Path, modules: tuple[str, ...]) -> None:
    """Install `folder`'s locked npm dependencies unless `modules` are there; skip the test where
    npm or its registry is missing, fail it where npm fails otherwise."""
    if all((folder / "node_modules" / name / "package.json").is_file() for name in modules):
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"npm is not on PATH: cannot install {folder.name}'s dependencies")
    where = f"npm ci --prefix {folder.relative_to(folder.parents[1])}"
    try:  # the lockfile's exact versions; onnxruntime-node's CUDA download skipped (its .npmrc too)
        done = subprocess.run(
            [npm, "ci", "--prefix", str(folder), "--no-audit", "--no-fund", "--fetch-retries=1"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "ONNXRUNTIME_NODE_INSTALL": "skip"},
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"{where} did not finish in 300 s (is the npm registry reachable?)")
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.startswith("npm error")]
        reason = next((line for line in said if "request to" in line), None) or next(
            (line for line in said if any(error in line for error in NETWORK_ERRORS)), None
        )
        if reason is not None:
            pytest.skip(f"npm registry unreachable ({reason}): {folder.name}'s dependencies not installed")
        pytest.fail(f"{where} failed: {' / '.join(said[:4] or done.stderr.splitlines()[-4:])}")


def _train(model: Transformer, sources: list[list[int]], targets: list[list[int]], steps: int) -> None:
    """A few hundred teacher-forced steps: enough that outputs end at EOS, at many lengths."""
    pad = model.cfg.pad_id

    def padded(rows):
        width = max(map(len, rows))
        return torch.tensor([r + [pad] * (width - len(r)) for r in rows])

    bos, eos = 1, 2
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        rows = torch.randint(0, len(sources), (32,), generator=generator).tolist()
        src = padded([sources[i] + [eos] for i in rows])
        tgt_in, tgt_out = padded([[bos] + targets[i] for i in rows]), padded([targets[i] + [eos] for i in rows])
        loss = F.cross_entropy(model(src, tgt_in, tgt_out), tgt_out[tgt_out != pad])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def trained_packages(
    folder: Path, data_dir: Path, packages: list[tuple[str, str]]
) -> tuple[dict[tuple[str, str], Path], list[str]]:
    """Packages of one tiny model trained for 200 steps on Multi30k (about 12 s), one per
    (variant, shortlist): shortlist "listed" (the test's), "none", or "wide" (580 of the 600 words:
    its output vocabulary would be every word, so beam search runs over the whole vocabulary);
    and the lines to translate: 40 unseen sentences, 4 long ones (cut to max_positions - 1 ids;
    two have more words than the shortlist's width W = 128 allows), and the edge lines."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        en, fr = multi30k_head(data_dir, "en", 240), multi30k_head(data_dir, "fr", 200)
        tokenizer = train_subword(en[:200] + fr, vocab_size=600)
        tokenizer.save(folder / "tokenizer.json")
        assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2)
        sources, targets = tokenizer.encode(en[:200]), tokenizer.encode(fr)
        table, _ = build_shortlist(
            list(zip(sources, targets)), tokenizer.vocab_size, frequent=30, per_word=6, always=[0, 1, 2, 3]
        )
        table.save(folder / "shortlist.npz")
        torch.manual_seed(3)
        # The invariance test's shape (uneven heads, a factorised table, pre-LN), trained briefly.
        model = Transformer(pruned_shape_config(tokenizer.vocab_size))
        _train(model, [s[:40] for s in sources], [t[:40] for t in targets], steps=200)
        calibration = [s[:63] + [tokenizer.eos_id] for s in tokenizer.encode(en[100:140])]
        np.savez(
            folder / "wide.npz",
            vocab_size=np.array(600, np.int64),
            always=np.arange(580, dtype=np.int64),
            offsets=np.zeros(601, np.int64),
            words=np.zeros(0, np.int32),
        )
        lists = {"none": None, "listed": folder / "shortlist.npz", "wide": folder / "wide.npz"}
        wanted = {(variant, shortlist): (variant, lists[shortlist]) for variant, shortlist in packages}
        built = build_packages(model, folder, wanted, calibration)
    finally:
        torch.set_num_threads(threads)
    long = [" ".join(en[i : i + 4]) for i in range(200, 240, 10)]
    return built, en[200:240] + long + EDGE_LINES
