"""A teacher imported from a Hugging Face checkpoint: a tiny, randomly initialised Marian model
with a SentencePiece vocabulary trained here on a few hundred Multi30k sentences (no network)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil

import pytest

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

from pipeline.commands import plan_recipe  # noqa: E402
from pipeline.engine.errors import RecipeError  # noqa: E402
from pipeline.engine.runner import run  # noqa: E402
from pipeline.engine.store import Store  # noqa: E402
from tests.helpers import cli  # noqa: E402
from tests.helpers.marian import _recipe, biased_to  # noqa: E402


@pytest.fixture(scope="module")
def wordy_marian(marian, tmp_path_factory):
    """The tiny Marian with its output layer biased to a dozen whole French words: it writes
    sequences of them, which re-encode to the ids it wrote (a random model's pieces rarely do, and
    the KD corpus keeps the teacher's distributions only where they line up with the student's encoding)."""
    from mt_runtime.subword import SubwordTokenizer

    from model.hf_tokenizer import teacher_tokenizers

    folder = tmp_path_factory.mktemp("wordy") / "opus-mt-wordy"
    shutil.copytree(marian, folder)
    tok = SubwordTokenizer(*teacher_tokenizers(folder))
    vocab = json.loads((folder / "vocab.json").read_text())
    words = [i for p, i in vocab.items() if p.startswith("▁") and len(p) > 3 and tok.encode_target([p[1:]])[0] == [i]][
        :12
    ]
    assert len(words) == 12
    return biased_to(folder, words)


@pytest.mark.slow
def test_an_imported_teacher_is_distilled_through_both_decoders(marian, tmp_path):
    store = Store(tmp_path / "store")
    plan = plan_recipe(_recipe(tmp_path, marian), [])
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
        assert rows[f"ctranslate2_teacher_{ct}"]["latency_ms"]["greedy_b1"]["p50"] > 0, rows[
            f"ctranslate2_teacher_{ct}"
        ]
    assert "imported, not trained" in (arts["report"].path / "report.md").read_text()

    # The fingerprint follows the weights: other weights, a new teacher and all that follows.
    changed = tmp_path / "changed"
    shutil.copytree(marian, changed)
    again = {n.name: n.fingerprint for n in plan_recipe(_recipe(tmp_path, changed), []).nodes}
    assert again["teacher"] == {n.name: n.fingerprint for n in plan.nodes}["teacher"]  # same bytes, same teacher
    weights = bytearray((changed / "model.safetensors").read_bytes())
    weights[len(weights) // 2] ^= 0x40  # one weight's exponent bit
    (changed / "model.safetensors").write_bytes(bytes(weights))
    other = {n.name: n.fingerprint for n in plan_recipe(_recipe(tmp_path, changed), []).nodes}
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
        transformers.BertModel(
            transformers.BertConfig(
                vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
            )
        ).save_pretrained(folder)
        recipe, expect = _recipe(tmp_path, folder), "not an encoder-decoder model"
    elif case == "hub_without_network":
        recipe, expect = _recipe(tmp_path, "Helsinki-NLP/opus-mt-en-fr"), "cannot be reached"
    else:
        recipe = _recipe(tmp_path, marian)
        text = recipe.read_text().replace(
            "    model: {d_model: 16", "    word_level: {enabled: true}\n    model: {d_model: 16"
        )
        recipe.write_text(text)
        expect = "word-level distillation needs one vocabulary"
    done = cli(
        "run",
        str(recipe),
        "--until",
        "kd_corpus",
        store=tmp_path / "s",
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")},
    )
    err = done.stderr.decode()
    lines = [ln for ln in err.splitlines() if "error" in ln.lower()]
    assert done.returncode == 2, err[-2000:]
    assert len(lines) == 1 and expect in lines[0], err[-2000:]


def test_an_imported_teacher_is_not_also_trained(marian, tmp_path):
    recipe = _recipe(tmp_path, marian)
    recipe.write_text(recipe.read_text().replace("  pretrained:", "  model: {d_model: 32}\n  pretrained:"))
    with pytest.raises(RecipeError, match="drop teacher.model"):
        plan_recipe(recipe, [])


def test_the_teachers_vocabulary_splits_text_as_marian_does(marian, data_dir):
    from mt_runtime.subword import SubwordTokenizer

    from model.hf_tokenizer import teacher_tokenizers

    ours = SubwordTokenizer(*teacher_tokenizers(marian))
    theirs = transformers.AutoTokenizer.from_pretrained(str(marian))
    assert ours.target is not None  # the two sides split text differently
    assert ours.vocab_size == len(theirs.get_vocab()) + 1 and ours.bos_id == len(theirs.get_vocab())  # + <s>
    assert (ours.pad_id, ours.eos_id, ours.unk_id) == (theirs.pad_token_id, theirs.eos_token_id, theirs.unk_token_id)
    with (
        gzip.open(data_dir / "multi30k" / "val.en.gz", "rt") as en,
        gzip.open(data_dir / "multi30k" / "val.fr.gz", "rt") as fr,
    ):
        sources, targets = [s.strip() for _, s in zip(range(300), en)], [t.strip() for _, t in zip(range(300), fr)]
    sources += ["  Two  dogs\u00a0run ", "ﬁne café №5 ½", ""]
    for ids, expected in (
        (ours.encode(sources), theirs(sources, add_special_tokens=False).input_ids),
        (ours.encode_target(targets), theirs(text_target=targets, add_special_tokens=False).input_ids),
    ):
        # Where they differ, SentencePiece wrote <unk> for a character its model never saw and
        # the Unigram spelt it with pieces of the other language's model.
        differ = [(a, b) for a, b in zip(ids, expected) if a != b]
        assert all(ours.unk_id in b for _, b in differ) and len(differ) <= len(ids) // 50, differ[:3]
    # Decoded as Marian decodes, but for <unk>, which we write where Marian drops it (as for our own vocabularies).
    written = [
        ids for ids in theirs(text_target=targets[:100], add_special_tokens=False).input_ids if ours.unk_id not in ids
    ]
    assert len(written) >= 90
    assert ours.decode(written) == [theirs.decode(ids, skip_special_tokens=True) for ids in written]


@pytest.mark.slow
def test_a_student_on_the_teachers_vocabulary_learns_from_its_distributions(wordy_marian, tmp_path):
    """tokenizer: {kind: teacher}: the student speaks the teacher's ids, so the KD corpus keeps the
    teacher's distributions for word-level distillation and the student starts from its embedding."""
    import numpy as np
    import torch
    from mt_runtime.subword import TARGET_FILE, SubwordTokenizer

    from model.torch_decoder import TorchTranslator
    from pipeline.corpora.distilled import TopKStore
    from pipeline.corpora.splits import read_split

    marian = wordy_marian
    recipe = _recipe(tmp_path, marian)
    text = recipe.read_text().replace("tokenizer: {kind: unigram, vocab_size: 400}", "tokenizer: {kind: teacher}")
    text = text.replace("corpus: {beam: 1,", "corpus: {beam: 1, top_k: 4,").replace(
        "    model: {d_model: 16",
        "    word_level: {enabled: true, from_kd_corpus: true}\n"
        "    embeddings_from_teacher: true\n    model: {d_model: 16",
    )
    recipe.write_text(text)
    store = Store(tmp_path / "store")
    plan = plan_recipe(recipe, ["export={}", "quantize={}"])
    run(plan, store, until="quantize")
    arts = {n.name: store.get(n.id) for n in plan.nodes if store.exists(n.id)}
    tokenizer, kd, student = arts["tokenizer"], arts["kd_corpus"], arts["student"]
    assert "teacher" in tokenizer.manifest["inputs"] and tokenizer.metrics["target_side"]
    tok = SubwordTokenizer.load(student.path)
    assert tok.target is not None and (student.path / TARGET_FILE).is_file()
    assert tok.vocab_size == len(json.loads((marian / "vocab.json").read_text())) + 1

    # The stored distributions are the teacher's, in its ids, at the positions of the student's
    # encoding of each translation: the top choice at each is the id the teacher wrote.
    stored = TopKStore(kd.path)
    src, tgt = read_split(kd.path, "kd")
    present = [i for i in range(len(stored)) if stored[i] is not None]
    assert len(present) == len(stored) - kd.metrics["top_k"]["pairs_without"] >= len(stored) * 0.9
    teacher = transformers.MarianMTModel.from_pretrained(str(marian)).eval()
    hf = transformers.AutoTokenizer.from_pretrained(str(marian))
    for i in present[:10]:
        ids, probs = stored[i]
        target = tok.encode_target([tgt[i]])[0]
        assert ids.shape == (len(target) + 1, 4) and ids[:-1, 0].tolist() == target
        with torch.no_grad():
            logits = teacher(
                **hf([src[i]], return_tensors="pt"),
                decoder_input_ids=torch.tensor([[teacher.config.decoder_start_token_id] + target]),
            ).logits[0]
        forced_p, forced_ids = logits.softmax(-1).topk(4, -1)
        assert (forced_ids.numpy() == ids).all()
        np.testing.assert_allclose(
            np.asarray(probs, dtype=np.float32), (forced_p / forced_p.sum(-1, keepdim=True)).numpy(), atol=3e-3
        )
    assert student.metrics["word_level_pairs"] == len(present)
    assert student.metrics["embeddings_from_teacher"]["teacher_d_model"] == 32

    # The student is a model of ours, on the teacher's vocabulary, that translates text.
    translator = TorchTranslator.load(student.path)
    cfg = translator.model.cfg
    assert translator.model.embed.weight.shape[0] == tok.vocab_size
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id) == (tok.pad_id, tok.bos_id, tok.eos_id) != (0, 1, 2)
    assert len(translator.translate(["A man is riding a bike.", "Two dogs."], beam=2)) == 2

    # What follows the student is unchanged with the teacher's special ids (pad last, </s> first):
    # the torch-free packages translate as the student does, and CTranslate2 converts it.
    from mt_runtime.translator import Translator

    expected = translator.translate(src[:8], beam=1)
    assert Translator(arts["export.student"].path / "fp32", threads=1).translate(src[:8], beam=1) == expected
    assert len(Translator(arts["quantize"].path / "int8_dynamic", threads=1).translate(src[:8], beam=2)) == 8
    if importlib.util.find_spec("ctranslate2"):
        from model.ctranslate2_export import compare_greedy, export_ctranslate2

        export_ctranslate2(student.path, tmp_path / "ct2", "float32")
        check = compare_greedy(student.path, tmp_path / "ct2", src[:8])
        assert check["identical"] == check["sentences"] == 8, check["mismatches"]


