"""`mt-runtime translate PACKAGE` (issue 60): real subprocesses with mt-runtime alone on the path
give the lines `pipeline translate` and Translator give, take their flags, and fail with the
pipeline's exit codes in one line (the same line where the cause is the package or a pipe)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings

import pytest
from mt_runtime import Translator
from mt_runtime.lines import normalize

from tests.helpers import REPO, _one_error_line, cli
from tests.helpers.packages import _copy

RUNTIME = REPO / "model" / "runtime"
# Real input's awkward cases: an empty and a blank line, a control byte, invalid UTF-8, a tab,
# NFC-normalisable text, and a line past the fixture's 31 tokens (truncated, with a warning).
LINES = [
    b"A man is riding a bicycle.",
    b"",
    b"Two dogs\x01 play\tin the snow.",
    b"caf\xe9 \xff broken utf-8",
    b"   ",
    "Cafe\u0301 au lait.".encode(),
    b"A little girl in a pink dress climbs the stairs of a big wooden house near the river.",
]
TEXT = b"\n".join(LINES) + b"\n"


def runtime(*args: str, input: bytes | None = TEXT, shell: str | None = None) -> subprocess.CompletedProcess:
    """`python -m mt_runtime ARGS` with only this checkout's mt-runtime importable (no pipeline,
    no torch), from a folder that holds neither."""
    cmd = [sys.executable, "-m", "mt_runtime", *args]
    if shell is not None:  # redirections Python cannot express: `<&-`, `>&-`, `> /dev/full`
        cmd = ["bash", "-c", " ".join(f"'{a}'" for a in cmd) + " " + shell]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(RUNTIME)}
    return subprocess.run(cmd, cwd=RUNTIME, input=input, capture_output=True, timeout=120, env=env)


def expected(package, beam: int) -> bytes:
    """What Translator gives the cleaned lines, one a line."""
    cleaned = [normalize(raw.decode("utf-8", "replace")) for raw in LINES]
    with warnings.catch_warnings():  # the long line's truncation: the commands' warning, checked there
        warnings.simplefilter("ignore")
        out = Translator(package, threads=1).translate(cleaned, beam=beam)
    return "".join(line + "\n" for line in out).encode()


def test_translate_gives_the_pipelines_lines_and_translators(package, tmp_path):
    store = tmp_path / "store"
    for beam in (1, 4):
        ours = runtime("translate", str(package), "--beam", str(beam), "--threads", "1")
        theirs = cli(
            "translate", "--model", str(package), "--beam", str(beam), "--threads", "1", input=TEXT, store=store
        )
        assert ours.returncode == 0 == theirs.returncode, ours.stderr.decode() + theirs.stderr.decode()
        assert ours.stdout == theirs.stdout == expected(package, beam)
        out = ours.stdout.decode().split("\n")
        assert len(out) == len(LINES) + 1 and out[1] == out[4] == "" and out[0]
        # The same warnings, in the same words, then the summary saying how it ran.
        shown = [line for line in ours.stderr.decode().splitlines() if line.startswith("warning: ")]
        assert shown == [line for line in theirs.stderr.decode().splitlines() if line.startswith("warning: ")]
        assert any("not valid UTF-8" in w for w in shown) and any("truncated" in w for w in shown)
        assert re.search(rf"^7 lines in [\d.]+ s: .*threads 1, beam {beam}, batch 32\)$", ours.stderr.decode(), re.M)
    # The pipeline's batches in two child processes: the same lines.
    theirs = cli("translate", "--model", str(package), "--batch-size", "2", "--processes", "2", input=TEXT, store=store)
    assert theirs.returncode == 0 and theirs.stdout == expected(package, 4), theirs.stderr.decode()
    assert "threads 1, processes 2, beam 4, batch 2)" in theirs.stderr.decode()
    assert expected(package, 1) != expected(package, 4)  # so the flag is seen to take effect


def test_flags_take_effect_and_batches_change_nothing(package):
    proc = runtime("translate", str(package), "--beam", "4", "--batch-size", "2", "--threads", "2")
    assert proc.returncode == 0 and proc.stdout == expected(package, 4), proc.stderr.decode()
    assert "threads 2, beam 4, batch 2)" in proc.stderr.decode()
    # Batches in two child processes: the same lines.
    proc = runtime("translate", str(package), "--beam", "4", "--batch-size", "2", "--processes", "2")
    assert proc.returncode == 0 and proc.stdout == expected(package, 4), proc.stderr.decode()
    assert "threads 1, processes 2, beam 4, batch 2)" in proc.stderr.decode()
    gpu = runtime("translate", str(package), "--device", "cuda", "--processes", "2")
    assert (
        gpu.returncode == 2
        and _one_error_line(gpu, 2) == "error: --processes: batches run in child processes on the CPU only\n"
    )
    cut = runtime("translate", str(package), "--beam", "1", "--max-line-bytes", "5", input=b"A man is riding.\nA.\n")
    assert cut.returncode == 0 and len(cut.stdout.splitlines()) == 2
    assert "warning: input line 1 is longer than 5 bytes" in cut.stderr.decode()
    assert runtime("translate", str(package), input=b"").stdout == b""


def test_errors_are_the_pipelines_exit_codes_in_one_line(package, tmp_path):
    def both(folder, *flags: str) -> tuple[str, str]:
        ours = runtime("translate", str(folder), *flags, input=b"A man.\n")
        theirs = cli("translate", "--model", str(folder), *flags, input=b"A man.\n", store=tmp_path / "store")
        assert ours.returncode == theirs.returncode, (ours.stderr, theirs.stderr)
        assert ours.stdout == b"" and "Traceback" not in theirs.stderr.decode()
        return _one_error_line(ours, theirs.returncode), theirs.stderr.decode()

    ours, _ = both(tmp_path / "missing")
    assert ours == f"error: {tmp_path / 'missing'}: no such folder\n"
    (tmp_path / "empty").mkdir()
    ours, _ = both(tmp_path / "empty")
    assert ours == f"error: {tmp_path / 'empty'}: not a package folder (no package.json)\n"
    copy = _copy(package, tmp_path)  # tampered: generation.json changed after export
    (copy / "generation.json").write_text(json.dumps({**json.loads((copy / "generation.json").read_text()), "beam": 9}))
    ours, theirs = both(copy)
    assert ours == theirs and "generation.json: modified after export" in ours
    (copy / "decoder.onnx").unlink()
    ours, theirs = both(copy)
    assert ours == theirs and ours.endswith("decoder.onnx: missing from the package\n")
    ours, theirs = both(package, "--device", "cuda", "--processes", "2")
    assert ours == "error: --processes: batches run in child processes on the CPU only\n" and ours.strip() in theirs
    for flags, message in (
        (["--beam", "0"], "--beam: must be above 0, got 0"),
        (["--beam", "x"], "--beam: must be a whole number above 0, got 'x'"),
        (["--batch-size", "0"], "--batch-size: must be above 0"),
        (["--threads", "-1"], "--threads: must be above 0"),
        (["--processes", "0"], "--processes: must be above 0"),
        (["--max-line-bytes", "0"], "--max-line-bytes: must be above 0"),
        (["--device", "tpu"], "--device: invalid choice: 'tpu'"),
        (["--nope"], "unrecognized arguments: --nope"),
    ):
        ours, theirs = both(package, *flags)  # the pipeline's is click's usage message, exit 2 too
        assert message in ours and ours.startswith("error: argument") == ("--nope" not in flags), ours


def test_closed_pipes_end_as_the_pipelines_do(package, tmp_path):
    model = ["translate", str(package), "--beam", "1", "--batch-size", "2"]
    assert "error: standard input is closed: nothing to translate" in _one_error_line(runtime(*model, shell="<&-"), 2)
    assert "error: standard output is closed" in _one_error_line(runtime(*model, shell=">&-"), 2)
    full = _one_error_line(runtime(*model, input=b"A man.\n" * 100, shell="> /dev/full"), 1)
    assert "cannot write the translations to standard output: No space left on device (after 0 lines)" in full
    (tmp_path / "in.txt").write_bytes(b"".join(b"A man rides a bike number %d.\n" % i for i in range(3000)))
    # `| head -1`: one line, nothing on stderr, and the pipe's status 141 (128 + SIGPIPE), as the pipeline's.
    head = subprocess.run(
        [
            "bash",
            "-c",
            f"set -o pipefail; '{sys.executable}' -m mt_runtime {' '.join(model)} --batch-size 2 < in.txt | head -1",
        ],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(RUNTIME)},
    )
    assert head.returncode == 141 and head.stdout.count(b"\n") == 1 and head.stderr == b"", head.stderr.decode()


def test_the_command_names_both_subcommands_and_its_version():
    from mt_runtime import __version__

    helped = runtime("--help", input=None)
    assert helped.returncode == 0 and b"translate" in helped.stdout and b"serve" in helped.stdout
    assert runtime("--version", input=None).stdout.decode().strip() == f"mt-runtime {__version__}"
    none = runtime(input=None)
    assert none.returncode == 2 and none.stderr.decode().startswith("error: the following arguments are required")


@pytest.mark.parametrize("module", ["mt_runtime", "mt_runtime.serve"])
def test_serve_runs_through_the_command_and_as_before(package, module, tmp_path):
    """`mt-runtime serve` is the command's subcommand; `python -m mt_runtime.serve serve` (the tests'
    and the load test's way) still starts the same server. A bad value is one line, exit 2."""
    bad = runtime("serve", str(package), "--workers", "0", input=None)
    assert _one_error_line(bad, 2).startswith("error: argument --workers: must be above 0")
    server = subprocess.Popen(
        [sys.executable, "-m", module, "serve", str(package), "--port", "0", "--threads", "1"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(RUNTIME)},  # aiohttp: the venv's
    )
    try:
        for line in server.stderr:
            if " ready: " in line:
                break
        server.terminate()
        assert server.wait(60) == 0
    finally:
        server.kill()
