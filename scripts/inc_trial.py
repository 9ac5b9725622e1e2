"""Intel Neural Compressor on this project's model, against the project's own int8 (issue 60;
docs/decisions.md has the figures). A trial, not a stage: neither package is a dependency.

Two throwaway venvs, never the project's: onnx-neural-compressor 1.0 (the ONNX half, which
neural-compressor no longer has since 3.8) pins numpy<2, pulls the CPU `onnxruntime` and imports
prettytable and scipy without declaring them; neural-compressor's torch half wants torchao, and
its GPTQ `accelerate` (undeclared):

    python3.11 -m venv /tmp/inc/venv-onc
    /tmp/inc/venv-onc/bin/pip install onnx-neural-compressor==1.0 prettytable scipy
    python3.11 -m venv /tmp/inc/venv-inc
    /tmp/inc/venv-inc/bin/pip install "neural-compressor[pt]==3.10" accelerate pytest torch==2.13.0 \
        transformers==5.25.0 sentencepiece tokenizers sacrebleu pydantic typer rich safetensors \
        pyyaml onnx onnxruntime-gpu==1.31.1

STORE: the store of a run that trained, exported and quantized one model; the trial's recipe was
the default's data on a teacher only (d_model 128, 3+2 layers, 4 heads of 32, ffn 512, unigram
4000, 1500 steps of 2500 tokens, lr 0.002, warmup 200; `quantize: {max_bleu_drop: 100,
guard_sentences: 200, latency_sentences: 0}`, so every group is int8, as INC's are). W: a work
folder. Run from the checkout, PYTHONPATH=model/runtime:. for every step, in this order:

    $PY record STORE W     # the project's venv: calibration inputs of the fp32 package (200
                           # valid sentences, as the quantize stage records them); ours timed
    $ONC onnx STORE W      # venv-onc: onnx-neural-compressor dynamic, static (defaults), static
                           # set as close to ours as it goes
    $PY compare STORE W    # the step graphs (encoder.onnx, decoder.onnx) of every variant through
                           # one search loop: greedy, batch 1, one thread, taking turns
    $PY packages STORE W   # INC's graphs made packages by our writer, against ours, as shipped
    $INC torch STORE W     # venv-inc: neural-compressor's torch API on the trained model
    $INC marian W          # venv-inc: its dynamic int8 on the tests' tiny Marian

Each prints a table and writes W/<step>.json. --sentences (200) sets how many validation
sentences are decoded (the PT2E graphs, seconds a sentence, take the first 50).
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

GRAPHS = ("encoder", "decoder")


def one(store: Path, pattern: str) -> Path:
    found = sorted((store / "objects").glob(pattern))
    if len(found) != 1:
        sys.exit(f"{store}: expected one {pattern}, found {[p.name for p in found]}")
    return found[0]


def fp32_package(store: Path) -> Path:
    return one(store, "export.*-*") / "fp32"


def valid_split(store: Path, n: int) -> tuple[list[str], list[str]]:
    data = one(store, "data-*")
    src = (data / "valid.src").read_text(encoding="utf-8").splitlines()[:n]
    ref = (data / "valid.tgt").read_text(encoding="utf-8").splitlines()[:n]
    return src, ref


def onnx_bytes(path: Path) -> int:
    """A graph's file and the external data files it names."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    files = {path}
    for t in proto.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                files.add(path.parent / entry.value)
    return sum(f.stat().st_size for f in files)


def table(rows: list[dict], keys: list[str]) -> None:
    print("  ".join(f"{k:>14}" for k in keys))
    for r in rows:
        print("  ".join(f"{r.get(k, ''):>14}" if not isinstance(r.get(k), float) else f"{r[k]:>14.2f}" for k in keys))


