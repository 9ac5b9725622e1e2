"""One text, one line: where text is written a sentence a line, a decoded string must never add
or remove a line, whatever a tokenizer's pieces hold.

`one_line` replaces every character str.splitlines() ends a line at (\\n, \\r, \\v, \\f, \\x1c-\\x1e,
U+0085, U+2028, U+2029; \\r\\n is two of them) by a space. Standard library only.
"""

from __future__ import annotations

import re

# Every character str.splitlines() ends a line at.
LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """text with every line break replaced by a space."""
    return LINE_BREAKS.sub(" ", text)
