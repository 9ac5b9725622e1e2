"""An imported teacher's tokenizer as the student's (`tokenizer: {kind: teacher}`): the checkpoint's
vocabulary in the pipeline's format (HF `tokenizers`, the teacher's ids), so that the student can
learn from the teacher's distributions, start from its embedding, and still ship with tokenizers
and onnxruntime alone (no sentencepiece, no transformers).

Two kinds of checkpoint tokenizer convert:
- a fast one (tokenizer.json, or one transformers builds: T5, NLLB, BART, ...): one tokenizer
  for both sides;
- Marian's (OPUS-MT): a SentencePiece model per side over one joint vocab.json. Each side becomes
  a Unigram over the joint vocabulary, scored by that side's SentencePiece model, so that it
  splits as MarianTokenizer does (tests/training/test_hf_teacher.py checks the ids). The source side is
  tokenizer.json (what the shipped package encodes, and decodes any id with); the target side is
  the training targets' (tokenizer.target.json).
The pipeline's decoder starts from <s>: a vocabulary without one (Marian's) gets it as one more id.
"""

from __future__ import annotations

import json
from pathlib import Path

from mt_runtime.subword import BOS, EOS, PAD, SPECIALS, UNK
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from .hf_checkpoint import check_checkpoint, from_pretrained

# A piece of the joint vocabulary that this side's SentencePiece model lacks: scored below any
# real segmentation, so that it is chosen only where SentencePiece would write <unk>.
_ABSENT_PIECE_SCORE = -1e4


class UnconvertibleTokenizer(ValueError):
    """The checkpoint's tokenizer has no form the pipeline's runtime can read."""


def teacher_tokenizers(checkpoint: Path) -> tuple[Tokenizer, Tokenizer | None]:
    """(source side, target side or None where one tokenizer serves both), with the teacher's ids."""
    checkpoint = Path(checkpoint)
    check_checkpoint(checkpoint, weights=False)  # UnsafeCheckpoint (a ValueError) where it is not plain data
    if (checkpoint / "source.spm").is_file() and (checkpoint / "vocab.json").is_file():
        return _marian(checkpoint)
    return _fast(checkpoint), None


def _marian(checkpoint: Path) -> tuple[Tokenizer, Tokenizer | None]:
    settings = _json(checkpoint / "tokenizer_config.json")
    if settings.get("separate_vocabs"):
        raise UnconvertibleTokenizer(
            "the teacher's source and target vocabularies differ (separate_vocabs); "
            "the student ties its embeddings over one"
        )
    vocab = _json(checkpoint / "vocab.json")
    names = {
        "pad": settings.get("pad_token", PAD),
        "eos": settings.get("eos_token", EOS),
        "unk": settings.get("unk_token", UNK),
    }
    _check_special_names(names)
    pieces = [None] * len(vocab)
    for piece, index in vocab.items():
        if not 0 <= index < len(vocab) or pieces[index] is not None:
            raise UnconvertibleTokenizer("the teacher's vocab.json is not one id per piece from 0")
        pieces[index] = piece
    sides = []
    for name in ("source.spm", "target.spm"):
        path = checkpoint / name
        sides.append(_unigram_over(pieces, _sentencepiece_model(path if path.is_file() else checkpoint / "source.spm")))
    source, target = sides
    same = (checkpoint / "target.spm").is_file() and (checkpoint / "target.spm").read_bytes() == (
        checkpoint / "source.spm"
    ).read_bytes()
    return source, None if same else target


def _unigram_over(pieces: list[str], proto) -> Tokenizer:
    """A Unigram over the joint vocabulary with one SentencePiece model's scores and settings
    (normalisation, dummy prefix), as transformers' own SentencePiece conversions build them."""
    scores = {p.piece: p.score for p in proto.pieces if p.type in (1, 4)}  # normal, user-defined
    specials = {PAD, BOS, EOS, UNK}
    vocab = [(piece, 0.0 if piece in specials else scores.get(piece, _ABSENT_PIECE_SCORE)) for piece in pieces]
    tok = Tokenizer(models.Unigram(vocab, unk_id=pieces.index(UNK), byte_fallback=False))
    spec = proto.normalizer_spec
    steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:  # spaces only: SentencePiece leaves other whitespace alone
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if steps:
        tok.normalizer = normalizers.Sequence(steps)
    scheme = "always" if spec.add_dummy_prefix else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    return _with_specials(tok)


def _fast(checkpoint: Path) -> Tokenizer:
    import transformers

    try:
        hf = from_pretrained(transformers.AutoTokenizer, checkpoint, use_fast=True)
    except Exception as exc:  # a tokenizer that needs a library or file we do not have
        raise UnconvertibleTokenizer(f"transformers cannot load it ({type(exc).__name__})") from None
    if not getattr(hf, "is_fast", False):
        raise UnconvertibleTokenizer(f"{type(hf).__name__} has no tokenizers form")
    _check_special_names({"pad": hf.pad_token, "eos": hf.eos_token, "unk": hf.unk_token})
    tok = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    tok.post_processor = None  # the pipeline adds EOS (and the decoder's BOS) itself
    # It pads and cuts sentences itself too: a package's tokenizer has neither setting (the
    # runtime refuses padding and ignores truncation: mt_runtime/package_checks.py).
    tok.no_padding()
    tok.no_truncation()
    return _with_specials(tok)


def _with_specials(tok: Tokenizer) -> Tokenizer:
    """The pipeline's specials marked special (never produced from text), <s> added where missing."""
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return tok


def _check_special_names(names: dict) -> None:
    expected = {"pad": PAD, "eos": EOS, "unk": UNK}
    odd = {k: v for k, v in names.items() if v != expected[k]}
    if odd:
        raise UnconvertibleTokenizer(
            "its special tokens are named "
            + ", ".join(f"{k} {v!r}" for k, v in odd.items())
            + f", not {PAD}, {EOS}, {UNK}"
        )


def _sentencepiece_model(path: Path):
    from sentencepiece import sentencepiece_model_pb2  # protobuf comes with onnx

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    if proto.trainer_spec.model_type != 1:
        raise UnconvertibleTokenizer(f"{path.name} is not a unigram SentencePiece model")
    if proto.trainer_spec.byte_fallback:
        raise UnconvertibleTokenizer(f"{path.name} falls back to bytes, which a tokenizers Unigram does not")
    return proto


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
