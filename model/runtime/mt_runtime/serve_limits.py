"""What a client may hold of `mt-runtime serve`: connections, time, bytes (issue 57).

The server accepts connections itself (Listener) instead of through asyncio's create_server, and
wraps each aiohttp protocol in a _Guard that the Connections registry watches:
- at most max_connections open; past it the longest-idle connection is closed to make room, or,
  when none is idle, the new one gets a 503 written on the raw socket and is closed;
- a connection with no request under way closes after idle_timeout; from a request's first byte,
  its line and headers must arrive within header_timeout and max_header_bytes (408, 431); the
  handler holds the body to body_timeout (serve.py);
- request bodies held across all connections stay within a Budget (serve.py takes from it);
- out of descriptors (EMFILE on accept), the listener pauses a moment and says so at most once a
  second, instead of asyncio's loop that logs a traceback per try (3.11: 17,944 in 8 s).
Plus what the handlers check: the Host header, and log lines made safe to print.

Standard library only: the protocol it wraps is any asyncio protocol factory (aiohttp's web.Server).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import dataclasses
import errno
import gc
import ipaddress
import json
import logging
import resource
import socket
import time
from collections.abc import Callable

log = logging.getLogger("mt_runtime.serve")

IDLE, HEADER, REQUEST, BUSY, DRAIN = "idle", "header", "request", "busy", "drain"
READ_SIZE = 64 << 10
_OUT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


@dataclasses.dataclass(frozen=True)
class HttpLimits:
    """What all clients together may hold; docs/serving.md has the reasons for each default."""

    max_inflight_bytes: int = 64 << 20  # request bodies being received or parsed, all connections
    max_connections: int | None = None  # None: from the descriptor limit (default_max_connections)
    idle_timeout: float = 5.0  # a connection with no request under way
    header_timeout: float = 5.0  # from a request's first byte to the end of its headers
    body_timeout: float = 10.0  # from the end of the headers to the end of the body
    max_header_bytes: int = 64 << 10  # a request's line and headers
    allowed_hosts: tuple[str, ...] | None = None  # None: loopback names on a loopback address, else any


def default_max_connections() -> int:
    """Open connections the descriptor limit leaves room for: an eighth of it (at least 32) kept
    for the process's own files, threads and the listener; at most 1024 (memory, docs/serving.md)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(1, min(1024, soft - max(32, soft // 8)))


class Budget:
    """Bytes of request bodies held, across all connections; a request takes what it will hold
    before reading it and gives it back when parsed."""

    def __init__(self, limit: int):
        self.limit, self.used, self.refused = limit, 0, 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            self.refused += 1
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n

    def hold(self) -> _Hold:
        """`with budget.hold() as hold: hold.take(n)`: all it took is given back at the end."""
        return _Hold(self)


class _Hold:
    __slots__ = ("budget", "n")

    def __init__(self, budget: Budget):
        self.budget, self.n = budget, 0

    def take(self, n: int) -> bool:
        if not self.budget.take(n):
            return False
        self.n += n
        return True

    def __enter__(self) -> _Hold:
        return self

    def __exit__(self, *exc) -> None:
        self.budget.give(self.n)
        self.n = 0


# ------------------------------------------------------------------------------------ what is logged
def printable(text: str, limit: int = 200) -> str:
    """`text` safe for a one-line log: backslash, control, escape and non-ASCII characters as
    Python escapes (a %0a in a path cannot start a forged line, ESC cannot reach a terminal), at
    most `limit` characters of it."""
    escaped = text[:limit].encode("unicode_escape").decode("ascii")
    return escaped + ("..." if len(text) > limit else "")


# --------------------------------------------------------------------------------------- Host header
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def allowed_hosts(bind_host: str, given: tuple[str, ...] | None) -> frozenset[str] | None:
    """The Host names served (lowercase, IPv6 in brackets, an optional :port), None for any: the
    given ones ("*" for any), else the loopback names when bound to a loopback address (a page
    that rebinds its own name to 127.0.0.1 sends its own name), else any."""
    if given is not None:
        names = {_normal(name) for name in given}
        return None if "*" in names else frozenset(names)
    return frozenset(LOOPBACK_NAMES) if _is_loopback(bind_host) else None


