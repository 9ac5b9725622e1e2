"""One text, one line: a decoded string never adds or removes a line where text is written a
sentence a line (the KD corpus, hypotheses, `pipeline translate`'s output).

A vocabulary piece may hold any character, a line break too (a teacher's, say), so whatever a
tokenizer's decoder emits goes through `one_line` before it is written: every character
str.splitlines() ends a line at (\\n, \\r, \\v, \\f, \\x1c-\\x1e, U+0085, U+2028, U+2029) becomes a
space (\\r\\n two spaces). Standard library only: this file ships inside every package as
mt_runtime/lines.py (mt_runtime/subword.py decodes through it).
"""

from __future__ import annotations

import re

# Every character str.splitlines() ends a line at.
LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """text with every line break replaced by a space."""
    return LINE_BREAKS.sub(" ", text)
