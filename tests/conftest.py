"""Fixtures every folder uses, and the hooks that print the fault and fuzz counts. Tests use small
slices of the Multi30k copy in ../shared/data (never a network); what they share that is not a
fixture is in tests/helpers/. A folder's own fixtures are in its conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import SUMMARY, SmokeStore, _data_dir, count


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: its counts go to the controller
        workeroutput["fault_and_fuzz_counts"] = dict(SUMMARY)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # pytest-xdist's controller, as each worker ends
    for name, value in getattr(node, "workeroutput", {}).get("fault_and_fuzz_counts", {}).items():
        count(name, value)


def pytest_terminal_summary(terminalreporter):
    if SUMMARY:
        terminalreporter.section("fault and fuzz counts")
        for name, value in SUMMARY.items():
            terminalreporter.write_line(f"{name}: {value}")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return _data_dir()


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # Test models are tiny: a second intra-op thread only adds waiting, and on a busy 2-core
    # machine PyTorch's spinning thread pool makes them crawl. Restored after each test.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _env(monkeypatch, data_dir, tmp_path):
    monkeypatch.setenv("PIPELINE_DATA", str(data_dir))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))  # never touch the user's cache


@pytest.fixture(scope="session")
def smoke(tmp_path_factory) -> SmokeStore:
    os.environ.setdefault("PIPELINE_DATA", str(_data_dir()))
    return SmokeStore(tmp_path_factory.mktemp("smoke-store"))


# The smoke recipe's export artifact, unpruned (tests/export/test_onnx_export.py has a fixture of
# its own by this name: a module's fixture overrides this one there).
@pytest.fixture(scope="module")
def exported(smoke):
    _, arts = smoke.build("export", "prune=null")
    return arts["export.student"]
