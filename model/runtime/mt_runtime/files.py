"""What a folder made by someone else may hold, and where its ONNX graphs may read from.

The rule, stated once here and enforced wherever the pipeline or the shipped runtime reads such
a folder (an artifact, a package; Python's tarfile `data` filter applies the same one to archive
members): every entry under the folder is a directory or a regular file, reached from the folder
without following a symbolic link. A symbolic link (to a file or a folder, pointing inside or
outside), a device, a fifo or a socket is refused, and so is any path that is absolute, holds
`..` or an empty part. Files are opened with O_NOFOLLOW and checked again on the open
descriptor, so a link swapped in after the check is refused too.

An ONNX graph's external data (TensorProto.external_data "location", in the main graph, in every
subgraph of every node attribute, such as BeamSearch's encoder/decoder, in functions and in
training graphs) must name such a file in the graph's own folder. `external_data_locations`
reads the locations straight from the protobuf bytes (no `onnx` package needed: this file ships
inside every package as mt_runtime/files.py), so they are checked before onnxruntime opens the graph;
`initializers` reads a graph's constants the same way (the runtime's checks of a package's sizes).

Standard library only.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator

from .layout import FORMAT, FORMAT_MAJOR, PACKAGE_JSON, READS, REQUIRED, format_version

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a fifo"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


class UnsafeFile(ValueError):
    """A path that breaks the rule above; the message says which and why."""


def reason(exc: BaseException) -> str:
    """An exception's message as one short line (its first line, or its type where it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__


def kind(mode: int) -> str:
    """'a regular file', 'a symbolic link', 'a fifo', ... for an st_mode."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def member_problem(folder: str | Path, rel: object) -> str | None:
    """None when `rel` (a relative POSIX path, as a manifest or a graph names it) is a regular
    file inside `folder` reached through no symbolic link; otherwise why not."""
    if not isinstance(rel, str) or not rel:
        return f"not a file name: {rel!r}"
    if "\\" in rel or "\x00" in rel:
        return f"{rel!r}: backslashes and NUL are not allowed in a file name"
    path = PurePosixPath(rel)
    if path.is_absolute() or rel.startswith("/"):
        return f"{rel!r}: an absolute path"
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return f"{rel!r}: a path with '..', '.' or an empty part"
    current = Path(folder)
    for i, part in enumerate(parts):
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return f"{rel!r}: missing"
        except OSError as exc:
            return f"{rel!r}: cannot be read ({exc.strerror})"
        last = i == len(parts) - 1
        if stat.S_ISLNK(mode):
            return f"{rel!r}: {'/'.join(parts[: i + 1])} is a symbolic link"
        if not last and not stat.S_ISDIR(mode):
            return f"{rel!r}: {'/'.join(parts[: i + 1])} is {kind(mode)}, not a folder"
        if last and not stat.S_ISREG(mode):
            return f"{rel!r}: {kind(mode)}, not a regular file"
    return None


def walk(folder: str | Path, skip_dirs: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(regular files, problems) under folder: the relative POSIX path of every regular file, and
    one line for every entry that is neither a folder nor a regular file. Never follows a link;
    folders named in skip_dirs (e.g. __pycache__) are not entered."""
    files: list[str] = []
    problems: list[str] = []
    root = Path(folder)

    def visit(path: Path, prefix: str) -> None:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as exc:
            problems.append(f"{path}: cannot list ({exc.strerror})")
            return
        for entry in entries:
            rel = f"{prefix}{entry.name}"
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                if entry.name not in skip_dirs:
                    visit(Path(entry.path), rel + "/")
            elif stat.S_ISREG(mode):
                files.append(rel)
            else:
                problems.append(f"{root / rel}: {kind(mode)}; only regular files are allowed here")

    visit(root, "")
    return files, problems


