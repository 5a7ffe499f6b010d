"""Injection scanner for curated memory entries: pure functions over text, no I/O.

An entry is normalised into one or more *views*: invisible characters dropped (Unicode tag
characters decoded into the ASCII they smuggle), NFKC, case-folded; plus, only when they could
differ, a copy with Cyrillic/Greek look-alikes folded to Latin, a copy with letter-spaced words
joined, and the text of decoded base64 payloads. Small lexicons (action verbs, sensitive
objects, destinations, per-language phrases) are matched on each view and rules combine them:
most findings need an imperative, a sensitive object and, where it applies, a destination in
the same clause, so a note that merely mentions a key, a URL or base64 stays clean.

Speed: Python's regex engine costs about 15 ns per character and alternative, far too much to
run dozens of word lists over every entry. So a view is split into its set of words once (a C
loop), lexicon terms are looked up by whole word or by 4-letter prefix in that set, and only
the terms actually present are located with str.find. Regexes run anchored at those hits or
behind rare gates, never as free searches over an ordinary entry.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from bisect import bisect_left
from collections.abc import Callable, KeysView, Sequence
from dataclasses import dataclass
from operator import itemgetter

# A 100,000-character entry must really be scanned; beyond this the entry is refused unread.
MAX_SCAN_CHARS = 200_000
# Base64 inside base64 is followed this many levels deep.
MAX_DECODE_DEPTH = 3


@dataclass(frozen=True, slots=True)
class Finding:
    id: str
    category: str


TOO_LONG = Finding("too_long", "oversized entry")
OVERRIDE = Finding("override", "instruction override")
OBEY_EXTERNAL = Finding("obey_external", "instruction override")
AUTO_APPROVE = Finding("auto_approve", "permission escalation")
ROLE_HIJACK = Finding("role_hijack", "role impersonation")
FAKE_SYSTEM = Finding("fake_system", "system impersonation")
EXFIL_URL = Finding("exfil_url", "exfiltration")
EXFIL_EMAIL = Finding("exfil_email", "exfiltration")
MD_IMAGE_EXFIL = Finding("md_image_exfil", "markdown-image exfiltration")
SECRET_READ = Finding("secret_read", "reading secrets")
PROMPT_LEAK = Finding("prompt_leak", "system prompt disclosure")
RCE_PIPE_SHELL = Finding("rce_pipe_shell", "remote code execution")
RCE_DECODE_SHELL = Finding("rce_decode_shell", "remote code execution")
REVERSE_SHELL = Finding("reverse_shell", "remote code execution")
CONCEAL = Finding("conceal", "concealment from the user")
CONFIG_TAMPER = Finding("config_tamper", "agent configuration tampering")
PERSISTENCE = Finding("persistence", "persistence")
SSH_KEY_PLANT = Finding("ssh_key_plant", "persistence")
C2_BEACON = Finding("c2_beacon", "command and control")
SECRET_PASSWORD = Finding("secret_password", "hard-coded secret")
SECRET_AWS_KEY = Finding("secret_aws_key", "hard-coded secret")
SECRET_GITHUB_TOKEN = Finding("secret_github_token", "hard-coded secret")
SECRET_API_KEY = Finding("secret_api_key", "hard-coded secret")
SECRET_PRIVATE_KEY = Finding("secret_private_key", "hard-coded secret")
SECRET_JWT = Finding("secret_jwt", "hard-coded secret")
ENCODED_PAYLOAD = Finding("encoded_payload", "encoded (base64) payload")

# The order findings are reported in, whatever order the detectors found them.
FINDING_ORDER: tuple[Finding, ...] = (
    TOO_LONG, OVERRIDE, OBEY_EXTERNAL, AUTO_APPROVE, ROLE_HIJACK, FAKE_SYSTEM, EXFIL_URL,
    EXFIL_EMAIL, MD_IMAGE_EXFIL, SECRET_READ, PROMPT_LEAK, RCE_PIPE_SHELL, RCE_DECODE_SHELL,
    REVERSE_SHELL, CONCEAL, CONFIG_TAMPER, PERSISTENCE, SSH_KEY_PLANT, C2_BEACON,
    SECRET_PASSWORD, SECRET_AWS_KEY, SECRET_GITHUB_TOKEN, SECRET_API_KEY, SECRET_PRIVATE_KEY,
    SECRET_JWT, ENCODED_PAYLOAD,
)


# -- normalisation ---------------------------------------------------------------------------

# Characters that render as nothing (format controls, bidi controls, zero-width, soft hyphen,
# fillers, variation selectors): an attacker splits words with them, so they are dropped.
_INVISIBLE_RANGES = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF9, 0xFFFB), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE001F), (0xE007F, 0xE007F), (0xE0100, 0xE01EF),
)
# Unicode tag characters mirror ASCII (U+E0020-U+E007E): they are decoded, not dropped, so the
# hidden sentence is scanned where it sits.
_TAG_BASE = 0xE0000


def _hidden_table() -> dict[int, str | None]:
    table: dict[int, str | None] = {}
    for low, high in _INVISIBLE_RANGES:
        table.update(dict.fromkeys(range(low, high + 1)))
    table.update({code: chr(code - _TAG_BASE) for code in range(0xE0020, 0xE007F)})
    return table


_HIDDEN_TABLE = _hidden_table()
_HIDDEN_RE = re.compile(
    "[" + "".join(f"{chr(low)}-{chr(high)}" for low, high in _INVISIBLE_RANGES)
    + "\U000e0020-\U000e007e]"
)

# Cyrillic and Greek letters that look like Latin ones, upper and lower case (folded before
# case-folding, so that a Greek capital Eta becomes H rather than the eta's "n"). Folding is
# done on a copy of the text, so genuine Russian keeps matching Russian phrases.
_CONFUSABLES = str.maketrans({
    "А": "A", "В": "B", "Е": "E", "Ё": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P",
    "С": "C", "Т": "T", "Х": "X", "У": "Y", "Ѕ": "S", "І": "I", "Ї": "I", "Ј": "J", "Һ": "H",
    "Ԛ": "Q", "Ԝ": "W", "Ӏ": "I",
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p",
    "с": "c", "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ї": "i", "ј": "j", "һ": "h",
    "ԁ": "d", "ԛ": "q", "ԝ": "w", "ӏ": "l", "ь": "b",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
    "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
    "α": "a", "β": "b", "γ": "y", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o",
    "ρ": "p", "τ": "t", "υ": "u", "χ": "x", "ω": "w", "ϲ": "c", "ϳ": "j",
})
_CYRILLIC_OR_GREEK = re.compile("[\u0370-\u03ff\u0400-\u052f]")

# Horizontal whitespace runs become one space, so multi-word terms match however they are spaced.
_SPACE_RUN = re.compile(r"[^\S\n]+")

# A letter-spaced run: single characters joined by one repeated separator ("i g n o r e",
# "c-u-r-l", "b.a.s.h"), standing alone between spaces. Its characters sit at even offsets.
_SPACED_RUN = re.compile(r"(?<!\S)\S([ .\-_·*])(?:\S\1){0,100000}\S(?!\S)")
# Worth a joined copy: one run of six characters, or two of three (Korean and Chinese words are short).
_SPACED_RUN_SHORT = re.compile(r"(?<!\S)\S([ .\-_·*])\S\1\S(?:\1\S){0,100000}(?!\S)")
_LONG_RUN = 11
_SINGLE_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz")


def _strip_hidden(text: str) -> str:
    if text.isascii() or _HIDDEN_RE.search(text) is None:
        return text
    return text.translate(_HIDDEN_TABLE)


# Full-width punctuation is what usually keeps Chinese or Japanese text from being NFKC already;
# replacing it as NFKC would is much cheaper than normalising the whole text.
_WIDE_PUNCTUATION = tuple((chr(code), chr(code - 0xFEE0)) for code in map(ord, "，：；（）！？"))


def _nfkc(text: str) -> str:
    if text.isascii() or unicodedata.is_normalized("NFKC", text):
        return text
    for wide, narrow in _WIDE_PUNCTUATION:
        if wide in text:
            text = text.replace(wide, narrow)
    if unicodedata.is_normalized("NFKC", text):
        return text
    return unicodedata.normalize("NFKC", text)


def _tidy(text: str) -> str:
    # NFKC has already turned the exotic spaces into plain ones.
    return _SPACE_RUN.sub(" ", text) if ("  " in text or "\t" in text or "\r" in text) else text


def _may_be_letter_spaced(text: str, words: set[str]) -> bool:
    """Cheap test first (an ASCII text needs several one-letter words), then the real one."""
    if text.isascii() and len(words & _SINGLE_LETTERS) < 6:
        return False
    runs = 0
    for match in _SPACED_RUN_SHORT.finditer(text):
        runs += 1
        if runs == 2 or match.end() - match.start() >= _LONG_RUN:
            return True
    return False


def _join_spaced(text: str) -> str:
    return _SPACED_RUN.sub(lambda match: match[0][::2], text)


def _views(clean: str) -> list[_View]:
    """The case-folded texts the detectors read: the entry itself and, when they differ,
    its look-alike-folded and letter-joined copies."""
    texts = [clean]
    if not clean.isascii() and _CYRILLIC_OR_GREEK.search(clean):
        texts.append(clean.translate(_CONFUSABLES))
    folded = [text.casefold() for text in texts]
    views = [_View(_tidy(text)) for text in folded]
    # Joined before spaces are tidied: the wider gaps are what separate the spaced words.
    if _may_be_letter_spaced(folded[0], views[0].words):
        views += [_View(_tidy(_join_spaced(text))) for text in folded]
    return views


# -- lexicons ---------------------------------------------------------------------------------

# Everything but letters and digits separates words (the apostrophe too: "user's" holds "user").
_SEPARATORS = str.maketrans(dict.fromkeys("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", " "))
# Words of a non-ASCII text: runs of Latin, Greek or Cyrillic letters and digits. Chinese,
# Japanese and Korean terms are found by their first character instead.
_WORD = re.compile(r"[0-9a-z\u00b5\u00c0-\u024f\u0370-\u03ff\u0400-\u052f\u1e00-\u1eff]+")
_PREFIX_LENGTH = 4
_PREFIX = itemgetter(slice(0, _PREFIX_LENGTH))
# From here on, scripts written without spaces (CJK, kana, Hangul): no word boundaries.
_DENSE_SCRIPT = "\u2e80"


def _is_word_char(char: str) -> bool:
    return char.isalnum() and char < _DENSE_SCRIPT


@dataclass(frozen=True, slots=True, eq=False)
class _Term:
    """A term to locate. Terms are pooled, one object per spelling and boundaries, so that a
    word several lexicons share is located once per view; they hash by identity (fast)."""

    text: str
    left: bool  # must start at a word boundary
    right: bool  # must end at a word boundary
    words: frozenset[str]  # its complete words, all of which a text holding it holds


_TERM_POOL: dict[tuple[str, bool, bool], _Term] = {}


def _term(text: str, left: bool, right: bool, words: frozenset[str]) -> _Term:
    return _TERM_POOL.setdefault((text, left, right), _Term(text, left, right, words))


_LEXICONS: list[_Lexicon] = []


class _Lexicon:
    """Terms to look for, indexed so that a view finds the present ones with set operations.

    Term syntax: terms separated by "|"; a trailing "*" lets the term end inside a word (a
    stem), a leading "*" lets it start inside one; "{a,b}" expands to alternatives.
    """

    __slots__ = ("by_gate", "by_prefix", "by_word")

    def __init__(self, spec: str) -> None:
        self.by_word: dict[str, list[_Term]] = {}
        self.by_prefix: dict[str, list[_Term]] = {}
        # Terms with neither a whole word nor a long enough first word: found by a substring.
        self.by_gate: dict[str, list[_Term]] = {}
        for raw in spec.split("|"):
            raw = " ".join(raw.split())
            if "*" in raw.strip("*"):
                raise ValueError(f"'*' only marks the ends of a term: {raw!r}")
            if raw:
                for variant in _expand(raw):
                    self._index(variant)
        # Every lexicon joins one index (built as the module loads), so that a view finds the
        # keys of all lexicons with a single set intersection.
        _LEXICONS.append(self)

    def _index(self, raw: str) -> None:
        left, right = not raw.startswith("*"), not raw.endswith("*")
        text = raw.strip("*").casefold()
        left_bound, right_bound = left and _is_word_char(text[0]), right and _is_word_char(text[-1])
        if any(char >= _DENSE_SCRIPT for char in text):
            first_dense = next(char for char in text if char >= _DENSE_SCRIPT)
            self.by_gate.setdefault(first_dense, []).append(_term(text, left_bound, right_bound, frozenset()))
            return
        tokens = text.translate(_SEPARATORS).split()
        # A "*" end cuts its word short, unless the term ends in punctuation there ("*_key").
        partial_first = not left and _is_word_char(text[0])
        partial_last = not right and _is_word_char(text[-1])
        whole = tokens[(1 if partial_first else 0): (-1 if partial_last else None)]
        term = _term(text, left_bound, right_bound, frozenset(whole))
        if whole:
            # The key should be a word ordinary notes rarely contain, so the term is rarely located.
            rare = [word for word in whole if word not in _COMMON_WORDS] or whole
            self.by_word.setdefault(max(rare, key=len), []).append(term)
        elif not partial_first and tokens and len(tokens[0]) >= _PREFIX_LENGTH:
            self.by_prefix.setdefault(tokens[0][:_PREFIX_LENGTH], []).append(term)
        else:
            self.by_gate.setdefault(text, []).append(term)


# Words too frequent in ordinary notes to index a longer term by.
_COMMON_WORDS = frozenset("""
    the a an to of in on at by for with from and or is are be as it its this that these those you your
    me my we our user users all any every no not never do don t s new only system data file files key
    keys token config json md access api run local login start startup github docker mode message dev
