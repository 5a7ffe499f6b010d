"""The scanner's second opinion: a linear model over an entry's words, learned from the
project's development corpus, for the attacks whose phrasing no rule anticipated.

The rules (`memd.core.scan`) say precisely why they block, and they stay the first line. But
word lists written from known attacks miss new phrasings of the same intent, while a model that
weighs every word and word pair generalises: on the held-out corpus, which neither the rules nor
the model were tuned or trained on, the two together block 86.8% of attacks where the rules alone
block 48.9%, and refuse 2.0% of ordinary notes where the rules alone refuse 1.1% (README,
"Injection scanner").

The model is logistic regression on binary features: each word, each pair of adjacent words, the
first letters of each long word (which carries across inflections: German, Spanish, Russian), each
word a negation stands before, marked so ("never disable 2fa" holds "!disable"), and for scripts
written without spaces (Chinese, Japanese, Korean) each character and each pair of adjacent
characters; a host name ("files.acme.com", "leak-desk.example") is one word for every host. A text's
features are weighed together and divided by the square root of their number, so a long text is not
suspicious for its length alone; and each sentence of an entry of several is also judged alone, so
that one bad order among ordinary facts is not outweighed by them. In training, each feature's
weight is scaled by how well the feature alone tells attacks from notes (as NBSVM scales a linear
model's words by naive Bayes), so that the model leans on words that mark an attack rather than on
words common to both. The thresholds are strict: on development batches left out of its training,
the rules and the model together refuse at most 1.75% of the ordinary notes (1.49%).

The weights live in `scan_model.tsv` beside this module, written by
`scripts/train_scan_model.py` from `tests/corpus/attacks.txt` and `benign.txt`; the header
records a digest of those files, and a test fails when they change without retraining.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from itertools import repeat

from memd.core.words import DENSE_RUN, LETTER_RUN, ascii_words

MODEL_FILE = "scan_model.tsv"
# Entries longer than this get the rules alone. Nearly every memory entry is shorter (Hermes's
# default budget for all of MEMORY.md is 2,200 characters); the model was trained on entries of
# that size, dilutes an attack sentence in a long text anyway, and on a 2,200-character note
# would double the scan's time.
MAX_CHARS = 1_000

# A non-ASCII text's words, with each run of Chinese, Japanese or Korean characters as one.
_TOKEN = re.compile(f"{LETTER_RUN}|{DENSE_RUN}")
# Where a sentence ends, so that it can be judged on its own.
# (The texts are NFKC, so a full-width "！" is "!" by now, and only "。" ends a sentence with no space.)
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n|(?<=\u3002)")
# A host name ("ops@files.example", "https://leak-desk.example/up", "team@acme.com"), read as one word
# whatever its labels. The development corpus, fictional as it must be, ends its addresses in ".example", which
# taught the model to suspect the English word ("the README example"); and its writers named the hosts of
# attacks after what the attack does ("leak-desk", "exfil-drop"), where a real attacker picks a harmless name
# and a real note names any. As one word for all hosts, what the model learns is that an address is named, which
# holds for any. A host is found by its last label (the dot matched first: a pattern that opens with a
# look-behind or a character class is tried at every character) and read from there both ways.
_TOP_LEVEL_DOMAIN = re.compile(
    r"\.(?<=[0-9a-z-]\.)(?:example|com|org|net|edu|gov|io|dev|app|ai|co|uk|de|fr|es|it|nl|ru|jp|kr|cn|eu|info"
    r"|biz|test|invalid|local|internal|lan)\b")
_HOST_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyz.-")
_HOST_WORD = " host "


def _hosts_as_one_word(sentence: str) -> str:
    pieces, done = [], 0
    for match in _TOP_LEVEL_DOMAIN.finditer(sentence):
        start, end = match.start(), match.end()
        if start < done:  # (a label inside a host already read: "x.example.com")
            continue
        while start > done and sentence[start - 1] in _HOST_CHARS:
            start -= 1
        while end < len(sentence) and sentence[end] in _HOST_CHARS:
            end += 1
        pieces += [sentence[done:start], _HOST_WORD]
        done = end
    return "".join(pieces) + sentence[done:] if pieces else sentence


_DENSE_SCRIPT = "\u3040"  # from kana on, every character _TOKEN matches is CJK, kana or Hangul
_STEM = 5  # letters kept of a longer word, for its stem feature
# A text's features are divided by the square root of their number, but never by less than
# this: a short text holds few words, and two or three of them must not decide alone. Nor does
# the model judge a text with fewer features (about seven words) at all: "keep this note 5" is
# too little to go on, and it is what test harnesses write by the thousand. The rules judge those.
FEWEST_COUNTED = 16
# A sentence judged alone needs more (about ten words): the model learned from whole entries, and
# a short clause of an ordinary one ("手で編集しないこと。") can look like an order out of context.
FEWEST_IN_A_SENTENCE = 24


def feature_value(count: int) -> float:
    """What each of `count` features present in a text adds up to, before weighting."""
    return 1.0 / math.sqrt(max(count, FEWEST_COUNTED))


def words_of(text: str) -> list[str]:
    return ascii_words(text) if text.isascii() else _TOKEN.findall(text)


def features(texts: Iterable[str]) -> set[str]:
    """The features of an entry, given as its normalised views (the union over all of them,
    so an entry disguised with look-alike letters or spacing shows its plain words too)."""
    return set().union(*sentence_features(texts))


def sentence_features(texts: Iterable[str]) -> list[set[str]]:
    """The features of each sentence of each view. A pair of words never spans two sentences.

    Feature strings cannot collide across kinds: a pair holds a space, a stem ends in "-" and a
    denied word starts with "!", which no word holds, and a CJK character is never a Latin word.
    """
    found = []
    for text in texts:
        for sentence in _SENTENCE_END.split(text):
            if "." in sentence:
                sentence = _hosts_as_one_word(sentence)
            words = words_of(sentence)
            if not words:
                continue
            own = set(words)
            own.update([f"{first} {second}" for first, second in zip(words, words[1:])])
            own.update([f"{word[:_STEM]}-" for word in words if len(word) > _STEM])
            own.update([f"!{word}" for word in _negated(words)])
            if not sentence.isascii():
                for word in words:
                    if word[0] >= _DENSE_SCRIPT:
                        own.update(word)
                        own.update([word[index:index + 2] for index in range(len(word) - 1)])
            found.append(own)
    return found


# Words that deny what follows, in the languages that space their words (Chinese, Japanese and
# Korean deny within a run of characters, which their character pairs already see). As the model's
# tokens have them: "don't" is "don" and "t". (The scanner's rules keep a list of their own, read
# against the text's words; the model's is part of what it was trained on.)
_NEGATIONS = frozenset("""
    never not no don dont doesn didn won shouldn mustn cannot nor nie niemals nicht kein keine keinen keinem
    jamais ne pas aucun aucune nunca jamás jamas ni не никогда нельзя ни