def host_allowed(header: str | None, allowed: frozenset[str] | None) -> bool:
    if allowed is None:
        return True
    if not header:
        return False
    host = _normal(header)
    name = host.rsplit(":", 1)[0] if host.rsplit(":", 1)[-1].isdigit() and not host.endswith("]") else host
    return host in allowed or name in allowed


def _normal(host: str) -> str:
    host = host.strip().lower()
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).version == 6:  # a bare IPv6 address, as --allowed-host may give it
            return f"[{host}]"
    return host.rstrip(".") if not host.endswith("]") else host


def _is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# ------------------------------------------------------------------------------- refusals on the wire
def raw_response(status: int, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, for where aiohttp is not involved."""
    body = json.dumps({"error": message, "code": code}).encode()
    retry = "Retry-After: 1\r\n" if status == 503 else ""
    return (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n{retry}Connection: close\r\n\r\n"
    ).encode() + body


def _refuse_socket(sock: socket.socket, answer: bytes) -> None:
    """Answer an accepted socket and close it without a transport. What the client already sent
    is read first: closing with unread bytes would send a reset that may overtake the answer."""
    try:
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError, InterruptedError):
            sock.recv(1 << 16)
        sock.send(answer)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        sock.close()


# ------------------------------------------------------------------------------------- connections
class _Guard(asyncio.BufferedProtocol):
    """One connection: forwards everything to the aiohttp protocol it wraps, and keeps the state
    the registry's timeouts read. idle -> header (first byte) -> request (headers' end seen) ->
    busy (the handler runs, serve.py) -> idle, or drain while aiohttp reads and drops a body the
    handler refused unread."""

    __slots__ = ("conns", "deadline", "header_bytes", "inner", "payload", "since", "state", "tail", "transport")

    def __init__(self, conns: Connections):
        self.conns, self.inner = conns, conns.factory()
        self.transport: asyncio.Transport | None = None
        self.state, self.since, self.deadline = IDLE, time.monotonic(), time.monotonic() + conns.limits.idle_timeout
        self.header_bytes, self.tail, self.payload = 0, b"", None

    def connection_made(self, transport) -> None:
        # The place it took as being opened is now held as open, in the same step: a task that
        # resumes later would count it twice meanwhile (a CI run refused clients under the cap).
        self.transport = transport
        self.conns.open[transport] = self
        self.conns.accepting -= 1
        self.inner.connection_made(transport)

    def connection_lost(self, exc) -> None:
        self.conns.open.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.conns.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(memoryview(self.conns.buffer)[:nbytes]))

    def data_received(self, data: bytes) -> None:
        if self.state in (IDLE, HEADER):
            limits = self.conns.limits
            if self.state == IDLE:
                self.state, self.header_bytes, self.tail = HEADER, 0, b""
                self.deadline = time.monotonic() + limits.header_timeout
            used = _header_end(self.tail, data)
            if used < 0:
                self.header_bytes += len(data)
                self.tail = (self.tail + data[-3:])[-3:]
            else:
                self.header_bytes += used
                self.state, self.deadline = REQUEST, time.monotonic() + limits.header_timeout
            if self.header_bytes > limits.max_header_bytes:
                self.conns.counts["headers_too_large"] += 1
                self.close(
                    raw_response(
                        431, "headers_too_large", f"the request line and headers pass {limits.max_header_bytes} bytes"
                    )
                )
                return
        self.inner.data_received(data)
        if self.state == DRAIN and self.payload is not None and self.payload.is_eof():
            self.idle()

    def eof_received(self):
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def idle(self) -> None:
        self.state, self.since, self.payload = IDLE, time.monotonic(), None
        self.deadline = self.since + self.conns.limits.idle_timeout

    def close(self, answer: bytes = b"") -> None:
        """Close, with a last answer when one is given; a transport that cannot flush what it
        holds (a client that does not read) is aborted instead."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size():
            transport.abort()
            return
        if answer:
            transport.write(answer)
        transport.close()


