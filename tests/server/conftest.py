"""The server tests' fixtures: a tiny int8 package with a shortlist, and servers started as
commands (killed after the test)."""

from __future__ import annotations

import pytest

from pipeline.export.package_builder import build_package
from tests.helpers import tiny_model
from tests.helpers.serving import Command


@pytest.fixture(scope="module")
def package(tmp_path_factory, data_dir):
    """An int8 package with a shortlist (the shipped form) of a tiny random model, and sentences."""
    folder = tmp_path_factory.mktemp("serve")
    model, _, en, _ = tiny_model(data_dir, folder)
    build_package(
        model,
        "int8_dynamic",
        folder / "int8",
        tokenizer=folder / "tokenizer.json",
        work=folder / "work",
        shortlist=folder / "shortlist.npz",
    )
    return folder / "int8", [s[:80] for s in en[:48]]


@pytest.fixture
def command():
    """Start `Command`s; whatever a failing test leaves running is killed after it."""
    started: list[Command] = []
    yield lambda *args, **kw: started.append(Command(*args, **kw)) or started[-1]
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
