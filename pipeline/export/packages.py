"""The shipped ONNX package: one self-contained folder per variant (fp32, fp16, int8_dynamic, ...).

    encoder.onnx, decoder.onnx   the graphs (I/O documented in MODEL_CARD.md); an int8 encoder
                                 reads the token table from decoder.onnx's bytes
    generate.onnx                CPU packages: both graphs inside onnxruntime's BeamSearch op,
                                 weights read from the two files above (model/onnx_passes/)
    generate_batch.onnx          int8 packages with a shortlist: the op over the output vocabulary (beam)
    decoder_batch.onnx           CPU packages: decoder.onnx for many rows (batches): the top k
                                 words per row instead of the distribution
    decoder_greedy.onnx          CPU packages: decoder_batch.onnx for greedy steps, no cache reorder
    decoder_greedy_inplace.onnx  the same with the cache written in place (format 2.1; mt-runtime 0.4)
    shortlist.npz, shortlist.onnx  int8 packages where the export made one: the words each source word
                                 may become, and the output projection restricted to a batch's
                                 (mt_runtime/shortlist.py); float32 packages carry shortlist.npz only

One sentence, one translation: on the CPU every graph of a package runs decoder.onnx's own nodes
(int8 products exact in int32, each row's activations quantized by that row alone or by a fixed
scale), and the one-sentence op and the many-row loop follow the same search rules, so a
sentence's translation does not depend on the batch it is in: the tolerance is none (the
evaluate stage checks every test sentence alone against its batched translation). GPU (fp16)
packages make no such promise: cuBLAS picks its kernels by shape.
    tokenizer.json               the subword tokenizer (HF tokenizers)
    generation.json              beam, length penalty, length limits, special ids, max positions
    MODEL_CARD.md                what it is, its figures, its graph I/O, how to run it
    package.json                 what it is, the format version (mt_runtime/layout.py), the runtime it
                                 needs (mt-runtime, by version) and every other file's sha256 (written last)

Torch-free, so `pipeline export-package` never imports torch.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import mt_runtime
from mt_runtime.files import PackageError, UnsafeFile, open_regular, sha256_file, verify_package, walk
from mt_runtime.layout import (
    DECODER,
    ENCODER,
    FORMAT_WRITTEN,
    GENERATION,
    GRAPH_FILES,
    MODEL_CARD,
    PACKAGE_JSON,
    SHORTLIST_FILE,
    SHORTLISTED,
    TOKENIZER,
)

from model.onnx_passes import DERIVED, derive_graphs
from model.onnx_passes.edit import graph_nodes

from ..engine.errors import IntegrityError, UserInputError
from ..engine.store import Artifact, now_iso


def runtime_requirement() -> str:
    """The runtime a package is written for, as a pip requirement: this mt-runtime's minor series
    (a 0.x minor may change what it reads; the format's major says what it can)."""
    major, minor, *_ = mt_runtime.__version__.split(".")
    return f"mt-runtime>={major}.{minor},<{major}.{int(minor) + 1}"


def write_package(
    dest: Path,
    encoder: Path,
    decoder: Path,
    tokenizer: Path,
    generation: dict,
    about: dict,
    figures: dict | None = None,
    shortlist: Path | None = None,
) -> dict:
    """Assemble a package folder from two graphs. `about` says what it is (variant, source model,
    precision, ...); `figures` are the measured numbers the card shows (or `set_figures` later,
    once the package has been measured); `shortlist`: a shortlist.npz for batches
    (mt_runtime/shortlist.py). Returns package.json."""
    dest.mkdir(parents=True, exist_ok=True)
    sources = [(encoder, ENCODER), (decoder, DECODER), (tokenizer, TOKENIZER)]
    for src, name in sources + ([(shortlist, SHORTLIST_FILE)] if shortlist is not None else []):
        if src.resolve() != (dest / name).resolve():
            shutil.copyfile(src, dest / name)
    if shortlist is None:
        (dest / SHORTLIST_FILE).unlink(missing_ok=True)
    (dest / GENERATION).write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for name, _ in DERIVED:
        (dest / name).unlink(missing_ok=True)
    derive_graphs(dest, generation, shortlist=shortlist is not None)
    return _write_card_and_manifest(dest, about, figures or {}, generation)


def set_figures(dest: Path, figures: dict) -> dict:
    """Put measured figures into a written package: its card and package.json change, nothing else."""
    meta = json.loads((dest / PACKAGE_JSON).read_text(encoding="utf-8"))
    about = {k: v for k, v in meta.items() if k not in _MANIFEST_OWN}
    generation = json.loads((dest / "generation.json").read_text(encoding="utf-8"))
    return _write_card_and_manifest(dest, about, figures, generation, known=meta["files"])


_MANIFEST_OWN = ("format", "runtime", "created", "figures", "opset", "files", "onnx_bytes")  # the rest is `about`


def _write_card_and_manifest(
    dest: Path, about: dict, figures: dict, generation: dict, known: dict | None = None
) -> dict:
    """The card, then package.json listing every file; `known`: digests of files unchanged since
    they were listed (all but the card), so that adding figures does not hash the graphs again."""
    io = {name.removesuffix(".onnx"): graph_io(dest / name) for name in GRAPH_FILES if (dest / name).is_file()}
    (dest / MODEL_CARD).write_text(model_card(about, figures, io, generation), encoding="utf-8")
    written, problems = walk(dest, skip_dirs=("__pycache__",))
    if problems:
        raise UnsafeFile(problems[0])
    files = {}
    for rel in written:
        if rel == PACKAGE_JSON:
            continue
        if known and rel in known and rel != MODEL_CARD:
            files[rel] = known[rel]
        else:
            files[rel] = {"sha256": sha256_file(dest / rel), "bytes": (dest / rel).stat().st_size}
    meta = {
        "format": FORMAT_WRITTEN,
        "runtime": runtime_requirement(),
        "created": now_iso(),
        **about,
        "figures": figures,
        "opset": io["decoder"]["opset"],
        "files": files,
        "onnx_bytes": sum(files[g]["bytes"] for g in GRAPH_FILES if g in files),
    }
    (dest / PACKAGE_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return meta


def graph_io(path: Path) -> dict:
    """Names, element types and (symbolic) shapes of a graph's inputs and outputs: for the card."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)

    def describe(values):
        out = []
        for v in values:
            t = v.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in t.shape.dim]
            out.append({"name": v.name, "type": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, "shape": dims})
        return out

    return {
        "inputs": describe(model.graph.input),
        "outputs": describe(model.graph.output),
        "opset": max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        "contrib_ops": sorted({n.op_type for n in graph_nodes(model.graph) if n.domain == "com.microsoft"}),
        "reads_from": sorted(
            {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
        ),
    }


def package_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------ the card
def _operators(io: dict) -> str:
    contrib = sorted({op for name in ("encoder", "decoder") for op in io[name].get("contrib_ops", [])})
    if not contrib:
        return "operators: standard ONNX only"
    return (
        f"operators: standard ONNX plus onnxruntime's contrib ops ({', '.join(contrib)}): run it with "
        "onnxruntime; for other runtimes (TensorRT) export with `export.fused_attention: false` and "
        "`export.optimize: false`, which write standard ONNX only"
    )


def _shape(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _io_table(io: dict) -> str:
    rows = ["| graph | direction | name | type | shape |", "| --- | --- | --- | --- | --- |"]
    for graph in ("encoder", "decoder"):
        for direction in ("inputs", "outputs"):
            for v in io[graph][direction]:
                rows.append(f"| {graph} | {direction[:-1]} | `{v['name']}` | {v['type']} | {_shape(v['shape'])} |")
    return "\n".join(rows)


def _shared_bytes(io: dict) -> str:
    readers = [
        f"`{g}.onnx` reads weights from bytes inside {', '.join(f'`{f}`' for f in io[g]['reads_from'])}"
        for g in ("encoder", "decoder")
        if io[g].get("reads_from")
    ]
    if not readers:
        return ""
    return (
        "\n" + "; ".join(readers) + " (ONNX external data, so the package stores the token table "
        "once): keep the files together.\n"
    )


def _generate_section(io: dict, generation: dict) -> str:
    if "generate" not in io:
        return ""
    return f"""
`generate.onnx` is the whole search in one graph (onnxruntime's `com.microsoft.BeamSearch` op with
the two graphs below as its subgraphs; it reads their weights from `encoder.onnx` and
`decoder.onnx`, so keep the three files together). On the CPU, `Translator` uses it: one
onnxruntime call per batch. Inputs: `input_ids` int32 [batch, src_len] (as `src_ids` below),
`max_length` int32 [1] (tokens including the start token), `num_beams` int32 [1] (1 = greedy),
`length_penalty` float [1]; output `sequences` int32 [batch, 1, length]: the start token
(id {generation["bos_id"]}), the translation, then EOS (id {generation["eos_id"]}) and PAD.
`Translator(folder, search="python")` drives the two step graphs from Python instead.
{_ONE_SENTENCE_LIST if any(i["name"] == SHORTLISTED for i in io["generate"]["inputs"]) else ""}\
{_MANY_ROWS if "generate_batch" in io else ""}{_DECODER_MANY_ROWS if "decoder_batch" in io else ""}\
{_DECODER_GREEDY if "decoder_greedy" in io else ""}\
{_DECODER_GREEDY_INPLACE if "decoder_greedy_inplace" in io else ""}{_SHORTLIST if "shortlist" in io else ""}"""


_ONE_SENTENCE_LIST = """A greedy call of one sentence (batch 1, `num_beams` 1) chooses from that sentence's word list
(`shortlist.npz`: the special ids, the frequent words, then the candidates of its source words in
id order, at most a fixed number; the op's vocabulary is filled to that number with words it may
not choose) instead of the whole vocabulary; the optional input `shortlisted` bool [1] (default
true) set false turns that off. Batches choose from the same list for each sentence.
"""

_MANY_ROWS = """`generate_batch.onnx` (same inputs and output) searches the package's output vocabulary (every
word `shortlist.npz` can list), normalized over it: `Translator` uses it for one sentence at
beam > 1, as `decoder_batch.onnx` does for batches.
"""

_DECODER_MANY_ROWS = """`decoder_batch.onnx` is `decoder.onnx` for a search loop over many rows: more inputs, `top_k`
int64 [1] and `normalize` bool [1], and instead of `log_probs` the `top_k` best entries of each
row, best first (`top_log_probs` float, `top_ids` int64 [batch, top_k]; with `normalize` false
`top_log_probs` is the logits of the whole vocabulary [batch, vocab] and `top_ids` [batch, 0]:
greedy search takes the argmax itself, without a softmax over the vocabulary); `group` int64 [1]
says how many consecutive rows are one sentence's beams, and `cross_*` and `src_mask` then have
one row per sentence. It reads its weights from `decoder.onnx`. `Translator` translates several
sentences at once with it and the package's own search loop (`mt_runtime/search.py`), which stops
computing a sentence's rows once it has finished.
"""

_DECODER_GREEDY = """`decoder_greedy.onnx` is `decoder_batch.onnx` for the greedy steps where every row continues
its own: no `cache_index` (row i of `past_*` is row i of the batch), no `top_k` or `normalize`,
and `logits` float [batch, vocab] out instead of the top entries. It saves the copy of every
cache tensor that the reorder makes each step; the loop takes the argmax.
"""

_DECODER_GREEDY_INPLACE = """`decoder_greedy_inplace.onnx` is `decoder_greedy.onnx` with the cache written in place:
`past_*` are buffers of `capacity` positions, `past_sequence_length` int32 [1] says how many are
filled (the step's index), and each `present_*` is its `past_*` buffer with this step's row
written at that position, so bind both to the same memory (onnxruntime's I/O binding). The same
numbers as `decoder_greedy.onnx`, without copying the cache into a new one each step.
"""

_SHORTLIST = """`shortlist.npz` lists the words each source word may become (and the most frequent words,
always allowed); `shortlist.onnx` takes a batch's words (`words` int64 [n]) and gives the output
projection over them (`shortlist_weight` [d, n] and its per-word scales), which
`decoder_batch.onnx` and `decoder_greedy.onnx` take with `shortlisted` true: their logits are
then [batch, n], indices into `words`. `Translator` uses a batch's words (the union of its
sentences' lists) for greedy search only, and masks each row to its own sentence's list (beam
search compares scores across beams, which a batch's list would shift); `shortlist=False` turns
that off. Beam search (`generate_batch.onnx`, and `decoder_batch.onnx` with `normalize` true)
runs over every word the shortlist can list (the words the training targets use), normalized
over those; ids in and out are word ids all the same.
"""


def model_card(about: dict, figures: dict, io: dict, generation: dict) -> str:
    layers = about.get("model", {})
    about_runtime = runtime_requirement()
    figure_lines = "\n".join(f"- {k.replace('_', ' ')}: {v}" for k, v in figures.items()) or "- not measured yet"
    n_layers = len([v for v in io["decoder"]["inputs"] if v["name"].startswith("past_k_")])
    return f"""# {about.get("title", "Transformer translation model")} ({about.get("variant")})

{about.get("description", "")}

- variant: **{about.get("variant")}** ({about.get("precision", "")});
  made from artifact `{about.get("source_artifact")}`
- architecture: encoder-decoder Transformer, d_model {layers.get("d_model")}, {layers.get("encoder_layers")} encoder /
  {layers.get("decoder_layers")} decoder layers, heads per layer: encoder {layers.get("enc_heads")},
  decoder self {layers.get("dec_self_heads")}, cross {layers.get("dec_cross_heads")};
  head size {layers.get("head_dim")};
  vocabulary {layers.get("vocab_size")}; {layers.get("params", "?")} parameters
- languages: {about.get("src_lang", "?")} -> {about.get("tgt_lang", "?")}
- ONNX opset {io["decoder"]["opset"]}; exported with onnxruntime {about.get("onnxruntime")}
- {_operators(io)}

## Figures

{figure_lines}

## Run it (needs only mt-runtime: `{about_runtime}`, torch-free)

```python
from mt_runtime import Translator
translator = Translator("path/to/this/folder")  # device="cuda" for onnxruntime-gpu; threads=N
print(translator.translate(["A man is riding a bicycle."], beam=4))
```

or serve it: `mt-runtime serve path/to/this/folder --port 8080` (the runtime's `serve` extra).
The format (mt-onnx-package, this package's version in `package.json`) is specified in the
pipeline's docs/package-format.md, for clients in other languages.

`Translator` checks every file against `package.json` (sha256) and refuses a modified package.
{_generate_section(io, generation)}
## The graphs, for your own client

Two graphs. Run the encoder once per batch, then the decoder once per generated token.
{_shared_bytes(io)}
{_io_table(io)}

- `src_ids`: subword ids of the source (`tokenizer.json`, no special tokens added) followed by
  EOS (id {generation["eos_id"]}), right-padded with PAD (id {generation["pad_id"]}).
- `src_mask`: `src_ids != {generation["pad_id"]}` (true = real token).
- `cross_k_i` / `cross_v_i` ({n_layers} decoder layers): cross-attention keys/values from the encoder, fed
  unchanged to every decoder step (for beam search, repeat each row `beam` times: row b*beam+k).
- First step: `tokens` = BOS (id {generation["bos_id"]}), `past_k_i` / `past_v_i` empty (`past_len` = 0).
  Each next step: `past_*` = the previous `present_*` and `tokens` = the chosen ids.
- `cache_index` [batch] int64: which row of `past_*` each row continues: `arange(batch)` for
  greedy, the parent beam's row for beam search (the reordering happens inside the graph).
- `log_probs`: log-softmax over the vocabulary for the next token. Stop at EOS or at
  `min({generation["max_len_a"]} * source length + {generation["max_len_b"]},
  {generation["max_positions"] - 1})` tokens.
- Defaults in `generation.json`: beam {generation["beam"]}, length penalty {generation["length_penalty"]}
  (hypothesis score = sum of log-probs / length ** penalty).

Minimal greedy decoding with onnxruntime alone:

```python
import numpy as np, onnxruntime as ort
from tokenizers import Tokenizer
tok = Tokenizer.from_file("tokenizer.json")
enc, dec = ort.InferenceSession("encoder.onnx"), ort.InferenceSession("decoder.onnx")
src = np.array([tok.encode("A dog runs.", add_special_tokens=False).ids + [{generation["eos_id"]}]])
cross = dict(zip([o.name for o in enc.get_outputs()], enc.run(None, {{"src_ids": src}})))
past = {{i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float16 if "16" in i.type else np.float32)
        for i in dec.get_inputs() if i.name.startswith("past_")}}
out, token = [], {generation["bos_id"]}
for _ in range({generation["max_positions"] - 1}):
    logp, *present = dec.run(None, {{"tokens": np.array([[token]]), "src_mask": src != {generation["pad_id"]},
                                    "cache_index": np.array([0]), **past, **cross}})
    past = dict(zip([n.replace("present", "past") for n in [o.name for o in dec.get_outputs()][1:]], present))
    token = int(logp[0].argmax())
    if token == {generation["eos_id"]}:
        break
    out.append(token)
print(tok.decode(out))
```
"""


# ------------------------------------------------------------------------- copying out
def packages_in(artifact: Artifact) -> list[str]:
    """The package folders the artifact's manifest lists (never what a link points to)."""
    files = artifact.manifest.get("files")
    return (
        sorted(
            {
                rel.split("/")[0]
                for rel in files
                if isinstance(rel, str) and rel.count("/") == 1 and rel.endswith("/" + PACKAGE_JSON)
            }
        )
        if isinstance(files, dict)
        else []
    )


def copy_packages(artifact: Artifact, dest: Path, package: str | None = None) -> list[Path]:
    """Copy package folders of an export or quantize artifact to dest/<package>/ after checking
    them: the artifact against its manifest (mt_runtime/files.py's rule: regular files only, no link,
    device or fifo), each package as its runtime will (package.json's digests, and every graph's
    external data inside the package). Only the files the manifest lists are copied, each read
    without following a link. Returns the folders written."""
    available = packages_in(artifact)
    if not available:
        raise UserInputError(f"artifact {artifact.id} holds no ONNX package (is it an export or quantize artifact?)")
    if package is not None and package not in available:
        raise UserInputError(f"artifact {artifact.id} has no package {package!r} (has: {', '.join(available)})")
    from ..engine.store import verify_folder

    problems = verify_folder(artifact.path, artifact.manifest)
    if problems:
        raise IntegrityError(
            f"artifact {artifact.id} failed verification: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        )
    names = [package] if package else available
    for name in names:
        try:
            verify_package(artifact.path / name)
        except (PackageError, UnsafeFile) as exc:
            raise IntegrityError(f"artifact {artifact.id}, package {name}: {exc}") from None
    dest = Path(dest)
    written = []
    for name in names:
        target = dest / name
        if target.exists() or target.is_symlink():
            raise UserInputError(f"{target} already exists; choose another destination")
        for rel in sorted(artifact.manifest["files"]):
            if rel.startswith(name + "/"):
                out = target / rel[len(name) + 1 :]
                out.parent.mkdir(parents=True, exist_ok=True)
                with (
                    os.fdopen(open_regular(artifact.path / rel, follow_links=False), "rb") as src,
                    open(out, "xb") as dst,
                ):
                    shutil.copyfileobj(src, dst, 1 << 20)
        written.append(target)
    return written