def open_regular(path: str | Path, follow_links: bool = True) -> int:
    """A read-only descriptor on path, which must be a regular file (a fifo, a device or, with
    follow_links=False, a symbolic link is refused: UnsafeFile). Opening never blocks."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if not follow_links and os.path.islink(path):
            raise UnsafeFile(f"{path}: a symbolic link, not a regular file") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        raise UnsafeFile(f"{path}: {kind(mode)}, not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_bounded(path: str | Path, limit: int, follow_links: bool = True) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (UnsafeFile otherwise); never reads
    more than limit + 1 bytes, whatever the file claims or does."""
    fd = open_regular(path, follow_links)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(f"{path}: larger than {limit} bytes")
    return data


# ------------------------------------------------------------------------ ONNX external data
# Field numbers of onnx.proto (ModelProto and what it nests), as far as tensors can hide.
_MODEL_GRAPH, _MODEL_TRAINING, _MODEL_FUNCTIONS = 7, 20, 25
_TRAINING_GRAPHS = (1, 2)  # initialization, algorithm
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_SPARSE = 1, 5, 15
_FUNCTION_NODE = 7
_NODE_ATTRIBUTE = 5
_ATTR_T, _ATTR_G, _ATTR_TENSORS, _ATTR_GRAPHS, _ATTR_SPARSE, _ATTR_SPARSES = 5, 6, 10, 11, 22, 23
_SPARSE_VALUES, _SPARSE_INDICES = 1, 2
_TENSOR_EXTERNAL = 13
_ENTRY_KEY, _ENTRY_VALUE = 1, 2
_MAX_DEPTH = 64


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise UnsafeFile("not an ONNX file (truncated or malformed protobuf)")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _scan(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of every field of one message: an int for varints, the
    bytes of length-delimited fields; fixed-width fields are skipped."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise UnsafeFile("not an ONNX file (a field runs past the end)")
            yield number, wire, buf[pos : pos + size]
            pos += size
        else:
            raise UnsafeFile(f"not an ONNX file (protobuf wire type {wire})")
        if pos > len(buf):
            raise UnsafeFile("not an ONNX file (truncated)")


def _fields(buf: memoryview) -> Iterator[tuple[int, memoryview]]:
    """(field number, bytes) of every length-delimited field of one message; others skipped."""
    for number, wire, value in _scan(buf):
        if wire == 2:
            yield number, value  # type: ignore[misc]


def _tensor(buf: memoryview, out: list[str]) -> None:
    for number, value in _fields(buf):
        if number == _TENSOR_EXTERNAL:
            entry = dict(_fields(value))
            if bytes(entry.get(_ENTRY_KEY, b"")) == b"location":
                out.append(bytes(entry.get(_ENTRY_VALUE, b"")).decode("utf-8", "replace"))


def _sparse(buf: memoryview, out: list[str]) -> None:
    for number, value in _fields(buf):
        if number in (_SPARSE_VALUES, _SPARSE_INDICES):
            _tensor(value, out)


def _nodes(buf: memoryview, node_field: int, out: list[str], depth: int) -> None:
    for number, node in _fields(buf):
        if number != node_field:
            continue
        for n, attr in _fields(node):
            if n != _NODE_ATTRIBUTE:
                continue
            for a, value in _fields(attr):
                if a in (_ATTR_T, _ATTR_TENSORS):
                    _tensor(value, out)
                elif a in (_ATTR_SPARSE, _ATTR_SPARSES):
                    _sparse(value, out)
                elif a in (_ATTR_G, _ATTR_GRAPHS):
                    _graph(value, out, depth + 1)


def _graph(buf: memoryview, out: list[str], depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise UnsafeFile(f"graphs nested more than {_MAX_DEPTH} deep")
    for number, value in _fields(buf):
        if number == _GRAPH_INITIALIZER:
            _tensor(value, out)
        elif number == _GRAPH_SPARSE:
            _sparse(value, out)
    _nodes(buf, _GRAPH_NODE, out, depth)


def external_data_locations(model: bytes | memoryview) -> list[str]:
    """Every external-data location a serialized ModelProto names, in every graph and subgraph."""
    buf = memoryview(model)
    out: list[str] = []
    for number, value in _fields(buf):
        if number == _MODEL_GRAPH:
            _graph(value, out, 0)
        elif number == _MODEL_FUNCTIONS:
            _nodes(value, _FUNCTION_NODE, out, 0)
        elif number == _MODEL_TRAINING:
            for n, graph in _fields(value):
                if n in _TRAINING_GRAPHS:
                    _graph(graph, out, 0)
    return out


# TensorProto's dims (repeated int64, packed or not), data_type, name and raw_data.
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME, _TENSOR_RAW = 1, 2, 8, 9


@dataclass(frozen=True)
class Initializer:
    name: str
    dims: tuple[int, ...]
    data_type: int  # onnx.TensorProto.DataType: 1 float, 10 float16, 7 int64, ...
    raw: memoryview  # raw_data; empty where the values are elsewhere (typed fields, external data)


def initializers(model: bytes | memoryview) -> Iterator[Initializer]:
    """The initializers of a serialized ModelProto's main graph, read from the bytes as above."""
    for number, graph in _fields(memoryview(model)):
        if number != _MODEL_GRAPH:
            continue
        for n, tensor in _fields(graph):
            if n != _GRAPH_INITIALIZER:
                continue
            dims: list[int] = []
            data_type, name, raw = 0, "", memoryview(b"")
            for field, wire, value in _scan(tensor):
                if field == _TENSOR_DIMS and wire == 0:
                    dims.append(value)  # type: ignore[arg-type]
                elif field == _TENSOR_DIMS:  # packed
                    pos = 0
                    while pos < len(value):  # type: ignore[arg-type]
                        dim, pos = _varint(value, pos)  # type: ignore[arg-type]
                        dims.append(dim)
                elif field == _TENSOR_TYPE and wire == 0:
                    data_type = value  # type: ignore[assignment]
                elif field == _TENSOR_NAME and wire == 2:
                    name = bytes(value).decode("utf-8", "replace")  # type: ignore[arg-type]
                elif field == _TENSOR_RAW and wire == 2:
                    raw = value  # type: ignore[assignment]
            yield Initializer(name, tuple(dims), data_type, raw)


def check_external_data(graph: str | Path) -> list[str]:
    """The external-data files a graph reads (each checked by the rule above against the graph's
    folder); UnsafeFile naming the graph and the location where one breaks it."""
    graph = Path(graph)
    fd = open_regular(graph, follow_links=False)
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    try:
        locations = external_data_locations(data)
    except UnsafeFile as exc:
        raise UnsafeFile(f"{graph}: {exc}") from None
    for location in dict.fromkeys(locations):
        problem = member_problem(graph.parent, location)
        if problem:
            raise UnsafeFile(
                f"{graph}: external data {problem}; a graph may read only regular files inside its own folder"
            )
    return sorted(set(locations))


# ------------------------------------------------------------------------------- packages
MAX_PACKAGE_JSON_BYTES = 16 << 20


class PackageError(Exception):
    """The package is incomplete, was modified after export, or holds what a package may not."""


def sha256_file(path: str | Path) -> str:
    """Digest of a regular file, opened without following a link."""
    h = hashlib.sha256()
    with os.fdopen(open_regular(path, follow_links=False), "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def listed_file_faults(folder: str | Path, files: dict) -> Iterator[tuple[str, str, str]]:
    """The one check of the files a record lists (`files`: relative path -> {"bytes", "sha256"};
    an artifact's manifest, a package's package.json, a work folder's record) in `folder`, in path
    order: (rel, verdict, detail) for each, the verdict one of "missing", "outside" (not a regular
    file inside the folder; detail: why), "entry" (not a mapping), "size" (detail: the size found),
    "content" (another sha256) or "ok" (detail: the sha256). Each caller words its own lines."""
    folder = Path(folder)
    for rel, meta in sorted(files.items()):
        problem = member_problem(folder, rel)
        if problem is not None:
            yield rel, "missing" if problem.endswith(": missing") else "outside", problem
            continue
        path = folder / rel
        if not isinstance(meta, dict):
            yield rel, "entry", ""
            continue
        size = path.stat().st_size
        if size != meta.get("bytes"):
            yield rel, "size", str(size)
            continue
        digest = sha256_file(path)
        yield rel, "ok" if digest == meta.get("sha256") else "content", digest


def check_format(folder: Path, meta: object) -> int:
    """The package's format major, if this runtime reads it (docs/package-format.md); PackageError
    with one line otherwise. A version 1 package loads with a warning."""
    from ._version import __version__

    found = meta.get("format") if isinstance(meta, dict) else None
    try:
        major, _ = format_version(found)
    except ValueError as exc:
        raise PackageError(f"{folder / PACKAGE_JSON}: {exc}") from None
    if major > FORMAT_MAJOR:
        raise PackageError(
            f"{folder}: package format {found} is newer than mt-runtime {__version__} reads ({FORMAT}): "
            "upgrade mt-runtime (the package's package.json names the version it needs under `runtime`)"
        )
    if major not in READS:
        raise PackageError(f"{folder}: package format {found} is not one mt-runtime {__version__} reads; re-export it")
    if major < FORMAT_MAJOR:
        warnings.warn(
            f"{folder}: package format {found}: it loads, but its int8 graphs may translate a sentence "
            f"differently alone and in a batch; re-export it (pipeline run) for {FORMAT}",
            stacklevel=4,
        )
    return major


def verify_package(folder: str | Path) -> dict:
    """Check a package folder before anything in it is opened by onnxruntime: nothing but folders
    and regular files in it (the rule above), every file package.json lists there with its size
    and sha256, and every external-data location of every listed graph inside the folder and
    listed (so checked) itself.
    Returns package.json's content; PackageError with one line otherwise."""
    folder = Path(folder)
    try:
        meta = json.loads(read_bounded(folder / PACKAGE_JSON, MAX_PACKAGE_JSON_BYTES, follow_links=False))
    except FileNotFoundError:
        raise PackageError(f"{folder}: not a package (no {PACKAGE_JSON})") from None
    except (UnsafeFile, OSError, ValueError) as exc:  # JSON and UTF-8 errors are ValueErrors
        raise PackageError(f"{folder / PACKAGE_JSON}: unreadable ({exc})") from None
    check_format(folder, meta)
    files = meta.get("files") if isinstance(meta, dict) else None
    if not isinstance(files, dict):
        raise PackageError(f"{folder / PACKAGE_JSON}: no file list")
    for required in REQUIRED:
        if required not in files:
            raise PackageError(f"{folder / PACKAGE_JSON}: does not list {required}")
    _, problems = walk(folder, skip_dirs=("__pycache__",))
    if problems:
        raise PackageError(f"{problems[0]}; refusing to load the package")
    for rel, verdict, detail in listed_file_faults(folder, files):
        if verdict == "missing":
            raise PackageError(f"{folder / rel}: missing from the package")
        if verdict == "outside":
            raise PackageError(
                f"{folder / PACKAGE_JSON}: names a file outside the package or not a regular file: {detail}"
            )
        if verdict != "ok":
            raise PackageError(
                f"{folder / rel}: modified after export (sha256 differs from {PACKAGE_JSON}); refusing to load it"
            )
    for rel in sorted(files):
        if rel.endswith(".onnx"):
            try:
                locations = check_external_data(folder / rel)
            except UnsafeFile as exc:
                raise PackageError(f"{exc}; refusing to load the package") from None
            # A file a graph reads must be one whose digest was just checked: otherwise anything
            # could be put there after export (the weights) and the package would still verify.
            unlisted = [location for location in locations if location not in files]
            if unlisted:
                raise PackageError(
                    f"{folder / rel}: reads external data {unlisted[0]!r}, which {PACKAGE_JSON} does not list "
                    "(nothing checks its content); refusing to load the package"
                )
    return meta
