"""`mt-runtime serve` in tests: its settings, the service behind aiohttp's test server, a POST,
and the command in a subprocess with its log read as it comes (fixtures: tests/server/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import subprocess
import sys
import threading

import pytest

from tests.helpers import REPO

aiohttp = pytest.importorskip("aiohttp")
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402
from mt_runtime.serve import Service, Settings, make_app  # noqa: E402


def settings(package, **kw) -> Settings:
    return Settings(package, workers=kw.pop("workers", 1), threads=1, batch_size=kw.pop("batch_size", 8), **kw)


@contextlib.asynccontextmanager
async def served(service: Service, load: bool = True):
    """The service behind aiohttp's test server on a loopback port; workers stopped after."""
    async with TestClient(TestServer(make_app(service))) as client:
        loading = asyncio.create_task(service.load())
        if load:
            await loading
        try:
            yield client, loading
        finally:
            await asyncio.wait([loading], timeout=30)
            service.workers.stop()


async def post(client, body, **kw):
    data = json.dumps(body) if isinstance(body, dict) else body
    r = await client.post("/translate", data=data, **kw)
    return r.status, await r.json(), r


class Command:
    """`python -m mt_runtime.serve serve PACKAGE --port 0 ...` with its log read as it comes; this
    checkout's runtime on its path; `nofile`: its descriptor limit."""

    def __init__(self, *args: str, nofile: int | None = None):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mt_runtime.serve", "serve", *args, "--port", "0"],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "model" / "runtime"), str(REPO)])},
        )
        self.lines: list[str] = []
        self.listening = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            if m := re.search(r"listening on (http://\S+),", line):
                self.url = m.group(1)
                self.listening.set()
        self.listening.set()

    def wait(self, timeout=60) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self.process.kill()
            self.reader.join(5)

    @property
    def log(self) -> str:
        return "\n".join(self.lines)
