"""Text a sentence a line, in and out.

Out: a decoded string never adds or removes a line where text is written a sentence a line (the
KD corpus, hypotheses, `translate`'s output). A vocabulary piece may hold any character, a line
break too (a teacher's, say), so whatever a tokenizer's decoder emits goes through `one_line`
before it is written: every character str.splitlines() ends a line at (\\n, \\r, \\v, \\f,
\\x1c-\\x1e, U+0085, U+2028, U+2029) becomes a space (\\r\\n two spaces).

In: `normalize` is how the pipeline's data stage cleans every sentence it trains and tests on, and
so how `translate` (mt-runtime's and the pipeline's) cleans what it is given; `bounded_lines`
reads a stream a line at a time in bounded memory, whatever one line holds.

Standard library only (mt_runtime/subword.py decodes through it; the pipeline imports it).
"""

from __future__ import annotations

import re
import unicodedata
from typing import BinaryIO, Iterator

# Every character str.splitlines() ends a line at.
LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
# The longest input line `translate` reads by default (bytes): far more than a model's positions.
MAX_LINE_BYTES = 16384
_SPACES = re.compile(r"\s+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SKIP_CHUNK = 1 << 16


def one_line(text: str) -> str:
    """text with every line break replaced by a space."""
    return LINE_BREAKS.sub(" ", text)


def normalize(line: str, nfc: bool = True) -> str:
    if nfc:
        line = unicodedata.normalize("NFC", line)
    # Control characters carry no meaning in text and confuse tokenizers; tabs become spaces.
    line = _CONTROL.sub(" ", line)
    return _SPACES.sub(" ", line).strip()


def bounded_lines(stream: BinaryIO, max_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """Each line of `stream` without its newline, cut to at most max_bytes (at a UTF-8 character
    boundary), and whether it was cut. Never holds more than max_bytes + 64 KiB of one line."""
    while True:
        raw = stream.readline(max_bytes + 1)
        if not raw:
            return
        if raw.endswith(b"\n"):
            yield raw[:-1], False
        elif len(raw) <= max_bytes:  # the last line, without a newline
            yield raw, False
        else:
            while (rest := stream.readline(_SKIP_CHUNK)) and not rest.endswith(b"\n"):
                pass
            yield utf8_prefix(raw[:max_bytes]), True


def utf8_prefix(data: bytes) -> bytes:
    """data without a UTF-8 sequence cut off at its end."""
    j = len(data) - 1
    while j >= 0 and len(data) - j <= 4 and 0x80 <= data[j] < 0xC0:
        j -= 1
    if j >= 0 and data[j] >= 0xC0:
        need = 2 if data[j] < 0xE0 else 3 if data[j] < 0xF0 else 4
        if len(data) - j < need:
            return data[:j]
    return data
