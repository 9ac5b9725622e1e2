"""A package's time per sentence in a browser (examples/web: onnxruntime-web, WebAssembly) beside
native onnxruntime, on the same sentences, greedy and beam 4:

    python scripts/web_bench.py PACKAGE [--sentences 40] [--threads 1,2] [--chromium PATH]

- python: mt-runtime's Translator, 1 thread, one sentence at a time (generate.onnx: onnxruntime's
  own search, native code);
- node: examples/js's client on onnxruntime-node, 1 thread, one sentence at a time: the step graphs
  and the search in JavaScript that the page runs, on native kernels;
- web: the page in headless Chromium at each --threads (wasm SIMD; threads where the page is
  cross-origin isolated, as serve.py makes it), one sentence at a time (examples/web/drive.mjs
  --time).

Each timing follows one sentence to warm up; sentences are Multi30k's test_2016_flickr (source
side, from PIPELINE_DATA). It also says how many of the page's translations are the Python
runtime's. Needs node, a Chromium and examples/js's and examples/web's node_modules (npm ci)."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WEB, JS = REPO / "examples" / "web", REPO / "examples" / "js"
BEAMS = (1, 4)

# examples/js's Translator, timed as drive.mjs times the page: per sentence after a warm-up.
NODE_TIMING = """
import { readFileSync } from "node:fs";
import { Translator } from "%s";
const [dir, file] = process.argv.slice(1);
const lines = JSON.parse(readFileSync(file, "utf8"));
const t = await Translator.open(dir, { threads: 1 });
const out = {};
for (const beam of [1, 4]) {
  await t.translate(lines.slice(0, 1), { beam });
  const start = performance.now();
  for (const line of lines) await t.translate([line], { beam });
  out[beam] = (performance.now() - start) / lines.length;
}
console.log(JSON.stringify(out));
"""


def python_ms(package: Path, lines: list[str]) -> tuple[dict[int, float], dict[int, list[str]]]:
    from mt_runtime.translator import Translator

    translator = Translator(package, threads=1)
    ms, outputs = {}, {}
    for beam in BEAMS:
        translator.translate(lines[:1], beam=beam, max_batch=1)
        start = time.perf_counter()
        outputs[beam] = [translator.translate([line], beam=beam, max_batch=1)[0] for line in lines]
        ms[beam] = (time.perf_counter() - start) * 1000 / len(lines)
    return ms, outputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--sentences", type=int, default=40)
    parser.add_argument("--threads", default="1,2", help="the page's wasm threads to time, comma-separated")
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM") or shutil.which("chromium"))
    args = parser.parse_args()
    data = Path(os.environ.get("PIPELINE_DATA", REPO.parent / "shared" / "data"))
    with gzip.open(data / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        lines = [next(f).strip() for _ in range(args.sentences)]
    node = shutil.which("node")
    if node is None or args.chromium is None:
        print("web_bench.py: needs node and a Chromium (--chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "lines.json"
        file.write_text(json.dumps(lines))
        rows = []
        ms, python_out = python_ms(args.package, lines)
        rows.append(("python (native, generate.onnx)", 1, ms, None))
        script = NODE_TIMING % (JS / "translate.mjs").as_uri()
        done = subprocess.run(
            [node, "--input-type=module", "-e", script, str(args.package), str(file)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(("node (native, step graphs)", 1, {int(k): v for k, v in json.loads(done.stdout).items()}, None))
        server = subprocess.Popen(
            [sys.executable, str(WEB / "serve.py"), str(args.package), "--port", "0"], stdout=subprocess.PIPE, text=True
        )
        try:
            url = server.stdout.readline().strip()
            for threads in args.threads.split(","):
                done = subprocess.run(
                    [node, str(WEB / "drive.mjs"), url, "--chromium", args.chromium, "--threads", threads]
                    + ["--lines", str(file), "--time"],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                result = json.loads(done.stdout)
                same = sum(
                    sum(a == b for a, b in zip(result["translations"]["1"][str(beam)], python_out[beam]))
                    for beam in BEAMS
                )
                ms = {int(k): v for k, v in result["ms_per_sentence"].items()}
                name = f"web (wasm SIMD, page open in {result['open_s']:.1f} s)"
                rows.append((name, result["settings"]["threads"], ms, same))
        finally:
            server.terminate()
            server.wait()
    print(f"{args.package}: {len(lines)} sentences, ms per sentence (x: against python)")
    print("| runtime | threads | greedy | beam 4 | identical to python (greedy + beam 4) |")
    print("|---|---|---|---|---|")
    base = rows[0][2]
    for name, threads, ms, same in rows:
        cells = [f"{ms[b]:.1f} ({ms[b] / base[b]:.1f}x)" for b in BEAMS]
        print(f"| {name} | {threads} | {' | '.join(cells)} | {'' if same is None else f'{same}/{2 * len(lines)}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
