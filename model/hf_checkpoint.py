"""A Hugging Face checkpoint folder someone else made is data, never code.

Before transformers (or CTranslate2's converter) is asked to open one, the folder is checked here
and refused with one line (UnsafeCheckpoint) where:
- an entry is a symbolic link, a fifo, a device or a socket (mt_runtime/files.py's rule for packages,
  applied to the whole folder but .git). The one exception is the hub's own cache: a snapshot
  folder (.../models--ORG--NAME/snapshots/REV) links each file into its repository's blobs/
  folder, and such a link is followed when it resolves to a regular file inside that blobs/
  folder (huggingface_hub made it; nothing else may point there);
- a config (config.json, tokenizer_config.json, any *config.json) has `auto_map`: loading it would
  need the checkpoint's own Python code;
- the weights are pickles only (pytorch_model.bin, *.pt, *.pth, *.ckpt, *.pkl), or there are none;
- a size in config.json (max_position_embeddings, vocab_size, d_model, layers, heads, FFN
  widths...) is not an integer within the bounds below, or the parameters they add up to would
  not fit in the memory this machine has available, before anything is allocated.

Loading then goes through `from_pretrained`: trust_remote_code=False, local files only,
safetensors only for weights, and fd 0 / sys.stdin on /dev/null while the library runs, so that
no prompt can ever read what the user meant for the translator.

The import copies the checkpoint's files (`copy_checkpoint`): regular files only, each opened
once without following a link and checked on its descriptor, written with no permission its
source lacks, and hashed as copied. Torch-free and transformers-free itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from contextlib import contextmanager
from pathlib import Path

from mt_runtime.files import UnsafeFile, kind, open_regular, read_bounded

from .sizes import MAX_DIM, MAX_LAYERS, MAX_VOCAB, _short

# Files a checkpoint folder holds that a translator never reads: not copied (and pickles beside
# safetensors weights never are: nothing here loads them).
SKIPPED = {".git", ".gitattributes", "README.md", "flax_model.msgpack", "tf_model.h5", "rust_model.ot"}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
CODE_SUFFIXES = (".py", ".pyc", ".so")
MAX_CONFIG_BYTES = 16 << 20
MAX_POSITIONS = 1 << 20
CONVERT_HINT = (
    "convert it to safetensors where you trust it (transformers: AutoModelForSeq2SeqLM.from_pretrained"
    "(FOLDER).save_pretrained(NEW_FOLDER) writes model.safetensors) and import that folder"
)
# How every checkpoint is opened: never code, never the network for a folder we have.
LOAD = {"trust_remote_code": False, "local_files_only": True}

_POSITIONS = (
    "max_position_embeddings",
    "n_positions",
    "max_positions",
    "max_source_positions",
    "max_target_positions",
    "max_encoder_position_embeddings",
    "max_decoder_position_embeddings",
    "relative_attention_max_distance",
)
_WIDTHS = (
    "d_model",
    "hidden_size",
    "n_embd",
    "d_kv",
    "d_ff",
    "ffn_dim",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "intermediate_size",
    "relative_attention_num_buckets",
)
_LAYERS = (
    "encoder_layers",
    "decoder_layers",
    "num_layers",
    "num_encoder_layers",
    "num_decoder_layers",
    "num_hidden_layers",
    "n_layer",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "num_heads",
    "num_attention_heads",
    "n_head",
)
BOUNDS = {
    **{f: MAX_POSITIONS for f in _POSITIONS},
    **{f: MAX_DIM for f in _WIDTHS},
    **{f: MAX_LAYERS for f in _LAYERS},
    "vocab_size": MAX_VOCAB,
    "decoder_vocab_size": MAX_VOCAB,
}


class UnsafeCheckpoint(ValueError):
    """The folder is not a checkpoint this pipeline opens; the message says why and what to do."""


def checkpoint_files(folder: str | Path) -> dict[str, Path]:
    """name -> the path to open, for every file of the folder an import copies. UnsafeCheckpoint
    where any entry under the folder (.git aside) is a link (but the hub cache's own), a fifo,
    a device or a socket."""
    folder = Path(folder)
    blobs = _hub_blobs(folder)
    files: dict[str, Path] = {}
    with os.scandir(folder) as listing:
        entries = sorted(listing, key=lambda e: e.name)
    for entry in entries:
        path, mode = Path(entry.path), entry.stat(follow_symlinks=False).st_mode
        if entry.name == ".git":
            continue
        if stat.S_ISDIR(mode):
            _no_links_under(path, blobs)
        elif stat.S_ISLNK(mode) and blobs is not None and _inside(path, blobs):
            files[entry.name] = Path(os.path.realpath(path))
        elif stat.S_ISLNK(mode):
            raise UnsafeCheckpoint(
                f"{path} is a symbolic link: a checkpoint is imported as regular files only "
                "(put the file itself in the folder)"
            )
        elif not stat.S_ISREG(mode):
            raise UnsafeCheckpoint(f"{path} is {kind(mode)}: a checkpoint is imported as regular files only")
        elif entry.name not in SKIPPED and not entry.name.endswith(CODE_SUFFIXES):
            files[entry.name] = path
    if any(name.endswith(".safetensors") for name in files):  # pickles are never read: not copied
        files = {name: path for name, path in files.items() if not name.endswith(PICKLE_SUFFIXES)}
    return files


def check_checkpoint(folder: str | Path, weights: bool = True) -> dict[str, Path]:
    """checkpoint_files(folder), once the folder has passed every check above (weights=False:
    a folder of config and tokenizer files only, as CTranslate2's serving folder keeps, or of a
    tokenizer alone)."""
    folder = Path(folder)
    files = checkpoint_files(folder)
    config = None
    for name, path in sorted(files.items()):
        if name.endswith("config.json") or name == "special_tokens_map.json":
            data = _json(path, folder / name)
            if isinstance(data, dict) and "auto_map" in data:
                raise UnsafeCheckpoint(
                    f"{folder / name}: auto_map asks for the checkpoint's own Python code "
                    f"({_short(data['auto_map'])}); an imported model is data, never code: use a "
                    "model type transformers has built in (Marian, M2M100, NLLB, T5, BART, ...)"
                )
            if name == "config.json":
                config = data
    if weights and config is None:
        raise UnsafeCheckpoint(f"{folder}: no config.json, not a transformers checkpoint")
    if weights:
        _check_weights(folder, files)
    problem = size_problem(config) if config is not None else None
    if problem:
        raise UnsafeCheckpoint(f"{folder / 'config.json'}: {problem}")
    return files


def _check_weights(folder: Path, files: dict[str, Path]) -> None:
    if any(name.endswith(".safetensors") for name in files):
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise UnsafeCheckpoint(
            f"{folder}: its weights are pickles only ({', '.join(pickles[:3])}), which can run code "
            f"when loaded; {CONVERT_HINT}"
        )
    raise UnsafeCheckpoint(f"{folder}: no model.safetensors (no weights to import)")


def size_problem(config: object) -> str | None:
    """None when every size config.json gives (its own and its sub-configs': encoder, decoder, ...)
    is an integer within BOUNDS and the parameters they add up to fit in available memory; else
    one line naming the field."""
    sections = list(_sections(config))
    for section in sections:
        for field, bound in BOUNDS.items():
            value = section.get(field)
            if value is not None and not (type(value) is int and 0 <= value <= bound):  # a bool is not a size
                return f"{field} must be an integer from 0 to {bound:,}, got {_short(value)}"
    terms: dict[str, int] = {}
    for section in sections:
        for field, count in _parameters(section).items():
            terms[field] = terms.get(field, 0) + count
    need = 4 * sum(terms.values())  # float32, as the translators run it
    available = available_memory()
    if available is not None and need > available:
        field = max(terms, key=terms.get)
        return (
            f"the model it describes needs about {need / 2**30:.1f} GiB in float32, most of it for {field}, "
            f"more than the {available / 2**30:.1f} GiB of memory available here"
        )
    return None


def _sections(config: object, depth: int = 0):
    """config and every dict nested in it (a composite model's encoder and decoder configs)."""
    if isinstance(config, dict) and depth <= 8:
        yield config
        for value in config.values():
            yield from _sections(value, depth + 1)


def _parameters(c: dict) -> dict[str, int]:
    """About how many parameters one config section asks for, by the field that drives each part:
    the token tables (input and output), the positional tables (learned or sinusoidal: both
    allocated), the layers."""

    def first(*names: str) -> int:
        return next((v for v in (c.get(n) for n in names) if isinstance(v, int) and v > 0), 0)

    d = first("d_model", "hidden_size", "n_embd")
    if not d:
        return {}
    inner = first("num_heads", "encoder_attention_heads", "num_attention_heads", "n_head") * first("d_kv") or d
    encoder = first("encoder_layers", "num_encoder_layers", "num_layers", "num_hidden_layers", "n_layer")
    decoder = first("decoder_layers", "num_decoder_layers", "num_layers", "num_hidden_layers", "n_layer")
    ffn_e = first("encoder_ffn_dim", "d_ff", "ffn_dim", "intermediate_size") or 4 * d
    ffn_d = first("decoder_ffn_dim", "d_ff", "ffn_dim", "intermediate_size") or 4 * d
    positions = max(_POSITIONS[:-1], key=lambda n: first(n))
    width = "d_model" if "d_model" in c else "hidden_size" if "hidden_size" in c else "n_embd"
    layers = encoder * (4 * d * inner + 2 * d * ffn_e) + decoder * (8 * d * inner + 2 * d * ffn_d)
    return {
        "vocab_size": 2 * max(first("vocab_size"), first("decoder_vocab_size")) * d,
        positions: 2 * first(positions) * d,
        f"{width} and the layers": layers,
    }


def available_memory() -> int | None:
    """Bytes this process may allocate: the system's MemAvailable, or a cgroup's (v2 or v1) limit
    where that is less; None where neither can be read."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            cap = int(Path(limit).read_text().strip())
            if cap < 1 << 60:
                found.append(cap)
        except (OSError, ValueError):  # "max", or no such controller
            pass
    return min(found) if found else None


def copy_checkpoint(folder: str | Path, dest: str | Path) -> dict[str, str]:
    """The files check_checkpoint(folder) lists copied into dest (which exists): each source
    opened once, without following a link (a hub cache link: its target, checked to lie inside
    its blobs/ folder), refused unless its descriptor is a regular file; the copy created anew
    with the source's permissions (never wider: the process's umask narrows them further) and
    hashed as written. Returns name -> sha256 of what was written."""
    dest = Path(dest)
    digests = {}
    for name, path in check_checkpoint(folder).items():
        try:
            fd = open_regular(path, follow_links=False)
        except UnsafeFile as exc:  # a link or a fifo swapped in since the check
            raise UnsafeCheckpoint(f"{exc}; the checkpoint changed while being imported") from None
        except OSError as exc:
            raise UnsafeCheckpoint(f"{path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as src:
            mode = stat.S_IMODE(os.fstat(src.fileno()).st_mode) & 0o666 | stat.S_IRUSR
            out_fd = os.open(
                dest / name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                mode,
            )
            h = hashlib.sha256()
            with os.fdopen(out_fd, "wb") as out:
                while block := src.read(1 << 20):
                    h.update(block)
                    out.write(block)
        digests[name] = h.hexdigest()
    return digests


def file_digests(folder: str | Path) -> dict[str, str]:
    """name -> sha256 of each file an import of the folder would copy, read as copy_checkpoint
    reads it (never through a link of the user's)."""
    digests = {}
    for name, path in checkpoint_files(folder).items():
        h = hashlib.sha256()
        with os.fdopen(open_regular(path, follow_links=False), "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        digests[name] = h.hexdigest()
    return digests


def narrow_permissions(folder: str | Path, like: str | Path) -> None:
    """Every file under folder (a conversion of the checkpoint in `like`) made no more permissive
    than the least permissive file of `like`: a private checkpoint's converted copy stays private."""
    allowed = 0o666
    for path in Path(like).iterdir():
        mode = path.lstat().st_mode
        if stat.S_ISREG(mode):
            allowed &= stat.S_IMODE(mode)
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                os.chmod(path, stat.S_IMODE(mode) & (allowed | stat.S_IRUSR))


def from_pretrained(loader, folder: str | Path, weights: bool = False, **kwargs):
    """loader.from_pretrained(folder) for a checked folder: no custom code, local files only,
    safetensors only where it loads weights (weights=True), stdin closed to the library."""
    check_checkpoint(folder, weights=weights)
    if weights:
        kwargs["use_safetensors"] = True
    with stdin_closed():
        return loader.from_pretrained(str(folder), **LOAD, **kwargs)


@contextmanager
def stdin_closed():
    """fd 0 and sys.stdin on /dev/null for the duration: a library's prompt reads nothing of the
    user's input (a `pipeline translate` reads it afterwards, from where it was)."""
    saved_stdin = sys.stdin
    try:
        saved_fd = os.dup(0)
    except OSError:  # stdin closed: /dev/null takes fd 0 below, and is closed again after
        saved_fd = None
    null = os.open(os.devnull, os.O_RDONLY)
    if null != 0:
        os.dup2(null, 0)
        os.close(null)
    sys.stdin = open(os.devnull, encoding="utf-8")
    try:
        yield
    finally:
        sys.stdin.close()
        sys.stdin = saved_stdin
        if saved_fd is not None:
            os.dup2(saved_fd, 0)
            os.close(saved_fd)
        else:
            os.close(0)


def _no_links_under(folder: Path, blobs: Path | None) -> None:
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = Path(root) / name
            mode = os.lstat(path).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode) and blobs and _inside(path, blobs)):
                raise UnsafeCheckpoint(f"{path} is {kind(mode)}: a checkpoint folder holds regular files only")


def _hub_blobs(folder: Path) -> Path | None:
    """The hub cache's blobs/ folder where `folder` is one of its snapshots, else None."""
    folder = Path(os.path.abspath(folder))
    repo = folder.parent.parent
    if (
        folder.parent.name == "snapshots"
        and repo.name.startswith(("models--", "datasets--"))
        and (repo / "blobs").is_dir()
        and not (repo / "blobs").is_symlink()
    ):
        return Path(os.path.realpath(repo / "blobs"))
    return None


def _inside(link: Path, blobs: Path) -> bool:
    target = Path(os.path.realpath(link))
    return target.parent == blobs and target.is_file() and not target.is_symlink()


def _json(path: Path, shown: Path):
    try:
        return json.loads(read_bounded(path, MAX_CONFIG_BYTES, follow_links=False))
    except (UnsafeFile, OSError, ValueError) as exc:  # JSON, UTF-8 and over-long number errors are ValueErrors
        raise UnsafeCheckpoint(f"{shown}: unreadable ({str(exc).splitlines()[0][:200]})") from None
