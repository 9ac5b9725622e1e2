"""One place opens a model folder (mt_runtime/registry.py, the pipeline's kinds registered by
pipeline/measure/translators.py): an ONNX package, a PyTorch model and a CTranslate2 folder made
from one tiny model each open as their runtime's translator, which every caller drives the same
way (translate, describe, runtime, device); a folder of no known kind is one line naming the kinds.
The imported Hugging Face kinds: tests/training/test_hf_teacher.py."""

from __future__ import annotations

import pytest
import torch
from mt_runtime import registry
from mt_runtime.registry import NotAModel, TextTranslator, open_translator

from model.subword_training import train_subword
from model.transformer import Transformer, save_model
from pipeline.engine.errors import UserInputError
from pipeline.export.package_builder import build_package
from pipeline.measure.translators import kind_of, open_model
from tests.helpers import cli, multi30k_head, one_layer_config


def test_the_registry_opens_each_kind_of_folder_once(tmp_path, data_dir, monkeypatch):
    ctranslate2_export = pytest.importorskip("model.ctranslate2_export")
    en, fr = multi30k_head(data_dir, "en", 200), multi30k_head(data_dir, "fr", 200)
    tokenizer = train_subword(en + fr, vocab_size=200)
    torch.manual_seed(0)
    ids = {"pad_id": tokenizer.pad_id, "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id}
    model = Transformer(one_layer_config(tokenizer.vocab_size, max_positions=64, **ids)).eval()
    folders = {"torch": tmp_path / "model"}
    save_model(model, folders["torch"])
    tokenizer.save(folders["torch"] / "tokenizer.json")
    folders["onnx-package"] = tmp_path / "fp32"
    build_package(model, "fp32", folders["onnx-package"], tokenizer=folders["torch"] / "tokenizer.json", work=tmp_path)
    folders["ctranslate2"] = tmp_path / "ct2"
    ctranslate2_export.export_ctranslate2(folders["torch"], folders["ctranslate2"], "float32")

    import mt_runtime.translator as onnx_translator

    verified = []
    real = onnx_translator.verify_package
    monkeypatch.setattr(onnx_translator, "verify_package", lambda folder: verified.append(folder) or real(folder))
    runtimes = {"onnx-package": "onnxruntime", "torch": "torch", "ctranslate2": "ctranslate2"}
    outputs = {}
    for kind, folder in folders.items():
        assert kind_of(folder).name == kind
        translator = open_model(folder, threads=1)
        assert isinstance(translator, TextTranslator) and translator.runtime == runtimes[kind]
        described = translator.describe()
        assert described["runtime"] == translator.runtime and described["device"] == translator.device == "cpu"
        outputs[kind] = translator.translate(en[:4] + [""], beam=1, max_batch=2)
    assert verified == [folders["onnx-package"]]  # the package's files checked once, when it opened
    # The same weights give the same greedy translations in every runtime.
    assert outputs["onnx-package"] == outputs["torch"] == outputs["ctranslate2"] and outputs["torch"][-1] == ""

    # A package opens without the pipeline too: mt-runtime registers that kind itself.
    assert open_translator(folders["onnx-package"], threads=1, search="python").describe()["search"] == "python"


def test_a_folder_of_no_known_kind_is_one_line_naming_the_kinds(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "model.bin").write_bytes(b"")  # CTranslate2's weights alone: not enough
    with pytest.raises(NotAModel) as caught:
        open_translator(tmp_path / "notes")
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"{tmp_path / 'notes'}: not a model folder of any known kind")
    assert all(kind.name in line for kind in registry.kinds()) and "model.safetensors + config.json" in line
    with pytest.raises(UserInputError, match="not a model folder"):
        open_model(tmp_path / "notes")
    proc = cli("translate", "--model", str(tmp_path / "notes"), store=tmp_path / "store", input=b"A dog.\n")
    assert proc.returncode == 2 and len(proc.stderr.decode().strip().splitlines()) == 1