# ------------------------------------------------------------------ record (project venv)
def record(store: Path, work: Path, n: int) -> None:

    from model.onnx_quantize import calibration_feeds
    from pipeline.measure.translators import open_model

    fp32 = open_model(fp32_package(store))
    src, _ = valid_split(store, n)
    feeds = calibration_feeds(fp32, src)
    arrays = {f"{g}/{i}/{k}": v for g in GRAPHS for i, feed in enumerate(feeds[g]) for k, v in feed.items()}
    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / "feeds.npz", **arrays)
    print(f"{len(feeds['encoder'])} encoder and {len(feeds['decoder'])} decoder feeds -> {work / 'feeds.npz'}")
    # The project's own quantizers on the same graphs and feeds, every group in int8, timed.
    from model.onnx_quantize import node_groups, quantize_rows, quantize_static

    paths = {g: fp32_package(store) / f"{g}.onnx" for g in GRAPHS}
    groups = node_groups(paths)
    seconds = {}
    for name, make in {
        "int8_dynamic": lambda out: quantize_rows(paths, out, groups),
        "int8_static": lambda out: quantize_static(paths, out, groups, feeds),
    }.items():
        start = time.perf_counter()
        make(work / "ours" / name)
        seconds[name] = round(time.perf_counter() - start, 1)
    (work / "record.json").write_text(
        json.dumps({"feeds": {g: len(feeds[g]) for g in GRAPHS}, "quantize_seconds": seconds}) + "\n"
    )
    print("ours, seconds to quantize:", seconds)


def load_feeds(work: Path) -> dict[str, list[dict]]:
    data = np.load(work / "feeds.npz")
    feeds: dict[str, dict[int, dict]] = {g: {} for g in GRAPHS}
    for key in data.files:
        graph, i, name = key.split("/", 2)
        feeds[graph].setdefault(int(i), {})[name] = data[key]
    return {g: [feeds[g][i] for i in sorted(feeds[g])] for g in GRAPHS}


