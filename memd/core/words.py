"""How the scanner's rules and its learned model split a normalised (case-folded, NFKC) text
into words, defined once so that both read the same words."""

from __future__ import annotations

# Everything but letters and digits separates words (the apostrophe too: "user's" holds "user").
PUNCTUATION_MARKS = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
# For an ASCII text's bytes: bytes.translate is a table lookup, a few times faster than str's.
_SEPARATOR_BYTES = bytes.maketrans(PUNCTUATION_MARKS.encode(), b" " * len(PUNCTUATION_MARKS))
# Words of a non-ASCII text: runs of Latin, Greek or Cyrillic letters and digits...
LETTER_RUN = r"[0-9a-z\u00b5\u00c0-\u024f\u0370-\u03ff\u0400-\u052f\u1e00-\u1eff]+"
# ... and runs of Chinese, Japanese or Korean characters, which are written without spaces.
DENSE_RUN = r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"


def ascii_words(text: str) -> list[str]:
    """The words of an ASCII text, in order."""
    return text.encode().translate(_SEPARATOR_BYTES).decode().split()
