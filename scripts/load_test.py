"""Load test of `mt-runtime serve` over loopback: sentences/s and p50/p99 latency at 1, 8 and 64
concurrent clients, what happens past the queue's bound, and SIGTERM under load.

    python scripts/load_test.py PACKAGE [--requests 512] [--seconds 30] [--beam 4] [--levels 1,8,64]
        [--rounds 3] [--workers N --threads N --processes N --batch-size 32 --max-wait-ms 5 --queue 256] [--no-offline]
    python scripts/load_test.py --url http://127.0.0.1:8080 [--levels ...]   (a running server)

With PACKAGE it first measures the offline figure on the same sentences and cores
(`Translator.translate`, batches of 32 like `pipeline translate`, at 1 thread and at one per
core: the faster counts) and the batch-1 latency, then starts the server on a free loopback port
(`python -m mt_runtime.serve serve PACKAGE --port 0`) and checks every served translation against
Translator's. Each client sends one sentence a request and the next when answered (closed loop),
each level at most --requests requests and --seconds seconds. The throughput ratio is the median
of --rounds rounds of offline and 64 clients taking turns (a shared machine's load drifts), with
CPU ms a sentence beside it (offline: this process; served: the server's process and this one's
clients), which the neighbours' load does not count. Past the bound: bursts of 128 concurrent
requests of --burst-texts texts each (several times the queue), the server's resident memory
before and after each. Last, 64 clients run while the server gets SIGTERM: its exit code, what
the clients got while it drained, and whether every request it accepted (its last log line) was
answered to a client. With --url only the levels and the bursts run.

Sentences: the first --sentences lines of Multi30k's test_2016_flickr.en.gz under PIPELINE_DATA,
or --text FILE (one sentence a line). Targets (issue 51, benchmarks): served at 64 clients >= 0.8
of offline; p99 at 8 clients <= 3x the batch-1 p50; past the bound refusals, not memory growth;
no accepted request lost on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's model/, not an installed one


def load_sentences(args) -> list[str]:
    if args.text:
        lines = Path(args.text).read_text(encoding="utf-8").splitlines()
    else:
        data = Path(os.environ.get("PIPELINE_DATA", REPO.parent / "shared" / "data"))
        with gzip.open(data / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
    lines = [line.strip() for line in lines if line.strip()][: args.sentences]
    if not lines:
        sys.exit("load_test: no sentences")
    return lines


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------------------- offline
class Offline:
    """Translator.translate on the sentences in batches of 32, like `pipeline translate`, at the
    faster of 1 thread and one per core (best of two rounds each), one sentence at a time (the
    first 64: the batch-1 p50, the lower of the two thread counts') and 8 at a time (the time
    8 clients' sentences take together, printed)."""

    def __init__(self, package: Path, sentences: list[str], beam: int, cores: int):
        from mt_runtime.translator import Translator

        self.sentences, self.beam, self.rounds = sentences, beam, []
        best, self.batch1_p50 = None, float("inf")
        for threads in sorted({1, cores}):
            translator = Translator(package, threads=threads)
            translator.translate(sentences[:8], beam=beam, max_batch=32)
            per_s, cpu_ms = max(self.round(translator) for _ in range(2))
            alone, eights = [], []
            for sentence in sentences[:64]:
                started = time.perf_counter()
                translator.translate([sentence], beam=beam)
                alone.append((time.perf_counter() - started) * 1000)
            for start in range(0, 64, 8):  # what 8 clients' sentences cost together, at the least
                started = time.perf_counter()
                translator.translate(sentences[start : start + 8], beam=beam)
                eights.append((time.perf_counter() - started) * 1000)
            print(
                f"  offline, {threads} thread(s): {per_s:.0f} sentences/s in batches of 32, "
                f"batch-1 p50 {statistics.median(alone):.1f} ms, a batch of 8 {statistics.median(eights):.1f} ms"
            )
            self.batch1_p50 = min(self.batch1_p50, statistics.median(alone))
            if best is None or per_s > best[0]:
                best = (per_s, cpu_ms, translator)
        self.rounds, self.cpu, self.translator = [best[0]], [best[1]], best[2]
        self.threads = self.translator.threads
        self.translations = dict(zip(sentences, self.translator.translate(sentences, beam=beam, max_batch=32)))

    def round(self, translator=None) -> tuple[float, float]:
        """Sentences/s and CPU ms a sentence (this process's) of one pass over the sentences."""
        started, cpu = time.perf_counter(), time.process_time()
        (translator or self.translator).translate(self.sentences, beam=self.beam, max_batch=32)
        n = len(self.sentences)
        return n / (time.perf_counter() - started), (time.process_time() - cpu) / n * 1000


# ----------------------------------------------------------------------------------------- server
class Server:
    """`python -m mt_runtime.serve serve PACKAGE --port 0 ...` in a child process; its log kept."""

    def __init__(self, package: Path, flags: list[str]):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mt_runtime.serve", "serve", str(package), "--port", "0", *flags],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.port = None
        listening = threading.Event()

        def read():
            for line in self.process.stderr:
                self.lines.append(line.rstrip())
                if (m := re.search(r"listening on http://[^:]+:(\d+)", line)) and self.port is None:
                    self.port = int(m.group(1))
                    listening.set()
            listening.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not listening.wait(120) or self.port is None:
            self.stop()
            sys.exit("load_test: the server did not start:\n" + "\n".join(self.lines[-20:]))
        self.url = f"http://127.0.0.1:{self.port}"

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    def cpu_s(self) -> float:
        """The server's CPU time so far (user + system), seconds."""
        with open(f"/proc/{self.process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


async def wait_ready(session: aiohttp.ClientSession, url: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with session.get(f"{url}/readyz") as r:
                if r.status == 200:
                    async with session.get(f"{url}/info") as info:
                        return await info.json()
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.1)
    sys.exit(f"load_test: {url} not ready after {timeout:.0f} s")


# ----------------------------------------------------------------------------------------- levels
async def level(
    session,
    url: str,
    sentences: list[str],
    beam: int,
    clients: int,
    requests: int,
    seconds: float,
    expected: dict | None,
    server: Server | None = None,
) -> dict:
    """`clients` closed-loop clients, one sentence a request, until `requests` were sent or
    `seconds` passed; with the server's process, its CPU ms a sentence, and this process's."""
    latencies, statuses, wrong = [], {}, 0
    sent = 0
    deadline = time.monotonic() + seconds

    async def client():
        nonlocal sent, wrong
        while sent < requests and time.monotonic() < deadline:
            sentence = sentences[sent % len(sentences)]
            sent += 1
            started = time.perf_counter()
            async with session.post(f"{url}/translate", json={"text": sentence, "beam": beam}) as r:
                body = await r.json()
            elapsed = (time.perf_counter() - started) * 1000
            statuses[r.status] = statuses.get(r.status, 0) + 1
            if r.status == 200:
                latencies.append(elapsed)
                if expected is not None and body["translations"] != [expected[sentence]]:
                    wrong += 1

    async def batches():
        async with session.get(f"{url}/info") as r:
            info = await r.json()
        return info.get("batches", 0), info.get("sentences", 0)

    cpu, (b0, s0) = server.cpu_s() if server else float("nan"), await batches()
    started, own = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall, n = time.perf_counter() - started, max(1, len(latencies))
    b1, s1 = await batches()
    return {
        "clients": clients,
        "per_s": len(latencies) / wall,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "ok": len(latencies),
        "statuses": statuses,
        "wrong": wrong,
        "server_cpu_ms": ((server.cpu_s() if server else float("nan")) - cpu) / n * 1000,
        "client_cpu_ms": (time.process_time() - own) / n * 1000,
        "batch": (s1 - s0) / (b1 - b0) if b1 > b0 else float("nan"),
    }


async def overload(
    session, url: str, sentences: list[str], beam: int, texts: int, rounds: int, server: Server | None
) -> dict:
    """Bursts of 128 concurrent requests of `texts` sentences each; statuses, and the server's
    resident memory before the first and after each."""
    statuses: dict[int, int] = {}
    rss = [server.rss_mb()] if server else []

    async def one(i):
        batch = [sentences[(i * texts + j) % len(sentences)] for j in range(texts)]
        async with session.post(f"{url}/translate", json={"texts": batch, "beam": beam}) as r:
            await r.read()
            statuses[r.status] = statuses.get(r.status, 0) + 1

    for _ in range(rounds):
        await asyncio.gather(*(one(i) for i in range(128)))
        if server:
            rss.append(server.rss_mb())
    return {"statuses": statuses, "rss": rss}


async def sigterm_under_load(
    session, server: Server, sentences: list[str], beam: int, expected: dict | None, after: float = 1.0
) -> dict:
    """64 clients sending until refused while the server gets SIGTERM `after` seconds in."""
    got = {
        "ok": 0,
        "ok_after_signal": 0,
        "refused_503": 0,
        "connection_refused": 0,
        "disconnected": 0,
        "wrong": 0,
        "other": 0,
    }
    signalled = None

    async def client(k):
        i = k
        while True:
            sentence = sentences[i % len(sentences)]
            i += 64
            try:
                async with session.post(f"{server.url}/translate", json={"text": sentence, "beam": beam}) as r:
                    body = await r.json()
            except aiohttp.ClientConnectorError:
                got["connection_refused"] += 1
                return
            except aiohttp.ServerDisconnectedError:  # a kept-alive connection closed before the request was read
                got["disconnected"] += 1
                return
            if r.status == 200:
                got["ok"] += 1
                got["ok_after_signal"] += signalled is not None
                got["wrong"] += expected is not None and body["translations"] != [expected[sentence]]
            elif r.status == 503:
                got["refused_503"] += 1
                return
            else:
                got["other"] += 1
                return

    async def kill():
        nonlocal signalled
        await asyncio.sleep(after)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)

    tasks = [asyncio.create_task(client(k)) for k in range(64)]
    await kill()
    await asyncio.gather(*tasks)
    code = await asyncio.get_running_loop().run_in_executor(None, lambda: server.process.wait(120))
    got["exit_code"], got["exit_after_s"] = code, time.monotonic() - signalled
    server.reader.join(5)
    return got


# ------------------------------------------------------------------------------------------- main
async def run(args) -> None:
    sentences = load_sentences(args)
    cores = len(os.sched_getaffinity(0))
    print(f"load average {loadavg()} ({cores} cores); {len(sentences)} sentences, beam {args.beam}")
    base = None
    if args.package and not args.no_offline:
        base = Offline(args.package, sentences, args.beam, cores)
    flags = [
        f"--{name.replace('_', '-')}={getattr(args, name)}"
        for name in ("workers", "threads", "processes", "batch_size", "max_wait_ms", "queue")
        if getattr(args, name) is not None
    ]
    server = Server(args.package, [*flags, "--drain-seconds", "0.5"]) if args.package else None
    url = server.url if server else args.url.rstrip("/")
    expected = base.translations if base else None
    results, client_ok = [], 0
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
            info = await wait_ready(session, url)
            print(
                f"server: {info['workers']} worker(s) x {info.get('processes') or 'no'} child process(es) x "
                f"{info['threads']} thread(s), batches of up to "
                f"{info['batch_size']} within {info['max_wait_ms']} ms, queue {info['queue']} sentences; {url}"
            )
            await level(session, url, sentences[:16], args.beam, 8, 32, 10, None)  # warm the connections
            client_ok += 32
            print(
                "clients  sentences/s  p50 ms  p99 ms  mean batch  answered  other statuses  "
                "differing from Translator  CPU ms a sentence: server, load test"
            )
            for clients in args.levels:
                r = await level(
                    session, url, sentences, args.beam, clients, args.requests, args.seconds, expected, server
                )
                results.append(r)
                client_ok += r["ok"]
                others = {k: v for k, v in r["statuses"].items() if k != 200}
                print(
                    f"{clients:7d}  {r['per_s']:11.0f}  {r['p50']:6.1f}  {r['p99']:6.1f}  {r['batch']:10.1f}  "
                    f"{r['ok']:8d}  "
                    f"{others or '-'!s:>14}  {r['wrong'] if expected else 'not checked'!s:>24}  "
                    f"{r['server_cpu_ms']:.2f}, {r['client_cpu_ms']:.2f}"
                )
            by = {r["clients"]: r for r in results}
            if base and 64 in by:
                served, cpu = [by[64]["per_s"]], [(by[64]["server_cpu_ms"], by[64]["client_cpu_ms"])]
                for _ in range(args.rounds - 1):  # taking turns, so that the machine's load weighs on both
                    per_s, cpu_ms = base.round()
                    base.rounds.append(per_s)
                    base.cpu.append(cpu_ms)
                    r = await level(
                        session, url, sentences, args.beam, 64, args.requests, args.seconds, expected, server
                    )
                    served.append(r["per_s"])
                    cpu.append((r["server_cpu_ms"], r["client_cpu_ms"]))
                    client_ok += r["ok"]
                ratio = statistics.median(served) / statistics.median(base.rounds)
                print(
                    f"served at 64 clients / offline ({base.threads} thread(s)), {len(served)} rounds taking turns: "
                    f"median {statistics.median(served):.0f} / {statistics.median(base.rounds):.0f} = {ratio:.2f} "
                    f"(target >= 0.80; rounds: served {', '.join(f'{x:.0f}' for x in served)}, offline "
                    f"{', '.join(f'{x:.0f}' for x in base.rounds)})"
                )
                offline_cpu, server_cpu = statistics.median(base.cpu), statistics.median(c[0] for c in cpu)
                if server:  # what a machine of our own would show: CPU time does not count the neighbours'
                    print(
                        f"CPU ms a sentence, medians: offline {offline_cpu:.2f}, the server {server_cpu:.2f} "
                        f"(+ {statistics.median(c[1] for c in cpu):.2f} in this load test's clients): "
                        f"offline / server {offline_cpu / server_cpu:.2f}"
                    )
            if 8 in by:
                line = f"p99 at 8 clients {by[8]['p99']:.1f} ms"
                if 1 in by:
                    line += f" = {by[8]['p99'] / by[1]['p50']:.1f}x the 1-client p50 ({by[1]['p50']:.1f} ms)"
                if base:
                    line += f", {by[8]['p99'] / base.batch1_p50:.1f}x offline batch-1 p50 ({base.batch1_p50:.1f} ms)"
                print(line + " (target <= 3x)")
            texts = min(args.burst_texts, info["limits"]["max_texts"])
            o = await overload(session, url, sentences, args.beam, texts, args.bursts, server)
            client_ok += o["statuses"].get(200, 0)
            print(
                f"past the bound: {args.bursts} bursts of 128 requests x {texts} sentences "
                f"({128 * texts} sentences a burst, queue {info['queue']}): statuses {o['statuses']}",
                end="",
            )
            if server:
                print(
                    f"; server RSS {o['rss'][0]:.1f} MB before, after each burst "
                    f"{', '.join(f'{x:.1f}' for x in o['rss'][1:])} MB ({o['rss'][-1] - o['rss'][0]:+.1f})"
                )
            else:
                print()
            if server and not args.no_sigterm:
                s = await sigterm_under_load(session, server, sentences, args.beam, expected)
                client_ok += s["ok"]
                print(
                    f"SIGTERM under 64 clients: exit {s['exit_code']} {s['exit_after_s']:.2f} s after the signal; "
                    f"answered {s['ok_after_signal']} after it, then {s['refused_503']} refused with 503, "
                    f"{s['connection_refused']} connections refused, {s['disconnected']} kept-alive connections "
                    f"closed before a request was read, {s['other']} other, {s['wrong']} differing"
                )
                last = next((line for line in reversed(server.lines) if "stopped (exit" in line), "")
                m = re.search(r"(\d+) requests accepted, (\d+) answered", last)
                if m:
                    accepted, answered = int(m.group(1)), int(m.group(2))
                    print(
                        f"the server accepted {accepted} requests and answered {answered}; the clients received "
                        f"{client_ok} answers: {'none lost' if accepted == answered == client_ok else 'LOST SOME'}"
                    )
                else:
                    print("the server's last line is missing: " + "\n".join(server.lines[-5:]))
    finally:
        if server:
            server.stop()
    print(f"load average {loadavg()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", type=Path, nargs="?", help="a package folder: start a server on it")
    parser.add_argument("--url", help="a running server instead (no offline figure, memory or SIGTERM)")
    parser.add_argument("--text", help="sentences, one a line (default: Multi30k test_2016_flickr.en)")
    parser.add_argument("--sentences", type=int, default=512, help="how many of them (default %(default)s)")
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 64])
    parser.add_argument("--requests", type=int, default=512, help="most requests a level (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=30, help="most seconds a level (default %(default)s)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of offline and 64 clients taking turns for the ratio (default %(default)s)",
    )
    parser.add_argument("--bursts", type=int, default=5, help="overload bursts (default %(default)s)")
    parser.add_argument("--burst-texts", type=int, default=16, help="sentences a burst request (default %(default)s)")
    parser.add_argument("--no-offline", action="store_true", help="skip the offline figure and the answer check")
    parser.add_argument("--no-sigterm", action="store_true", help="leave out SIGTERM under load")
    for name in ("workers", "threads", "processes", "batch-size", "queue"):
        parser.add_argument(f"--{name}", type=int, help="passed to the server")
    parser.add_argument("--max-wait-ms", type=float, help="passed to the server")
    args = parser.parse_args()
    if bool(args.package) == bool(args.url):
        parser.error("give a PACKAGE or --url")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
