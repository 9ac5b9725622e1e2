"""`mt-runtime serve PACKAGE`: translate over HTTP with a package, with dynamic batching.

JSON in and out (docs/serving.md): POST /translate {"text": "..."} or {"texts": [...], "beam": 4}
-> {"translations": [...], "beam": 4}; GET /healthz (the process is alive), GET /readyz (the
package is loaded and the workers run; 503 while loading or draining), GET /info (the package and
the limits).

Requests are cut into sentences that wait in one queue; each worker thread owns a Translator and
takes up to --batch-size sentences at a time, waiting at most --max-wait-ms after the first of them
arrived for more to come while requests come concurrently (Workers). A package gives a sentence the
same translation in any batch (docs/package-format.md), so batching never changes an answer. The
queue is bounded: a request whose sentences would take the sentences accepted and not yet answered
past --queue is refused at once with 503 and Retry-After, and so is every request while loading or
draining.

On SIGTERM or SIGINT the server drains: readiness turns false, new requests get 503, every accepted
request is answered, then the listener closes and the process exits 0 (1 if --shutdown-timeout
passed first or a second signal came). The HTTP side is aiohttp (docs/decisions.md, issue 51).

Torch-free: onnxruntime, tokenizers and NumPy through the runtime, and aiohttp (the `serve`
extra); it imports the runtime relatively, as the runtime's own files do.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

try:
    from aiohttp import web
    from aiohttp.http_exceptions import HttpProcessingError
except ImportError:  # the `serve` extra is not installed: main() says so in one line
    web = None

from .layout import PACKAGE_JSON
from .translator import Translator

log = logging.getLogger("mt_runtime.serve")


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may hold; beyond it, a 4xx that says which limit."""

    max_bytes: int = 1 << 20  # the body
    max_texts: int = 64  # sentences in one request
    max_chars: int = 2000  # characters in one sentence
    max_beam: int = 8


@dataclasses.dataclass(frozen=True)
class Settings:
    package: Path
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    threads: int = 1  # onnxruntime intra-op threads of each worker's Translator
    batch_size: int = 32
    max_wait_ms: float = 5.0
    queue: int = 256  # sentences accepted and not yet answered
    limits: Limits = Limits()
    drain_seconds: float = 0.0  # after SIGTERM, readiness false this long before the listener closes
    shutdown_timeout: float = 60.0
    access_log: bool = False


