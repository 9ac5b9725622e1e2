"""Recipe files: YAML validated by a strict, typed schema.

A recipe names the stages to run and configures each one. Its schema is assembled from the
sections the stages declare (`recipe_schema`; each stage's section lives with the stage, in
pipeline/stages/<kind>/__init__.py). Unknown keys, wrong types and impossible values are
rejected with one line per problem, naming the file and the dotted key. This module holds the
loader and the bounded number types every section uses.
"""

from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Iterable, get_args, get_origin

import yaml
from mt_runtime.files import UnsafeFile, read_bounded
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from .errors import RecipeError

# Every number a recipe gives is bounded, here, once: floats are finite (Strict: no inf, no nan),
# counts are at most MAX_COUNT, model sizes within model/sizes.py's bounds (Dim, Layers in
# pipeline/training/settings.py), and the YAML itself holds no integer beyond 64 bits
# (_check_numbers). So `lr: .inf`, `seed: 1e23` or `d_model: 1e9` fail validation with one line
# instead of a stage later.
MAX_COUNT = 2**31 - 1
PositiveInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
NonNegInt = Annotated[int, Field(ge=0, le=MAX_COUNT)]
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
OpenFraction = Annotated[float, Field(ge=0, lt=1)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
MAX_RECIPE_BYTES = 1 << 20  # a recipe file (and each file it extends) is read up to this size
MAX_ALIAS_VALUES = 10_000  # values YAML aliases may repeat in one recipe file, all together
_MAX_YAML_INT = 2**63
RECIPE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def recipe_schema(sections: Iterable) -> type[Strict]:
    """The recipe's schema: `name` (names the run logs and the `latest` pointer; defaults to the
    file's stem), then each stage's sections (pipeline/engine/stage.py's Section: key, model,
    default) in the registry's order."""
    fields: dict[str, Any] = {"name": (Annotated[str, Field(pattern=RECIPE_NAME)] | None, None)}
    for section in sections:
        if section.key in fields:
            raise ValueError(f"recipe section {section.key!r} declared twice")
        fields[section.key] = (section.model if section.default is not None else section.model | None, section.default)
    return create_model("Recipe", __base__=Strict, **fields)


# ----------------------------------------------------------------------------- loading
def load_recipe(path: str | Path, overrides: list[str], schema: type[BaseModel]) -> tuple[Any, dict]:
    """Read, merge (`extends:`), override (`a.b=c`) and validate a recipe against `schema`
    (recipe_schema's).

    Returns the validated recipe and the raw merged mapping (what the run log records).
    Raises RecipeError with one line per problem.
    """
    path = Path(path)
    raw = _load_with_extends(path, seen=())
    for item in overrides:
        _apply_override(raw, item, path)
    raw.setdefault("name", re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem).lstrip("._-")[:100] or "recipe")
    try:
        recipe = schema.model_validate(raw)
    except ValidationError as exc:
        raise RecipeError([f"{path}: {line}" for line in _explain(exc, raw, schema)]) from None
    return recipe, raw