""".split())


_BRACES = re.compile(r"\{([^{}]*)\}")


def _expand(term: str) -> set[str]:
    """A term with its {a,b} alternatives spelled out, plus accent-free spellings of Latin
    words (attackers drop accents) and German umlauts written ae/oe/ue."""
    match = _BRACES.search(term)
    if match:
        return {
            variant
            for choice in match[1].split(",")
            for variant in _expand(term[: match.start()] + choice + term[match.end():])
        }
    variants = {term}
    if not term.isascii() and all(char < "\u0250" for char in term):
        variants.add("".join(c for c in unicodedata.normalize("NFD", term) if not unicodedata.combining(c)))
        variants.add(term.translate(_UMLAUTS))
    if "ё" in term:
        variants.add(term.replace("ё", "е"))
    return variants


_UMLAUTS = str.maketrans({"ä": "ae", "ö": "oe", "ü": "ue"})


# -- views ------------------------------------------------------------------------------------

Span = tuple[int, int]

# Clause stops; rules only combine words of one clause.
_CLAUSE_STOPS_ASCII = ("\n", ";", ". ", "! ", "? ", ": ")
_CLAUSE_STOPS = (*_CLAUSE_STOPS_ASCII, "。", "！", "？", "；")


def _occurrences(text: str, term: _Term, start: int = 0, end: int | None = None) -> list[Span]:
    """Where the term occurs (within text[start:end]) with the word boundaries it asks for."""
    found = []
    needle, left, right = term.text, term.left, term.right
    size, length = len(needle), len(text)
    at = text.find(needle, start, end)
    while at != -1:
        stop = at + size
        if (not left or at == 0 or not _is_word_char(text[at - 1])) and (
            not right or stop == length or not _is_word_char(text[stop])
        ):
            found.append((at, stop))
        at = text.find(needle, at + 1, end)
    return found


# After this many windowed term searches a lexicon is located in the whole text instead.
_WINDOW_SEARCHES_BEFORE_LOCATING = 24


class _View:
    """One normalised text and its words; which lexicon terms it may hold and where they
    are, computed once and on demand."""

    __slots__ = (
        "_clause_questions",
        "_found",
        "_spans",
        "_stops",
        "_terms",
        "_windows",
        "lexicons",
        "send_verbs",
        "text",
        "words",
    )

    def __init__(self, text: str) -> None:
        self.text = text
        words = text.translate(_SEPARATORS).split() if text.isascii() else _WORD.findall(text)
        self.words = set(words)
        # Every lexicon's present terms at once: most rules ask about lexicons the text lacks,
        # and then a dictionary lookup answers.
        self._terms = _present_terms(text, self.words)
        # The lexicons with present terms: what a rule's needs are compared with.
        self.lexicons: KeysView[_Lexicon] = self._terms.keys()
        self._found: dict[_Term, list[Span]] = {}
        self._spans: dict[_Lexicon, list[Span]] = {}
        self._windows: dict[_Lexicon, int] = {}
        self._stops: list[int] | None = None
        self._clause_questions = 0
        # The affirmed send verbs, shared by the URL and e-mail exfiltration rules.
        self.send_verbs: list[Span] | None = None

    def terms(self, lexicon: _Lexicon) -> Sequence[_Term]:
        """The lexicon's terms whose key word, prefix or gate the text holds."""
        return self._terms.get(lexicon, ())

    def may_have(self, lexicon: _Lexicon) -> bool:
        """A cheap test that spares locating anything when a rule cannot fire anyway."""
        return lexicon in self._terms

    def spans(self, lexicon: _Lexicon) -> list[Span]:
        """Every match of the lexicon, in order."""
        found = self._spans.get(lexicon)
        if found is None:
            terms = self._terms.get(lexicon)
            if terms is None:
                return []
            # One term's occurrences are in order already (and most lexicons have one present).
            found = self._occurrences(terms[0]) if len(terms) == 1 else sorted(
                [span for term in terms for span in self._occurrences(term)])
            self._spans[lexicon] = found
        return found

    def _occurrences(self, term: _Term) -> list[Span]:
        found = self._found.get(term)
        if found is None:
            found = self._found[term] = _occurrences(self.text, term)
        return found

    def has(self, lexicon: _Lexicon) -> bool:
        return bool(self.spans(lexicon))

    def between(self, lexicon: _Lexicon, low: int, high: int) -> list[Span]:
        """The matches starting from low to high: searched in that window only (most
        lexicons are only ever needed near an anchor), unless asked about too often."""
        low = max(0, low)
        spans = self._spans.get(lexicon)
        if spans is None:
            terms = self._terms.get(lexicon)
            if terms is None:
                return []
            # Each window costs a search per present term: a lexicon with many present terms,
            # or asked about often, is cheaper to locate in the whole text once.
            asked = self._windows.get(lexicon, 0) + len(terms)
            self._windows[lexicon] = asked
            if asked <= _WINDOW_SEARCHES_BEFORE_LOCATING:
                return sorted([span for term in terms
                               for span in _occurrences(self.text, term, low, high + len(term.text))])
            spans = self.spans(lexicon)
        index = bisect_left(spans, (low, -1))
        found = []
        while index < len(spans) and spans[index][0] <= high:
            found.append(spans[index])
            index += 1
        return found

    def same_clause(self, first: int, second: int) -> bool:
        """Whether no clause stop lies between the two offsets. The first few questions are
        answered by searching between them; a text asked often gets its stops listed."""
        low, high = min(first, second), max(first, second)
        stops = _CLAUSE_STOPS_ASCII if self.text.isascii() else _CLAUSE_STOPS
        if self._stops is None:
            self._clause_questions += 1
            if self._clause_questions <= _WINDOW_SEARCHES_BEFORE_LOCATING // 2:
                text = self.text
                return all(text.find(stop, low, high + len(stop) - 1) == -1 for stop in stops)
            self._stops = sorted(at for stop in stops if stop in self.text for at in _positions(self.text, stop))
        index = bisect_left(self._stops, low)
        return index == len(self._stops) or self._stops[index] >= high


def _present_terms(text: str, words: set[str]) -> dict[_Lexicon, list[_Term]]:
    """For each lexicon with any, its terms whose key word, key prefix or gate the text holds
    (and, for a phrase, all of whose words it holds)."""
    keys = [
        *map(_BY_WORD.__getitem__, _WORD_KEYS & words),
        *map(_BY_PREFIX.__getitem__, _PREFIX_KEYS.intersection(map(_PREFIX, words))),
        # (A gate's first character is searched first: a two-character search is much slower.)
        *(_BY_GATE[gate] for gate in _ASCII_GATES if gate[0] in text and gate in text),
    ]
    if not text.isascii() and max(text) >= _DENSE_SCRIPT:
        # Chinese, Japanese and Korean terms are gated by their first character: the text's
        # characters answer all of them.
        keys += map(_BY_GATE.__getitem__, _DENSE_GATES.intersection(text))
    found: dict[_Lexicon, list[_Term]] = {}
    for entries in keys:
        for lexicon, needs, terms in entries:
            # A phrase's key word being present is not enough: all its words must be.
            if not needs or needs <= words:
                found.setdefault(lexicon, []).extend(terms)
    return found


def _positions(text: str, needle: str) -> list[int]:
    found = []
    at = text.find(needle)
    while at != -1:
        found.append(at)
        at = text.find(needle, at + 1)
    return found


# -- rule helpers -----------------------------------------------------------------------------

Guard = Callable[[_View, Span], bool]


def _near(
    view: _View, anchor: Span, lexicon: _Lexicon, before: int, after: int, accept: Guard | None = None,
) -> bool:
    """Whether the lexicon matches in the anchor's clause, from `before` characters ahead of
    the anchor to `after` characters past it (and, given `accept`, is accepted by it)."""
    return _hit(view, lexicon, anchor[0] - before, anchor[1] + after, anchor[0], accept)


def _hit(view: _View, lexicon: _Lexicon, low: int, high: int, clause_of: int, accept: Guard | None = None) -> bool:
    """Whether the lexicon matches, starting from low to high, in the clause of `clause_of`."""
    return any(
        view.same_clause(clause_of, span[0]) and (accept is None or accept(view, span))
        for span in view.between(lexicon, low, high)
    )


class _Rule:
    """One way a finding is made: a test of a view, and the lexicons the test cannot pass
    without. Those are known as the module loads, so a view lacking one skips the rule with
    a single set comparison: most rules stop there for most entries."""

    __slots__ = ("needs", "test")

    def __init__(self, test: Callable[[_View], bool], *needs: _Lexicon) -> None:
        self.test = test
        self.needs = frozenset(needs)


def _together(anchor: _Lexicon, others: tuple[tuple[_Lexicon, int, int], ...], guard: Guard | None = None) -> _Rule:
    """A rule: some match of the anchor lexicon (accepted by the guard) has every other lexicon
    near it, each (lexicon, before, after) within that many characters before and after."""

    def test(view: _View) -> bool:
        for span in view.spans(anchor):
            if (guard is None or guard(view, span)) and all(
                    _near(view, span, lexicon, before, after) for lexicon, before, after in others):
                return True
        return False

    return _Rule(test, anchor, *(lexicon for lexicon, _, _ in others))


def _phrase(
    trigger: _Lexicon, pattern: re.Pattern[str], reach: tuple[int, int] | None = None, needs: tuple[_Lexicon, ...] = (),
) -> _Rule:
    """A rule: the pattern matches starting at one of the trigger's hits or, given a reach
    (characters before, after), anywhere around one. Lexicons in `needs` hold words the
    pattern cannot match without."""
    if reach is None:
        def test(view: _View) -> bool:
            return any(pattern.match(view.text, start) for start, _ in view.spans(trigger))
    else:
        before, after = reach

        def test(view: _View) -> bool:
            return any(pattern.search(view.text, max(0, start - before), end + after)
                       for start, end in view.spans(trigger))

    return _Rule(test, trigger, *needs)


# Negation right before a verb ("never upload", "do not print", "不要粘贴") or right after it
# in Japanese and Korean ("送信しないで", "붙여 넣지 말"): the entry forbids the act.
_NEGATIONS = frozenset("never not no nunca jamais ne nie niemals nicht никогда не".split())
_DENSE_NEGATIONS_BEFORE = ("不要", "别", "別", "勿", "不能", "不得", "禁止", "切勿", "不可", "不准", "决不", "絶対に", "절대")
_DENSE_NEGATIONS_AFTER = ("ないで", "しない", "するな", "禁止", "지 마", "지마", "지 말", "지말", "지 않", "지않", "말 것")
_PUNCTUATION = ".,;:!?\"'`()[]{}*"


def _last_words(text: str, end: int, count: int) -> list[str]:
    return [word.strip(_PUNCTUATION) for word in text[max(0, end - 24): end].split()[-count:]]


def _narrated(view: _View, span: Span) -> bool:
    """Whether an English verb stands in the past ("we ignored", "a token that was exposed"):
    a report of what happened, not an order."""
    text, end = view.text, span[1]
    while end < len(text) and text[end].isalpha() and end - span[1] < 12:
        end += 1
    # Only an ending the term leaves open counts: "embed" itself ends in "ed".
    return end > span[1] and text[end - 2: end] == "ed" and text[span[0]: span[1]].isascii()