# ------------------------------------------------------------------ onnx (venv-onc)
def onnx_step(store: Path, work: Path) -> None:
    from onnx_neural_compressor import data_reader
    from onnx_neural_compressor.quantization import QuantFormat, config, quantize
    from onnx_neural_compressor.version import __version__ as onc_version

    class Reader(data_reader.CalibrationDataReader):
        def __init__(self, feeds: list[dict]):
            self.feeds, self.i = feeds, 0

        def get_next(self):
            self.i += 1
            return self.feeds[self.i - 1] if self.i <= len(self.feeds) else None

        def rewind(self):
            self.i = 0

    feeds = load_feeds(work)
    fp32 = fp32_package(store)
    symmetric = {"ActivationSymmetric": True, "WeightSymmetric": True}
    variants = {
        # What a user gets from the defaults: per-tensor weights, the default CPU op list.
        "onc_dynamic": lambda graph: config.DynamicQuantConfig(),
        "onc_static": lambda graph: config.StaticQuantConfig(
            Reader(feeds[graph]), calibration_sampling_size=len(feeds[graph])
        ),
        # As close as it goes to ours (model/onnx_quantize/static.py): QDQ, MatMul and Gather
        # only, per-column symmetric int8 weights, symmetric activations.
        "onc_static_like_ours": lambda graph: config.StaticQuantConfig(
            Reader(feeds[graph]),
            calibration_sampling_size=len(feeds[graph]),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul", "Gather"],
            per_channel=True,
            extra_options=symmetric,
        ),
    }
    results = {"onnx_neural_compressor": onc_version, "variants": {}}
    for name, make in variants.items():
        out = work / "onnx" / name
        out.mkdir(parents=True, exist_ok=True)
        report: dict = {}
        start = time.perf_counter()
        try:
            for graph in GRAPHS:
                quantize(str(fp32 / f"{graph}.onnx"), str(out / f"{graph}.onnx"), make(graph))
            report["seconds"] = round(time.perf_counter() - start, 1)
        except Exception as exc:  # a failure is a finding: keep it and go on
            report["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        results["variants"][name] = report
        print(name, report)
    (work / "onnx.json").write_text(json.dumps(results, indent=2) + "\n")


# ------------------------------------------------------------------ compare (project venv)
def session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def turns(decoders: dict, src: list[list[int]], gen, run) -> tuple[dict, dict]:
    """Each sentence through every variant in turn: outputs and seconds per variant."""
    outputs = {name: [] for name in decoders}
    seconds = dict.fromkeys(decoders, 0.0)
    for ids in src:
        for name, decoder in decoders.items():
            start = time.perf_counter()
            outputs[name].append(run(decoder, ids))
            seconds[name] += time.perf_counter() - start
    return outputs, seconds


def score(outputs: dict, seconds: dict, tokenizer, refs: list[str], base: str) -> dict[str, dict]:
    import sacrebleu

    rows = {}
    for name, hyps in outputs.items():
        text = tokenizer.decode(hyps)
        rows[name] = {
            "variant": name,
            "identical": sum(a == b for a, b in zip(hyps, outputs[base])),
            "bleu": round(sacrebleu.corpus_bleu(text, [refs]).score, 2),
            "ms_sentence": round(1000 * seconds[name] / len(hyps), 2),
            "distinct_outputs": len({tuple(h) for h in hyps}),
        }
    return rows


def compare(store: Path, work: Path, n: int) -> None:
    from mt_runtime.search import _greedy_one, prepare_sources
    from mt_runtime.translator import OnnxDecoder

    from pipeline.measure.translators import open_model

    fp32_dir = fp32_package(store)
    ours = one(store, "quantize-*")
    fp32 = open_model(fp32_dir)
    gen = fp32.generation
    folders = {"fp32": fp32_dir}
    folders.update({v: ours / v for v in ("int8_static", "int8_dynamic") if (ours / v).is_dir()})
    folders.update({p.name: p for p in sorted((work / "onnx").glob("*")) if (p / "decoder.onnx").is_file()})
    decoders, bytes_ = {}, {}
    for name, folder in folders.items():
        try:
            sessions = [session(folder / f"{g}.onnx") for g in GRAPHS]
        except Exception as exc:
            print(f"{name}: onnxruntime refuses it: {str(exc).splitlines()[0][:300]}")
            continue
        decoders[name] = OnnxDecoder(*sessions, pad_id=gen.pad_id)
        bytes_[name] = sum(onnx_bytes(folder / f"{g}.onnx") for g in GRAPHS)
    src_text, refs = valid_split(store, n)
    src = prepare_sources(fp32.tokenizer, src_text, gen.max_positions, warn=False)
    turns(decoders, src[:5], gen, lambda d, ids: _greedy_one(d, ids, gen))  # warm-up
    outputs, seconds = turns(decoders, src, gen, lambda d, ids: _greedy_one(d, ids, gen))
    rows = score(outputs, seconds, fp32.tokenizer, refs, "fp32")
    from mt_runtime.search import greedy_search

    for name, row in rows.items():
        row["mb_encoder_decoder"] = round(bytes_[name] / 1e6, 3)
        # The same sentences in batches of 16 (as they come): a translation that changes with its
        # neighbours breaks the package format's promise (docs/decisions.md, issue 52).
        batched = [h for i in range(0, len(src), 16) for h in greedy_search(decoders[name], src[i : i + 16], gen)]
        row["same_in_batch"] = sum(a == b for a, b in zip(batched, outputs[name]))
    import onnxruntime

    result = {"onnxruntime": onnxruntime.__version__, "sentences": len(src), "rows": list(rows.values())}
    (work / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    table(result["rows"], ["variant", "identical", "bleu", "ms_sentence", "mb_encoder_decoder", "same_in_batch"])


# ------------------------------------------------------------------ packages (project venv)
def packages(store: Path, work: Path, n: int) -> None:
    """onnx-neural-compressor's graphs made packages by the project's writer (its search and
    batch graphs derived from them, the fp32 package's shortlist), against ours, as a user gets
    them: Translator, one thread; greedy one sentence at a time taking turns, the same sentences
    in batches, and beam 4 in batches (the guard's setting)."""
    import onnx
    import sacrebleu

    from pipeline.export.packages import write_package
    from pipeline.measure.translators import open_model

    fp32_dir = fp32_package(store)
    ours = one(store, "quantize-*")
    generation = json.loads((fp32_dir / "generation.json").read_text(encoding="utf-8"))
    shortlist = fp32_dir / "shortlist.npz"
    folders = {"fp32": fp32_dir, "int8_static": ours / "int8_static", "int8_dynamic": ours / "int8_dynamic"}
    for graphs in sorted((work / "onnx").glob("onc_*")):
        inline = work / "inline" / graphs.name
        inline.mkdir(parents=True, exist_ok=True)
        for g in GRAPHS:  # INC writes the weights beside the graph (X.onnx_data); a package holds them inline
            onnx.save(onnx.load(str(graphs / f"{g}.onnx")), str(inline / f"{g}.onnx"))
        folders[graphs.name] = work / "packages" / graphs.name
        write_package(
            folders[graphs.name],
            inline / "encoder.onnx",
            inline / "decoder.onnx",
            fp32_dir / "tokenizer.json",
            generation,
            {"variant": graphs.name, "purpose": "a neural-compressor trial (scripts/inc_trial.py)"},
            shortlist=shortlist if shortlist.is_file() else None,
        )
    translators = {name: open_model(folder, threads=1) for name, folder in folders.items() if folder.is_dir()}
    src, refs = valid_split(store, n)
    alone = {name: [] for name in translators}
    seconds = dict.fromkeys(translators, 0.0)
    for sentence in src:
        for name, t in translators.items():
            start = time.perf_counter()
            alone[name] += t.translate([sentence], beam=1)
            seconds[name] += time.perf_counter() - start
    rows = []
    for name, t in translators.items():
        batched = t.translate(src, beam=1)
        beam4 = t.translate(src, beam=4)
        meta = json.loads((folders[name] / "package.json").read_text(encoding="utf-8"))
        rows.append(
            {
                "variant": name,
                "same_as_fp32": sum(a == b for a, b in zip(alone[name], alone["fp32"])),
                "bleu_greedy": round(sacrebleu.corpus_bleu(alone[name], [refs]).score, 2),
                "bleu_beam4": round(sacrebleu.corpus_bleu(beam4, [refs]).score, 2),
                "ms_sentence": round(1000 * seconds[name] / len(src), 2),
                "same_in_batch": sum(a == b for a, b in zip(batched, alone[name])),
                "package_mb": round(sum(f.stat().st_size for f in folders[name].iterdir()) / 1e6, 2),
                "onnx_mb": round(meta.get("onnx_bytes", 0) / 1e6, 2),
            }
        )
    (work / "packages.json").write_text(json.dumps({"sentences": len(src), "rows": rows}, indent=2) + "\n")
    table(rows, ["variant", "same_as_fp32", "bleu_greedy", "bleu_beam4", "ms_sentence", "same_in_batch", "package_mb"])


# ------------------------------------------------------------------ torch (venv-inc)
class FullForward:
    """An IncrementalDecoder over a model's forward(src, tgt_in) -> logits [B, T, V]: each step
    runs the whole prefix again (PT2E's exported graph is the forward, with no cache)."""

    def __init__(self, forward, bos_id: int):
        self.forward, self.bos_id = forward, bos_id

    def encode(self, src, beam):
        import torch

        self.src = torch.tensor(src, dtype=torch.long)
        self.prefix = []

    def step(self, tokens, parents):
        import torch

        self.prefix.append(int(tokens[0]))
        with torch.no_grad():
            logits = self.forward(self.src, torch.tensor([self.prefix], dtype=torch.long))
        return torch.log_softmax(logits[:, -1].float(), -1).numpy()


def state_bytes(model) -> int:
    import torch

    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell()


def torch_step(store: Path, work: Path, n: int) -> None:
    import copy

    import neural_compressor
    import torch
    from mt_runtime.search import _greedy_one, prepare_sources
    from mt_runtime.subword import SubwordTokenizer
    from neural_compressor.torch.export import export
    from neural_compressor.torch.quantization import (
        DynamicQuantConfig,
        GPTQConfig,
        RTNConfig,
        TuningConfig,
        autotune,
        convert,
        prepare,
        quantize,
    )

    from model.torch_decoder import TorchDecoder
    from model.transformer import load_model

    torch.set_num_threads(1)
    teacher = one(store, "teacher-*")
    fp32 = load_model(teacher).eval()
    tokenizer = SubwordTokenizer.load(teacher / "tokenizer.json")
    from mt_runtime.search import GenerationConfig

    cfg = fp32.cfg
    gen = GenerationConfig(
        beam=1, bos_id=cfg.bos_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id, max_positions=cfg.max_positions
    )
    src_text, refs = valid_split(store, n)
    src = prepare_sources(tokenizer, src_text, gen.max_positions, warn=False)

    models, seconds, notes = {}, {}, {}

    def timed(name, make):
        start = time.perf_counter()
        try:
            models[name] = make()
            seconds[name] = round(time.perf_counter() - start, 2)
        except Exception as exc:
            notes[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            print(name, notes[name])

    # Weight-only round-to-nearest: nn.Linear -> INC's WeightOnlyLinear (int8 per column, int4 in
    # groups of 32), the module structure kept, so the cached decoder runs it.
    timed("inc_rtn_int8", lambda: quantize(copy.deepcopy(fp32), RTNConfig(bits=8, group_size=-1, use_layer_wise=False)))
    timed(
        "inc_rtn_int4_g32",
        lambda: quantize(copy.deepcopy(fp32), RTNConfig(bits=4, group_size=32, use_layer_wise=False)),
    )
    # torch's own dynamic int8 Linear, for reference: what INC's 2.x torch dynamic quantization ran.
    timed(
        "torch_dynamic_int8",
        lambda: torch.ao.quantization.quantize_dynamic(copy.deepcopy(fp32), {torch.nn.Linear}, dtype=torch.qint8),
    )
    # GPTQ (int4, groups of 32) calibrated on 32 teacher-forced validation pairs. 3.10 needs
    # `accelerate` (not declared) and a model_path even when not layer-wise: "" is sent to the
    # Hugging Face hub as a repository id; a local folder is taken as it is.
    calib = [
        (torch.tensor([ids]), torch.tensor([[cfg.bos_id] + tokenizer.encode([ref])[0]]))
        for ids, ref in zip(src[:32], refs[:32])
    ]

    def calibrate(model):
        with torch.no_grad():
            for s, t in calib:
                model(s, t)

    def gptq():
        prepared = prepare(
            copy.deepcopy(fp32),
            GPTQConfig(bits=4, group_size=32, use_layer_wise=False, model_path=str(teacher)),
            example_inputs=calib[0],
        )
        calibrate(prepared)
        return convert(prepared)

    timed("inc_gptq_int4_g32", gptq)
    cached = {"fp32": TorchDecoder(fp32)}
    cached.update({k: TorchDecoder(m) for k, m in models.items()})

    # INC 3.x dynamic int8 is PT2E: the forward exported (torch.export), X86InductorQuantizer's
    # dynamic config, quantize/dequantize pairs around each Linear; no cache in that graph.
    example = (torch.tensor([src[0]]), torch.tensor([[cfg.bos_id, 5, 6]]))
    dims = {
        "src": {1: torch.export.Dim("s", min=2, max=cfg.max_positions)},
        "tgt_in": {1: torch.export.Dim("t", min=1, max=cfg.max_positions)},
    }

    def pt2e_dynamic():
        exported = export(copy.deepcopy(fp32), example, dynamic_shapes=dims)
        return convert(prepare(exported, DynamicQuantConfig(), example_inputs=example))

    def pt2e_dynamic_calibrated():  # the weights' observers have run once
        exported = export(copy.deepcopy(fp32), example, dynamic_shapes=dims)
        prepared = prepare(exported, DynamicQuantConfig(), example_inputs=example)
        calibrate(prepared)
        return convert(prepared)

    timed("inc_pt2e_dynamic", pt2e_dynamic)  # as INC's docs (PT_DynamicQuant.md) write it
    timed("inc_pt2e_dynamic_calibrated", pt2e_dynamic_calibrated)
    full = {"fp32_full_forward": FullForward(fp32, cfg.bos_id)}
    for name in ("inc_pt2e_dynamic", "inc_pt2e_dynamic_calibrated"):
        if name in models:
            full[name] = FullForward(models.pop(name), cfg.bos_id)

    run = lambda d, ids: _greedy_one(d, ids, gen)  # noqa: E731
    turns(cached, src[:5], gen, run)
    outputs, secs = turns(cached, src, gen, run)
    rows = score(outputs, secs, tokenizer, refs, "fp32")
    # The exported graphs run quantize/dequantize pairs eagerly (seconds a sentence): 50 sentences.
    outputs_full, secs_full = turns(full, src[:50], gen, run)
    rows.update(score(outputs_full, secs_full, tokenizer, refs[:50], "fp32_full_forward"))
    for name, row in rows.items():
        row["sentences"] = len((outputs | outputs_full)[name])
        row["identical_to_fp32"] = sum(a == b for a, b in zip((outputs | outputs_full)[name], outputs["fp32"]))
        row["quantize_s"] = seconds.get(name, "")
        model = {"fp32": fp32, "fp32_full_forward": fp32} | models
        if name in model:
            row["mb_state"] = round(state_bytes(model[name]) / 1e6, 3)

    # autotune: whole-model configs tried in order, the first whose metric is within a relative
    # tolerance of fp32's returned (here BLEU on 50 sentences, RTN at 2, 4 and 8 bits).
    def bleu_of(model) -> float:
        import sacrebleu

        hyps = [_greedy_one(TorchDecoder(model), ids, gen) for ids in src[:50]]
        return sacrebleu.corpus_bleu(tokenizer.decode(hyps), [refs[:50]]).score

    trials = []

    def recorded(model) -> float:
        trials.append(round(bleu_of(model), 2))
        return trials[-1]

    tuned = autotune(
        copy.deepcopy(fp32),
        TuningConfig(config_set=[RTNConfig(bits=[2, 4, 8], group_size=32, use_layer_wise=False)], tolerable_loss=0.01),
        eval_fn=recorded,
    )
    autotune_result = {
        "bleu_fp32_then_trials": trials,
        "chosen_bits": sorted({getattr(m, "bits", None) for m in tuned.modules() if hasattr(m, "bits")} - {None}),
    }
    print("autotune:", autotune_result)
    examples = {name: tokenizer.decode(hyps) for name, hyps in outputs_full.items()}
    result = {
        "examples": examples,
        "autotune": autotune_result,
        "neural_compressor": neural_compressor.__version__,
        "torch": torch.__version__,
        "sentences": len(src),
        "rows": list(rows.values()),
        "failed": notes,
    }
    (work / "torch.json").write_text(json.dumps(result, indent=2) + "\n")
    table(
        result["rows"],
        ["variant", "sentences", "identical_to_fp32", "bleu", "ms_sentence", "quantize_s", "mb_state"],
    )


# ------------------------------------------------------------------ marian (venv-inc)
def marian(work: Path, data: Path) -> None:
    """The tests' tiny Marian (tests/helpers/marian.py: random weights, d_model 32, one layer a
    side), fp32 against INC's PT2E dynamic int8: teacher-forced argmax on 50 pairs."""
    import gzip

    import torch
    import transformers
    from neural_compressor.torch.export import export
    from neural_compressor.torch.quantization import DynamicQuantConfig, convert, prepare

    from tests.helpers.marian import make_marian

    folder = work / "marian"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    ckpt = make_marian(folder / "opus-mt-tiny", data)
    model = transformers.MarianMTModel.from_pretrained(ckpt).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(ckpt)
    lines = {}
    for lang in ("en", "fr"):
        with gzip.open(data / "multi30k" / f"train.{lang}.gz", "rt") as f:
            lines[lang] = [s.strip() for _, s in zip(range(50), f)]
    pad = model.config.decoder_start_token_id
    pairs = [
        (tokenizer(s).input_ids, [pad] + tokenizer(text_target=t).input_ids[:-1])
        for s, t in zip(lines["en"], lines["fr"])
    ]

    class Forward(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, decoder_input_ids):
            return self.inner(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits

    fp32 = Forward(model).eval()
    example = (torch.tensor([pairs[0][0]]), torch.tensor([pairs[0][1]]))
    dims = {
        "input_ids": {1: torch.export.Dim("s", min=2, max=127)},
        "decoder_input_ids": {1: torch.export.Dim("t", min=2, max=127)},
    }

    def argmax_ids(forward) -> list[int]:
        with torch.no_grad():
            return [i for s, t in pairs for i in forward(torch.tensor([s]), torch.tensor([t]))[0].argmax(-1).tolist()]

    def summary(ids: list[int], reference: list[int]) -> dict:
        top = max(set(ids), key=ids.count)
        return {
            "argmax_agree_with_fp32": sum(a == b for a, b in zip(ids, reference)),
            "distinct_argmax": len(set(ids)),
            "most_common": top,
            "most_common_share": round(ids.count(top) / len(ids), 3),
        }

    def observers(prepared) -> dict[str, list[str]]:
        """Observer kind -> what it watches: the weights' min-max observers only see a value
        when the prepared model runs."""
        seen: dict[str, set[str]] = {}
        for node in prepared.graph.nodes:
            module = getattr(prepared, node.target) if node.op == "call_module" else None
            if module is not None and "Observer" in type(module).__name__:
                watched = "weights" if str(node.args[0]).endswith("weight") else "activations"
                seen.setdefault(type(module).__name__, set()).add(watched)
        return {kind: sorted(what) for kind, what in seen.items()}

    reference = argmax_ids(fp32)
    result = {"positions": len(reference), "fp32": summary(reference, reference)}
    # As INC's docs say (PT_DynamicQuant.md): export, prepare, convert; no calibration run.
    prepared = prepare(
        export(Forward(model).eval(), example, dynamic_shapes=dims), DynamicQuantConfig(), example_inputs=example
    )
    result["observers"] = observers(prepared)
    result["inc_dynamic_as_documented"] = summary(argmax_ids(convert(prepared)), reference)
    # The same with the prepared model run on the 50 pairs before convert.
    prepared = prepare(
        export(Forward(model).eval(), example, dynamic_shapes=dims), DynamicQuantConfig(), example_inputs=example
    )
    argmax_ids(prepared)
    result["inc_dynamic_after_a_calibration_run"] = summary(argmax_ids(convert(prepared)), reference)
    result["torch_dynamic_int8"] = summary(
        argmax_ids(torch.ao.quantization.quantize_dynamic(Forward(model).eval(), {torch.nn.Linear}, dtype=torch.qint8)),
        reference,
    )
    (work / "marian.json").write_text(json.dumps(result, indent=2) + "\n")
    print(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["record", "onnx", "compare", "packages", "torch", "marian"])
    parser.add_argument("paths", nargs="+", type=Path, help="STORE W (marian: W)")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"), help="marian: PIPELINE_DATA")
    args = parser.parse_args()
    if args.step == "marian":
        marian(args.paths[-1], args.data)
        return
    store, work = args.paths
    work.mkdir(parents=True, exist_ok=True)
    {
        "record": lambda: record(store, work, args.sentences),
        "onnx": lambda: onnx_step(store, work),
        "compare": lambda: compare(store, work, args.sentences),
        "packages": lambda: packages(store, work, args.sentences),
        "torch": lambda: torch_step(store, work, args.sentences),
    }[args.step]()


if __name__ == "__main__":
    main()
