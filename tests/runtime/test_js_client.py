"""A second language from the spec alone (issue 51): examples/js/translate.mjs, a JavaScript
client written from docs/package-format.md, translates what the Python runtime translates,
identically, for every CPU package variant (fp32, int8_dynamic, int8_static; with a shortlist and
without), greedy and beam 4, one sentence per decoder call and in batches.

The model is tiny but trained for a few seconds, so that its outputs end at EOS at many lengths
(an untrained one runs to the length limit): the beam rules for finished hypotheses are then
exercised, not only the limit's. Skipped where `node` is not on PATH; installs the client's
pinned dependencies (`npm ci`) where examples/js/node_modules is missing, skipping if the npm
registry cannot be reached."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from mt_runtime.translator import Translator

from tests.helpers import REPO
from tests.helpers.js_packages import npm_ci, trained_packages

# slow: the packages fixture trains a model and builds its three CPU variants (about 40 s)
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*longer than the model's.*:UserWarning")]

JS = REPO / "examples" / "js"
VARIANTS = ("fp32", "int8_dynamic", "int8_static")
# Each variant with the test's shortlist and without one; int8_dynamic also with a shortlist that
# lists nearly every word (the output vocabulary's "none where that would be every word").
PACKAGES = [(variant, shortlist) for variant in VARIANTS for shortlist in ("listed", "none")] + [
    ("int8_dynamic", "wide")
]


@pytest.fixture(scope="module")
def node() -> str:
    exe = shutil.which("node")
    if exe is None:
        pytest.skip("node is not on PATH: the JavaScript client (examples/js) is not run")
    npm_ci(JS, ("onnxruntime-node", "@huggingface/tokenizers"))
    return exe


@pytest.fixture(scope="module")
def packages(tmp_path_factory, data_dir):
    return trained_packages(tmp_path_factory.mktemp("js-client"), data_dir, PACKAGES)


def run_js(node: str, package: Path, lines: list[str], beam: int, batch: int = 1, *options: str) -> list[str]:
    done = subprocess.run(
        [node, str(JS / "translate.mjs"), str(package), "--beam", str(beam), "--batch", str(batch), *options],
        input="".join(line + "\n" for line in lines).encode(),
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    out = done.stdout.decode().split("\n")
    assert out[-1] == "" and len(out) == len(lines) + 1  # one line out per line in
    return out[:-1]


@pytest.mark.parametrize("variant,shortlist", PACKAGES, ids=[f"{v}-{s}" for v, s in PACKAGES])
def test_js_client_translates_as_the_python_runtime(node, packages, variant, shortlist):
    built, lines = packages
    translator = Translator(built[variant, shortlist], threads=1)
    assert translator.describe()["shortlist"] == (shortlist != "none" and variant != "fp32")
    for beam in (1, 4):
        alone = translator.translate(lines, beam=beam, max_batch=1)  # generate.onnx: onnxruntime's own search
        batched = translator.translate(lines, beam=beam)  # one length-sorted batch: the Python search loop
        assert len({len(t.split()) for t in alone}) > 5  # outputs of many lengths
        js = run_js(node, built[variant, shortlist], lines, beam)
        assert run_js(node, built[variant, shortlist], lines, beam, 16) == js  # any batch, same translation
        differ = [i for i, (a, b) in enumerate(zip(js, alone)) if a != b]
        assert not differ, [(lines[i], alone[i], js[i]) for i in differ]
        # The Python runtime's batches agree with its one-sentence search (the op), and so does
        # this client: at beam > 1 it runs decoder_batch.onnx with a sentence's beams grouped in
        # each cross-attention, as the op does (one product per beam over decoder.onnx summed
        # otherwise by an ulp, which moved int8 activations and, here, 3 of 7 packages' beams).
        assert batched == alone, (variant, shortlist, beam)
    # Another length penalty than generation.json's (the hypotheses' float32 t ** penalty).
    alone = translator.translate(lines, beam=4, length_penalty=0.6, max_batch=1)
    assert run_js(node, built[variant, shortlist], lines, 4, 1, "--length-penalty", "0.6") == alone


@pytest.mark.parametrize("variant", ["int8_dynamic", "int8_static"])
def test_the_shortlist_changes_what_is_compared(packages, variant):
    """The shortlist's rules are exercised: an int8 package with one translates some sentences
    otherwise than the same model without one, greedy and beam."""
    built, lines = packages
    for beam in (1, 4):
        listed, whole = (
            Translator(built[variant, shortlist], threads=1).translate(lines, beam=beam, max_batch=1)
            for shortlist in ("listed", "none")
        )
        assert listed != whole, (variant, beam)


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def test_js_client_refuses_what_the_spec_refuses(node, packages, tmp_path):
    """A major version it does not know, a changed file, a symbolic link: refused before any graph
    opens, in one line (exit 1); a newer minor version is read."""
    built, _ = packages

    def attempt(folder: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [node, str(JS / "translate.mjs"), str(folder)], input=b"A dog runs.\n", capture_output=True, timeout=120
        )

    def copy(name: str) -> Path:
        return Path(shutil.copytree(built["fp32", "listed"], tmp_path / name))

    def set_format(folder: Path, value: str) -> None:
        about = json.loads((folder / "package.json").read_text())
        (folder / "package.json").write_text(json.dumps({**about, "format": value}))

    newer_minor = copy("minor")
    set_format(newer_minor, "mt-onnx-package/2.1")
    done = attempt(newer_minor)
    assert done.returncode == 0 and done.stdout.count(b"\n") == 1, done.stderr
    for name, spoil, says in (
        ("major", lambda f: set_format(f, "mt-onnx-package/3"), b"mt-onnx-package/3"),
        ("old", lambda f: set_format(f, "mt-onnx-package/1"), b"re-export"),
        ("changed", lambda f: _flip_last_byte(f / "decoder.onnx"), b"sha256"),
        ("link", lambda f: f.joinpath("extra").symlink_to(f / "generation.json"), b"regular file"),
    ):
        folder = copy(name)
        spoil(folder)
        done = attempt(folder)
        assert done.returncode == 1 and says in done.stderr and done.stdout == b"", (name, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, (name, done.stderr)
