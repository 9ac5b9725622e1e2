"""A teacher imported from a Hugging Face checkpoint: a tiny, randomly initialised Marian model
with a SentencePiece vocabulary trained here on a few hundred Multi30k sentences (no network)."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

from pipeline.errors import RecipeError  # noqa: E402
from pipeline.runner import make_plan, run  # noqa: E402
from pipeline.store import Store  # noqa: E402

from .conftest import cli  # noqa: E402

RECIPE = """name: hf_smoke
data: {{source: multi30k, src_lang: en, tgt_lang: fr, max_train: 100, max_valid: 20, max_test: 20}}
tokenizer: {{kind: unigram, vocab_size: 400}}
teacher:
  pretrained: {{path: {path}{decoder}}}
distill:
  corpus: {{beam: 1, batch_tokens: 2000}}
  student:
    model: {{d_model: 16, encoder_layers: 1, decoder_layers: 1, heads: 2, head_dim: 8, ffn_dim: 32, max_positions: 128}}
    train: {{lr: 0.003, warmup_steps: 5, batch_tokens: 1200, max_steps: 6, max_epochs: null,
            valid_bleu_sentences: 10, num_threads: 1}}
  ablation: false
evaluate: {{beam: 1, greedy_too: false}}
benchmark: {{sentences: 4, batch_size: 2, min_repeats: 1, max_repeats: 1, threads: [1], paired_rounds: 0}}
report: {{}}
"""


@pytest.fixture(scope="module")
def marian(tmp_path_factory, data_dir):
    """A Marian checkpoint folder as OPUS-MT's are laid out (vocab.json, source/target.spm)."""
    folder = tmp_path_factory.mktemp("marian")
    with gzip.open(data_dir / "multi30k" / "train.en.gz", "rt") as en, gzip.open(data_dir / "multi30k" / "train.fr.gz",
                                                                               "rt") as fr:
        lines = [s.strip() for _, s in zip(range(400), en)] + [t.strip() for _, t in zip(range(400), fr)]
    (folder / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(folder / "corpus.txt"), model_prefix=str(folder / "sp"), vocab_size=300,
                                   character_coverage=1.0, bos_id=-1, eos_id=1, pad_id=-1, unk_id=0,
                                   minloglevel=2)
    pieces = spm.SentencePieceProcessor(model_file=str(folder / "sp.model"))
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(pieces.get_piece_size()):
        vocab.setdefault(pieces.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)  # Marian's pad is the last id
    ckpt = folder / "opus-mt-tiny"
    ckpt.mkdir()
    (ckpt / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(folder / "sp.model", ckpt / name)
    tokenizer = transformers.MarianTokenizer(vocab=str(ckpt / "vocab.json"), source_spm=str(ckpt / "source.spm"),
                                             target_spm=str(ckpt / "target.spm"), source_lang="en", target_lang="fr")
    config = transformers.MarianConfig(
        vocab_size=len(vocab), d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
        pad_token_id=vocab["<pad>"], eos_token_id=0, decoder_start_token_id=vocab["<pad>"], forced_eos_token_id=0)
    transformers.set_seed(0)
    transformers.MarianMTModel(config).save_pretrained(ckpt)
    tokenizer.save_pretrained(ckpt)
    return ckpt


def _recipe(tmp_path, path, decoder=None):
    recipe = tmp_path / "hf.yaml"
    recipe.write_text(RECIPE.format(path=path, decoder=f", decoder: {decoder}" if decoder else ""), encoding="utf-8")
    return recipe


def test_an_imported_teacher_is_distilled_through_both_decoders(marian, tmp_path):
    store = Store(tmp_path / "store")
    plan = make_plan(_recipe(tmp_path, marian), [])
    run(plan, store)
    arts = {n.name: store.get(n.id) for n in plan.nodes if store.exists(n.id)}
    teacher, kd = arts["teacher"], arts["kd_corpus"]
    assert teacher.metrics["imported"] and teacher.metrics["model_type"] == "marian"
    assert "checkpoint/model.safetensors" in teacher.manifest["files"]
    assert kd.metrics["decoder"] == "ctranslate2"
    decoders = kd.metrics["decoders"]
    assert decoders["ctranslate2"]["sentences_per_s"] > 0 and decoders["transformers"]["sentences_per_s"] > 0
    assert decoders["identical_outputs"] == decoders["ctranslate2"]["sentences"]

    # The corpus is the model's own greedy output, as transformers' generate writes it.
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(marian)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(marian))
    src = (kd.path / "kd.src").read_text(encoding="utf-8").splitlines()
    tgt = (kd.path / "kd.tgt").read_text(encoding="utf-8").splitlines()
    assert len(src) == len(tgt) == kd.metrics["sentences"] == 100 - kd.metrics["empty_translations"] > 0
    for s, t in list(zip(src, tgt))[:12]:
        ids = tokenizer([s], return_tensors="pt").input_ids
        limit = max(8, min(128, int(1.5 * ids.shape[1]) + 10))
        out = model.generate(input_ids=ids, num_beams=1, do_sample=False, max_new_tokens=limit)
        assert tokenizer.decode(out[0], skip_special_tokens=True).strip() == t

    # The student has its own small tokenizer and trained on the teacher's text; the teacher is scored.
    assert arts["student"].metrics["source"] == "kd_corpus"
    assert arts["evaluate.teacher"].metrics["runtime"] == "transformers"

    # (Pruning, export and int8 after the student are the same code as with our own teacher: not rerun here.)
    # The report has the model the user started from: BLEU, size, and its latency with
    # transformers and with CTranslate2, beside the student's.
    report = json.loads((arts["report"].path / "report.json").read_text())
    rows = {r["name"]: r for r in report["rows"]}
    assert rows["teacher"]["bleu"] == arts["evaluate.teacher"].metrics["bleu"]
    assert rows["teacher"]["bytes"] == teacher.metrics["model_bytes"] > 0
    assert rows["teacher"]["latency_ms"]["greedy_b1"]["p50"] > 0
    for ct in ("int8", "float32"):
        assert rows[f"ctranslate2_teacher_{ct}"]["latency_ms"]["greedy_b1"]["p50"] > 0, rows[f"ctranslate2_teacher_{ct}"]
    assert "imported, not trained" in (arts["report"].path / "report.md").read_text()

    # The fingerprint follows the weights: other weights, a new teacher and all that follows.
    changed = tmp_path / "changed"
    shutil.copytree(marian, changed)
    again = {n.name: n.fingerprint for n in make_plan(_recipe(tmp_path, changed), []).nodes}
    assert again["teacher"] == {n.name: n.fingerprint for n in plan.nodes}["teacher"]  # same bytes, same teacher
    weights = bytearray((changed / "model.safetensors").read_bytes())
    weights[len(weights) // 2] ^= 0x40  # one weight's exponent bit
    (changed / "model.safetensors").write_bytes(bytes(weights))
    other = {n.name: n.fingerprint for n in make_plan(_recipe(tmp_path, changed), []).nodes}
    assert other["teacher"] != again["teacher"] and other["student"] != again["student"]


@pytest.mark.parametrize("case", ["not_a_checkpoint", "encoder_only", "hub_without_network", "word_level"])
def test_bad_teachers_are_one_line_and_exit_2(case, marian, tmp_path):
    if case == "not_a_checkpoint":
        folder = tmp_path / "empty"
        folder.mkdir()
        (folder / "weights.txt").write_text("nothing")
        recipe, expect = _recipe(tmp_path, folder), "not a checkpoint folder"
    elif case == "encoder_only":
        folder = tmp_path / "bert"
        transformers.BertModel(transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                       num_attention_heads=2, intermediate_size=32)).save_pretrained(folder)
        recipe, expect = _recipe(tmp_path, folder), "not an encoder-decoder model"
    elif case == "hub_without_network":
        recipe, expect = _recipe(tmp_path, "Helsinki-NLP/opus-mt-en-fr"), "cannot be reached"
    else:
        recipe = _recipe(tmp_path, marian)
        text = recipe.read_text().replace("    model: {d_model: 16", "    word_level: {enabled: true}\n    model: {d_model: 16")
        recipe.write_text(text)
        expect = "word-level distillation needs one vocabulary"
    done = cli("run", str(recipe), "--until", "kd_corpus", store=tmp_path / "s",
               env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")})
    err = done.stderr.decode()
    lines = [ln for ln in err.splitlines() if "error" in ln.lower()]
    assert done.returncode == 2, err[-2000:]
    assert len(lines) == 1 and expect in lines[0], err[-2000:]


def test_an_imported_teacher_is_not_also_trained(marian, tmp_path):
    recipe = _recipe(tmp_path, marian)
    recipe.write_text(recipe.read_text().replace("  pretrained:", "  model: {d_model: 32}\n  pretrained:"))
    with pytest.raises(RecipeError, match="drop teacher.model"):
        make_plan(recipe, [])
