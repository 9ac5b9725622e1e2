"""`mt-runtime serve PACKAGE`: translate over HTTP with a package, with dynamic batching.

JSON in and out (docs/serving.md): POST /translate {"text": "..."} or {"texts": [...], "beam": 4}
-> {"translations": [...], "beam": 4}; GET /healthz (the process is alive), GET /readyz (the
package is loaded and the workers run; 503 while loading or draining), GET /info (the package by
name and digest, never its path; the limits and counts).

Requests are cut into sentences that wait in one queue; each worker thread owns a Translator and
takes up to --batch-size sentences at a time, waiting at most --max-wait-ms after the first of them
arrived for more to come while requests come concurrently (Workers). A package gives a sentence the
same translation in any batch (docs/package-format.md), so batching never changes an answer. The
queue is bounded: a request whose sentences would take the sentences accepted and not yet answered
past --queue is refused at once with 503 and Retry-After, and so is every request while loading or
draining.

On SIGTERM or SIGINT the server drains: readiness turns false, new requests get 503, every accepted
request is answered, then the listener closes and the process exits 0 (1 if --shutdown-timeout
passed first or a second signal came). The HTTP side is aiohttp (docs/decisions.md, issue 51);
connections are accepted and watched by serve_limits (a cap, idle/header timeouts, a budget of
body bytes across all connections that read_body takes from), and every request's Host header is
checked (issue 57). The command line is serve_settings, the batching serve_workers.

Torch-free: onnxruntime, tokenizers and NumPy through the runtime, and aiohttp (the `serve`
extra); it imports the runtime relatively, as the runtime's own files do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

try:
    from aiohttp import web
    from aiohttp.http_exceptions import HttpProcessingError
except ImportError:  # the `serve` extra is not installed: main() says so in one line
    web = None

from .layout import PACKAGE_JSON
from .registry import open_translator
from .serve_limits import (
    Budget,
    Connections,
    Listener,
    allowed_hosts,
    default_max_connections,
    host_allowed,
    printable,
)
from .serve_settings import Limits, Settings, parser, settings_from
from .serve_workers import Workers
from .translator import Translator

__all__ = ["Limits", "Service", "Settings", "main", "make_app", "parse_request", "serve", "settings_from"]

log = logging.getLogger("mt_runtime.serve")


class ClientError(Exception):
    """A request the server will not run: its status, a short code and one line; `close` ends
    the connection with the answer (a body that stopped coming)."""

    def __init__(self, status: int, code: str, message: str, retry_after: int | None = None, close: bool = False):
        super().__init__(message)
        self.status, self.code, self.retry_after, self.close = status, code, retry_after, close

    def response(self) -> web.Response:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        response = _json({"error": str(self), "code": self.code}, self.status, headers)
        if self.close:
            response.force_close()
        return response


def _json(body: dict, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers, dumps=lambda o: json.dumps(o, ensure_ascii=False))


# ----------------------------------------------------------------------------------------- requests
def parse_request(raw: bytes, limits: Limits, default_beam: int) -> tuple[list[str], int]:
    """The texts and beam of a /translate body, or a ClientError naming what is wrong."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ClientError(400, "not_json", "the body is not UTF-8") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, digits past int's limit, nesting
        raise ClientError(400, "not_json", f"the body is not JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise ClientError(400, "bad_request", 'the body must be a JSON object: {"text": "..."} or {"texts": [...]}')
    unknown = sorted(set(body) - {"text", "texts", "beam"})
    if unknown:
        raise ClientError(400, "bad_request", f"unknown field {unknown[0][:100]!r}: the fields are text, texts, beam")
    if ("text" in body) == ("texts" in body):
        raise ClientError(400, "bad_request", 'give either "text" (a string) or "texts" (a list of strings)')
    if "text" in body:
        texts = [body["text"]]
        if not isinstance(texts[0], str):
            raise ClientError(400, "bad_request", f'"text" must be a string, not {_kind(texts[0])}')
    else:
        texts = body["texts"]
        if not isinstance(texts, list):
            raise ClientError(400, "bad_request", f'"texts" must be a list of strings, not {_kind(texts)}')
        if len(texts) > limits.max_texts:
            raise ClientError(413, "too_many_texts", f"{len(texts)} texts: at most {limits.max_texts} a request")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ClientError(400, "bad_request", f'"texts"[{i}] must be a string, not {_kind(text)}')
        if len(text) > limits.max_chars:
            raise ClientError(413, "text_too_long", f"text {i} has {len(text)} characters: at most {limits.max_chars}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ClientError(400, "bad_request", f"text {i} holds a lone surrogate (not Unicode text)") from None
    beam = body.get("beam", default_beam)
    if not isinstance(beam, int) or isinstance(beam, bool) or not 1 <= beam <= limits.max_beam:
        raise ClientError(
            400, "bad_beam", f'"beam" must be an integer from 1 to {limits.max_beam}, not {json.dumps(beam)[:50]}'
        )
    return texts, beam


def _kind(value) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------------------------- service
class Service:
    """The state the handlers share: loading -> ready -> draining (or failed), the count of
    sentences accepted and not yet answered, and the workers."""

    def __init__(self, settings: Settings, make_translator: Callable[[], Translator] | None = None):
        self.settings, self.limits = settings, settings.limits
        self.workers = Workers(
            make_translator
            or (lambda: open_translator(settings.package, threads=settings.threads, processes=settings.processes)),
            settings.workers,
            settings.batch_size,
            settings.max_wait_ms,
        )
        self.state, self.error = "loading", None
        self.pending = 0
        self.counts = {"accepted": 0, "answered": 0, "overloaded": 0}  # requests
        self.default_beam = 1
        self.about: dict = {}
        self.budget = Budget(settings.http.max_inflight_bytes)  # request bodies held, all connections
        self.hosts = allowed_hosts(settings.host, settings.http.allowed_hosts)
        self.connections: Connections | None = None  # serve() sets it; not behind aiohttp's test server

    async def load(self) -> None:
        try:
            await self.workers.start()
        except Exception as exc:
            self.state, self.error = "failed", _one_line(exc)
            raise
        first = self.workers.translators[0]
        self.default_beam = min(first.generation.beam, self.limits.max_beam)
        described = first.describe()
        digest = hashlib.sha256((self.settings.package / PACKAGE_JSON).read_bytes()).hexdigest()
        self.about = {  # what the package is, never where it lies on this disk
            "package": {
                "name": self.settings.package.resolve().name,
                "variant": described.get("variant"),
                "src_lang": first.package.get("src_lang"),
                "tgt_lang": first.package.get("tgt_lang"),
                "sha256": digest,  # of package.json, which holds every other file's
            },
            "variant": described.get("variant"),
            "onnxruntime": described.get("onnxruntime"),
            "default_beam": self.default_beam,
        }
        if self.state == "loading":  # not when a signal came while loading
            self.state = "ready"

    def admit(self, n: int) -> None:
        if self.state != "ready":
            code = {"loading": "loading", "draining": "shutting_down"}.get(self.state, "unavailable")
            message = {"loading": "the package is loading", "draining": "the server is shutting down"}.get(
                self.state, "the package did not load"
            )
            raise ClientError(503, code, message, retry_after=1)
        if self.pending + n > self.settings.queue:
            self.counts["overloaded"] += 1
            raise ClientError(
                503,
                "overloaded",
                f"the queue is full ({self.pending} of {self.settings.queue} "
                f"sentences waiting): retry later or elsewhere",
                retry_after=1,
            )
        self.pending += n
        self.counts["accepted"] += 1

    def release(self, n: int) -> None:
        self.pending -= n

    async def translate(self, texts: list[str], beam: int) -> list[str]:
        self.admit(len(texts))
        try:
            answers = list(await asyncio.gather(*self.workers.submit(texts, beam)))
        finally:
            self.release(len(texts))
        self.counts["answered"] += 1
        return answers

    def readiness(self) -> dict:
        return {
            "ready": self.state == "ready",
            "state": self.state,
            "pending": self.pending,
            "queue": self.settings.queue,
            **({"error": self.error} if self.error else {}),
        }


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


async def read_body(request: web.Request, service: Service, hold) -> bytes:
    """A request's body, read as it comes within --body-timeout, its bytes taken from the
    budget of bodies held across all connections before they are held: the announced length at
    once (refused unread when it does not fit), what comes past it (chunked, decompressed) as it
    comes. A ClientError says which limit it met."""
    limits, budget = service.limits, service.budget
    length = request.content_length
    if length is not None and length > limits.max_bytes:
        raise ClientError(413, "body_too_large", f"the body has {length} bytes: at most {limits.max_bytes}")
    chunks, got = [], 0
    try:
        try:
            async with asyncio.timeout(service.settings.http.body_timeout):
                if length and not hold.take(length):
                    raise _inflight_full(budget)
                while chunk := await request.content.readany():
                    got += len(chunk)
                    if got > limits.max_bytes:
                        raise ClientError(413, "body_too_large", f"the body has more than {limits.max_bytes} bytes")
                    if got > hold.n and not hold.take(got - hold.n):
                        raise _inflight_full(budget)
                    chunks.append(chunk)
        except TimeoutError:
            message = f"the body did not arrive within {service.settings.http.body_timeout:g} s (--body-timeout)"
            raise ClientError(408, "body_timeout", message, close=True) from None
        except ConnectionError:  # the client went away mid-body: nobody reads the answer, nothing to log
            raise ClientError(400, "incomplete_body", "the connection closed before the body ended") from None
    except BaseException:
        chunks.clear()  # now, not when the traceback that holds this frame is collected
        raise
    return b"".join(chunks)


def _inflight_full(budget: Budget) -> ClientError:
    return ClientError(
        503,
        "inflight_bytes",
        f"request bodies being received fill the server's budget ({budget.used} of {budget.limit} bytes, "
        "--max-inflight-bytes): retry later",
        retry_after=1,
    )


def make_app(service: Service) -> web.Application:
    """The aiohttp application: routes, JSON errors for every 4xx, a line per request if asked."""

    @web.middleware
    async def errors(request: web.Request, handler):
        started = time.perf_counter()
        if service.connections is not None:
            service.connections.started(request.transport)
        try:
            host = request.headers.get("Host")
            if not host_allowed(host, service.hosts):
                raise ClientError(
                    421,
                    "host_not_allowed",
                    f"the Host header {printable(host or '(none)', 100)!r} is not served here: "
                    f"{', '.join(sorted(service.hosts))} are (--allowed-host)",
                )
            response = await handler(request)
        except ClientError as exc:
            response = exc.response()
        except web.HTTPException as exc:  # 404, 405, 413 from aiohttp itself
            response = _json(
                {"error": exc.reason, "code": exc.reason.lower().replace(" ", "_")},
                exc.status,
                {k: v for k, v in exc.headers.items() if k == "Allow"},
            )
        except Exception:
            log.exception("%s %s failed", printable(request.method, 20), printable(request.path))
            response = _json({"error": "internal error (logged by the server)", "code": "internal"}, 500)
        if service.state == "draining":
            response.force_close()  # a kept-alive connection ends with this answer
        if service.settings.access_log:  # the path as Python escapes it: no control byte reaches the log
            log.info(
                "%s %s %d %.1f ms",
                printable(request.method, 20),
                printable(request.path),
                response.status,
                (time.perf_counter() - started) * 1000,
            )
        if service.connections is not None:
            service.connections.finished(request.transport, request.content)
        return response

    async def translate(request: web.Request) -> web.Response:
        with service.budget.hold() as hold:  # given back once the body is parsed
            raw = await read_body(request, service, hold)
            texts, beam = parse_request(raw, service.limits, service.default_beam)
            del raw
        if not texts:
            return _json({"translations": [], "beam": beam})
        try:
            translations = await service.translate(texts, beam)
        except ClientError:
            raise
        except Exception as exc:  # noqa: BLE001 (the worker's error, logged once, answered as a 500)
            log.error("translation failed for %d texts: %s: %s", len(texts), type(exc).__name__, _one_line(exc))
            raise ClientError(500, "translation_failed", "translation failed (logged by the server)") from None
        return _json({"translations": translations, "beam": beam})

    async def healthz(request: web.Request) -> web.Response:
        return _json({"alive": True, "state": service.state})

    async def readyz(request: web.Request) -> web.Response:
        body = service.readiness()
        return _json(body, 200 if body["ready"] else 503)

    async def info(request: web.Request) -> web.Response:
        s = service.settings
        return _json(
            {
                **service.about,
                "state": service.state,
                "limits": dataclasses.asdict(s.limits),
                "batch_size": s.batch_size,
                "max_wait_ms": s.max_wait_ms,
                "queue": s.queue,
                "workers": s.workers,
                "threads": s.threads,
                "processes": s.processes,
                "requests": service.counts,
                "batches": service.workers.batches,
                "sentences": service.workers.sentences,
                "http": {
                    **{k: v for k, v in dataclasses.asdict(s.http).items() if k != "allowed_hosts"},
                    "max_connections": service.connections.max if service.connections else None,
                    "inflight_bytes": service.budget.used,
                    "inflight_refused": service.budget.refused,
                    "connections": service.connections.describe() if service.connections else None,
                },
            }
        )

    app = web.Application(middlewares=[errors], client_max_size=service.limits.max_bytes)
    app.router.add_post("/translate", translate)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/info", info)
    return app


# ------------------------------------------------------------------------------------------------ run
class _NoParseTracebacks(logging.Filter):
    """aiohttp logs a malformed HTTP request with its traceback: one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], HttpProcessingError):
            record.msg, record.args = printable(f"{record.getMessage()}: {_one_line(record.exc_info[1])}", 300), ()
            record.exc_info = record.exc_text = None
        return True


async def serve(settings: Settings, make_translator: Callable[[], Translator] | None = None) -> int:
    """Listen, load the package, serve until SIGTERM/SIGINT, drain; the exit code."""
    service, http = Service(settings, make_translator), settings.http
    runner = web.AppRunner(
        make_app(service),
        access_log=None,
        handle_signals=False,
        shutdown_timeout=5.0,
        keepalive_timeout=http.idle_timeout + http.header_timeout,  # a backstop: the guard's comes first
        lingering_time=http.body_timeout,  # a body refused unread is read and dropped this long at most
    )
    await runner.setup()
    # Connections are accepted and watched by serve_limits, not aiohttp's sites (docs/decisions.md).
    connections = Connections(runner.server, http, http.max_connections or default_max_connections())
    try:
        listener = Listener(settings.host, settings.port, connections)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", settings.host, settings.port, exc.strerror or exc)
        await runner.cleanup()
        return 1
    service.connections = connections
    connections.start()
    listener.start()
    host, port = listener.address
    log.info("listening on http://%s:%d, loading %s", f"[{host}]" if ":" in host else host, port, settings.package)

    loop = asyncio.get_running_loop()
    signals: list[int] = []
    stop = asyncio.Event()

    def on_signal(number: int) -> None:
        signals.append(number)
        stop.set()
        if len(signals) == 1:
            service.state = "draining" if service.state != "failed" else service.state
            log.info(
                "%s: draining (%d sentences accepted and unanswered)", signal.Signals(number).name, service.pending
            )
        else:
            log.warning("%s again: exiting without waiting", signal.Signals(number).name)

    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, on_signal, number)
    loading = asyncio.create_task(service.load())

    def loaded(task: asyncio.Task) -> None:
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error("cannot load %s: %s", settings.package, service.error)
            stop.set()
        elif service.state == "ready":
            log.info(
                "ready: %d worker(s) x %s%d onnxruntime thread(s), batches of up to %d sentences gathered "
                "for up to %g ms, queue %d sentences; at most %d connections, %d body bytes held",
                settings.workers,
                f"{settings.processes} process(es) x " if settings.processes else "",
                settings.threads,
                settings.batch_size,
                settings.max_wait_ms,
                settings.queue,
                connections.max,
                http.max_inflight_bytes,
            )

    loading.add_done_callback(loaded)
    await stop.wait()
    failed = service.state == "failed"
    code = 1 if failed else await _drain(service, settings, signals)
    listener.close()
    await runner.cleanup()
    connections.stop()
    if loading.done() and code == 0:
        service.workers.stop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(number)
    log.info(
        "stopped (exit %d): %d requests accepted, %d answered, %d refused as overloaded",
        code,
        service.counts["accepted"],
        service.counts["answered"],
        service.counts["overloaded"],
    )
    return code


async def _drain(service: Service, settings: Settings, signals: list[int]) -> int:
    """Readiness false for at least drain_seconds, and until every accepted sentence is answered
    (or shutdown_timeout passes, or a second signal comes); 0 when all were answered."""
    started = time.monotonic()
    while (
        len(signals) < 2
        and time.monotonic() - started < settings.shutdown_timeout
        and (service.pending or time.monotonic() - started < settings.drain_seconds)
    ):
        await asyncio.sleep(0.02)
    if service.pending:
        log.error("exiting with %d accepted sentences unanswered", service.pending)
        return 1
    return 0


def run(args) -> int:
    """`mt-runtime serve` with its parsed command line (mt_runtime/cli.py)."""
    if web is None:
        sys.exit("mt-runtime: serving needs aiohttp: pip install 'mt-runtime[serve]' (or 'aiohttp>=3.9,<4')")
    settings = settings_from(args, args.subparser)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s mt-runtime %(message)s")
    logging.getLogger("aiohttp.server").addFilter(_NoParseTracebacks())
    code = asyncio.run(serve(settings))
    if code or threading.active_count() > 1:  # a worker may still be inside onnxruntime (loading, or a
        logging.shutdown()  # second signal): do not wait for it, nor let finalization
        os._exit(code)  # pull the interpreter from under it
    return code


def main(argv: list[str] | None = None) -> None:
    """`python -m mt_runtime.serve serve PACKAGE ...`: serve alone (`mt-runtime` is mt_runtime/cli.py)."""
    sys.exit(run(parser().parse_args(argv)))


if __name__ == "__main__":
    main()