def _affirmed(view: _View, span: Span) -> bool:
    text = view.text
    if _narrated(view, span):
        return False
    if any(word in _NEGATIONS or word.endswith("n't") for word in _last_words(text, span[0], 2)):
        return False
    if text.isascii():
        return True
    before, after = text[max(0, span[0] - 10): span[0]], text[span[1]: span[1] + 8]
    return not any(mark in before for mark in _DENSE_NEGATIONS_BEFORE) and not any(
        mark in after for mark in _DENSE_NEGATIONS_AFTER)


_USER = _Lexicon("""
    user|users|human|owner|anyone|usuario|usuarios|utilisateur|utilisatrice|utilisateurs|usager
    |nutzer|nutzerin|benutzer|benutzerin|anwender|пользовател*|用户|用戶|使用者|ユーザー|利用者|사용자|유저
""")


# -- instruction override ----------------------------------------------------------------------

_OVERRIDE_VERB = _Lexicon("""
    ignor* | disregard* | forget | forgets | forgetting | overrid{e,es,ing} | bypass* | discard* | abandon*
    | supersed* | overrul* | trumps | outrank* | take precedence over | takes precedence over
    | take priority over | takes priority over
    | set aside | pay no attention | pay no heed | do not follow | do not obey | don't follow | don't obey
    | dont follow | no longer follow | no longer obey | stop following | stop obeying | throw out | scrap
    | olvid* | descart* | omit{e,a,an,ir} | no hagas caso | no haga caso | no hagan caso | haz caso omiso
    | pasa por alto | pasen por alto | deja de lado
    | oubli* | ne tiens pas compte | ne tenez pas compte | ne tiens plus compte | ne tenez plus compte
    | ne prends pas en compte | ne prenez pas en compte | fais abstraction | faites abstraction
    | passe outre | passez outre | outrepass*
    | vergiss | vergessen | vergesst | missacht* | außer acht | verwirf | verwerfen | überschreib*
    | игнорир* | проигнорир* | забудь | забудьте | забыть | не обращай внимания | не обращайте внимания
    | пренебрег* | отбрось | отбросьте | не следуй | не выполняй | не слушай | не слушайся
    | 忽略|忽視|忽视|无视|無視|不要理会|不要理會|别理会|不理会|不用理会|抛开|拋開|忘记|忘記|忘掉|丢弃|丟棄|跳过|推翻
    | 無視|忘れ|破棄|従わな|上書き
    | 무시|잊어|잊고|잊으|따르지 마|따르지 말|폐기
""")
_INSTRUCTION_NOUN = _Lexicon("""
    instruction* | rule | rules | guideline | guidelines | directive | directives | prompt | prompts
    | policy | policies | constraints | restrictions | guardrails | programming | commands | orders
    | safeguards | context | everything | anything
    | instruccion* | regla | reglas | indicaciones | directrices | normas | pautas | órdenes | política
    | políticas | restricciones
    | règle | règles | consigne | consignes | ordres | politique | politiques | tout ce | todo lo | alles
    | anweisung* | sicherheitsanweisung* | systemanweisung* | regel | regeln | richtlinie* | vorgabe
    | vorgaben | befehle | instruktion* | vorschriften | einschränkung* | systemprompt
    | инструкци* | правил* | указани* | директив* | промпт* | ограничени* | всё
    | 指令|指示|规则|規則|提示词|提示詞|命令|约束|約束|限制|规定|規定|准则|準則|内容|내용
    | ルール|プロンプト|制約|ガイドライン|ポリシー
    | 지시|명령|규칙|지침|프롬프트|제약|정책|가이드라인
""")
_PRIOR_QUALIFIER = _Lexicon("""
    previous* | prior | above | earlier | preceding | former | original | initial | existing | all | any
    | every | your | system* | developer* | safety | content | ethical | told | you follow | you were given
    | you have been given | you've been given | given to you
    | anterior* | previa | previas | precedente | precedentes | de arriba | del sistema | toda | todas
    | todo | todos | tus
    | précédent* | antérieur* | ci-dessus | plus haut | tous | toutes | tout | tes | vos | système
    | initiale | initiales
    | vorherig* | bisherig* | obig* | früher* | vorangegangen* | ursprünglich* | alle | allen | alles
    | deine | deinen | vorige | vorigen
    | предыдущ* | прежн* | выше | все | всё | всех | систем* | ранее | изначальн* | свои | твои
    | 之前|以前|先前|此前|上面|上述|以上|前面|原来|原有|原先|所有|全部|一切|系统|系統
    | これまで|前の|上記|上の|先の|すべて|全て|システム|元の
    | 이전|앞의|앞서|위의|모든|전부|기존|시스템|원래
""")
# Phrases that override on their own; each alternative starts with a trigger word.
_OVERRIDE_PHRASE_TRIGGER = _Lexicon("""
    forget | instructions | rules | guidelines | directives | prompt | programming
    | supersede | supersedes | override | overrides | replace | replaces | trump | trumps | take | takes
    | outrank | outranks | obey | follow | instead | olvida | oublie | oubliez | vergiss | забудь
    | befolge | folge | sigue | obedece | suis | suivez | obéis | следуй | подчиняйся | слушай
    | 只 | 仅 | 僅
""")
_OVERRIDE_PHRASE = re.compile(
    r"forget (?:about )?(?:everything|all)(?: that)? (?:you(?:'ve| have| were| had)? "
    r"(?:been )?(?:told|learned|know)|above|before|prior|previous|so far)"
    r"|(?:instructions|rules|guidelines|directives|prompt|programming) (?:are|is) (?:now |hereby )?"
    r"(?:void|null|cancel+ed|revoked|obsolete|invalid|superseded|overridden|no longer (?:valid|in effect|apply))"
    r"|(?:supersedes?|overrides?|replaces?|trumps?|takes? (?:precedence|priority) over|outranks?) "
    r"(?:(?:all|any|every|the|your) ){0,2}(?:(?:previous|prior|earlier|other|existing|original|system|developer) ){0,2}"
    r"(?:instructions|rules|guidelines|directives|prompts?|system prompt|polic(?:y|ies))"
    r"|(?:obey|follow) only (?:this|these|me\b|my)"
    r"|follow (?:them|it|these|this|my|only this)(?: \w+)? instead\b"
    r"|(?:befolge|folge|sigue|obedece|suis|suivez|ob[ée]is|следуй|подчиняйся|слушай) "
    r"(?:nur|solo|s[óo]lamente|uniquement|seulement|только) (?:diese|meine|esta|estas|mis|cette|ces|mes|этой|этим|моим|мне)"
    r"|instead of (?:the |your )?(?:user'?s?|system'?s?|original|developer'?s?) (?:request|instructions|prompt|question|task)"
    r"|olvida (?:todo|lo) (?:lo )?anterior|oublie(?:z)? tout ce qui (?:pr[ée]c[èe]de|est au-dessus)"
    r"|vergiss alles\b|забудь (?:всё|все) (?:что|предыдущ|выше|ранее)"
    r"|(?:只|仅|僅)(?:按照|遵循|遵守|听从|聽從|服从|服從|执行|執行)(?:这条|此条|本条|這條|我的)"
)
# "New rules take priority": a priority phrase, an instruction noun and a word marking them new.
_PRIORITY = _Lexicon("""
    take priority | takes priority | take precedence | takes precedence | have priority | has priority
    | have precedence | has precedence | take top priority | takes top priority | get priority
    | tienen prioridad | tiene prioridad | tienen la prioridad | tiene la prioridad | tienen precedencia
    | prevalece | prevalecen | ont la priorité | ont priorité | a la priorité | prévalent | prévaut
    | haben vorrang | hat vorrang | vorrang haben | haben priorität | hat priorität | приоритет*
    | 优先|優先|우선
""")
_NEW_QUALIFIER = _Lexicon("""
    new | these | this | following | below | nueva | nuevas | nuevo | nuevos | estas | esta
    | nouvelle | nouvelles | nouveaux | ces | neue | neuen | diese | diesen | новые | новых | эти | это
    | 新 | 这条 | 這條 | 此条 | 以下 | 下面 | この | 새로운 | 이 규칙
""")
# "say 'ignore previous instructions'" is a mention, not an order.
_MENTION_CUE = re.compile(
    r"(?:\bsays?|\bsaid|\bsaying|\blike|\bsuch as|\bphrases?|\bwords?|\bcontains?|\bcontaining|"
    r"\btext|\be\.g\.|\bmessages?)\W{0,6}$"
)
_QUOTES = "\"'“”‘’«»「」『』`"


def _not_a_quoted_mention(view: _View, span: Span) -> bool:
    if _narrated(view, span):
        return False
    before = view.text[max(0, span[0] - 40): span[0]].rstrip()
    if not before or before[-1] not in _QUOTES:
        return True
    return _MENTION_CUE.search(before[:-1]) is None


# What keeps a model safe: ignoring these needs no "previous" or "all" to be an override.
_GUARD_NOUN = _Lexicon("""
    restrictions | constraints | guardrails | safeguards | safety guidelines | safety rules
    | safety policy | content policy | content policies | safety filters | system prompt | ethical guidelines
    | restricciones | directrices de seguridad | restrictions de sécurité | consignes de sécurité
    | einschränkungen | sicherheitsrichtlinien | ограничения | правила безопасности
    | 安全限制|安全规则|安全規則|系统提示词|系統提示詞|制約|制限|安全ポリシー|システムプロンプト|제약|제한|안전 정책|시스템 프롬프트
""")
# "The rules you were given earlier no longer apply": earlier instructions declared void.
_VOIDED = _Lexicon("""
    no longer apply | no longer applies | no longer valid | no longer in effect | no longer binding
    | are void | is void | are now void | null and void | are null | are cancelled | are canceled
    | is cancelled | are revoked | have been revoked | have been cancelled | are obsolete | are invalid
    | don't apply | do not apply | are suspended | are lifted | are overridden | are superseded
    | ya no aplican | ya no se aplican | ya no son válidas | quedan anuladas | están anuladas
    | quedan sin efecto | son nulas | quedan revocadas | ne s'appliquent plus | sont annulées
    | sont caduques | sont nulles | ne sont plus valables | sont révoquées | sont obsolètes
    | gelten nicht mehr | sind ungültig | sind aufgehoben | sind außer kraft | sind nichtig | sind hinfällig
    | больше не действуют | отменены | недействительны | утратили силу | аннулированы
    | 作废|作廢|无效|無效|失效|不再适用|不再適用|已取消|已废除|已廢除|不再有效|無効
    | 適用されません|もう適用されない|取り消され|廃止され|무효|더 이상 적용되지|취소되었|폐기되었
""")
# "The user says the old rules are void" reports speech; it does not void anything.
_REPORTED = ("say", "said", "说", "說", "dit", "sagt", "dice", "говорит", "言う", "言っ", "말하", "말했")


def _not_reported(view: _View, span: Span) -> bool:
    before = view.text[max(0, span[0] - 40): span[0]]
    return not any(cue in before for cue in _REPORTED)


_OVERRIDE_RULES = (
    _phrase(_OVERRIDE_PHRASE_TRIGGER, _OVERRIDE_PHRASE),
    _together(_OVERRIDE_VERB, ((_INSTRUCTION_NOUN, 30, 50), (_PRIOR_QUALIFIER, 30, 50)), _not_a_quoted_mention),
    _together(_OVERRIDE_VERB, ((_GUARD_NOUN, 30, 40),), _not_a_quoted_mention),
    _together(_VOIDED, ((_INSTRUCTION_NOUN, 60, 10), (_PRIOR_QUALIFIER, 70, 10)), _not_reported),
    _together(_PRIORITY, ((_INSTRUCTION_NOUN, 40, 20), (_NEW_QUALIFIER, 50, 20))),
)


# -- obeying outside sources, permission escalation ------------------------------------------

