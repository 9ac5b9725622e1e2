"""What code a stage runs, as digests: the stage's module and every module of this project
(model/, pipeline/, mt-runtime's model/runtime/mt_runtime/) it imports, directly or through
others, lazily inside functions included.

The digests enter each stage's fingerprint, so a change to a file a stage runs rebuilds that
stage and what follows, without anyone remembering to bump a number (as DVC hashes a stage's
code dependencies). They are taken over the source's tokens without comments, blank lines and
docstrings: a reworded comment rebuilds nothing, a changed line of code does. Found by reading
the files (ast), never by importing them: planning a run imports no torch.
"""

from __future__ import annotations

import ast
import hashlib
import io
import tokenize
from functools import lru_cache
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Each top-level package of this repository and its folder: mt_runtime is its own distribution.
PACKAGES = {"model": "model", "pipeline": "pipeline", "mt_runtime": "model/runtime/mt_runtime"}
# How a stage is called, not what it computes: its context (paths, log, progress), the error
# types, the store's artifact handles, the recipe schema's toolkit and the declaration types and
# planner (what they produce, a node's config and inputs, enters the fingerprint itself). Left
# out so that an edit there does not rebuild an hour of models. The store is a package: every
# module of it (PLUMBING_PACKAGES).
PLUMBING = frozenset(
    {
        "pipeline/engine/context.py",
        "pipeline/engine/errors.py",
        "pipeline/engine/recipe.py",
        "pipeline/engine/stage.py",
    }
)
PLUMBING_PACKAGES = ("pipeline/engine/store/",)


def stage_code(module: str, root: Path | None = None) -> dict[str, str]:
    """{path relative to the project root: digest} for `module` and the project modules it runs."""
    return dict(_closure(module, (root or PROJECT_ROOT).resolve()))


def combined(files: dict[str, str]) -> str:
    """One digest for a stage's files (what its fingerprint takes)."""
    return hashlib.sha256("\n".join(f"{path} {digest}" for path, digest in sorted(files.items())).encode()).hexdigest()[
        :16
    ]


def changed_files(before: dict[str, str] | None, now: dict[str, str]) -> list[str]:
    """Files added, removed or changed between two `stage_code` results."""
    before = before or {}
    return sorted(path for path in set(before) | set(now) if before.get(path) != now.get(path))


@lru_cache(maxsize=None)
def _closure(module: str, root: Path) -> tuple[tuple[str, str], ...]:
    seen: dict[str, str] = {}
    pending = [module]
    while pending:
        name = pending.pop()
        path = _module_file(name, root)
        if path is None:
            continue
        rel = path.relative_to(root).as_posix()
        if rel in seen or rel in PLUMBING or rel.startswith(PLUMBING_PACKAGES):
            continue
        seen[rel], imports = _file_facts(path, name)
        pending.extend(imports)
    return tuple(sorted(seen.items()))


@lru_cache(maxsize=None)
def _file_facts(path: Path, module: str) -> tuple[str, tuple[str, ...]]:
    """(digest, imported names) of one file: read once however many stages run it."""
    source = path.read_text(encoding="utf-8")
    return source_digest(source), tuple(_imports(source, module, path.name == "__init__.py"))


def _module_file(name: str, root: Path) -> Path | None:
    top, *rest = name.split(".")
    if top not in PACKAGES:
        return None
    base = root.joinpath(PACKAGES[top], *rest)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def import_statements(source: str, module: str, is_package: bool) -> list[tuple[str, list[str]]]:
    """(module, names) of each import in the source, lazy ones inside functions included, module
    names made absolute: `import x` gives (x, []), `from x import y, z` gives (x, [y, z]) (y may be
    a module of x, or a name defined there)."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            found.append((base, [alias.name for alias in node.names]))
    return found


def _imports(source: str, module: str, is_package: bool) -> list[str]:
    """Absolute names of what the source imports, `from x import y` giving both x and x.y (y may
    be a module); names outside this project are dropped later."""
    return [
        name
        for base, names in import_statements(source, module, is_package)
        for name in (base, *(f"{base}.{n}" for n in names))
    ]


def source_digest(source: str) -> str:
    """sha256 of the source's tokens, comments, blank lines and docstrings left out."""
    tokens = [
        t
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type not in (tokenize.COMMENT, tokenize.NL)
    ]
    kept = []
    skip_newline = False
    for i, tok in enumerate(tokens):
        if skip_newline and tok.type == tokenize.NEWLINE:
            skip_newline = False
            continue
        previous = tokens[i - 1].type if i else tokenize.NEWLINE
        following = tokens[i + 1].type if i + 1 < len(tokens) else tokenize.ENDMARKER
        if (
            tok.type == tokenize.STRING
            and following in (tokenize.NEWLINE, tokenize.ENDMARKER)
            and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        ):
            skip_newline = True  # a docstring, or a string standing alone as a statement: no code
            continue
        kept.append(f"{tok.type}:{tok.string}")
    return hashlib.sha256("\x00".join(kept).encode()).hexdigest()