""".split())
_NEGATED_REACH = 4  # words after a negation that it is taken to deny


def _negated(words: list[str]) -> list[str]:
    """The words a negation stands before ("never disable 2fa": disable, 2fa), each of which also
    counts as a feature of its own, "!disable": the same words ordered and forbidden are opposites,
    and a protective note ("never turn off two-factor") should not weigh as the attack it forbids."""
    found, reach = [], 0
    for word in words:
        if word in _NEGATIONS:
            reach = _NEGATED_REACH
        elif reach:
            found.append(word)
            reach -= 1
    return found


@dataclass(frozen=True, slots=True)
class Model:
    bias: float
    threshold: float  # on the logit: the model objects when an entry's score reaches it
    sentence_threshold: float  # the same for one sentence of an entry of several
    weights: Mapping[str, float]
    corpus_digest: str  # of the development corpus it was trained on

    def score(self, found: set[str]) -> float:
        """The logit that `found` (an entry's features) come from an attack."""
        return self.bias + sum(map(self.weights.get, found, repeat(0.0))) * feature_value(len(found))

    def objects(self, texts: Sequence[str]) -> bool:
        """Whether the entry, or one of its sentences, is too much like the attacks. Sentences
        are judged alone too, since one bad order among ordinary facts weighs little in the
        whole, against a threshold of their own (an entry of many sentences has many chances to
        look bad)."""
        whole, sentences = self.scores(texts)
        return whole >= self.threshold or any(score >= self.sentence_threshold for score in sentences)

    def scores(self, texts: Sequence[str]) -> tuple[float, Iterator[float]]:
        """The entry's score and, computed as they are asked for, those of its sentences judged alone
        (none when it has one sentence); -inf for each with too few features to be judged."""
        sentences = sentence_features(texts)
        alone = sentences if len(sentences) > len(texts) else []
        return (self._judged(set().union(*sentences), FEWEST_COUNTED),
                (self._judged(sentence, FEWEST_IN_A_SENTENCE) for sentence in alone))

    def _judged(self, found: set[str], fewest: int) -> float:
        return self.score(found) if len(found) >= fewest else -math.inf


def logit(probability: float) -> float:
    return math.log(probability / (1.0 - probability))


_REMEDY = "; the file is damaged: reinstall memd, or run python scripts/train_scan_model.py in a checkout"


def parse_model(lines: Iterable[str]) -> Model:
    """Read a model file, given its text or its lines: "# key value" header lines (other keys are
    comments), then one "weight<TAB>feature" per line."""
    header: dict[str, str] = {}
    weights: dict[str, float] = {}
    # The file lists its weights in order, so equal ones stand together, and each number is read
    # once for its run: the shipped file's 151,203 weights are 106,346 numbers, and the features
    # that share one share its float (2.4 MB less memory for the daemon).
    written, value = "", 0.0
    for number, line in enumerate(lines.splitlines() if isinstance(lines, str) else lines, 1):
        line = line.rstrip("\n")
        if line.startswith("# "):
            key, _, text = line[2:].partition(" ")
            header[key] = text.strip()
        elif line:
            weight, tab, feature = line.partition("\t")
            try:
                if weight != written:
                    written, value = weight, float(weight)
                weights[feature] = value
            except ValueError:
                tab = ""  # not a weight: the line is as unreadable as one without its tab
            if not tab or not feature:
                raise ValueError(f"{MODEL_FILE} line {number}: expected weight<TAB>feature, got {line!r}{_REMEDY}")
    try:
        return Model(
            float(header["bias"]), float(header["threshold"]), float(header["sentence_threshold"]), weights,
            header["corpus"],
        )
    except KeyError as missing:
        raise ValueError(f"{MODEL_FILE}: the header lacks {missing}{_REMEDY}") from None
    except ValueError as error:
        raise ValueError(f"{MODEL_FILE}: a header value is not a number ({error}){_REMEDY}") from None


def format_model(model: Model, comments: Iterable[str] = ()) -> str:
    """The text of a model file, strongest weights first, so its head shows what it learned."""
    lines = [f"# {comment}" for comment in comments]
    lines += [
        f"# bias {model.bias!r}", f"# threshold {model.threshold!r}",
        f"# sentence_threshold {model.sentence_threshold!r}", f"# corpus {model.corpus_digest}",
    ]
    ranked = sorted(model.weights.items(), key=lambda item: (-item[1], item[0]))
    lines += [f"{weight:.6g}\t{feature}" for feature, weight in ranked]
    return "\n".join(lines) + "\n"


@functools.cache
def shipped_model() -> Model:
    """The model in `scan_model.tsv`, read once, on first use rather than at import: the command
    line imports the scanner's module for file names alone, and reading its hundred thousand
    weights takes about a tenth of a second. (The engine asks for it as it starts, so no write
    waits for it.)"""
    # Line by line: the whole text and a list of its lines would cost 17 MB more at the peak, and
    # a daemon's memory does not shrink back after it.
    with resources.files(__package__).joinpath(MODEL_FILE).open(encoding="utf-8") as lines:
        return parse_model(lines)