class ClientError(Exception):
    """A request the server will not run: its status, a short code and one line."""

    def __init__(self, status: int, code: str, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.code, self.retry_after = status, code, retry_after

    def response(self) -> web.Response:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return _json({"error": str(self), "code": self.code}, self.status, headers)


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


# ---------------------------------------------------------------------------------- batching workers
class _Sentence:
    __slots__ = ("arrived", "beam", "future", "request", "text")

    def __init__(self, text: str, beam: int, future: asyncio.Future, request: int):
        self.text, self.beam, self.future, self.request, self.arrived = text, beam, future, request, time.monotonic()


class Workers:
    """Worker threads, each with its own Translator, taking sentences from one queue in batches
    of up to batch_size. A worker whose previous batch held several requests' sentences (requests
    come concurrently) gathers until max_wait after the first sentence arrived (one that waited
    that long already goes at once with what is there); one whose previous batch came from a
    single request takes what is queued and goes, since waiting would only delay a lone client.
    Sentences that arrive while every worker is busy make the next batches whatever the wait.
    Answers go back to the event loop's futures."""

    def __init__(self, make_translator: Callable[[], Translator], workers: int, batch_size: int, max_wait_ms: float):
        self.make_translator, self.count = make_translator, workers
        self.batch_size, self.max_wait = batch_size, max_wait_ms / 1000
        self.queue: queue.SimpleQueue[_Sentence | None] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.translators: list[Translator] = []
        self.requests = itertools.count()
        self.batches = self.sentences = 0  # translated, counted on the event loop

    async def start(self) -> None:
        """Load a Translator in each worker thread and start them; raises what loading raised."""
        loop = asyncio.get_running_loop()
        loaded = [loop.create_future() for _ in range(self.count)]
        for i in range(self.count):
            thread = threading.Thread(target=self._run, args=(loop, loaded[i]), name=f"mt-worker-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)
        self.translators = list(await asyncio.gather(*loaded))

    def submit(self, texts: list[str], beam: int) -> list[asyncio.Future]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in texts]
        request = next(self.requests)
        for text, future in zip(texts, futures):
            self.queue.put(_Sentence(text, beam, future, request))
        return futures

    def stop(self, timeout: float = 10.0) -> None:
        for _ in self.threads:
            self.queue.put(None)
        for thread in self.threads:
            thread.join(timeout)

    def _run(self, loop: asyncio.AbstractEventLoop, loaded: asyncio.Future) -> None:
        try:
            translator = self.make_translator()
            for beam in sorted({1, translator.generation.beam}):  # onnxruntime's first runs allocate
                translator.translate(["warm up"], beam=beam)
                translator.translate(["warm", "up"], beam=beam)
        except Exception as exc:  # noqa: BLE001 (handed to the event loop, which says it in one line)
            loop.call_soon_threadsafe(_settle, loaded, None, exc)
            return
        loop.call_soon_threadsafe(_settle, loaded, translator, None)
        concurrent = False
        while (batch := self._gather(concurrent)) is not None:
            concurrent = len({s.request for s in batch}) > 1
            batch = [s for s in batch if not s.future.cancelled()]
            for beam in sorted({s.beam for s in batch}):
                group = [s for s in batch if s.beam == beam]
                try:
                    texts = [s.text for s in group]
                    out, error = translator.translate(texts, beam=beam, max_batch=self.batch_size), None
                except Exception as exc:  # noqa: BLE001 (answered as a 500 to the requests of this batch)
                    out, error = [None] * len(group), exc
                loop.call_soon_threadsafe(self._answer, [s.future for s in group], out, error)

    def _gather(self, wait: bool) -> list[_Sentence] | None:
        first = self.queue.get()
        if first is None:
            return None
        batch, deadline = [first], first.arrived + (self.max_wait if wait else 0.0)
        while len(batch) < self.batch_size:
            left = deadline - time.monotonic()
            try:
                item = self.queue.get(timeout=left) if left > 0 else self.queue.get_nowait()
            except queue.Empty:
                break
            if item is None:  # stopping: leave the sign for this worker's next turn
                self.queue.put(None)
                break
            batch.append(item)
        return batch

    def _answer(self, futures: list[asyncio.Future], values: list, error: BaseException | None) -> None:
        """On the event loop: one batch's answers to its futures, and the batch counted."""
        self.batches += 1
        self.sentences += len(futures)
        for future, value in zip(futures, values):
            _settle(future, value, error)


def _settle(future: asyncio.Future, value, error: BaseException | None) -> None:
    if not future.done():
        future.set_exception(error) if error is not None else future.set_result(value)


# --------------------------------------------------------------------------------------------- service
class Service:
    """The state the handlers share: loading -> ready -> draining (or failed), the count of
    sentences accepted and not yet answered, and the workers."""

    def __init__(self, settings: Settings, make_translator: Callable[[], Translator] | None = None):
        self.settings, self.limits = settings, settings.limits
        self.workers = Workers(
            make_translator or (lambda: Translator(settings.package, threads=settings.threads)),
            settings.workers,
            settings.batch_size,
            settings.max_wait_ms,
        )
        self.state, self.error = "loading", None
        self.pending = 0
        self.counts = {"accepted": 0, "answered": 0, "overloaded": 0}  # requests
        self.default_beam = 1
        self.about: dict = {}

    async def load(self) -> None:
        try:
            await self.workers.start()
        except Exception as exc:
            self.state, self.error = "failed", _one_line(exc)
            raise
        first = self.workers.translators[0]
        self.default_beam = min(first.generation.beam, self.limits.max_beam)
        described = first.describe()
        self.about = {
            "package": str(self.settings.package),
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


def make_app(service: Service) -> web.Application:
    """The aiohttp application: routes, JSON errors for every 4xx, a line per request if asked."""

    @web.middleware
    async def errors(request: web.Request, handler):
        started = time.perf_counter()
        try:
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
            log.exception("%s %s failed", request.method, request.path)
            response = _json({"error": "internal error (logged by the server)", "code": "internal"}, 500)
        if service.state == "draining":
            response.force_close()  # a kept-alive connection ends with this answer
        if service.settings.access_log:
            log.info(
                "%s %s %d %.1f ms",
                request.method,
                request.path,
                response.status,
                (time.perf_counter() - started) * 1000,
            )
        return response

    async def translate(request: web.Request) -> web.Response:
        limits = service.limits
        if request.content_length is not None and request.content_length > limits.max_bytes:
            raise ClientError(
                413, "body_too_large", f"the body has {request.content_length} bytes: at most {limits.max_bytes}"
            )
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ClientError(413, "body_too_large", f"the body has more than {limits.max_bytes} bytes") from None
        except ConnectionError:  # the client went away mid-body: nobody reads the answer, nothing to log
            raise ClientError(400, "incomplete_body", "the connection closed before the body ended") from None
        texts, beam = parse_request(raw, limits, service.default_beam)
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
                "requests": service.counts,
                "batches": service.workers.batches,
                "sentences": service.workers.sentences,
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
            record.msg, record.args = f"{record.getMessage()}: {_one_line(record.exc_info[1])}", ()
            record.exc_info = record.exc_text = None
        return True


async def serve(settings: Settings, make_translator: Callable[[], Translator] | None = None) -> int:
    """Listen, load the package, serve until SIGTERM/SIGINT, drain; the exit code."""
    service = Service(settings, make_translator)
    runner = web.AppRunner(make_app(service), access_log=None, handle_signals=False, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", settings.host, settings.port, exc.strerror or exc)
        await runner.cleanup()
        return 1
    host, port = runner.addresses[0][:2]
    log.info("listening on http://%s:%d, loading %s", host, port, settings.package)

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
                "ready: %d worker(s) x %d onnxruntime thread(s), batches of up to %d sentences gathered "
                "for up to %g ms, queue %d sentences",
                settings.workers,
                settings.threads,
                settings.batch_size,
                settings.max_wait_ms,
                settings.queue,
            )

    loading.add_done_callback(loaded)
    await stop.wait()
    failed = service.state == "failed"
    code = 1 if failed else await _drain(service, settings, signals)
    await runner.cleanup()
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


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mt-runtime", description="Translate with an ONNX translation package.")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser(
        "serve",
        help="serve a package over HTTP (JSON; docs/serving.md)",
        description="Serve a package over HTTP: POST /translate, GET /healthz, /readyz, /info.",
    )
    d, limits = Settings(Path()), Limits()
    p.add_argument("package", type=Path, help="the package folder")
    p.add_argument("--host", default=d.host, help="address to listen on (default %(default)s; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=d.port, help="port (default %(default)s; 0: any free one, logged)")
    p.add_argument(
        "--workers",
        type=_positive(int),
        default=None,
        help="worker threads, each with its own copy of the model (default 1: it served more than "
        "one a core, docs/serving.md)",
    )
    p.add_argument(
        "--threads",
        type=_positive(int),
        default=None,
        help="onnxruntime threads of each worker (default: the cores but one, divided among the workers)",
    )
    p.add_argument(
        "--batch-size",
        type=_positive(int),
        default=d.batch_size,
        help="most sentences translated together (default %(default)s)",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=d.max_wait_ms,
        help="under concurrent requests, how long a batch waits for more sentences after its "
        "first arrived (default %(default)s)",
    )
    p.add_argument(
        "--queue",
        type=_positive(int),
        default=d.queue,
        help="sentences accepted and not yet answered; beyond it requests get 503 (default %(default)s)",
    )
    for field, what in (
        ("max_texts", "texts in one request"),
        ("max_chars", "characters in one text"),
        ("max_bytes", "bytes in one request body"),
        ("max_beam", "largest beam a request may ask for"),
    ):
        p.add_argument(
            "--" + field.replace("_", "-"),
            type=_positive(int),
            default=getattr(limits, field),
            help=what + " (default %(default)s)",
        )
    p.add_argument(
        "--drain-seconds",
        type=float,
        default=d.drain_seconds,
        help="after SIGTERM, answer /readyz 503 at least this long before closing, so that a load "
        "balancer stops sending first (default %(default)s)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=d.shutdown_timeout,
        help="most seconds to finish accepted requests after SIGTERM (default %(default)s)",
    )
    p.add_argument("--access-log", action="store_true", help="log one line per request")
    p.set_defaults(subparser=p)
    return parser


def settings_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Settings:
    """The settings the command line asks for; a bad combination exits 2 with one line."""
    workers = args.workers or 1
    # A core for the event loop (HTTP, JSON) where there are several: on 2 cores, 1 thread against
    # 2 gave p99 at 8 clients 29-37 ms against 38-59 ms and 326-375 sentences/s against 272-283
    # (docs/serving.md).
    threads = args.threads or max(1, (cores() - 1) // workers if cores() > 1 else 1)
    if args.max_texts > args.queue:
        parser.error(f"--max-texts ({args.max_texts}) must not exceed --queue ({args.queue})")
    if args.max_wait_ms < 0 or args.drain_seconds < 0 or args.shutdown_timeout <= 0:
        parser.error("--max-wait-ms and --drain-seconds must be 0 or more, --shutdown-timeout above 0")
    if not (args.package / PACKAGE_JSON).is_file():
        parser.error(f"{args.package}: not a package folder (no {PACKAGE_JSON})")
    return Settings(
        args.package,
        args.host,
        args.port,
        workers,
        threads,
        args.batch_size,
        args.max_wait_ms,
        args.queue,
        Limits(args.max_bytes, args.max_texts, args.max_chars, args.max_beam),
        args.drain_seconds,
        args.shutdown_timeout,
        args.access_log,
    )


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if web is None:
        sys.exit("mt-runtime: serving needs aiohttp: pip install 'mt-runtime[serve]' (or 'aiohttp>=3.9,<4')")
    settings = settings_from(args, args.subparser)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s mt-runtime %(message)s")
    logging.getLogger("aiohttp.server").addFilter(_NoParseTracebacks())
    code = asyncio.run(serve(settings))
    if code or threading.active_count() > 1:  # a worker may still be inside onnxruntime (loading, or a
        logging.shutdown()  # second signal): do not wait for it, nor let finalization
        os._exit(code)  # pull the interpreter from under it


if __name__ == "__main__":
    main()