_TRUST_VERB = _Lexicon("""
    obey* | trust | trusts | treat | treats | comply with every | comply with all | comply with any | carry out all
    | carry out any | carry out every
    | obedec* | obedezc* | confía en | confia en | confiar en | obéis | obéir | obéissez | obeis | fais confiance
    | befolge | befolgen | vertrau* | gehorch* | выполняй | доверя* | подчиня* | слушайся
    | 服从|服從|听从|聽從|信任|信頼|従え|従って|신뢰|복종|따르
""")
_ORDERS = _Lexicon("""
    instruction | instructions | command | commands | order | orders | directive | directives | request
    | requests | instrucciones | órdenes | comandos | ordres | consignes | anweisungen | befehle
    | команд* | инструкци* | указани* | приказ* | 指令|命令|指示|지시|명령
""")
_OUTSIDE_SOURCE = _Lexicon("""
    email | emails | e-mail | e-mails | inbox | tool result | tool results | tool output | tool outputs
    | web page | web pages | webpage | webpages | website | websites | search results | document
    | documents | issue | issues | comment | comments | untrusted | external | third-party | third party
    | anyone | any sender | whoever | stranger | strangers | example | correo | correos | página web
    | páginas web | herramienta | externo | externos | cualquiera | courriel | courriels | page web
    | pages web | outil | outils | externe | externes | webseite | webseiten | werkzeug | externen
    | письм* | почт* | сайт* | внешн* | инструмент* | любого
    | 邮件|郵件|网页|網頁|工具结果|工具結果|外部|来自|來自|メール|ウェブ|ツール|이메일|메일|웹|외부|도구
""")
_ANY_SCOPE = _Lexicon("""
    any | arbitrary | every | all | whatever | cualquier | todos los | n'importe quel | n'importe quelle
    | toutes les | jede | jeden | jedem | jeder | jedes | alle | beliebige* | любые | любую | любой | все
    | 任何|所有|一切|全ての|全部の|あらゆる|どんな|모든|어떤|아무
""")
_ACTIONS = _Lexicon("""
    command | commands | shell | code | script | scripts | program | programs | action | actions
    | operation | operations | comando | comandos | acción | acciones | commande | commandes | befehl
    | befehle | kommando | kommandos | команд* | 命令|指令|操作|コマンド|명령
""")
_NO_CONFIRMATION = _Lexicon("""
    without asking | without approval | without confirmation | without confirming | without permission
    | without consent | without review | without checking | without asking the user
    | without checking with the user | without telling the user | no approval needed
    | no confirmation needed | no approval required | no confirmation required
    | sin pedir | sin preguntar | sin confirmación | sin permiso | sin aprobación | sin consultar
    | sans demander | sans confirmation | sans permission | sans autorisation | sans validation
    | ohne rückfrage | ohne nachfrage | ohne bestätigung | ohne genehmigung | ohne erlaubnis
    | ohne zu fragen | ohne freigabe
    | без подтвержд* | без разрешени* | без спроса | без согласовани* | без вопросов
    | 无需|無需|不需要|不用|无须|無須|不必|未经|未經|確認なし|確認せず|許可なく|承認なし|確認を取らず
    | 확인 없이|허락 없이|승인 없이|묻지 않고
""")
_APPROVAL_PHRASE_TRIGGER = _Lexicon("""
    longer | authorized | authorised | allowed | permitted | approval | confirmation | confirmations | permission
    | pre-approved | preapproved
""")
_APPROVAL_PHRASE = re.compile(
    r"no longer (?:needs?|requires?) (?:approval|confirmation|permission)"
    r"|(?:authori[sz]ed|allowed|permitted) (?:you )?to (?:run|execute|do) (?:anything|any)\b"
    r"|never (?:ask|wait) for (?:approval|confirmation|permission)"
    r"|disable (?:all )?(?:confirmations|confirmation prompts|approvals)"
    r"|pre-?approved (?:everything|all|any|every)\b"
)


_OBEY_EXTERNAL_RULES = (_together(_TRUST_VERB, ((_ORDERS, 30, 40), (_OUTSIDE_SOURCE, 30, 80))),)
_AUTO_APPROVE_RULES = (
    _phrase(_APPROVAL_PHRASE_TRIGGER, _APPROVAL_PHRASE, reach=(40, 40)),
    _together(_NO_CONFIRMATION, ((_ANY_SCOPE, 60, 30), (_ACTIONS, 60, 30))),
)


# -- role and system impersonation -------------------------------------------------------------

_ROLE_CUE = _Lexicon("""
    you are now | you're now | youre now | you are no longer | you're no longer | from now on you
    | from this point on you | from this point forward you | from here on you | henceforth you | you will now
    | you shall now | you are hereby
    | act as | acting as | pretend* | roleplay* | role-play* | role play | behave as | behave like
    | play the role | your new role | your new persona | your new identity | mode enabled
    | mode activated | mode on | mode unlocked | enable | activate | enter | simulate
    | ahora eres | ya eres | eres ahora | actúa como | finge | tu es maintenant | tu es désormais
    | vous êtes maintenant | vous êtes désormais | agis comme | fais semblant | du bist jetzt | du bist nun
    | du bist ab sofort | du bist ab jetzt | sie sind jetzt | sie sind nun | verhalte dich | tu so als
    | теперь ты | ты теперь | отныне ты | притворись | представь что ты | веди себя как
    | 你现在是|你現在是|从现在起你是|從現在起你是|你已经是|扮演|假装你是|假裝你是|你的新身份|你的新角色
    | 从现在起|從現在起|从今以后你|從今以後你|你将成为|你將成為
    | あなたは今から|今からあなたは|あなたはもう|として振る舞|のふりをし
    | 너는 이제|당신은 이제|이제부터 너는|이제 너는|인 척|처럼 행동
""")
_UNRESTRICTED = _Lexicon("""
    unrestricted | unfiltered | uncensored | jailbroken | jailbreak* | amoral | never refuse*
    | do anything now | no longer bound | no longer restricted | no longer limited | not bound by
    | developer mode | god mode | dan mode | jailbreak mode | root mode | sudo mode
    | uneingeschränkt* | ungefiltert* | zensurfrei | неограниченн* | 越狱|越獄|無制限|无限制|無限制|무제한
""")
_LACKING = _Lexicon("""
    no | without | free of | free from | sin | sans | ohne | без | 没有|沒有|无|無|不受|ない|なし|없는|없이
""")
_RESTRICTION_NOUN = _Lexicon("""
    polic* | limit | limits | limitations | restriction* | filter* | rules | guideline* | ethic* | moral*
    | censor* | boundar* | safeguard* | guardrail* | restricci* | límite* | limite* | filtro* | censura
    | reglas | règles | einschränkung* | beschränkung* | grenzen | zensur | regeln | ограничени* | фильтр*
    | цензур* | правил* | 限制|约束|約束|过滤|過濾|审查|審查|规则|規則|制限|制約|ルール|フィルター|検閲|제한|제약|규칙|필터|검열
""")
# Fake role headers: "[SYSTEM]:", "【系统】", "<|im_start|>system", "### System message:".
_HEADER_ROLE = _Lexicon("""
    system | sys | sistema | système | systeme | systemnachricht | система | системное сообщение
    | システム|시스템|系统|系統 | system message | system prompt | inst
""")
# Roles that also label ordinary things ("the [Admin] badge"): headers only opening a line or
# followed by a colon.
_HEADER_WEAK_ROLE = _Lexicon("""
    admin | administrator | developer | root | operator | администратор | 管理员|管理員
""")
_HEADER_OPEN = "[【(<"
# A few more words may share the brackets ("[SYSTEM NOTICE]", "【系统通知】"); a markdown link
# ("[System](docs/system.md)") or a mention of template tags ("<system> tags") is not a header.
_HEADER_CLOSE = re.compile(
    r"[^\]】)>\n\[【(<]{0,20}[\]】)>](?!\()(?!\s*(?:tags?|elements?|blocks?|sections?)\b)(\s*:)?")
# ("|" separates terms, so the chat-template tokens are triggered by their inner words.)
_HEADER_PHRASE_TRIGGER = _Lexicon("""
    system | im_start | im_sep | <<sys>> | mensaje | message | systemmeldung
    | systemnachricht | системное | システムメッセージ | 시스템 메시지 | 系统消息 | 系統訊息 | 系统指令 | 系统通知
    | anulación
""")
_HEADER_PHRASE = re.compile(
    r"<\|(?:im_start|system|im_sep)\|?>|<<sys>>"
    r"|system (?:override|directive|instructions?|notice|announcement|command)\b"
    r"|(?:system message|mensaje del sistema|message (?:du )?syst[èe]me|systemmeldung|systemnachricht"
    r"|системное сообщение|システムメッセージ|시스템 메시지|系统消息|系統訊息|系统指令|系统通知)\s*:"
    r"|anulaci[óo]n del sistema\b"
)
# "system:" or "system message:" opening the entry or a line, after at most a few marks (###, **).
_LINE_START_SYSTEM = re.compile(r"system(?: message)?\s*:")
_LINE_LEAD = re.compile(r"(?:^|\n)\W{0,6}$")


_ROLE_HIJACK_RULES = (
    _together(_ROLE_CUE, ((_UNRESTRICTED, 20, 90),)),
    _together(_ROLE_CUE, ((_LACKING, 20, 90), (_RESTRICTION_NOUN, 20, 110))),
)


def _bracketed(view: _View, span: Span, strong: bool = True) -> bool:
    before = view.text[max(0, span[0] - 3): span[0]].rstrip()
    if not before or before[-1] not in _HEADER_OPEN:
        return False
    close = _HEADER_CLOSE.match(view.text, span[1])
    if close is None:
        return False
    if close[1] is not None:
        return True
    # Parentheses are everyday prose, "(admin)": only "(SYSTEM):" reads as a header.
    return before[-1] != "(" and (strong or _LINE_LEAD.search(view.text, max(0, span[0] - 8), span[0]) is not None)


# A line "System: macOS 14, 32 GB" describes a machine; a header goes on to give orders.
_DIRECTIVE_WORDS = re.compile(
    r"[^\n]{0,160}?\b(?:you|your|assistant|agent|model|ai|must|ignore|override|disable[ds]?|enabled?|"
    r"policy|policies|safety|instructions?|rules|comply|obey|restrictions?|mode|directive|filters?|admin|"
    r"root|clearance|authori[sz]ed|unrestricted|revoked|suspended)\b"
)


def _opens_line(view: _View, span: Span) -> bool:
    match = _LINE_START_SYSTEM.match(view.text, span[0])
    return (match is not None and _LINE_LEAD.search(view.text, max(0, span[0] - 7), span[0]) is not None
            and (match[0].startswith("system message") or _DIRECTIVE_WORDS.match(view.text, match.end()) is not None))


_FAKE_SYSTEM_RULES = (
    _Rule(lambda view: any(_bracketed(view, span) or _opens_line(view, span) for span in view.spans(_HEADER_ROLE)),
          _HEADER_ROLE),
    _Rule(lambda view: any(_bracketed(view, span, strong=False) for span in view.spans(_HEADER_WEAK_ROLE)),
          _HEADER_WEAK_ROLE),
    _phrase(_HEADER_PHRASE_TRIGGER, _HEADER_PHRASE, reach=(3, 40)),
)


# -- exfiltration -------------------------------------------------------------------------------

