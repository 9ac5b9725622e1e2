"""`pipeline translate`: models by artifact id, folder or package, one line out per line in
(whatever the bytes, a decoder's line breaks, a 10 MB line within bounded memory), the runtime's
error passed through in one line, closed pipes ended quietly."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from mt_runtime.lines import bounded_lines, one_line

from pipeline.engine.machine import usable_cores
from tests.helpers import REPO, SOURCE_PATH, cli
from tests.helpers.packages import _copy, _resign


def _teacher(smoke):
    store, arts = smoke.build("teacher")
    return store, arts["teacher"]


@pytest.mark.slow
def test_translate_keeps_one_line_per_input_line_whatever_it_gets(smoke):
    store, teacher = _teacher(smoke)
    lines = [
        b"A man is riding a bicycle.",
        b"",
        b"Two dogs\x01 play\x7f in the \x1b[31msnow.",
        b"caf\xe9 \xff\xfe broken utf-8",
        b"x" * 100_000,
        b"word " * 5000,
        b"   ",
    ]
    proc = cli(
        "translate",
        "--model",
        teacher.id,
        "--beam",
        "2",
        store=store.root,
        input=b"\n".join(lines) + b"\n",
        timeout=240,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    out = proc.stdout.decode().split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    assert out[1] == "" and out[6] == ""  # empty and blank inputs stay empty
    assert out[0].strip()  # real input gets a translation
    assert "truncated" in err and "not valid UTF-8" in err
    assert "Traceback" not in err
    # The last word on stderr: how fast, and how (all cores unless --threads says otherwise).
    assert re.search(
        rf"^7 lines in [\d.]+ s: [\d.]+ sentences/s \([\d.]+ while translating; runtime torch, "
        rf"threads {usable_cores()}, beam 2, batch 32\)$",
        err,
        re.M,
    ), err


@pytest.mark.slow
def test_translate_accepts_a_folder_and_empty_input(smoke):
    store, teacher = _teacher(smoke)
    proc = cli("translate", "--model", str(teacher.path), input=b"", store=store.root)
    assert proc.returncode == 0 and proc.stdout == b""
    bad = cli("translate", "--model", "teacher-0000000000000000", input=b"hi\n", store=store.root)
    assert bad.returncode == 2 and "no artifact" in bad.stderr.decode()
    torch_model = cli("translate", "--model", str(teacher.path), "--processes", "2", input=b"hi\n", store=store.root)
    said = torch_model.stderr.decode()
    assert torch_model.returncode == 2 and "--processes: ONNX packages only" in said and "torch" in said, said


def test_an_artifacts_default_package_is_the_faster_int8(tmp_path):
    """Without --package, an artifact's int8_static goes first (docs/results.md: the faster int8
    at every point), then int8_dynamic, fp32, fp16; a folder that is itself a model is itself."""
    from pipeline.commands.translate import resolve_model
    from pipeline.engine.store import Store

    folder = tmp_path / "quantize"
    for name in ("fp32", "int8_dynamic", "int8_static"):
        (folder / name).mkdir(parents=True)
        (folder / name / "package.json").write_text("{}")
    store = Store(tmp_path / "store")
    assert resolve_model(store, str(folder), None) == folder / "int8_static"
    (folder / "int8_static" / "package.json").unlink()
    assert resolve_model(store, str(folder), None) == folder / "int8_dynamic"
    assert resolve_model(store, str(folder / "fp32"), None) == folder / "fp32"


def _cli(*args: str, input: bytes | None = b"", shell: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SOURCE_PATH, "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "pipeline.commands.cli", *args]
    if shell is not None:  # redirections Python cannot express: `<&-`, `>&-`, `> /dev/full`
        cmd = ["bash", "-c", " ".join(f"'{a}'" for a in cmd) + " " + shell]
    return subprocess.run(cmd, cwd=REPO, input=input, capture_output=True, timeout=120, env=env)


def _one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    err = proc.stderr.decode()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == code, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_translate_passes_the_runtimes_line_through(package, tmp_path):
    copy = _copy(package, tmp_path)
    values = json.loads((copy / "generation.json").read_text())
    _resign(copy, "generation.json", json.dumps({**values, "max_positions": 1e12}).encode())
    line = _one_line(_cli("translate", "--model", str(copy), input=b"A man.\n"), 1)
    assert "generation.json: max_positions: must be an integer" in line
    (copy / "decoder.onnx").unlink()  # the runtime's message, not "not a model"
    line = _one_line(_cli("translate", "--model", str(copy), input=b"A man.\n"), 1)
    assert line.endswith("decoder.onnx: missing from the package") and "not a model" not in line


def test_closed_pipes_end_quietly(package, tmp_path):
    model = ["translate", "--model", str(package), "--beam", "1"]
    assert "standard input is closed" in _one_line(_cli(*model, input=None, shell="<&-"), 2)
    assert "standard output is closed" in _one_line(_cli(*model, input=b"A man.\n", shell=">&-"), 2)
    full = _one_line(_cli(*model, input=b"A man.\n" * 100, shell="> /dev/full"), 1)
    assert "cannot write the translations to standard output: No space left on device" in full
    # `| head -1`: the reader goes away after one line.
    lines = b"".join(b"A man rides a bike number %d.\n" % i for i in range(3000))
    (tmp_path / "in.txt").write_bytes(lines)
    with open(tmp_path / "in.txt", "rb") as stdin:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.commands.cli", *model, "--batch-size", "2"],
            cwd=REPO,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": SOURCE_PATH},
        )
        assert proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read().decode()
        proc.wait(120)
    assert proc.returncode == 141 and err == "", err  # 128 + SIGPIPE, as a shell shows a process SIGPIPE ended


def test_a_package_whose_pieces_decode_to_line_breaks_still_gives_one_line_per_line(package, tmp_path):
    copy = _copy(package, tmp_path)
    tokenizer = json.loads((copy / "tokenizer.json").read_text())
    tokenizer["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": "\r\n\u2028\x85"},
            tokenizer["decoder"],
        ],
    }
    _resign(copy, "tokenizer.json", json.dumps(tokenizer).encode())
    proc = _cli("translate", "--model", str(copy), "--beam", "2", input=b"A man rides.\n\nTwo dogs\r play.\nA cat.\n")
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    assert out.count("\n") == 4 and len(out.splitlines()) == 4 and out.splitlines()[1] == ""
    assert not any(c in out for c in "\r\u2028\x85")


def test_bounded_lines_cut_long_lines_at_a_character_and_keep_the_count():
    import io

    data = b"short\n" + "é".encode() * 30 + b"\n" + b"x" * 1_000_000 + b"\nlast"
    lines = list(bounded_lines(io.BytesIO(data), 9))
    assert [(raw, cut) for raw, cut in lines] == [
        (b"short", False),
        ("é".encode() * 4, True),
        (b"x" * 9, True),
        (b"last", False),
    ]
    assert one_line("a\nb\rc\u2028d\u2029e\x85f\x0bg\x0ch\x1ci") == "a b c d e f g h i"


@pytest.mark.slow
def test_translate_cuts_a_10mb_line_and_stays_within_memory(smoke, tmp_path):
    store, arts = smoke.build("teacher")
    text = b"A man.\n" + b"word " * 2_000_000 + b"\nTwo dogs.\n"
    proc = subprocess.run(
        [
            "/usr/bin/time",
            "-f",
            "%M",
            sys.executable,
            "-m",
            "pipeline.commands.cli",
            "translate",
            "--model",
            arts["teacher"].id,
            "--beam",
            "1",
            "--store",
            str(store.root),
        ],
        cwd=REPO,
        input=text,
        capture_output=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": SOURCE_PATH},
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert len(proc.stdout.decode().split("\n")) == 4
    assert err.count("longer than 16384 bytes") == 1 and "Traceback" not in err
    peak_kb = int(err.strip().splitlines()[-1])
    assert peak_kb < 1_000_000, f"peak RSS {peak_kb} KB"  # 2.3 GB before the line bound
    small = cli(
        "translate",
        "--model",
        arts["teacher"].id,
        "--max-line-bytes",
        "3",
        store=store.root,
        input=b"A man is riding.\n",
        timeout=120,
    )
    assert small.returncode == 0 and len(small.stdout.splitlines()) == 1 and b"longer than 3 bytes" in small.stderr


@pytest.mark.slow
def test_a_decoder_that_emits_line_breaks_still_gives_one_line_per_line(smoke, tmp_path):
    store, arts = smoke.build("teacher")
    model = tmp_path / "model"
    shutil.copytree(arts["teacher"].path, model)
    (model / "manifest.json").unlink()  # a plain model folder, as someone might hand one over
    tok = json.loads((model / "tokenizer.json").read_text())
    tok["decoder"] = {
        "type": "Sequence",
        "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": "\n\r\u2028"}, tok["decoder"]],
    }
    (model / "tokenizer.json").write_text(json.dumps(tok))
    lines = b"A man is riding a bicycle.\nTwo dogs play.\n\nA woman sings.\n"
    proc = cli("translate", "--model", str(model), "--beam", "1", input=lines, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    assert out.count("\n") == 4 and len(out.splitlines()) == 4 and "\r" not in out and "\u2028" not in out


def test_a_translator_of_several_threads_gets_enough_lines_a_call_to_keep_them_busy(package):
    """translate_lines hands each translate call 8 batches, or twice the batches a translator of
    several threads keeps at work: with N threads, a call of 8 batches would leave the rest idle.
    The translations are those of one thread, line for line."""
    import io

    from mt_runtime import translate_stream as stream
    from mt_runtime.translator import Translator

    lines = [f"A man number {i} is riding a bicycle." for i in range(100)]
    text = ("\n".join(lines) + "\n").encode()
    outputs, sizes = {}, {}
    for threads in (1, 3):
        translator = Translator(package, threads=threads)
        calls = []
        translate = translator.translate
        translator.translate = lambda block, **kw: calls.append(len(block)) or translate(block, **kw)
        out = io.BytesIO()
        stream.translate_lines(translator, io.BytesIO(text), out, 1, 2, 10**6, print)  # batches of 2
        outputs[threads], sizes[threads] = out.getvalue(), calls
    assert sizes[1] == [16] * 6 + [4]  # 8 batches
    assert sizes[3] == [48, 48, 4]  # 3 threads keep 12 batches at work (cores.WAVE each): twice that
    assert outputs[3] == outputs[1] and outputs[1].count(b"\n") == 100