def _header_end(tail: bytes, data: bytes) -> int:
    """How many bytes of `data` end the headers (up to their blank line), -1 if it does not end
    them; `tail`: the last bytes before `data`, where the blank line may begin."""
    at = (tail + data[:3]).find(b"\r\n\r\n")
    if at >= 0:
        return at + 4 - len(tail)
    at = data.find(b"\r\n\r\n")
    return at + 4 if at >= 0 else -1


class Connections:
    """The open connections, their cap and their deadlines; a sweep a few times a second closes
    the ones past theirs."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], limits: HttpLimits, max_connections: int):
        self.factory, self.limits, self.max = factory, limits, max_connections
        self.open: dict[asyncio.BaseTransport, _Guard] = {}
        self.accepting = 0  # accepted sockets whose transport is being made
        # Every connection reads into this one buffer (the loop reads one socket at a time): at
        # most READ_SIZE a read, where asyncio's transport takes up to 256 KiB, each piece held
        # until aiohttp's parser and the handler are done with it. 400 connections sending 1 MiB
        # each, one of them accepted: RSS +94 MB at 256 KiB a read, +31 MB at 64 KiB.
        self.buffer = bytearray(READ_SIZE)
        self.counts = dict.fromkeys(("refused", "evicted", "idle_closed", "header_timeouts", "headers_too_large"), 0)
        self.tick = min(0.5, max(0.05, min(limits.idle_timeout, limits.header_timeout, limits.body_timeout) / 5))
        self._sweeper: asyncio.Task | None = None
        self._trim = _malloc_trim()

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()

    def admit(self, sock: socket.socket) -> bool:
        """An accepted socket: served, or room made for it, or refused with a 503; False when a
        connection was closed to make room (its descriptor is freed when the loop turns)."""
        evicted = False
        if self._held() >= self.max and not (evicted := self._evict()):
            self.counts["refused"] += 1
            message = f"the server holds its most connections ({self.max}): retry later"
            _refuse_socket(sock, raw_response(503, "too_many_connections", message))
            return True
        self.accepting += 1
        asyncio.get_running_loop().create_task(self._connect(sock))
        return not evicted

    async def _connect(self, sock: socket.socket) -> None:
        guard = None
        try:
            guard = _Guard(self)
            sock.setblocking(False)
            await asyncio.get_running_loop().connect_accepted_socket(lambda: guard, sock)
        except OSError:  # the client left already
            sock.close()
        finally:
            if guard is None or guard.transport is None:  # never made: its place is given back here
                self.accepting -= 1

    def _held(self) -> int:
        """Places taken under the cap: sockets being opened and open connections not closing. A
        closing one gives its descriptor back when the loop turns; counted, it refused the client
        that came a millisecond after it (a CI run: the readiness probe's connection, closed)."""
        if len(self.open) + self.accepting < self.max:
            return len(self.open) + self.accepting
        return self.accepting + sum(1 for transport in self.open if not transport.is_closing())

    def _evict(self) -> bool:
        """Close the longest-idle connection that has waited at least a second (or half the idle
        timeout): a client between requests or that connected and said nothing."""
        least = time.monotonic() - min(1.0, self.limits.idle_timeout / 2)
        idle = [g for g in self.open.values() if g.state == IDLE and g.since <= least and not _unread(g.transport)]
        if not idle:
            return False
        oldest = min(idle, key=lambda g: g.since)
        self.open.pop(oldest.transport, None)  # its slot is free now, whenever the close completes
        oldest.close()
        self.counts["evicted"] += 1
        return True

    def started(self, transport) -> None:
        """A request's handler runs: no deadline here (serve.py's body timeout, then the queue)."""
        if (guard := self.open.get(transport)) is not None:
            guard.state, guard.deadline = BUSY, None

    def finished(self, transport, payload) -> None:
        """The handler returned: idle, or drain while aiohttp reads the body it left unread."""
        if (guard := self.open.get(transport)) is None:
            return
        guard.idle()
        if not payload.is_eof():
            guard.state, guard.payload = DRAIN, payload
            guard.deadline = time.monotonic() + self.limits.body_timeout

    async def _sweep(self) -> None:
        held = 0
        while True:
            await asyncio.sleep(self.tick)
            now = time.monotonic()
            for guard in [g for g in self.open.values() if g.deadline is not None and g.deadline < now]:
                if guard.state == HEADER:
                    self.counts["header_timeouts"] += 1
                    message = f"the request's headers did not arrive within {self.limits.header_timeout:g} s"
                    guard.close(raw_response(408, "header_timeout", message))
                else:
                    self.counts["idle_closed"] += guard.state == IDLE
                    guard.close()
            # What many connections held is freed in cycles (exceptions, aiohttp's protocol and
            # request) and in pieces glibc keeps: collect and give the pages back once most of
            # those connections are gone (400 held bodies: 237 MB kept, 169 MB with the trim
            # alone, 105 MB with both, from 101 MB before them).
            held = max(held, len(self.open))
            if held > 16 and len(self.open) <= held // 4 and self._trim is not None:
                gc.collect()
                self._trim(0)
                held = len(self.open)

    def describe(self) -> dict:
        return {"open": len(self.open), "max": self.max, **self.counts}


def _unread(transport) -> bool:
    """Whether the client sent bytes the loop has not read yet: a request waiting its turn on a
    busy loop, not an idle client (a CI run evicted one that had sent its headers a second before)."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    probe = socket.socket(fileno=sock.fileno())  # asyncio's TransportSocket has no recv
    try:
        return bool(probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))  # b"": the client left
    except OSError:  # nothing waiting (EAGAIN), or the socket is gone
        return False
    finally:
        probe.detach()


def _malloc_trim():
    """glibc's malloc_trim, or None where there is none (musl, macOS)."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    return None


# ---------------------------------------------------------------------------------------- listening
class Listener:
    """Listening sockets and their accept loop: each accepted socket goes to Connections.admit.
    Out of descriptors it stops accepting for `pause` seconds (the backlog waits in the kernel)
    and logs one line a second at most, with how many times it happened."""

    def __init__(self, host: str, port: int, conns: Connections, backlog: int = 128, pause: float = 0.25):
        self.conns, self.pause, self.backlog = conns, pause, backlog
        self.sockets = _listen(host, port, backlog)
        self.out_of_descriptors, self._said, self._unsaid = 0, 0.0, 0
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.sockets[0].getsockname()[:2]

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for sock in self.sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def close(self) -> None:
        for sock in self.sockets:
            if self._loop is not None and sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
            sock.close()

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(self.backlog):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno not in _OUT_OF:
                    log.error("accept failed: %s", exc.strerror or exc)
                    return
                self._out(sock, exc)
                return
            if not self.conns.admit(conn):
                return  # the rest when the connection closed to make room has given its descriptor back

    def _out(self, sock: socket.socket, exc: OSError) -> None:
        self.out_of_descriptors += 1
        self._unsaid += 1
        now = time.monotonic()
        if now - self._said >= 1.0:
            log.warning(
                "cannot accept connections: %s (%d open, %d being opened); %d time(s) since the last such line; "
                "pausing %g s",
                exc.strerror or errno.errorcode.get(exc.errno, exc),
                len(self.conns.open),
                self.conns.accepting,
                self._unsaid,
                self.pause,
            )
            self._said, self._unsaid = now, 0
        self._loop.remove_reader(sock.fileno())
        self._loop.call_later(self.pause, self._resume, sock)

    def _resume(self, sock: socket.socket) -> None:
        if sock.fileno() >= 0:
            self._loop.add_reader(sock.fileno(), self._accept, sock)


def _listen(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for every address `host` names (as asyncio's
    create_server makes them); OSError when none can be made."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets
