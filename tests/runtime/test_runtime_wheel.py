"""mt-runtime as a wheel (issue 60): built from model/runtime alone, it holds every module of the
runtime and nothing else (no tests, no caches), describes itself (README, changelog, version,
dependencies, the command), and installed by itself translates a package as the checkout does."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

import pytest
from mt_runtime import Translator, __version__

from tests.helpers import REPO

RUNTIME = REPO / "model" / "runtime"


def test_the_pipeline_pins_the_runtimes_one_version():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = [d for d in project["dependencies"] + project["optional-dependencies"]["serve"] if "mt-runtime" in d]
    assert pins == [f"mt-runtime=={__version__}", f"mt-runtime[serve]=={__version__}"]
    runtime = tomllib.loads((RUNTIME / "pyproject.toml").read_text())
    assert runtime["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mt_runtime._version.__version__"}
    assert f"## {__version__}" in (RUNTIME / "CHANGELOG.md").read_text()  # each version says what it brought


@pytest.mark.slow
def test_the_wheel_holds_the_runtime_and_translates_by_itself(package, tmp_path):
    src = tmp_path / "src"  # built from a copy, caches included, so the checkout gets no build/
    shutil.copytree(RUNTIME, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--wheel-dir", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if built.returncode != 0 and re.search(r"No module named (pip|setuptools)|BackendUnavailable", built.stderr):
        pytest.skip(f"cannot build a wheel offline here: {built.stderr.strip().splitlines()[-1]}")
    assert built.returncode == 0, built.stderr
    wheel = tmp_path / "dist" / f"mt_runtime-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"mt_runtime-{__version__}.dist-info"
        metadata = z.read(f"{info}/METADATA").decode()
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    modules = {f"mt_runtime/{p.name}" for p in (RUNTIME / "mt_runtime").glob("*.py")}
    assert {n for n in names if not n.startswith(info)} == modules
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or n.rsplit("/", 1)[-1].startswith("test")]
    assert f"Version: {__version__}" in metadata and "Description-Content-Type: text/markdown" in metadata
    assert "mt-runtime translate PACKAGE" in metadata and "# mt-runtime changelog" in metadata
    for requirement in (
        "onnxruntime-gpu>=1.24.1",
        "tokenizers>=0.19",
        "numpy>=1.26",
        'aiohttp<4,>=3.9; extra == "serve"',
    ):
        assert f"Requires-Dist: {requirement}" in metadata, metadata
    assert "mt-runtime = mt_runtime.cli:main" in entry_points

    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    # The installed wheel and this interpreter's third-party packages, nothing else: no site
    # (whose .pth files would map mt_runtime to a checkout), run from a folder without one.
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{site}:{sysconfig.get_paths()['purelib']}"}
    where = subprocess.run(
        [sys.executable, "-S", "-c", "import mt_runtime; print(mt_runtime.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert where.stdout.strip() == str(site / "mt_runtime" / "__init__.py"), where.stderr
    lines = ["A man is riding a bicycle.", "", "Two dogs play in the snow."]
    translated = subprocess.run(
        [sys.executable, "-S", "-m", "mt_runtime", "translate", str(package), "--beam", "2", "--threads", "1"],
        input="".join(line + "\n" for line in lines).encode(),
        capture_output=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert translated.returncode == 0, translated.stderr.decode()
    expected = Translator(package, threads=1).translate(lines, beam=2)
    assert translated.stdout.decode() == "".join(line + "\n" for line in expected)
