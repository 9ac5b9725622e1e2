"""`mt-runtime serve`'s settings and its command line (docs/serving.md has the flags' table).

Standard library only: the command line answers --help without aiohttp installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from .layout import PACKAGE_JSON
from .serve_limits import HttpLimits, default_max_connections


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
    threads: int = 1  # onnxruntime intra-op threads of each worker's Translator (of each of its processes)
    batch_size: int = 32
    max_wait_ms: float = 5.0
    queue: int = 256  # sentences accepted and not yet answered
    limits: Limits = Limits()
    drain_seconds: float = 0.0  # after SIGTERM, readiness false this long before the listener closes
    shutdown_timeout: float = 60.0
    access_log: bool = False
    http: HttpLimits = HttpLimits()  # what all clients together may hold (serve_limits.py)
    processes: int = 0  # child processes of each worker searching its batches (0: the worker's own thread)


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_NAMES = {int: "a whole number", float: "a number"}


def positive(kind):
    """An argparse type: a number of `kind` above 0, or one line saying what was given."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {_NAMES[kind]} above 0, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


def _hosts(text: str) -> list[str]:
    hosts = [h.strip() for h in text.split(",") if h.strip()]
    if not hosts:
        raise argparse.ArgumentTypeError("give a host name, a comma list of them, or *")
    return hosts


class OneLineParser(argparse.ArgumentParser):
    """A usage error in one line, as every other error of the command (argparse prints the usage
    first); exit 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    """`mt-runtime serve` alone, as `python -m mt_runtime.serve serve PACKAGE` runs it; the whole
    command (serve and translate) is mt_runtime/cli.py's."""
    top = OneLineParser(prog="mt-runtime", description="Translate with an ONNX translation package.")
    add_serve(top.add_subparsers(dest="command", required=True))
    return top


def add_serve(commands) -> argparse.ArgumentParser:
    """`mt-runtime serve`'s parser, added to the command's subcommands."""
    p = commands.add_parser(
        "serve",
        help="serve a package over HTTP (JSON; docs/serving.md)",
        description="Serve a package over HTTP: POST /translate, GET /healthz, /readyz, /info.",
    )
    d, limits, http = Settings(Path()), Limits(), HttpLimits()
    p.add_argument("package", type=Path, help="the package folder")
    p.add_argument("--host", default=d.host, help="address to listen on (default %(default)s; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=d.port, help="port (default %(default)s; 0: any free one, logged)")
    p.add_argument(
        "--workers",
        type=positive(int),
        default=None,
        help="worker threads, each with its own copy of the model (default 1: it served more than "
        "one a core, docs/serving.md)",
    )
    p.add_argument(
        "--threads",
        type=positive(int),
        default=None,
        help="threads of each worker, its batches split among them (default: the cores, divided among the workers)",
    )
    p.add_argument(
        "--processes",
        type=positive(int),
        default=None,
        help="child processes of each worker that search its batches, each with --threads threads (default: "
        "none, the worker's own thread); they share no interpreter lock (docs/serving.md, Using the cores)",
    )
    p.add_argument(
        "--batch-size",
        type=positive(int),
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
        type=positive(int),
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
            type=positive(int),
            default=getattr(limits, field),
            help=what + " (default %(default)s)",
        )
    p.add_argument(
        "--max-inflight-bytes",
        type=positive(int),
        default=http.max_inflight_bytes,
        help="request bodies held at once, all connections together; a request past it gets 503 before "
        "its body is read (default %(default)s)",
    )
    p.add_argument(
        "--max-connections",
        type=positive(int),
        default=None,
        help="open connections; past it the longest-idle one is closed, or the new one gets 503 (default: "
        f"the descriptor limit less an eighth, at most 1024: {default_max_connections()} here)",
    )
    for field, what in (
        ("idle_timeout", "close a connection with no request under way after this many seconds"),
        ("header_timeout", "seconds from a request's first byte to the end of its headers, else 408"),
        ("body_timeout", "seconds from the end of a request's headers to the end of its body, else 408"),
    ):
        p.add_argument(
            "--" + field.replace("_", "-"),
            type=positive(float),
            default=getattr(http, field),
            help=what + " (default %(default)s)",
        )
    p.add_argument(
        "--allowed-host",
        type=_hosts,
        action="extend",
        default=None,
        metavar="HOST",
        help="a Host header name served (any port; name:port for one), repeatable or a comma list, * for any; "
        "others get 421 (default: localhost, 127.0.0.1, [::1] when --host is a loopback address, else any)",
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
    p.add_argument(
        "--access-log", action="store_true", help="log one line per request (the path escaped: no control bytes)"
    )
    p.set_defaults(subparser=p)
    return p


def settings_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Settings:
    """The settings the command line asks for; a bad combination exits 2 with one line."""
    workers = args.workers or 1
    # Every core, divided among the workers: since threads split batches into shards, 2 threads
    # on 2 cores served 1.3-1.6x what 1 did at 8 and 64 clients and the same to one client, the
    # event loop and the load test's clients on the same cores (docs/serving.md, "Using the cores").
    processes = args.processes or 0
    threads = args.threads or max(1, cores() // (workers * max(1, processes)))
    if args.max_texts > args.queue:
        parser.error(f"--max-texts ({args.max_texts}) must not exceed --queue ({args.queue})")
    if args.max_bytes > args.max_inflight_bytes:
        parser.error(f"--max-bytes ({args.max_bytes}) must not exceed --max-inflight-bytes ({args.max_inflight_bytes})")
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
        HttpLimits(
            max_inflight_bytes=args.max_inflight_bytes,
            max_connections=args.max_connections,
            idle_timeout=args.idle_timeout,
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            allowed_hosts=tuple(args.allowed_host) if args.allowed_host else None,
        ),
        processes,
    )