def test_the_teachers_vocabulary_needs_an_imported_teacher_and_its_distributions_stored(marian, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: x\ndata: {source: multi30k}\ntokenizer: {kind: teacher}\n", encoding="utf-8")
    with pytest.raises(RecipeError, match="needs teacher.pretrained"):
        plan_recipe(recipe, [])
    recipe = _recipe(tmp_path, marian)  # an imported teacher is not run in the student's training loop
    with pytest.raises(RecipeError, match="set from_kd_corpus: true"):
        plan_recipe(recipe, ["tokenizer={kind: teacher}", "distill.student.word_level.enabled=true"])


def test_a_fast_tokenizer_converts_with_its_ids(tmp_path, data_dir):
    """A checkpoint whose tokenizer transformers builds in `tokenizers` (T5, NLLB, BART, ...): one
    tokenizer for both sides, the same ids, <s> added where the vocabulary lacks it."""
    from mt_runtime.subword import SubwordTokenizer
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from model.hf_tokenizer import UnconvertibleTokenizer, teacher_tokenizers

    with gzip.open(data_dir / "multi30k" / "val.en.gz", "rt") as f:
        lines = [s.strip() for _, s in zip(range(300), f)]
    backend = Tokenizer(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.train_from_iterator(
        lines, trainers.UnigramTrainer(vocab_size=200, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    )
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    hf.save_pretrained(tmp_path / "t5ish")
    source, target = teacher_tokenizers(tmp_path / "t5ish")
    ours = SubwordTokenizer(source, target)
    assert target is None and ours.vocab_size == 201 and ours.bos_id == 200
    assert ours.encode(lines[:50]) == hf(lines[:50], add_special_tokens=False).input_ids
    written = [ids + [hf.eos_token_id, hf.pad_token_id] for ids in hf(lines[:50]).input_ids]  # as a decoder ends them
    assert ours.decode(written) == [hf.decode(ids, skip_special_tokens=True) for ids in written]

    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", eos_token="</s>", unk_token="<unk>"
    )
    hf.save_pretrained(tmp_path / "odd")
    with pytest.raises(UnconvertibleTokenizer, match="pad '\\[PAD\\]'"):
        teacher_tokenizers(tmp_path / "odd")


def test_the_registry_opens_an_imported_teacher_and_its_ctranslate2_conversion(marian, tmp_path):
    """The imported kinds (mt_runtime/registry.py, registered by pipeline/measure/translators.py):
    an import_teacher artifact's folder (hf_import.json + checkpoint/) opens in transformers, the
    benchmark's CTranslate2 conversion of it (model.bin + hf/) in CTranslate2."""
    pytest.importorskip("ctranslate2")
    from model.hf_translator import convert_for_serving
    from pipeline.measure.translators import kind_of, open_model

    imported = tmp_path / "import_teacher"
    shutil.copytree(marian, imported / "checkpoint")
    (imported / "hf_import.json").write_text("{}", encoding="utf-8")
    converted = convert_for_serving(imported / "checkpoint", tmp_path / "teacher-float32")
    sentences = ["A man is riding a bike.", "Two dogs play in the snow."]
    outputs = {}
    kinds = ((imported, "hf-import", "transformers"), (converted, "ctranslate2-hf", "ctranslate2"))
    for folder, kind, runtime in kinds:
        assert kind_of(folder).name == kind
        translator = open_model(folder, threads=1)
        assert translator.runtime == translator.describe()["runtime"] == runtime and translator.device == "cpu"
        outputs[kind] = translator.translate(sentences, beam=1)
    for out in outputs.values():  # a random model: the two engines' texts agree only mostly
        assert len(out) == 2 and all(out)