_SEND_VERB = _Lexicon("""
    send* | upload* | forward* | transmit* | exfiltrat* | leak* | beam | relay* | deliver*
    | nc | ncat | netcat | socat | --data* | --upload-file | --form
    | envía | envia | enviar | envíe | manda | mandar | sube | subir | súbel* | reenvía | reenvia | comparte | transfiere
    | envoie | envoyez | envoyer | transmet* | téléverse* | partage | transfère | publie | fais suivre
    | sende | senden | schick* | lade | hochlad* | übermittle | leite | weiterleit* | teile | übertrag*
    | отправ* | пошли | перешл* | пересыл* | загрузи | выгрузи | передай | передава* | слей | опубликуй | отошли
    | 发送|發送|发到|發到|发给|發給|上传|上傳|转发|轉發|传送|傳送|同步到|抄送|推送|发往|發往|寄给|寄到|传到|傳到
    | 送信|送って|送る|アップロード|転送|共有|投稿|送付
    | 전송|보내|업로드|전달|공유|게시|올려
""")
_DATA_OBJECT = _Lexicon("""
    key | keys | token | tokens | secret | secrets | password | passwords | passwd | credential
    | credentials | cookie | cookies | .env | history | conversation | conversations | chat | chats
    | transcript | transcripts | context | system prompt | prompt | prompts | memory | memory.md | user.md
    | ssh | id_rsa | id_ed25519 | id_ecdsa | id_dsa | source code | codebase | environment variables
    | env vars
    | clave | claves | llave | llaves | contraseña | contraseñas | credenciales | secreto | secretos
    | historial | conversación | contexto
    | clé | clés | clef | clefs | mot de passe | mots de passe | identifiants | jeton | jetons | historique
    | contexte
    | schlüssel* | passw* | kennw* | zugangsdaten | anmeldedaten | geheimnis* | verlauf* | chatverlauf*
    | gesprächsverlauf* | nachrichtenverlauf* | gespräch* | unterhaltung* | kontext
    | ключ* | парол* | токен* | учётн* | учетн* | секрет* | истори* | переписк* | разговор* | контекст* | куки
    | 文件|檔案|密钥|密鑰|金鑰|秘钥|令牌|密码|密碼|凭证|凭据|憑證|聊天记录|聊天記錄|对话|對話|会话|會話|历史|歷史
    | 消息|訊息|上下文|系统提示|记忆|環境變數|环境变量|私钥|私鑰
    | キー|鍵|パスワード|トークン|認証情報|秘密|履歴|会話|メッセージ|コンテキスト|ファイル|データ|クッキー
    | 키|비밀번호|암호|토큰|자격 증명|비밀|기록|대화|메시지|컨텍스트|파일|데이터|쿠키
""")
# Words that are as often nouns or descriptions ("the reset email links to ..."): verbs only
# where an order would put them.
_SEND_VERB_AMBIGUOUS = _Lexicon("""
    post | posts | email | e-mail | mail | sync | copy | share | push | report | publish | pipe | submit
    | back up | backup | mirror | archive | save | store | stash | dump | make a backup of | keep a copy of
""")
_IMPERATIVE_LEAD = frozenset("""
    and then also please always to must should will shall can may you quietly silently secretly
    automatically immediately just now first next finally later periodically regularly daily or but
    y luego siempre et puis toujours und dann immer и затем потом всегда
""".split())


def _in_order_position(view: _View, span: Span) -> bool:
    """Whether a word stands where an imperative would: opening a clause, or after "and",
    "please", "always", "to"..."""
    before = view.text[max(0, span[0] - 30): span[0]].rstrip()
    if not before or before[-1] in ",:;(\"'`*>-\n":
        return True
    return before.split()[-1].strip(_PUNCTUATION) in _IMPERATIVE_LEAD


# Loose words ("messages", "files") only count when the data is the user's or all of it.
_LOOSE_DATA = _Lexicon("""
    message | messages | data | files | file | emails | documents | chats | notes | mensajes | datos
    | archivos | correos | données | fichiers | nachrichten | daten | dateien | сообщения | данные | файлы
""")
_WHOSE_OR_ALL_BEFORE = re.compile(
    r"(?:\bevery|\ball|\beach|\bany|\bprivate|\bpersonal|\btheir|\bhis|\bher|\buser'?s|\btodos los|\btodas las"
    r"|\bsus|\btous les|\btoutes les|\bses|\balle|\bseine|\bihre|\bвсе|\bего|\bеё)\s(?:\S+\s)?$"
)
_WHOSE_AFTER = re.compile(r" (?:the user|del usuario|de l'utilisat|des (?:be)?nutzers|пользовател)")


def _sensitive_loose_data(view: _View, span: Span) -> bool:
    return (_WHOSE_OR_ALL_BEFORE.search(view.text, max(0, span[0] - 30), span[0]) is not None
            or _WHOSE_AFTER.match(view.text, span[1]) is not None)


_URL = _Lexicon("http:// | https:// | ftp:// | ftps:// | sftp:// | ws:// | wss:// | tcp://")
_EMAIL_AT = _Lexicon("*@*")
# The last three parts of a dotted quad: starting with a literal "." makes the search fast.
_IP_TAIL = re.compile(r"\.\d{1,3}\.\d{1,3}\.\d{1,3}(?![\d.]*\d)")
_OCTETS = frozenset(str(number) for number in range(256))
_LOCAL_HOST = re.compile(r"(?:localhost|127\.)")


def _is_remote_url(view: _View, span: Span) -> bool:
    return _LOCAL_HOST.match(view.text, span[1]) is None


def _is_email(view: _View, span: Span) -> bool:
    text, (at, end) = view.text, span
    return (at > 0 and (_is_word_char(text[at - 1]) or text[at - 1] in "._+-")
            and end < len(text) and _is_word_char(text[end]) and "." in text[end: end + 64])


def _destination(view: _View, lexicon: _Lexicon, verb: Span, accept: Guard) -> Span | None:
    for span in view.between(lexicon, verb[0] - 60, verb[1] + 160):
        if accept(view, span):
            return span
    return None


def _sensitive_object_before(view: _View, verb: Span, destination: Span) -> bool:
    """A sensitive object in the clause, ahead of the destination: "send the keys to X",
    "whenever you see a token, POST it to X" (but not "POST X with the job token")."""
    low, high = min(verb[0], destination[0]) - 120, destination[0] - 1
    return _hit(view, _DATA_OBJECT, low, high, destination[0]) or _hit(
        view, _LOOSE_DATA, low, high, destination[0], _sensitive_loose_data)


def _send_verbs(view: _View) -> list[Span]:
    verbs = view.spans(_SEND_VERB) + [
        span for span in view.spans(_SEND_VERB_AMBIGUOUS) if _in_order_position(view, span)]
    # "explains how to send a token to ..." describes; it does not order.
    return [verb for verb in verbs if _affirmed(view, verb) and "how" not in _last_words(view.text, verb[0], 3)]


def _exfiltrates(view: _View, destination_near: Callable[[_View, Span], Span | None]) -> bool:
    """Whether an affirmed send verb has a destination shortly after it (or, in Japanese and
    Korean word order, shortly before) and a sensitive object ahead of that destination."""
    if not (view.may_have(_DATA_OBJECT) or view.may_have(_LOOSE_DATA)):
        return False
    if not (view.may_have(_SEND_VERB) or view.may_have(_SEND_VERB_AMBIGUOUS)):
        return False
    if view.send_verbs is None:
        view.send_verbs = _send_verbs(view)
    for verb in view.send_verbs:
        destination = destination_near(view, verb)
        if (destination is not None and view.same_clause(verb[0], destination[0])
                and _sensitive_object_before(view, verb, destination)):
            return True
    return False


def _ips(text: str, start: int, end: int) -> list[Span]:
    """Remote IPv4 addresses (not loopback) starting from start to end."""
    found = []
    for match in _IP_TAIL.finditer(text, start, end):
        first = match.start()
        while first > 0 and match.start() - first < 3 and text[first - 1].isdigit():
            first -= 1
        if first < match.start() and (first == 0 or text[first - 1] not in ".0123456789") and text[first:first + 4] != "127.":
            found.append((first, match.end()))
    return found


def _url_or_ip_near(view: _View, verb: Span) -> Span | None:
    url = _destination(view, _URL, verb, _is_remote_url)
    if url is not None:
        return url
    # An IPv4 address leaves numbers up to 255 among the words: only then is the regex run.
    if view.words.isdisjoint(_OCTETS):
        return None
    ips = _ips(view.text, max(0, verb[0] - 60), verb[1] + 160)
    return ips[0] if ips else None


def _email_near(view: _View, verb: Span) -> Span | None:
    return _destination(view, _EMAIL_AT, verb, _is_email)


# Markdown or HTML images whose URL carries data: a placeholder, or a query naming data.
_IMAGE_TRIGGER = _Lexicon("![ | <img")
_IMAGE_URL = re.compile(
    r"!\[[^\]\n]{0,200}\]\(\s*<?(https?://[^)\s]{1,800})|<img\b[^>]{0,200}?src\s*=\s*[\"']?(https?://[^\"'\s>]{1,800})"
)
_CARRIES_DATA = re.compile(
    r"[{}<>$]|%s|\[[^\]]*\]|[?&][^=&#]{0,20}=[^&#]{0,40}"
    r"(?:secret|token|key|passw|histor|chat|conversa|messag|prompt|context|cookie|session|memory|"
    r"credential|data|user|env)|[?&](?:secret|token|key|passw|history|chat|conv|msg|prompt|ctx|data|d|q|c)="
    r"(?!\w{0,20}(?:png|svg|jpe?g|flat|square|plastic|badge)\b)"
)


def _detect_image_exfiltration(view: _View) -> bool:
    for start, _ in view.spans(_IMAGE_TRIGGER):
        match = _IMAGE_URL.match(view.text, start)
        if match:
            url = match[1] or match[2]
            host_end = url.find("/", 8)
            if host_end != -1 and _CARRIES_DATA.search(url, host_end):
                return True
    return False


# -- reading secrets, disclosing the system prompt ----------------------------------------------

_DISCLOSE_VERB = _Lexicon("""
    print* | show | show me | display* | output | reveal* | dump* | tell me | give me | send me
    | disclose* | leak* | expose* | type out | write out | extract* | retrieve*
    | harvest* | steal* | collect* | exfiltrat* | reply with | reply only with | respond with
    | imprime | muestra | mostrar | enséñame | dime | revela | extrae | vuelca | saca
    | affiche* | montre | montrez | montre-moi | révèle* | extrais | extrait | donne-moi | dis-moi
    | zeig* | gib | drucke | ausgeben | verrate | extrahiere | nenne
    | выведи | покажи | распечатай | напечатай | раскрой | сообщи | извлеки | дай мне
    | 打印|输出|輸出|显示|顯示|查看|告诉我|告訴我|给我|給我|泄露|洩露
    | 表示|出力|見せて|教えて|印刷|書き出
    | 출력|보여|알려|표시
""")
# Reading verbs: they leak when what is read is a secret file ("read ~/.ssh/id_rsa"), not when a
# note says where a secret is read from ("the app reads the token from DB_PASSWORD").
_READ_VERB = _Lexicon("""
    read | open | cat | echo | list | head | tail | strings | lee | leer | abre | lis | lisez | lire | ouvre
    | lies | lese | öffne | прочитай | прочти | открой | перечисли | 读取|讀取|读出|讀出|打开|打開|列出
    | 読んで|読み取|読み込|開いて|읽고|읽어|열어
""")
# Copying something into the reply counts when the reply is named ("include it in your answer").
_ATTACH_VERB = _Lexicon("""
    include* | paste* | copy | insert* | add | append* | attach* | put | embed*
    | incluye | pega | copia | añade | inclus | incluez | colle | copie | ajoute | füge | kopiere | hänge
    | включи | вставь | скопируй | добавь | приложи
    | 附在|附上|粘贴|貼上|贴出|复制|複製|包含|放在|加到|含めて|貼り付け|コピー|포함|붙여|복사|첨부
""")
_REPLY_TARGET = _Lexicon("""
    reply | replies | answer | response | summary | output | chat | message | comment | respuesta | resumen
    | réponse | résumé | antwort | zusammenfassung | ответ* | чат
    | 回答|回复|回覆|答复|聊天|总结|返答|답변|응답|대답
""")
# Secrets that are files or named stores: reading them at all is the leak.
_SECRET_FILE = _Lexicon("""
    ~/.ssh/id_* | .ssh/id_* | id_rsa | id_dsa | id_ecdsa | id_ed25519 | .env | /etc/shadow | /etc/passwd
    | /etc/sudoers | /etc/gshadow | .aws/credentials | .git-credentials | .netrc | .pgpass
    | .docker/config.json | .kube/config | credentials.json | keychain* | keyring* | wallet.dat
    | seed phrase | mnemonic | private key | private keys | private ssh key | private ssh keys
    | ssh private key | ssh private keys | private gpg key | privatekey | private_key | secret access key
    | secret_access_key | llave privada | llaves privadas | clave privada | claves privadas | clé privée
    | clés privées | privaten schlüssel | privater schlüssel | privaten schlüssels | schlüsselbund*
    | trousseau | закрытый ключ | закрытого ключа | закрытые ключи | закрытых ключей | приватный ключ
    | приватного ключа | приватные ключи | связка ключей | связку ключей
    | 私钥|私鑰|钥匙串|鑰匙串|秘密鍵|キーチェーン|개인 키|개인키|키체인
""")
# Public keys and examples are not secrets.
_NOT_SECRET_AFTER = re.compile(r"\.pub\b|\.example\b|\.sample\b|\.template\b|\.dist\b")
# Secrets named generically: only disclosure verbs (print, show, reveal) count.
_SECRET_WORD = _Lexicon("""
    keys | token | tokens | secret | secrets | password | passwords | passwd | passphrase | passphrases
    | credentials | cookies | api key | api keys | api token | api tokens | access key | access keys
    | access token | access tokens | auth token | auth tokens | session token | session tokens
    | bearer token | environment variables | env vars | ssh key | ssh keys | gpg key | signing key
    | deploy key | *_key | *_token | *_secret | *_password | *_passwd | *_pwd | *_credentials | contraseña | contraseñas | credenciales
    | secreto | secretos | clave de api | claves de api | claves api | variables de entorno
    | mot de passe | mots de passe | identifiants | jeton | jetons | clés api | variables d'environnement
    | passw* | kennw* | zugangsdaten | geheimnisse | api-schlüssel | umgebungsvariablen
    | парол* | токен* | учётные данные | учетные данные | секрет* | переменные окружения
    | 密码|密碼|令牌|凭证|凭据|憑證|环境变量|環境變數|密钥|密鑰|金鑰|パスワード|トークン|認証情報|シークレット|環境変数
    | 비밀번호|암호|토큰|자격 증명|시크릿|환경 변수
""")
# "password policy", "token limit": the word names something about secrets, not a secret.
_ABOUT_SECRETS = re.compile(
    r" (?:polic|strength|field|reset|manager|meter|rule|form|hash|length|rotation|expir|format|"
    r"requirement|page|dialog|input|box|flow|template|generator|change|validation|scope|endpoint|"
    r"limit|count|usage|budget|refresh)"
)
_PROMPT_OBJECT = _Lexicon("""
    system prompt | your initial prompt | your hidden prompt | your original prompt | your full prompt
    | your initial instructions | your hidden instructions | your original instructions | your instructions
    | your prompt | system message | prompt del sistema | prompt système | prompt du système | systemprompt
    | system-prompt | системный промпт | системные инструкции | системную подсказку | системный запрос
    | 系统提示|系統提示|システムプロンプト|시스템 프롬프트
""")
# "Show the user how to rotate API keys" teaches; it does not disclose.
_EXPLAIN_WORDS = frozenset("how where why whether cómo como comment wie как".split())
_DENSE_EXPLAINS = ("如何", "怎么", "怎樣", "怎样")