def _read_yaml(path: Path, referrer: Path | None) -> dict:
    where = f"{referrer}: extends" if referrer else str(path)
    if not path.exists():
        raise RecipeError([f"{where}: file not found: {path}"])
    if path.is_dir():
        raise RecipeError([f"{where}: is a directory, not a recipe file: {path}"])
    try:
        text = read_bounded(path, MAX_RECIPE_BYTES).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError([f"{path}: not UTF-8 text (byte {exc.start})"]) from None
    except UnsafeFile as exc:
        prefix = f"{referrer}: extends: " if referrer else ""
        raise RecipeError([f"{prefix}{exc} (a recipe is a regular file of at most {MAX_RECIPE_BYTES} bytes)"]) from None
    except OSError as exc:
        raise RecipeError([f"{path}: cannot read: {exc.strerror}"]) from None
    try:
        data = _safe_load(text, str(path))
    except ValueError as exc:  # int(): an integer of more digits than Python converts (4300)
        raise RecipeError([f"{path}: {_digits_message(exc)}"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError([f"{path}: {at}YAML syntax error: {problem}"]) from None
    except RecursionError:
        raise RecipeError([f"{path}: YAML nested too deeply"]) from None
    if data is None:
        raise RecipeError([f"{path}: empty recipe (expected a mapping of stage sections)"])
    if not isinstance(data, dict):
        raise RecipeError([f"{path}: top level must be a mapping, got {_kind(data)}"])
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise RecipeError([f"{path}: keys must be strings, got {_short_repr(bad[0])}"])
    _check_numbers(data, str(path))
    return data


def _safe_load(text: str, where: str) -> Any:
    """yaml.safe_load, refusing a document whose aliases would repeat more than MAX_ALIAS_VALUES
    values (or one that holds itself) before anything is built from it: PyYAML shares an aliased
    value instead of copying it, but whatever walks the result (the checks here, deepcopy, the
    schema) visits it once per alias, so nested aliases (a "billion laughs") took minutes."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_aliases(node, where)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_aliases(root: yaml.Node, where: str) -> None:
    """RecipeError where the values under `root`, counted once per alias that reaches them, exceed
    the distinct values by more than MAX_ALIAS_VALUES, or where a value contains itself. One pass
    over the distinct nodes (each one's expanded size kept), without recursion."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        children = (
            [c for pair in node.value for c in pair]
            if isinstance(node, yaml.MappingNode)
            else node.value
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        if finished:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
            open_nodes.discard(id(node))
            if sizes[id(node)] - len(sizes) > MAX_ALIAS_VALUES:
                raise RecipeError(
                    [
                        f"{where}: YAML aliases repeat more than {MAX_ALIAS_VALUES} values; "
                        "a recipe may reuse a section by alias, not build a tree of them"
                    ]
                )
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            raise RecipeError([f"{where}: a YAML alias inside the value it names (a recursive value)"])
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


def _digits_message(exc: ValueError) -> str:
    if "digits" in str(exc):
        return "a number has more digits than a recipe takes (integers up to 2**63)"
    return f"unreadable value ({str(exc).splitlines()[0][:100]})"


def _short_repr(value: Any) -> str:
    if isinstance(value, int) and abs(value) >= _MAX_YAML_INT:
        return "an integer beyond 64 bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_numbers(value: Any, where: str, key: str = "") -> None:
    """No integer beyond 64 bits anywhere in a recipe (YAML reads 0x... of any length, and a
    pydantic error would print it)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int) and abs(value) >= _MAX_YAML_INT:
        raise RecipeError([f"{where}: {key or '(top level)'}: integer too large (recipes take integers up to 2**63)"])
    if isinstance(value, dict):
        for k, v in value.items():
            _check_numbers(k, where, key)
            _check_numbers(v, where, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_numbers(v, where, f"{key}.{i}" if key else str(i))


def _load_with_extends(path: Path, seen: tuple[Path, ...], referrer: Path | None = None) -> dict:
    resolved = path.resolve()
    if resolved in seen:
        chain = " -> ".join(str(p) for p in (*seen, resolved))
        raise RecipeError([f"{path}: extends: cycle: {chain}"])
    data = _read_yaml(path, referrer)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise RecipeError([f"{path}: extends: must be a file path, got {_kind(parent)}"])
    base = _load_with_extends(path.parent / parent, (*seen, resolved), referrer=path)
    return _deep_merge(base, data)


def _deep_merge(base: dict, top: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _apply_override(raw: dict, item: str, path: Path) -> None:
    if "=" not in item:
        raise RecipeError([f"{path}: --set {item!r}: expected KEY=VALUE, e.g. teacher.train.lr=0.001"])
    dotted, _, text = item.partition("=")
    keys = dotted.strip().split(".")
    if not all(keys):
        raise RecipeError([f"{path}: --set {item!r}: empty key"])
    try:
        value = _safe_load(text, f"{path}: --set {dotted}") if text.strip() else None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise RecipeError([f"{path}: --set {dotted}: {_digits_message(exc)}"]) from None
    except yaml.YAMLError:
        value = text
    _check_numbers(value, f"{path}: --set", dotted.strip())
    node = raw
    for i, key in enumerate(keys[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            where = ".".join(keys[: i + 1])
            raise RecipeError([f"{path}: --set {dotted}: {where} is not a mapping"])
        node = child
    node[keys[-1]] = value


# ------------------------------------------------------------------------ error messages
def _kind(value: Any) -> str:
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _lookup(raw: Any, loc: tuple) -> Any:
    node = raw
    for key in loc:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _model_at(loc: tuple, schema: type[BaseModel]) -> type[BaseModel] | None:
    """The schema class that the mapping at `loc` is validated against (for "did you mean")."""
    model: Any = schema
    for key in loc:
        if isinstance(key, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(key)
        if field is None:
            return None
        model = _unwrap(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Optional[X], list[X], dict[str, X] -> X, so nested schemas can be found."""
    for _ in range(4):
        origin = get_origin(annotation)
        if origin is None:
            return annotation
        args = [a for a in get_args(annotation) if a is not type(None)]
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if models:
            return models[0]
        if not args:
            return annotation
        annotation = args[-1]
    return annotation


def _num(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


_MESSAGES = {
    "greater_than": lambda c: f"must be > {_num(c.get('gt'))}",
    "greater_than_equal": lambda c: f"must be >= {_num(c.get('ge'))}",
    "less_than": lambda c: f"must be < {_num(c.get('lt'))}",
    "less_than_equal": lambda c: f"must be <= {_num(c.get('le'))}",
    "int_type": lambda c: "must be an integer",
    "int_parsing": lambda c: "must be an integer",
    "int_from_float": lambda c: "must be a whole number",
    "int_parsing_size": lambda c: "must be an integer of a sane size",
    "float_type": lambda c: "must be a number",
    "float_parsing": lambda c: "must be a number",
    "finite_number": lambda c: "must be a finite number",
    "bool_type": lambda c: "must be true or false",
    "bool_parsing": lambda c: "must be true or false",
    "string_type": lambda c: "must be a string",
    "list_type": lambda c: "must be a list",
    "dict_type": lambda c: "must be a mapping",
    "model_type": lambda c: "must be a mapping",
    "model_attributes_type": lambda c: "must be a mapping",
    "literal_error": lambda c: f"must be one of {c.get('expected')}",
    "missing": lambda c: "required key is missing",
    "string_pattern_mismatch": lambda c: "must be letters, digits, '_', '.' or '-' (at most 100)",
}


def _explain(exc: ValidationError, raw: dict, schema: type[BaseModel]) -> list[str]:
    lines: list[str] = []
    seen_locs: set[tuple] = set()
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        # pydantic reports a value once per union member; keep the most specific (first) one.
        loc = tuple(k for k in loc if not (isinstance(k, str) and ("[" in k or k.startswith("function-"))))
        if loc in seen_locs:
            continue
        seen_locs.add(loc)
        dotted = ".".join(str(k) for k in loc) or "(top level)"
        etype = err["type"]
        if etype == "extra_forbidden":
            parent = _model_at(loc[:-1], schema)
            hint = ""
            if parent is not None:
                close = difflib.get_close_matches(str(loc[-1]), list(parent.model_fields), n=1, cutoff=0.6)
                if close:
                    hint = f" (did you mean '{close[0]}'?)"
                else:
                    hint = f" (known keys: {', '.join(parent.model_fields)})"
            lines.append(f"{dotted}: unknown key{hint}")
            continue
        if etype in _MESSAGES:
            message = _MESSAGES[etype](err.get("ctx") or {})
        else:
            message = err["msg"]
            if message.startswith("Value error, "):
                message = message[len("Value error, ") :]
        got = _lookup(raw, loc)
        # A model-level check (e.g. "set at least one budget") concerns the whole mapping.
        if etype != "missing" and not (etype == "value_error" and isinstance(got, dict)):
            shown = _kind(got) if isinstance(got, (dict, list)) or got is None else repr(got)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            message = f"{message}, got {shown}"
        lines.append(f"{dotted}: {message}")
    return lines or [str(exc).splitlines()[0]]


def dump_config(section: BaseModel | None) -> Any:
    """Canonical plain-data form of a config section (what fingerprints hash)."""
    return None if section is None else section.model_dump(mode="json")
