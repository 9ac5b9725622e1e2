"""Serve the translation page and one package on this machine:

    python examples/web/serve.py PACKAGE_DIR [--port 8000] [--host 127.0.0.1]

then open the address it prints. Python's standard library alone. It serves examples/web (the
page and its node_modules: run `npm ci` there first), examples/js's modules (the shared search) and
the package under /package/, with the MIME types a browser insists on for modules and WebAssembly,
and the two headers that make the page cross-origin isolated, which onnxruntime-web's threads
need (SharedArrayBuffer). It binds the loopback address unless told otherwise."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

WEB = Path(__file__).resolve().parent
JS = WEB.parent / "js"
TYPES = {
    ".mjs": "text/javascript",
    ".js": "text/javascript",
    ".wasm": "application/wasm",
    ".json": "application/json",
    ".html": "text/html; charset=utf-8",
    ".onnx": "application/octet-stream",
    ".npz": "application/octet-stream",
    ".md": "text/markdown; charset=utf-8",
}


class PageHandler(SimpleHTTPRequestHandler):
    """/ -> /web/; /web/... from examples/web, /js/NAME.mjs from examples/js, /package/... from
    the package; anything else is 404 (http.server's own path cleaning keeps `..` inside)."""

    extensions_map = TYPES

    def __init__(self, *args, package: Path, **kwargs):
        self.package = package
        super().__init__(*args, directory=str(WEB), **kwargs)

    def translate_path(self, path: str) -> str:
        route = unquote(urlsplit(path).path)
        for prefix, root in (("/web/", WEB), ("/package/", self.package)):
            if route.startswith(prefix):
                self.directory = str(root)
                return super().translate_path("/" + path[len(prefix) :])
        name = route.removeprefix("/js/")
        if name != route and "/" not in name and name.endswith(".mjs"):
            return str(JS / name)
        return str(WEB / "missing" / "404")  # under a folder that does not exist: a 404

    def do_GET(self):
        if urlsplit(self.path).path == "/":
            self.send_response(302)
            self.send_header("Location", "/web/")
            self.end_headers()
            return
        super().do_GET()

    def end_headers(self):
        # Cross-origin isolation: onnxruntime-web's wasm threads need SharedArrayBuffer.
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cache-Control", "no-store")  # a re-exported package is fetched anew
        super().end_headers()

    def log_message(self, format, *args):  # quiet: errors only
        if args and str(args[1]).startswith(("4", "5")):
            super().log_message(format, *args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the translation page and a package (examples/web).")
    parser.add_argument("package", type=Path, help="the package folder (mt-onnx-package/2)")
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="the port (0: any free one; default 8000)")
    args = parser.parse_args(argv)
    if not (args.package / "package.json").is_file():
        print(f"serve.py: {args.package} holds no package.json: not a package", file=sys.stderr)
        return 2
    if not (WEB / "node_modules" / "onnxruntime-web" / "package.json").is_file():
        print(f"serve.py: {WEB / 'node_modules'} is missing: run `npm ci` in {WEB} first", file=sys.stderr)
        return 2
    handler = partial(PageHandler, package=args.package.resolve())
    try:
        server = ThreadingHTTPServer((args.host, args.port), handler)
    except OSError as error:
        print(f"serve.py: cannot listen on {args.host}:{args.port}: {error.strerror}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    print(f"http://{host}:{port}/web/", flush=True)  # the first line: the page's address
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