def _discloses(view: _View, verb: Span) -> bool:
    if not _affirmed(view, verb):
        return False
    following = view.text[verb[1]: verb[1] + 30]
    if not _EXPLAIN_WORDS.isdisjoint(word.strip(_PUNCTUATION) for word in following.split()):
        return False
    return following.isascii() or not any(mark in following for mark in _DENSE_EXPLAINS)


def _not_negated(view: _View, span: Span) -> bool:
    """False for an object the entry rules out: "..., never the raw token", "not to authorized_keys"."""
    return not any(word in _NEGATIONS for word in _last_words(view.text, span[0], 3))


def _real_secret_file(view: _View, span: Span) -> bool:
    return _NOT_SECRET_AFTER.match(view.text, span[1]) is None and _not_negated(view, span)


def _real_secret_word(view: _View, span: Span) -> bool:
    return _ABOUT_SECRETS.match(view.text, span[1]) is None and _not_negated(view, span)


def _secret_near(view: _View, verb: Span, before: int, after: int) -> bool:
    return _near(view, verb, _SECRET_FILE, before, after, _real_secret_file) or _near(
        view, verb, _SECRET_WORD, before, after, _real_secret_word)


# "What's in ~/.netrc? Print it.": a pronoun carries the object over a sentence stop.
_BACK_REFERENCE = re.compile(r" (?:it|them|that|this|its contents|their contents)\b")


def _refers_back(view: _View, verb: Span) -> bool:
    return _BACK_REFERENCE.match(view.text, verb[1]) is not None and _affirmed(view, verb)


# "read-only", "read access", "open source": the verb's word used to describe something.
_ADJECTIVE_USE = re.compile(r"[- ](?:only|write|protected|access|permissions?|source)\b")


def _detect_secret_read(view: _View) -> bool:
    if not (view.may_have(_SECRET_FILE) or view.may_have(_SECRET_WORD)):
        return False
    if any(_discloses(view, verb) and _secret_near(view, verb, 30, 80) for verb in view.spans(_DISCLOSE_VERB)):
        return True
    if view.may_have(_SECRET_FILE) and any(
            _refers_back(view, verb) and _hit(view, _SECRET_FILE, verb[0] - 80, verb[0], verb[0] - 80, _real_secret_file)
            for verb in view.spans(_DISCLOSE_VERB)):
        return True
    if view.may_have(_SECRET_FILE) and any(
            _ADJECTIVE_USE.match(view.text, verb[1]) is None and _discloses(view, verb)
            and _near(view, verb, _SECRET_FILE, 30, 80, _real_secret_file)
            for verb in view.spans(_READ_VERB)):
        return True
    return view.may_have(_REPLY_TARGET) and any(
        _affirmed(view, verb) and _reply_is_its_target(view, verb) and _secret_near(view, verb, 60, 60)
        for verb in view.spans(_ATTACH_VERB)
    )


def _reply_is_its_target(view: _View, verb: Span) -> bool:
    """A reply named after the verb, with no other copying verb in between (in "copy .env.example
    to .env; never paste it in the chat" the chat belongs to the forbidden paste)."""
    for target in view.between(_REPLY_TARGET, verb[0] - 40, verb[1] + 60):
        if view.same_clause(verb[0], target[0]) and not any(
                other != verb and min(verb[0], target[0]) < other[0] < max(verb[0], target[0])
                for other in view.between(_ATTACH_VERB, min(verb[0], target[0]), max(verb[0], target[0]))):
            return True
    return False


_PROMPT_LEAK_RULES = (_together(_DISCLOSE_VERB, ((_PROMPT_OBJECT, 30, 50),), _discloses),)


# -- remote code execution --------------------------------------------------------------------

_SHELL = r"(?:sudo(?:\s+-[a-z]+){0,3}\s+)?(?:/bin/|/usr/bin/)?(?:ba|z|k|da|fi|c|tc)?sh\b|python\d?\b|perl\b|ruby\b|node\b|iex\b|invoke-expression\b"
_FETCH = _Lexicon("curl | wget | fetch | iwr | irm | invoke-webrequest | invoke-restmethod")
_FETCH_PIPE_SHELL = re.compile(r"[\w-]+\b([^|\n]{0,240}+)\|\s*(?:" + _SHELL + ")")
_HOST_IN_COMMAND = re.compile(r"https?://|\d{1,3}(?:\.\d{1,3}){3}|\b[\w-]+\.[a-z]{2,}\b")
_SHELL_OF_FETCH_TRIGGER = _Lexicon("*<(* | *$(* | iex")
_SHELL_OF_FETCH = re.compile(
    r"\b(?:ba|z|k)?sh\s+<\(\s*(?:curl|wget)\b|\b(?:bash|sh|zsh)\s+-c\s+[\"']?\$\(\s*(?:curl|wget)\b"
    r"|\beval\s+[\"']?\$\(\s*(?:curl|wget)\b|\b(?:source|\.)\s+<\(\s*(?:curl|wget)\b|\bpython\d?\s+<\(\s*(?:curl|wget)\b"
    r"|\biex\s*\(\s*(?:new-object|iwr|irm|invoke-webrequest)"
)
_DECODE_TRIGGER = _Lexicon("base64 | b64 | xxd | frombase64string | powershell | pwsh | exec | eval")
_DECODE_PIPE_SHELL = re.compile(
    r"(?:base64|b64)\s+(?:-d|--decode|-D)\b[^|\n]{0,100}+\|\s*(?:" + _SHELL + ")"
    r"|xxd\s+-r\b[^|\n]{0,100}+\|\s*(?:" + _SHELL + ")"
    r"|frombase64string\b|(?:powershell|pwsh)(?:\.exe)?\b[^\n|]{0,40}?\s-e(?:nc|ncodedcommand)?\s+[a-z0-9+/=]{24,}"
    r"|exec\s*\(\s*(?:base64\.)?b64decode|eval\s*\(\s*(?:atob|base64_decode)\b"
)
_REVERSE_SHELL_TRIGGER = _Lexicon("""
    /dev/tcp/ | /dev/udp/ | nc | ncat | netcat | mkfifo | dup2 | pty.spawn | fsockopen | tcpclient
    | socat | -rsocket | sh -i | bash -i | zsh -i
""")
_REVERSE_SHELL = re.compile(
    r"/dev/(?:tcp|udp)/[\w.-]+/\d+"
    r"|\b(?:nc|ncat|netcat)\b[^\n|;]{0,60}?\s-[a-z]*[ec]\s*\S*(?:sh|cmd|powershell)\b"
    r"|\b(?:ba|z)?sh\s+-i\s*(?:>&|&>|>\s*&)"
    r"|\bmkfifo\b[^\n]{0,120}?\b(?:nc|ncat|netcat|telnet)\b"
    r"|\bsocket\b[^\n]{0,300}?\bdup2\b|\bdup2\b[^\n]{0,300}?(?:/bin/|subprocess|pty\.spawn)"
    r"|\bpty\.spawn\(\s*[\"']/bin/|\bfsockopen\s*\(|\bnet\.sockets\.tcpclient\b|\bsocat\b[^\n]{0,80}?\bexec:"
    r"|\bruby\s+-rsocket\b"
)


def _fetch_piped_to_shell(view: _View) -> bool:
    for start, _ in view.spans(_FETCH):
        if view.text.find("|", start, start + 260) == -1:
            continue
        match = _FETCH_PIPE_SHELL.match(view.text, start)
        if match and _HOST_IN_COMMAND.search(match[1]):
            return True
    return False


_PIPE_TO_SHELL_RULES = (
    _Rule(_fetch_piped_to_shell, _FETCH),
    _phrase(_SHELL_OF_FETCH_TRIGGER, _SHELL_OF_FETCH, reach=(24, 30)),
)
_DECODE_TO_SHELL_RULES = (_phrase(_DECODE_TRIGGER, _DECODE_PIPE_SHELL),)
_REVERSE_SHELL_RULES = (_phrase(_REVERSE_SHELL_TRIGGER, _REVERSE_SHELL, reach=(330, 330)),)


# -- concealment -------------------------------------------------------------------------------

# Each English phrase has its own trigger and the other words it cannot match without, so an
# entry that merely mentions the user or keeping something runs no pattern at all.
_CONCEAL_PHRASES: tuple[tuple[_Lexicon, tuple[_Lexicon, ...], re.Pattern[str]], ...] = (
    (_Lexicon("keep | kept"), (_Lexicon("hidden | secret | private | confidential | quiet"),), re.compile(
        r"(?:keep|kept) (?:all (?:of )?)?(?:this|these|it|that|the|everything)(?: [\w-]+){0,2} "
        r"(?:hidden|secret|private|confidential|quiet) from\b")),
    (_Lexicon("hide"), (), re.compile(
        r"hide (?:this|these|it|that|any|all|the|every|your)\b[^.\n;]{0,60}?\bfrom (?:the )?(?:user|human|owner)")),
    (_Lexicon("without"), (_Lexicon("informing | telling | notifying | alerting | letting"),), re.compile(
        r"without (?:informing|telling|notifying|alerting|letting) (?:the )?(?:user|human|owner)")),
    (_Lexicon("user"), (
        _Lexicon("must | should | shall | may | mustn't | shouldn't | is not to"),
        _Lexicon("know | find | notice | learn | see | discover | told | realise | realize | suspect"),
    ), re.compile(
        r"user (?:must|should|shall|may|mustn't|shouldn't|is not to|must never|should never)(?: not| never)? (?:ever )?"
        r"(?:know|find out|notice|learn|see|discover|be told|realise|realize|suspect)\b")),
    (_Lexicon("behind"), (), re.compile(r"behind the user's back\b")),
    (_Lexicon("""
        sin | usuario | oculta* | secreto | sans | cache* | ohne | verborgenen | nutzer | benutzer | скрой
        | скрыть | пользователь | без | втайне
    """), (), re.compile(
        r"sin (?:avisar|decir(?:le)?|informar|que (?:lo sepa|se entere))"
        r"|usuario no (?:se entere|lo sepa|lo note)|oc[úu]lta(?:lo|le|selo)? al usuario|(?<=en )secreto\b"
        r"|sans (?:pr[ée]venir|informer|avertir|le dire [àa]) (?:l'utilisat|l'usager)|cache[rz]? [^.\n]{0,40}[àa] l'utilisat"
        r"|ohne (?:den |die )?(?:be)?nutzer(?:in)? zu (?:informieren|benachrichtigen)|(?<=im )verborgenen\b"
        r"|(?:be)?nutzer(?:in)? (?:verbergen|geheim)"
        r"|скр(?:ой|ыть) от пользовател|пользователь не должен (?:знать|узнать)|без ведома пользовател|втайне от")),
)
_CONCEAL_FIXED = _Lexicon("""
    不要让用户知道|不要讓用戶知道|别让用户知道|別讓用戶知道|不让用户知道|不讓用戶知道|别让用户发现|別讓用戶發現
    | 不要让用户发现|不要讓用戶發現|不讓用戶發現|對用戶保密|对用户保密|瞒着用户|瞞著用戶|不要告诉用户|不要告訴用戶
    | 别告诉用户|別告訴用戶|不要向用户透露|不要让用户看到|不要讓用戶看到|别让用户看到|別讓用戶看到|不能让用户知道
    | 不能讓用戶知道|对用户隐瞒|對用戶隱瞞|向用户隐瞒|向用戶隱瞞|隐瞒用户|瞒住用户|不让用户看到
    | ユーザーに気づかれない|ユーザーにばれない|ユーザーに知らせずに|사용자가 눈치채지|사용자가 알지 못하게
    | 사용자에게 알리지 않고|사용자에게 숨겨|ユーザーに知られない|ユーザーには黙って|ユーザーには内緒|ユーザーに内緒
    | 사용자가 모르게|사용자 몰래
""")
_CONCEAL_DENSE_TRIGGER = _Lexicon("ユーザー | 사용자")
_CONCEAL_DENSE = re.compile(
    r"ユーザーに(?:は)?(?:絶対に|決して)?(?:言わない|伝えない|知らせない|教えない|話さない|秘密|内緒)"
    r"|사용자(?:에게|한테)(?:는)? ?(?:절대 |절대로 )?(?:말하지 ?마|말하지 ?말|알리지 ?마|알리지 ?말|알려주지 ?마|비밀)"
)
_HUSH_NEGATION = _Lexicon("""
    never | don't | dont | do not | must not | should not | shouldn't | no | nunca | jamás | ne | jamais
    | rien | niemals | nie | nicht | nichts | никогда | не
""")
_HUSH_VERB = _Lexicon("""
    mention* | tell | inform* | reveal* | disclose* | say | let the user know | notify | alert | bring up
    | report | digas | diga | cuentes | menciones | informes | avises | reveles | hables | hable
    | dis | dites | mentionne* | révèle* | signale* | préviens | prévenez | informe | parle | parlez
    | raconte | racontez | avertis | erwähn* | sag | sage | erzähl* | verrate | informier* | mitteil*
    | sprich | rede | говори | сообщай | упоминай | рассказывай | информируй | показывай | пиши
""")
_HUSHED_MATTER = _Lexicon("""
    this | these | it | that | what you | you've | you have | you're | you are | you did | about this
    | about it | about these | about that | about the change* | about what | about any
    | any of | que | nada | esto | esta | este | rien | cela | ça | cette | ces | davon | dies* | das | dass
    | nichts | об этом | этой | эту | это | что
""")


# "Make sure the user never finds out": concealment as the purpose of an act.
_CONCEAL_PURPOSE_TRIGGER = _Lexicon("make sure | ensure | so that | such that | in a way that | sans que | damit | чтобы")
_CONCEAL_PURPOSE = re.compile(
    r"(?:make sure|ensure|so that|such that|in a way that)\b[^.\n;]{0,20}?\buser (?:\w+n't |\w+ not |\w+ never |never |not )"
    r"(?:ever )?(?:know|find|notice|learn|see|discover|suspect|realis|realiz|is told|gets told|hear)"
    r"|sans que l'utilisat\w* (?:ne )?(?:le )?(?:sache|remarque|voie|s'en rende)"
    r"|damit (?:der|die) (?:be)?nutzer(?:in)? (?:es |davon )?nicht(?:s)? (?:merkt|erf[äa]hrt|bemerkt|sieht|mitbekommt)"
    r"|чтобы пользователь не (?:узнал|заметил|увидел|догадался)"
)


_CONCEAL_RULES = (
    _Rule(lambda view: view.has(_CONCEAL_FIXED), _CONCEAL_FIXED),
    *(_phrase(trigger, pattern, needs=needs) for trigger, needs, pattern in _CONCEAL_PHRASES),
    _phrase(_CONCEAL_PURPOSE_TRIGGER, _CONCEAL_PURPOSE, needs=(_USER, _HUSH_NEGATION)),
    _phrase(_CONCEAL_DENSE_TRIGGER, _CONCEAL_DENSE),
    _together(_HUSH_VERB, ((_HUSH_NEGATION, 30, 30), (_USER, 30, 40), (_HUSHED_MATTER, 30, 50))),
)


# -- configuration tampering and persistence ---------------------------------------------------

_EDIT_VERB = _Lexicon("""
    edit* | modify* | change* | update* | append* | add | adds | insert* | write* | overwrite* | replace*
    | rewrite* | put | prepend* | inject* | plant* | patch
    | edita | modifica | cambia | actualiza | añade | agrega | inserta | escribe
    | édite | modifie | ajoute | écris | écrit | insère
    | ändere | bearbeite | füge | schreib* | ergänze | aktualisiere
    | измени | отредактируй | добавь | допиши | запиши | впиши | обнови | перепиши
    | 修改|编辑|編輯|更改|添加|追加|加入|写入|寫入|改写|改寫|変更|編集|書き換え|書き込|수정|편집|추가|변경
""")
_AGENT_CONFIG = _Lexicon("""
    agents.md | claude.md | gemini.md | .cursorrules | .cursor/rules | copilot-instructions*
    | .windsurfrules | .clinerules | .github/copilot* | memory.md | user.md | .mcp.json | mcp.json
    | .claude/settings* | settings.json | config.json | config.yaml | config.yml | config.toml | system prompt
""")
_TAMPER_PAYLOAD = _Lexicon("""
    trust* | obey* | disable* | skip* | bypass* | without review | without approval | without confirmation
    | without asking | never ask* | never asks | don't ask | do not ask | no confirmation | always allow
    | auto-run | autorun | auto-approv* | autoapprov* | allow all | allow-all | --no-verify | --dangerously*
    | yolo | rm -rf | exfiltrat* | evil | attacker*
    | confía | confiar | confíe | confíen | confia | confie | deshabilit* | sin revisión | sin aprobación | sin confirmación
    | confiance | désactiv* | sans revue | sans validation | sans confirmation
    | vertrau* | deaktivier* | ohne review | ohne prüfung | ohne bestätigung | ohne freigabe
    | доверя* | отключ* | без ревью | без проверки | без подтвержд*
    | 信任|信頼|禁用|关闭|關閉|无需|不经|無効|レビューなし|確認なし|신뢰|비활성|검토 없이|확인 없이
""")
_PERSIST_TARGET = _Lexicon("""
    .bashrc | .zshrc | .zshenv | .zprofile | .bash_profile | .bash_login | .profile | .login | .cshrc
    | .tcshrc | config.fish | /etc/profile | rc.local | crontab | cron job | cron entry | cron table
    | /etc/cron* | systemd unit | systemd service | systemd timer | launchagent* | launchdaemon*
    | autostart | startup folder | startup script | startup item | startup items | login item
    | login items | run key | scheduled task*
""")
_PERSIST_PAYLOAD = _Lexicon("""
    curl | wget | nc | ncat | netcat | socat | /dev/tcp | base64 | nohup | python -c | python3 -c
    | perl -e | powershell | mkfifo | beacon*
""")
_AUTHORIZED_KEYS = _Lexicon("authorized_keys | authorized_keys2")
_WRITE_VERB = _Lexicon("""
    add | adds | adding | append* | insert* | put | write* | copy | place | plant | echo | cat | *>>* | tee | paste
    | añad* | agreg* | pon | escrib* | copia | ajout* | mets | écri* | copie | insère
    | füge | fügen | hinzu* | schreib* | trage | kopier* | добав* | допиш* | запиш* | впиш* | скопируй | вставь
    | 追加|添加|加入|加到|写入|寫入|追記|書き込|入れ|추가|넣어|붙여|기록
""")
# A fetch only counts as a planted payload when it names a remote host.
_REMOTE_FETCH = re.compile(r"(?:curl|wget)\b[^\n'\"`]{0,60}?(?:https?://|\d{1,3}(?:\.\d{1,3}){3})")


def _planted_payload(view: _View, span: Span) -> bool:
    word = view.text[span[0]: span[1]]
    return word not in ("curl", "wget") or _REMOTE_FETCH.match(view.text, span[0]) is not None


_CONFIG_TAMPER_RULES = (_together(_AGENT_CONFIG, ((_EDIT_VERB, 80, 40), (_TAMPER_PAYLOAD, 120, 140))),)
# The payloads are the rarer words, and "curl" is located for other rules anyway.
_PERSISTENCE_RULES = (_together(_PERSIST_PAYLOAD, ((_PERSIST_TARGET, 140, 140),), _planted_payload),)
_SSH_KEY_PLANT_RULES = (_together(_AUTHORIZED_KEYS, ((_WRITE_VERB, 100, 40),), _not_negated),)


# -- command and control -----------------------------------------------------------------------

_C2_SERVER = _Lexicon("""
    c2 server | c2 servers | c2-server | c2 endpoint | c2 channel | c2 host | c2 node | c2 infrastructure
    | c2 domain | c2-сервер* | c2 сервер* | c2サーバ* | c2 서버 | c2서버 | c2服务器 | c2伺服器 | servidor c2
    | serveur c2 | c&c | command and control
    | command-and-control | command & control | command server | control server | comando y control
    | commande et contrôle | kommando-server | kommandoserver | steuerserver | steuerungsserver
    | сервер управления | серверу управления | сервером управления | командный сервер | командному серверу
    | командным сервером | 指挥控制|指揮控制|命令与控制|命令控制|控制服务器|控制伺服器|指令サーバ
    | コマンド&コントロール|명령 제어|명령 및 제어|지휘 통제
""")
_C2_ACTION = _Lexicon("""
    beacon* | check in | check-in | phone home | call home | register* | connect* | report | contact*
    | poll* | heartbeat* | wait for | receive* | fetch* | every | pull*
    | conéct* | conect* | registr* | contacta* | recib* | cada | connecte* | contacte* | inscri*
    | toutes les | recevoir | melde* | verbind* | registrier* | alle | empfang*
    | связыв* | подключ* | регистр* | каждые | получа* | свяжись
    | 连接|連接|注册|註冊|等待|每隔|接続|登録|ごとに|待機|등록|연결|접속|마다|대기
""")
_BEACON_TRIGGER = _Lexicon("beacon* | check | wait | poll | listen | register")
_BEACON_PHRASE = re.compile(
    r"beacon(?:s|ing)? (?:back |home |out )?to\b"
    r"|check in (?:with \S+ )?(?:every \S+ \S+ )?(?:for|to (?:get|receive|fetch)) (?:new )?(?:tasks|orders|commands|instructions)"
    r"|(?:wait|poll|listen) for (?:new |further )?(?:orders|commands|tasks|instructions) from\b"
    r"|register (?:this|the) (?:agent|assistant|bot|machine|host) with\b"
)


# A bare "C2" (also a language level) counts with a contact verb and tasking words.
_C2_WORD = _Lexicon("c2 | c&c")
_TASKING = _Lexicon("""
    commands | tasks | instructions | orders | payloads | payload | órdenes | comandos | tareas
    | instrucciones | commandes | tâches | ordres | befehle | aufgaben | anweisungen | команды | команд
    | задания | задачи | инструкции | приказы | 命令|指令|任务|任務|指示|タスク|명령|작업|지시
""")
_BEACON_VERB = _Lexicon("""
    beacon* | phone home | phones home | call home | calls home | check in | check-in | checks in
    | report back | heartbeat*
""")
# Polling for tasks is what job queues do; it is command and control when a remote host is polled.
_POLL = _Lexicon("poll | polls | polling | poll* | fetch | pull")
_EXECUTE = _Lexicon("""
    execute* | run them | run it | carry out | carry them out | perform | follow them | obey
    | run whatever | execute whatever | do whatever | whatever it returns | whatever it says
    | ejecuta* | exécute* | führe | выполняй | выполни | 执行|執行|実行|실행
""")


_C2_RULES = (
    _phrase(_BEACON_TRIGGER, _BEACON_PHRASE),
    _together(_C2_SERVER, ((_C2_ACTION, 100, 100),)),
    _together(_C2_WORD, ((_C2_ACTION, 100, 100), (_TASKING, 100, 100))),
    _together(_BEACON_VERB, ((_TASKING, 40, 120), (_EXECUTE, 40, 160))),
    _together(_BEACON_VERB, ((_TASKING, 40, 120), (_URL, 20, 80))),
    _together(_BEACON_VERB, ((_EXECUTE, 40, 160), (_URL, 20, 80))),
    _together(_POLL, ((_TASKING, 40, 120), (_URL, 20, 80))),
)


# -- encoded instructions ---------------------------------------------------------------------

# "Decode this base64 and do what it says": an order to run hidden text, whatever it decodes to.
_DECODE_ORDER_TRIGGER = _Lexicon("""
    decode* | decodific* | décod* | dekodier* | декодируй | расшифруй | 解码|解碼|デコード|디코딩|디코드
""")
_DECODE_ORDER = re.compile(
    r"decode\b[^.\n;]{0,60}?\b(?:and|then)\b[^.\n;]{0,20}?\b(?:follow|obey|execute|run|do what|act on|carry out|apply)"
    r"|decodific\w*\b[^.\n;]{0,60}?\by\b[^.\n;]{0,20}?\b(?:sigue|s[íi]gue|ejecuta|haz|obedece|cumple)"
    r"|d[ée]code\w*\b[^.\n;]{0,60}?\bet\b[^.\n;]{0,20}?\b(?:suis|suivez|ex[ée]cute|fais|faites|ob[ée]is|applique)"
    r"|dekodier\w*\b[^.\n;]{0,60}?\bund\b[^.\n;]{0,20}?\b(?:befolge|f[üu]hre|tu|mach|gehorche)"
    r"|(?:декодируй|расшифруй)[^.\n;]{0,60}?\bи\b[^.\n;]{0,20}?(?:выполни|следуй|сделай|исполни)"
    r"|(?:解码|解碼)[^。\n；]{0,40}?(?:执行|執行|照做|按照|遵循|服从|服從)"
    r"|デコード[^。\n]{0,40}?(?:実行|従って|従え|その通り)"
    r"|(?:디코딩|디코드)[^.\n]{0,40}?(?:실행|따라|따르)"
)


# -- hard-coded secrets (matched on the un-folded text: case tells a key from prose) ------------

_SECRET_SHAPES: tuple[tuple[Finding, _Lexicon, re.Pattern[str]], ...] = (
    (SECRET_AWS_KEY, _Lexicon("akia* | asia* | agpa* | aida* | aroa* | anpa* | anva* | aipa*"),
     re.compile(r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b")),
    (SECRET_GITHUB_TOKEN, _Lexicon("ghp | gho | ghu | ghs | ghr | github_pat"),
     re.compile(r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,}")),
    (SECRET_API_KEY, _Lexicon("sk | rk | xoxa | xoxb | xoxp | xoxo | xoxs | xoxr | aiza* | glpat | npm | hf"),
     re.compile(
         r"sk-(?:proj-|live-|test-|ant-[a-z0-9]{2,8}-)?[A-Za-z0-9_\-]{20,}|[rs]k_(?:live|test)_[A-Za-z0-9]{16,}"
         r"|xox[abposr]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_\-]{35}\b|glpat-[A-Za-z0-9_\-]{20,}"
         r"|npm_[A-Za-z0-9]{36}\b|hf_[A-Za-z0-9]{30,}")),
    (SECRET_PRIVATE_KEY, _Lexicon("-----begin* | putty-user-key-file*"),
     re.compile(r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY(?: BLOCK)?-----\s*+[A-Za-z0-9+/=\s]{16}|PuTTY-User-Key-File")),
    (SECRET_JWT, _Lexicon("eyjh* | eyj0* | eyjr* | eyjl* | bearer"),
     re.compile(r"eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}|[Bb]earer\s+[A-Za-z0-9._~+/-]{30,}")),
)
# "password = ..." and its translations, with a value that looks like a real secret.
_PASSWORD_WORD = _Lexicon("""
    password* | passwd* | passphrase* | secret* | *_key | *-key | apikey* | token*
    | contraseña* | mot de passe | passwort* | kennwort* | пароль* | 密码|密碼|口令|パスワード|비밀번호|암호
""")
_PASSWORD_VALUE = re.compile(
    r"\w{0,20}\s*(?:[:=]|\bis\b|\best\b|\bist\b|\bes\b|\blautet\b|\bequals\b|\bwas\b|это|は|는|은|为|為|是)"
    r"\s*[\"'「`]?([^\s\"'」`]{6,64})",
)
# Values that point at a secret rather than being one ("${DB_PASSWORD}", "1Password").
_SECRET_REFERENCE = re.compile(
    r"^(?:\$|<|\{|%|\(|\[|os\.|env|process\.|getenv|vault:|secret/|\*{3}|x{4}|\.{3})"
    r"|1password|bitwarden|lastpass|keepass|keychain|vault", re.IGNORECASE)


def _looks_like_secret(value: str) -> bool:
    if _SECRET_REFERENCE.search(value):
        return False
    classes = sum((
        any(char.islower() for char in value), any(char.isupper() for char in value),
        any(char.isdigit() for char in value), any(not char.isalnum() for char in value),
    ))
    return classes >= 2 and any(char.isdigit() or not char.isalnum() for char in value)


def _hard_coded_secrets(clean: str, view: _View) -> set[str]:
    """Ids of the secrets found by shape. The view locates candidates; the un-folded text is where the shape is
    checked (at the same offsets when folding kept the length, else anywhere)."""
    aligned = len(view.text) == len(clean)
    found = set()
    for finding, trigger, shape in _SECRET_SHAPES:
        spans = view.spans(trigger)
        if spans and (any(shape.match(clean, start) for start, _ in spans) if aligned else shape.search(clean)):
            found.add(finding.id)
    for start, end in view.spans(_PASSWORD_WORD):
        match = _PASSWORD_VALUE.match(clean, end) if aligned else _PASSWORD_VALUE.match(view.text, end)
        if match and _looks_like_secret(match[1].rstrip(".,;)")):
            found.add(SECRET_PASSWORD.id)
            break
    return found


# -- base64 payloads --------------------------------------------------------------------------

_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_\-]{16,}={0,2}")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffd]")
_LETTER = re.compile(r"[^\W\d_]")


def _decode_base64(run: str) -> str | None:
    """The text a base64 run (standard or URL-safe) stands for, if it is mostly printable."""
    body = run.rstrip("=").replace("-", "+").replace("_", "/")
    if len(body) % 4 == 1:
        body = body[:-1]
    try:
        decoded = base64.b64decode(body + "=" * (-len(body) % 4), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    if len(_CONTROL.findall(decoded)) > len(decoded) // 20:
        return None
    if len(_LETTER.findall(decoded)) < len(decoded) // 3:
        return None
    return decoded


def _base64_candidates(view: _View) -> list[str]:
    """Words that may be pieces of a base64 run. Only a text with a word of 16 characters or
    more is looked at (prose rarely has one; "+", "/", "-" and "_" split a run into words, and
    a run worth decoding keeps a long piece), which keeps ordinary entries off this path."""
    if max(map(len, view.words), default=0) < 16:
        return []
    return [word for word in view.words if len(word) >= 12]


def _decoded_payloads(clean: str, view: _View) -> str:
    """Every decodable base64 run of the text, one per line (so they are scanned together)."""
    candidates = _base64_candidates(view)
    if not candidates:
        return ""
    if len(clean) != len(view.text):
        runs = [match[0] for match in _BASE64_RUN.finditer(clean)]
    else:
        runs = _runs_around(clean, sorted(at for word in candidates for at in _positions(view.text, word)))
    decoded = (_decode_base64(run) for run in runs)
    return "\n".join(text for text in decoded if text)


_BASE64_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-=")


def _runs_around(clean: str, starts: list[int]) -> list[str]:
    """The base64 runs holding the given offsets, each once."""
    runs = []
    covered = 0
    for at in starts:
        if at < covered:
            continue
        begin = at
        while begin > covered and clean[begin - 1] in _BASE64_CHARS:
            begin -= 1
        match = _BASE64_RUN.match(clean, begin)
        if match:
            runs.append(match[0])
            covered = match.end()
    return runs


# -- putting it together -----------------------------------------------------------------------

# An index entry: a lexicon, the words its terms need besides the key, and those terms.
_Entry = tuple[_Lexicon, frozenset[str], list[_Term]]


def _key_index(by_key: str) -> dict[str, list[_Entry]]:
    index: dict[str, list[_Entry]] = {}
    for lexicon in _LEXICONS:
        for key, terms in getattr(lexicon, by_key).items():
            # Terms needing the same words are checked together; most need only the key.
            by_needs: dict[frozenset[str], list[_Term]] = {}
            for term in terms:
                by_needs.setdefault(term.words - {key}, []).append(term)
            index.setdefault(key, []).extend((lexicon, needs, group) for needs, group in by_needs.items())
    return index


# Built last, once every lexicon above has joined _LEXICONS.
_BY_WORD = _key_index("by_word")
_BY_PREFIX = _key_index("by_prefix")
_BY_GATE = _key_index("by_gate")
_WORD_KEYS = frozenset(_BY_WORD)
_PREFIX_KEYS = frozenset(_BY_PREFIX)
_ASCII_GATES = tuple(gate for gate in _BY_GATE if gate.isascii())
_DENSE_GATES = frozenset(gate for gate in _BY_GATE if gate >= _DENSE_SCRIPT)

_VIEW_DETECTORS: tuple[tuple[Finding, tuple[_Rule, ...]], ...] = (
    (OVERRIDE, _OVERRIDE_RULES),
    (OBEY_EXTERNAL, _OBEY_EXTERNAL_RULES),
    (AUTO_APPROVE, _AUTO_APPROVE_RULES),
    (ROLE_HIJACK, _ROLE_HIJACK_RULES),
    (FAKE_SYSTEM, _FAKE_SYSTEM_RULES),
    (EXFIL_URL, (_Rule(lambda view: _exfiltrates(view, _url_or_ip_near)),)),
    (EXFIL_EMAIL, (_Rule(lambda view: _exfiltrates(view, _email_near), _EMAIL_AT),)),
    (MD_IMAGE_EXFIL, (_Rule(_detect_image_exfiltration, _IMAGE_TRIGGER),)),
    (SECRET_READ, (_Rule(_detect_secret_read),)),
    (PROMPT_LEAK, _PROMPT_LEAK_RULES),
    (RCE_PIPE_SHELL, _PIPE_TO_SHELL_RULES),
    (RCE_DECODE_SHELL, _DECODE_TO_SHELL_RULES),
    (REVERSE_SHELL, _REVERSE_SHELL_RULES),
    (CONCEAL, _CONCEAL_RULES),
    (CONFIG_TAMPER, _CONFIG_TAMPER_RULES),
    (PERSISTENCE, _PERSISTENCE_RULES),
    (SSH_KEY_PLANT, _SSH_KEY_PLANT_RULES),
    (C2_BEACON, _C2_RULES),
    (ENCODED_PAYLOAD, (_phrase(_DECODE_ORDER_TRIGGER, _DECODE_ORDER),)),
)
# Every rule with the id of its finding, in one flat sequence. Findings are tracked by id:
# frozen dataclasses hash slowly.
_VIEW_RULES = tuple((finding.id, rule) for finding, rules in _VIEW_DETECTORS for rule in rules)


def _scan_clean(clean: str, depth: int) -> set[str]:
    """The ids of the findings in a text already stripped of invisible characters and
    NFKC-normalised."""
    views = _views(clean)
    found = _hard_coded_secrets(clean, views[0])
    for view in views:
        present = view.lexicons
        for finding, rule in _VIEW_RULES:
            if finding not in found and present >= rule.needs and rule.test(view):
                found.add(finding)
    if depth < MAX_DECODE_DEPTH:
        payload = _decoded_payloads(clean, views[0])
        if payload:
            inner = _scan_clean(_nfkc(_strip_hidden(payload)), depth + 1)
            if inner:
                found |= inner
                found.add(ENCODED_PAYLOAD.id)
    return found


def scan(text: str) -> tuple[Finding, ...]:
    """The threat patterns found in a memory entry; an empty tuple means clean."""
    if len(text) > MAX_SCAN_CHARS:
        return (TOO_LONG,)
    found = _scan_clean(_nfkc(_strip_hidden(text)), 0)
    return tuple(finding for finding in FINDING_ORDER if finding.id in found)
