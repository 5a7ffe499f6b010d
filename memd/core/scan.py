"""Injection scanner for curated memory entries: pure functions over text, no I/O.

An entry is normalised into one or more *views*: invisible characters dropped (Unicode tag
characters decoded into the ASCII they smuggle), NFKC, case-folded; plus, only when they could
differ, a copy with Cyrillic/Greek look-alikes folded to Latin, a copy with letter-spaced words
joined, and the text of decoded base64 payloads. Small lexicons (action verbs, sensitive
objects, destinations, per-language phrases) are matched on each view and rules combine them:
most findings need an imperative, a sensitive object and, where it applies, a destination in
the same clause, so a note that merely mentions a key, a URL or base64 stays clean.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass

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
# hidden sentence is scanned in place.
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
# case-folding, so that Greek capital Eta becomes H rather than the eta's "n").
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

# A letter-spaced run: single characters joined by one repeated separator ("i g n o r e",
# "c-u-r-l", "b.a.s.h"), standing alone between spaces. Six characters make a text worth a
# joined copy; in that copy, runs of two or more are joined.
_SPACED_RUN_LONG = re.compile(r"(?<!\S)\S([ .\-_·*])(?:\S\1){4}")
_SPACED_RUN = re.compile(r"(?<!\S)\S([ .\-_·*])(?:\S\1){0,100000}\S(?!\S)")


def _strip_hidden(text: str) -> str:
    if _HIDDEN_RE.search(text) is None:
        return text
    return text.translate(_HIDDEN_TABLE)


def _nfkc(text: str) -> str:
    if text.isascii() or unicodedata.is_normalized("NFKC", text):
        return text
    return unicodedata.normalize("NFKC", text)


def _join_spaced(text: str) -> str:
    return _SPACED_RUN.sub(lambda match: match[0][::2], text)


def _views(clean: str) -> list[str]:
    """The case-folded texts the detectors read: the entry itself and, when they differ,
    its look-alike-folded and letter-joined copies."""
    bases = [clean]
    if not clean.isascii() and _CYRILLIC_OR_GREEK.search(clean):
        bases.append(clean.translate(_CONFUSABLES))
    views = [base.casefold() for base in bases]
    if _SPACED_RUN_LONG.search(clean):
        views += [_join_spaced(view) for view in views]
    return views


# -- base64 payloads --------------------------------------------------------------------------

_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_\-]{16,}={0,2}")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffd]")
_LETTER = re.compile(r"[^\W\d_]")


def _decode_base64(run: str) -> str | None:
    """The text a base64 run (standard or URL-safe) stands for, if it is mostly printable."""
    body = run.rstrip("=").replace("-", "+").replace("_", "/")
    body = body[: len(body) - len(body) % 4] if len(body) % 4 == 1 else body
    try:
        raw = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
        decoded = raw.decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    if len(_CONTROL.findall(decoded)) > len(decoded) // 20:
        return None
    if len(_LETTER.findall(decoded)) < len(decoded) // 3:
        return None
    return decoded


def _decoded_payloads(clean: str) -> str:
    """Every decodable base64 run of the text, one per line (so they are scanned together)."""
    if len(clean) < 16:
        return ""
    decoded = (_decode_base64(match[0]) for match in _BASE64_RUN.finditer(clean))
    return "\n".join(text for text in decoded if text)


# -- matching helpers -------------------------------------------------------------------------

# A clause ends at a sentence stop followed by a space, at a semicolon or at a line break;
# rules only combine words of one clause.
_CLAUSE_BREAK = re.compile(r"[.!?;:](?=\s)|[;\n。！？；]")


class _View:
    """One normalised text, with the matches of each lexicon computed once, on demand."""

    __slots__ = ("text", "_spans", "_breaks")

    def __init__(self, text: str) -> None:
        self.text = text
        self._spans: dict[re.Pattern[str], list[tuple[int, int]]] = {}
        self._breaks: list[int] | None = None

    def spans(self, lexicon: re.Pattern[str]) -> list[tuple[int, int]]:
        found = self._spans.get(lexicon)
        if found is None:
            found = [match.span() for match in lexicon.finditer(self.text)]
            self._spans[lexicon] = found
        return found

    def has(self, lexicon: re.Pattern[str]) -> bool:
        return bool(self.spans(lexicon))

    def same_clause(self, first: int, second: int) -> bool:
        if self._breaks is None:
            self._breaks = [match.start() for match in _CLAUSE_BREAK.finditer(self.text)]
        low, high = min(first, second), max(first, second)
        index = bisect_left(self._breaks, low)
        return index == len(self._breaks) or self._breaks[index] >= high


Span = tuple[int, int]
Guard = Callable[[_View, Span], bool]


def _near(view: _View, anchor: Span, lexicon: re.Pattern[str], before: int, after: int) -> bool:
    """Whether the lexicon matches in the anchor's clause, from `before` characters ahead of
    the anchor to `after` characters past it."""
    spans = view.spans(lexicon)
    index = bisect_left(spans, (anchor[0] - before, -1))
    while index < len(spans) and spans[index][0] <= anchor[1] + after:
        if view.same_clause(anchor[0], spans[index][0]):
            return True
        index += 1
    return False


def _together(
    view: _View,
    anchor: re.Pattern[str],
    others: Iterable[tuple[re.Pattern[str], int, int]],
    guard: Guard | None = None,
) -> bool:
    """Whether some match of the anchor lexicon has every other lexicon near it."""
    needed = tuple(others)
    for span in view.spans(anchor):
        if guard is not None and not guard(view, span):
            continue
        if all(_near(view, span, lexicon, before, after) for lexicon, before, after in needed):
            return True
    return False


def _lexicon(*parts: str) -> re.Pattern[str]:
    return re.compile("|".join(parts))


# Negation right before a verb ("never upload", "do not print", "不要粘贴") or right after it
# in Japanese and Korean ("送信しないで", "붙여 넣지 말"): the entry forbids the act.
_NEGATED_BEFORE = re.compile(
    r"(?:\bnever|\bnot|n't|\bno|\bnunca|\bjamais|\bne|\bnie|\bniemals|\bnicht|никогда|\bне)"
    r"\s+(?:\S+\s+)?$|(?:不要|别|別|勿|不能|不得|禁止|切勿|不可|不准|决不|絶対に|절대)\S{0,8}$"
)
_NEGATED_AFTER = re.compile(r"^\S{0,4}\s?(?:ないで|しない|するな|禁止|지 ?마|지 ?말|지 ?않|말 것)")


def _affirmed(view: _View, span: Span) -> bool:
    before = view.text[max(0, span[0] - 24): span[0]]
    after = view.text[span[1]: span[1] + 10]
    return _NEGATED_BEFORE.search(before) is None and _NEGATED_AFTER.search(after) is None


# -- lexicons shared by several rules ---------------------------------------------------------

_URL = re.compile(r"\b(?:https?|ftps?|sftp|wss?|tcp|gopher)://(?!(?:localhost|127\.)[:/\d])")
_IP = re.compile(r"(?<![\d.])(?!127\.|0\.0\.0\.0)(?:\d{1,3}\.){3}\d{1,3}(?![\d.]*\d)")
_EMAIL = re.compile(r"(?<=[\w.+-])@[\w-]{1,63}(?:\.[\w-]{1,63}){1,8}")

_USER = _lexicon(
    r"\buser\b|\busers\b|\buser's\b|\bhuman\b|\bowner\b|\banyone\b",
    r"usuario", r"utilisat(?:eur|rice)|l'usager", r"(?:be)?nutzer|anwender",
    r"пользовател", "用户|用戶|使用者|ユーザー|利用者|사용자|유저",
)


# -- instruction override ----------------------------------------------------------------------

_OVERRIDE_VERB = _lexicon(
    r"\bignor(?:e|es|ed|ing)\b", r"\bdisregard", r"\bforget\b|\bforgetting\b", r"\boverrid",
    r"\bbypass", r"\bdiscard", r"\babandon", r"\bset aside", r"\bpay no (?:attention|heed)",
    r"\b(?:do not|don't|dont|no longer|stop) (?:follow|obey)", r"\bthrow out", r"\bscrap\b",
    r"\bignor[ae](?:r|n|s)?\b", r"\bolvid[aeé]", r"\bdescart[ae]", r"\bomit[ae]\b",
    r"\bno (?:hagas|haga|hagan) caso", r"\bhaz caso omiso", r"\bpasa por alto",
    r"\bignorez\b", r"\boubli", r"\bne (?:tiens|tenez|tenir|prends|prenez) (?:pas |plus )?(?:en )?compte",
    r"\bfai(?:s|tes) abstraction", r"\bpassez? outre", r"\boutrepass",
    r"\bignorier", r"\bvergiss|\bvergessen\b|\bvergesst", r"\bmissacht", r"\bau(?:ss|ß)er acht",
    r"\bverwirf|\bverwerfen", r"\b[üu]berschreib",
    r"игнорир", r"забудь|забыть|забудьте", r"не обращай(?:те)? внимани", r"пренебрег",
    r"отбрось|отбросьте", r"не (?:следуй|выполняй|слушай|слушайся)",
    "忽略|忽視|忽视|无视|無視|不要理会|不要理會|别理会|不理会|不用理会|抛开|拋開|忘记|忘記|忘掉|丢弃|丟棄|跳过|推翻",
    "無視|忘れ|破棄|従わな|上書き",
    "무시|잊어|잊고|잊으|따르지 마|따르지 말|폐기",
)
_INSTRUCTION_NOUN = _lexicon(
    r"\binstruction", r"\brules?\b", r"\bguidelines?\b", r"\bdirectives?\b", r"\bprompts?\b",
    r"\bpolic(?:y|ies)\b", r"\bconstraints\b", r"\brestrictions\b", r"\bguardrails\b",
    r"\bprogramming\b", r"\bcommands\b", r"\borders\b", r"\bsafeguards\b", r"\bcontext\b",
    r"\binstruccion", r"\breglas?\b", r"\bindicaciones\b", r"\bdirectrices\b", r"\bnormas\b",
    r"\bpautas\b", r"\b[óo]rdenes\b", r"\bpol[íi]ticas?\b", r"\brestricciones\b",
    r"\br[èe]gles?\b", r"\bconsignes?\b", r"\bordres\b",
    r"anweisung", r"regeln\b|\bregel\b", r"richtlinie", r"\bvorgaben?\b", r"\bbefehle\b",
    r"instruktion", r"vorschriften", r"einschr[äa]nkung", r"systemprompt",
    r"инструкци", r"правил", r"указани", r"директив", r"промпт", r"ограничени",
    "指令|指示|规则|規則|提示词|提示詞|命令|约束|約束|限制|规定|規定|准则|準則",
    "ルール|プロンプト|制約|ガイドライン|ポリシー",
    "지시|명령|규칙|지침|프롬프트|제약|정책|가이드라인",
)
_PRIOR_QUALIFIER = _lexicon(
    r"\bprevious", r"\bprior\b", r"\babove\b", r"\bearlier\b", r"\bpreceding\b", r"\bformer\b",
    r"\boriginal\b", r"\binitial\b", r"\bexisting\b", r"\ball\b", r"\bany\b", r"\bevery\b",
    r"\byour\b", r"\bsystem\b", r"\bdeveloper", r"\bsafety\b", r"\bcontent\b", r"\bethical\b",
    r"\banterior", r"\bprevias?\b", r"\bprecedentes?\b", r"\bde arriba\b", r"\bdel sistema\b",
    r"\btodas?\b", r"\btus\b",
    r"pr[ée]c[ée]dent", r"ant[ée]rieur", r"ci-dessus", r"plus haut", r"\btou(?:te)?s\b",
    r"\btes\b|\bvos\b", r"syst[èe]me", r"\binitiales?\b",
    r"vorherig", r"bisherig", r"\bobig", r"fr[üu]her", r"vorangegangen", r"urspr[üu]nglich",
    r"\balle[ns]?\b", r"\bdeine\b", r"\bvorigen?\b",
    r"предыдущ", r"прежн", r"\bвыше\b", r"\bвсе\b|\bвсё\b|\bвсех\b", r"систем", r"\bранее\b",
    r"изначальн", r"\bсвои\b|\bтвои\b",
    "之前|以前|先前|此前|上面|上述|以上|前面|原来|原有|原先|所有|全部|一切|系统|系統",
    "これまで|前の|上記|上の|先の|すべて|全て|システム|元の",
    "이전|앞의|앞서|위의|모든|전부|기존|시스템|원래",
)
# Whole phrases that override on their own.
_OVERRIDE_PHRASE = _lexicon(
    r"\bforget (?:about )?(?:everything|all)(?: that)? (?:you(?:'ve| have| were| had)? "
    r"(?:been )?(?:told|learned|know)|above|before|prior|previous|so far)",
    r"\b(?:instructions|rules|guidelines|directives|prompt|programming) (?:are|is) (?:now |hereby )?"
    r"(?:void|null|cancel+ed|revoked|obsolete|invalid|superseded|overridden|no longer (?:valid|in effect|apply))",
    r"\b(?:supersedes?|overrides?|replaces?|trumps?|takes? (?:precedence|priority) over|outranks?) "
    r"(?:(?:all|any|every|the|your) ){0,2}(?:(?:previous|prior|earlier|other|existing|original|system|developer) ){0,2}"
    r"(?:instructions|rules|guidelines|directives|prompts?|system prompt|polic(?:y|ies))",
    r"\b(?:obey|follow) only (?:this|these|me\b|my)",
    r"\bfollow (?:them|it|these|this|my)(?: instructions| rules)? instead\b",
    r"\binstead of (?:the |your )?(?:user'?s?|system'?s?|original|developer'?s?) (?:request|instructions|prompt|question|task)",
    r"\bolvida (?:todo|lo) (?:lo )?anterior", r"\boublie(?:z)? tout ce qui (?:pr[ée]c[èe]de|est au-dessus)",
    r"\bvergiss alles\b", r"забудь (?:всё|все) (?:что|предыдущ|выше|ранее)",
    "(?:只|仅|僅)(?:按照|遵循|遵守|听从|聽從|服从|服從|执行|執行)(?:这条|此条|本条|這條|我的)",
)
# "New rules take priority": a priority word, an instruction noun and a word marking them new.
_PRIORITY = _lexicon(
    r"\b(?:takes?|have|has|get|gets|given) (?:top |absolute |full )?(?:priority|precedence)\b",
    r"\btienen? (?:la )?(?:prioridad|precedencia)|\bprevalecen?\b",
    r"\b(?:ont|a) (?:la )?priorit[ée]|\bpr[ée]valen", r"\bvorrang\b|\bpriorit[äa]t\b",
    r"приоритет", "优先|優先|우선",
)
_NEW_QUALIFIER = _lexicon(
    r"\bnew\b|\bthese\b|\bthis\b|\bfollowing\b|\bbelow\b|\bmy\b",
    r"\bnuev[ao]s?\b|\bestas?\b|\bnouvelles?\b|\bnouveaux\b|\bces\b|\bneuen?\b|\bdiese[n]?\b",
    r"\bнов[ыо]|\bэти\b|\bэто\b", "新|这条|這條|此条|以下|下面|この|새로운|이 ",
)
# "say 'ignore previous instructions'" is a mention, not an order.
_MENTION_CUE = re.compile(
    r"(?:\bsays?|\bsaid|\bsaying|\blike|\bsuch as|\bphrases?|\bwords?|\bcontains?|\bcontaining|"
    r"\btext|\be\.g\.|\bmessages?)\W{0,6}$"
)
_QUOTES = "\"'“”‘’«»「」『』`"


def _not_a_quoted_mention(view: _View, span: Span) -> bool:
    before = view.text[max(0, span[0] - 40): span[0]]
    stripped = before.rstrip()
    if not stripped or stripped[-1] not in _QUOTES:
        return True
    return _MENTION_CUE.search(stripped[:-1]) is None


def _detect_override(view: _View) -> bool:
    if view.has(_OVERRIDE_PHRASE):
        return True
    if view.has(_OVERRIDE_VERB) and _together(
        view, _OVERRIDE_VERB,
        ((_INSTRUCTION_NOUN, 30, 50), (_PRIOR_QUALIFIER, 30, 50)),
        _not_a_quoted_mention,
    ):
        return True
    return view.has(_PRIORITY) and _together(
        view, _PRIORITY, ((_INSTRUCTION_NOUN, 40, 20), (_NEW_QUALIFIER, 50, 20)))


# -- obeying outside sources, permission escalation ------------------------------------------

_TRUST_VERB = _lexicon(
    r"\bobey|\btrust\b|\btrusts\b|\bcomply with (?:every|all|any)\b|\bcarry out (?:all|any|every)\b",
    r"\bobedec|\bobedezc|\bconf[íi]a(?:r)? en\b", r"\bob[ée]i[rs]?\b|\bob[ée]issez\b|\bfais confiance",
    r"\bbefolge|\bvertrau|\bgehorch", r"выполняй|доверя|подчиня|слушайся",
    "服从|服從|听从|聽從|信任|信頼|従え|従って|신뢰|복종|따르",
)
_ORDERS = _lexicon(
    r"\binstructions?\b|\bcommands?\b|\borders?\b|\bdirectives?\b|\brequests?\b",
    r"instrucciones|[óo]rdenes|comandos", r"\binstructions\b|\bordres\b|\bconsignes\b",
    r"anweisungen|befehle", r"команд|инструкци|указани|приказ",
    "指令|命令|指示|命令|지시|명령",
)
_OUTSIDE_SOURCE = _lexicon(
    r"\be-?mails?\b|\binbox\b|\btool (?:results?|outputs?)\b|\bweb ?pages?\b|\bwebsites?\b",
    r"\bsearch results\b|\bdocuments?\b|\bissues?\b|\bcomments?\b|\buntrusted\b|\bexternal\b",
    r"\bthird[- ]party\b|\banyone\b|\bany sender\b|\bwhoever\b|\bstrangers?\b",
    r"(?<![\w.])[\w-]+\.(?:example|com|net|org|io|ru|cn|xyz|top|info|biz)\b",
    r"correos?|p[áa]ginas? web|herramienta|externos?|cualquiera", r"courriels?|pages? web|outils?|externes?",
    r"webseiten?|werkzeug|externen?", r"письм|почт|сайт|внешн|инструмент|любого",
    "邮件|郵件|网页|網頁|工具结果|工具結果|外部|来自|來自|メール|ウェブ|外部|ツール|이메일|메일|웹|외부|도구",
)
_ANY_SCOPE = _lexicon(
    r"\bany\b|\barbitrary\b|\bevery\b|\ball\b|\bwhatever\b", r"\bcualquier|\btodos? los\b",
    r"\bn'importe (?:quel|quelle)|\btoutes? les\b", r"\bjede[nmrs]?\b|\balle\b|\bbeliebige",
    r"\bлюб[ыо]|\bвсе\b", "任何|所有|一切|全ての|全部の|あらゆる|どんな|모든|어떤|아무",
)
_ACTIONS = _lexicon(
    r"\bcommands?\b|\bshell\b|\bcode\b|\bscripts?\b|\bprograms?\b|\bactions?\b|\boperations?\b",
    r"\bcomandos?\b|\bacci[óo]n", r"\bcommandes?\b", r"\bbefehle?\b|\bbefehl\b|\bkommandos?\b",
    r"команд", "命令|指令|操作|コマンド|명령",
)
_NO_CONFIRMATION = _lexicon(
    r"\bwithout (?:asking|approval|confirmation|confirming|permission|consent|review|checking|"
    r"(?:asking|checking with|telling) the user)", r"\bno (?:approval|confirmation|permission)s? "
    r"(?:is |are )?(?:needed|required)",
    r"\bsin (?:pedir|preguntar|confirmaci[óo]n|permiso|aprobaci[óo]n|consultar)",
    r"\bsans (?:demander|confirmation|permission|autorisation|validation)",
    r"\bohne (?:r[üu]ckfrage|nachfrage|best[äa]tigung|genehmigung|erlaubnis|zu fragen|freigabe)",
    r"без (?:подтвержд|разрешени|спроса|согласовани|вопросов)",
    "无需|無需|不需要|不用|无须|無須|不必|未经|未經|確認なし|確認せず|許可なく|承認なし|確認を取らず",
    "확인 없이|허락 없이|승인 없이|묻지 않고",
)
_APPROVAL_PHRASE = _lexicon(
    r"\bno longer (?:needs?|requires?) (?:approval|confirmation|permission)",
    r"\b(?:authori[sz]ed|allowed|permitted) (?:you )?to (?:run|execute|do) (?:anything|any)\b",
    r"\bnever (?:ask|wait) for (?:approval|confirmation|permission)",
    r"\bdisable (?:all )?(?:confirmations|confirmation prompts|approvals)",
)


def _detect_obey_external(view: _View) -> bool:
    return view.has(_TRUST_VERB) and _together(
        view, _TRUST_VERB, ((_ORDERS, 30, 40), (_OUTSIDE_SOURCE, 30, 80)))


def _detect_auto_approve(view: _View) -> bool:
    if view.has(_APPROVAL_PHRASE):
        return True
    return view.has(_NO_CONFIRMATION) and _together(
        view, _NO_CONFIRMATION, ((_ANY_SCOPE, 60, 30), (_ACTIONS, 60, 30)))


# -- role and system impersonation -------------------------------------------------------------

_ROLE_CUE = _lexicon(
    r"\byou(?: are|'re|re)? (?:now|no longer)\b", r"\bfrom now on,? you\b", r"\bact(?:ing)? as\b",
    r"\bpretend\b", r"\brole-?play", r"\bbehave (?:as|like)\b", r"\bplay the role\b",
    r"\byour new (?:role|persona|identity)\b", r"\bmode (?:enabled|activated|on|unlocked)\b",
    r"\b(?:enable|activate|enter) (?:\w+ )?mode\b", r"\bsimulate\b",
    r"\bahora eres\b|\bya eres\b|\beres ahora\b|\bact[úu]a como\b|\bfinge\b",
    r"\btu es (?:maintenant|d[ée]sormais)\b|\bvous [êe]tes (?:maintenant|d[ée]sormais)\b|\bagis comme\b|\bfais semblant\b",
    r"\bdu bist (?:jetzt|nun|ab sofort|ab jetzt)\b|\bsie sind (?:jetzt|nun)\b|\bverhalte dich\b|\btu so,? als\b",
    r"теперь ты|ты теперь|отныне ты|притворись|представь,? что ты|веди себя как",
    "你现在是|你現在是|从现在起你是|從現在起你是|你已经是|扮演|假装你是|假裝你是",
    "あなたは今から|今からあなたは|あなたはもう|として振る舞|のふりをし",
    "너는 이제|당신은 이제|이제부터 너는|이제 너는|인 척|처럼 행동",
)
_UNRESTRICTED = _lexicon(
    r"\bunrestricted\b|\bunfiltered\b|\buncensored\b|\bjailbr(?:oken|eak)", r"\bamoral\b",
    r"\b(?:no|without(?: any)?|free (?:of|from)(?: all| any)?) (?:content |ethical |safety |moral )?"
    r"(?:polic|limit|restriction|filter|rule|guideline|ethic|moral|censor|boundar|safeguard|guardrail)",
    r"\bnever refuses?\b|\bdo anything now\b|\bno longer (?:bound|restricted|limited)\b|\bnot bound by\b",
    r"\b(?:developer|god|dan|jailbreak|root|sudo) mode\b",
    r"\bsin (?:ning[úu]n[ao]s? )?(?:restricci|l[íi]mite|filtro|censura|regla)",
    r"\bsans (?:aucune? )?(?:restriction|limite|filtre|censure|r[èe]gle)",
    r"\bohne (?:jegliche |alle |irgendwelche )?(?:einschr[äa]nkung|beschr[äa]nkung|grenzen|filter|zensur|regeln)",
    r"\buneingeschr[äa]nkt|\bungefiltert|\bzensurfrei",
    r"без (?:каких-либо |всяких |любых )?(?:ограничени|фильтр|цензур|правил)|неограниченн",
    "没有任何限制|没有限制|沒有任何限制|沒有限制|无限制|無限制|不受限制|不受任何限制|没有任何约束|不受约束|越狱|越獄",
    "制限のない|制限なし|制約のない|無制限|フィルターなし|検閲なし",
    "제한이 없는|제한 없는|제한없는|무제한|필터 없는|검열 없는",
)
# Fake role headers: "[SYSTEM]:", "【系统】", "<|im_start|>system", "### System message:".
# ("wrap it in <system> tags" is a mention, hence the look-ahead.)
_FAKE_HEADER = _lexicon(
    r"[\[【(<]\s*(?:system|sys|admin|administrator|developer|root|operator|sistema|syst[èe]me|"
    r"systemnachricht|система|системное сообщение|администратор|システム|시스템|系统|系統|管理员|管理員|"
    r"system message|system prompt|inst)\s*[\]】)>]"
    r"(?!\s*(?:tags?|elements?|blocks?|sections?)\b)",
    r"<\|(?:im_start|system|im_sep)\|?>", r"<<sys>>",
    r"\bsystem (?:override|directive|instructions?|notice|announcement|command)\b",
    r"(?:^|\n)\W{0,6}system(?: message)?\s*:",
    r"\b(?:system message|mensaje del sistema|message (?:du )?syst[èe]me|systemmeldung|systemnachricht|"
    r"системное сообщение|システムメッセージ|시스템 메시지)\s*:",
    "系统消息[:：]|系統訊息[:：]|系统指令[:：]|系统通知[:：]",
    r"\banulaci[óo]n del sistema\b",
)
def _detect_role_hijack(view: _View) -> bool:
    return view.has(_ROLE_CUE) and _together(view, _ROLE_CUE, ((_UNRESTRICTED, 20, 90),))


def _detect_fake_system(view: _View) -> bool:
    return view.has(_FAKE_HEADER)


# -- exfiltration -------------------------------------------------------------------------------

_SEND_VERB = _lexicon(
    r"\bsend|\bupload|\bforward|\bpost\b|\bposts\b|\be-?mail\b|\bsync|\bcopy\b|\bshare|\btransmit",
    r"\bexfiltrat|\bleak|\bpush\b|\bsubmit|\breport\b|\bbeam\b|\brelay|\bdeliver|\bpublish|\bpipe\b",
    r"\|\s*(?:nc|ncat|netcat|curl|socat)\b|\bcurl\b[^\n]{0,40}?(?:-d\b|--data|-f\b|--form|-t\b|--upload)",
    r"\benv[íi]a|\benviar|\bmanda|\bsub[ea]\b|\bsubir|\bs[úu]bel|\breenv[íi]a|\bcomparte|\btransfiere",
    r"\benvoie|\benvoyez|\benvoyer|\btransmet|\bt[ée]l[ée]vers|\bpartage|\btransf[èe]re|\bpublie|\bfais suivre",
    r"\bsende|\bsenden\b|\bschick|\blade\b|\bhochlad|\b[üu]bermittle|\bleite|\bweiterleit|\bteile\b|\b[üu]bertrag",
    r"отправ|пошли|перешл|пересыл|загрузи|выгрузи|передай|передава|слей|опубликуй|отошли",
    "发送|發送|发到|發到|发给|發給|上传|上傳|转发|轉發|传送|傳送|同步到|抄送|推送|发往|發往|寄给|寄到|传到|傳到",
    "送信|送って|送る|アップロード|転送|共有|投稿|送付",
    "전송|보내|업로드|전달|공유|게시|올려",
)
_DATA_OBJECT = _lexicon(
    r"(?<![a-z])(?:api[ _-]?)?(?:keys?|tokens?|secrets?|passwords?|passwd|credentials?|cookies?)\b",
    r"(?<![a-z])\.env\b|\bhistory\b|\bconversations?\b|\bchats?\b|\btranscripts?\b|\bcontext\b",
    r"\bsystem prompt\b|\bprompts?\b|\bmemory\b|memory\.md|user\.md|\bssh\b|\bid_[a-z0-9]+",
    r"\b(?:every|all|each|any|user'?s?|private|their|his|her|personal) (?:\w+ )?(?:messages?|data|files|emails|documents)\b",
    r"\b(?:the )?(?:repository|repo|source code|codebase|environment variables|env vars|everything)\b",
    r"\$\{?[a-z_]*(?:token|key|secret|pass)",
    r"\bclaves?\b|\bllaves?\b|\bcontrase[ñn]as?\b|\bcredenciales\b|\bsecretos?\b|\bhistorial\b|\bconversaci[óo]n\b|\bmensajes\b|\bdatos\b|\bcontexto\b",
    r"\bcl[ée]s?\b|\bclefs?\b|\bmots? de passe\b|\bidentifiants\b|\bjetons?\b|\bhistorique\b|\bmessages\b|\bdonn[ée]es\b|\bfichiers?\b|\bcontexte\b",
    r"schl[üu]ssel|passw[öo]rt|kennw[öo]rt|zugangsdaten|anmeldedaten|geheimnis|verlauf|gespr[äa]ch|unterhaltung|nachrichten|\bdaten\b|dateien|\bkontext\b",
    r"ключ|парол|токен|учётн|учетн|секрет|истори|переписк|разговор|сообщени|контекст|файл|данн|куки",
    "文件|檔案|密钥|密鑰|金鑰|秘钥|令牌|密码|密碼|凭证|凭据|憑證|聊天记录|聊天記錄|对话|對話|会话|會話|历史|歷史|消息|訊息|上下文|系统提示|记忆|環境變數|环境变量|私钥|私鑰",
    "キー|鍵|パスワード|トークン|認証情報|秘密|履歴|会話|メッセージ|コンテキスト|ファイル|データ|クッキー",
    "키|비밀번호|암호|토큰|자격 증명|비밀|기록|대화|메시지|컨텍스트|파일|데이터|쿠키",
)


def _detect_exfiltration(view: _View, destination: re.Pattern[str]) -> bool:
    return view.has(destination) and view.has(_SEND_VERB) and _together(
        view, destination,
        ((_SEND_VERB, 160, 40), (_DATA_OBJECT, 200, 60)),
        lambda v, span: _together_affirmed(v, span),
    )


def _together_affirmed(view: _View, destination: Span) -> bool:
    """A send verb near the destination that is not negated ("never upload ... to ...")."""
    spans = view.spans(_SEND_VERB)
    index = bisect_left(spans, (destination[0] - 160, -1))
    while index < len(spans) and spans[index][0] <= destination[1] + 40:
        if view.same_clause(spans[index][0], destination[0]) and _affirmed(view, spans[index]):
            return True
        index += 1
    return False


# Markdown or HTML images whose URL carries data: a placeholder, or a query naming data.
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
    if "![" not in view.text and "<img" not in view.text:
        return False
    for match in _IMAGE_URL.finditer(view.text):
        url = match[1] or match[2]
        if _URL.match(url) and _CARRIES_DATA.search(url, url.find("/", 8) + 1 or len(url)):
            return True
    return False


# -- reading secrets, disclosing the system prompt ----------------------------------------------

_DISCLOSE_VERB = _lexicon(
    r"\bprint|\bcat\b|\bshow\b|\bshow me\b|\bdisplay|\boutput\b|\breveal|\bdump|\btell me\b|\bgive me\b",
    r"\bsend me\b|\bdisclose|\bleak|\bexpose|\btype out\b|\bwrite out\b|\becho\b|\bread\b|\bopen\b",
    r"\bextract|\bretrieve|\blist\b|\bharvest|\bsteal|\bcollect|\bexfiltrat|\breply (?:only )?with\b|\brespond with\b",
    r"\blee\b|\bleer\b|\bimprime|\bmuestra|\bmostrar|\bens[ée][ñn]a|\bdime\b|\brevela|\bextrae|\babre\b|\bvuelca|\bsaca\b",
    r"\blis\b|\blisez\b|\blire\b|\baffiche|\bimprime|\bmontre|\br[ée]v[èe]le|\bextrai[st]|\bouvre|\bdonne-moi|\bdis-moi",
    r"\blies\b|\blese\b|\bzeig|\bgib\b|\bdrucke|\bausgeben|\bverrate|\b[öo]ffne|\bextrahiere|\bnenne\b",
    r"прочитай|прочти|выведи|покажи|распечатай|напечатай|раскрой|сообщи|открой|перечисли|извлеки|дай мне",
    "打印|输出|輸出|显示|顯示|读取|讀取|读出|查看|列出|告诉我|告訴我|给我|給我|泄露|洩露",
    "表示|出力|読んで|読み取|読み込|見せて|教えて|印刷|開いて|書き出",
    "출력|읽고|읽어|보여|알려|표시|열어",
)
# Copying something into the reply counts when the reply is named ("include it in your answer").
_ATTACH_VERB = _lexicon(
    r"\binclude|\bpaste|\bcopy|\binsert|\badd\b|\bappend|\battach|\bput\b|\bembed",
    r"\bincluye|\bpega\b|\bcopia\b|\ba[ñn]ade|\binclus|\bincluez|\bcolle\b|\bcopie\b|\bajoute",
    r"\bf[üu]ge|\bkopiere|\bh[äa]nge", r"включи|вставь|скопируй|добавь|приложи",
    "附在|附上|粘贴|貼上|贴出|复制|複製|包含|放在|加到|含めて|貼り付け|コピー|포함|붙여|복사|첨부",
)
_REPLY_TARGET = _lexicon(
    r"\b(?:reply|replies|answer|response|summary|output|chat|message|comment)\b",
    r"respuesta|resumen|r[ée]ponse|r[ée]sum[ée]|antwort|zusammenfassung|ответ|чат",
    "回答|回复|回覆|答复|聊天|总结|返答|回答|답변|응답|대답",
)
# Secrets that are files or named stores: reading them at all is the leak.
_SECRET_FILE = _lexicon(
    r"~/\.ssh/(?!config\b|known_hosts\b)[\w.-]*(?<!\.pub)\b(?!\.pub)", r"\bid_(?:rsa|dsa|ecdsa|ed25519)\b(?!\.pub)",
    r"(?<![\w.-])\.env\b(?![.\w-])", r"/etc/(?:shadow|passwd|sudoers|gshadow)\b",
    r"\.aws/credentials|\.git-credentials|\.netrc\b|\.pgpass\b|\.docker/config\.json|\.kube/config",
    r"credentials\.json|\bkeychain|\bkeyring|wallet\.dat|\bseed phrase|\bmnemonic\b|\bprivate[ _-]?keys?\b",
    r"\bsecret[ _-]access[ _-]key|\baws_secret_access_key|\bllaves? privadas?|\bclaves? privadas?",
    r"\bcl[ée]s? priv[ée]es?|\bprivaten? schl[üu]ssel|закрыт\w* ключ|приватн\w* ключ|\bschl[üu]sselbund|\btrousseau",
    "私钥|私鑰|钥匙串|鑰匙串|秘密鍵|キーチェーン|개인 ?키|키체인",
)
# Secrets named generically: only disclosure verbs (print, show, reveal) count.
_SECRET_WORD = _lexicon(
    r"(?<![a-z])(?:api[ _-]?)?(?:keys|tokens?|secrets?|passwords?|passwd|passphrases?|credentials|cookies)\b"
    r"(?! (?:polic|strength|field|reset|manager|meter|rule|form|hash|length|rotation|expir|format|"
    r"requirement|page|dialog|input|box|flow|template|generator|change|validation|scope|endpoint|limit|count|usage))",
    r"\b(?:api|access|auth|session|bearer|secret) (?:keys?|tokens?)\b", r"\benvironment variables\b|\benv vars\b",
    r"\$\{?[a-z_]*(?:token|key|secret|pass)",
    r"\bcontrase[ñn]as?\b|\bcredenciales\b|\bsecretos?\b|\bclaves? (?:de )?api\b|\bvariables de entorno\b",
    r"\bmots? de passe\b|\bidentifiants\b|\bjetons?\b|\bcl[ée]s api\b|\bvariables d'environnement\b",
    r"passw[öo]rt|kennw[öo]rt|zugangsdaten|\btokens?\b|geheimnisse|api-schl[üu]ssel|umgebungsvariablen",
    r"парол|токен|учётн\w* данн|учетн\w* данн|секрет|переменн\w* окружени",
    "密码|密碼|令牌|凭证|凭据|憑證|环境变量|環境變數|密钥|密鑰|金鑰|パスワード|トークン|認証情報|シークレット|環境変数|apiキー",
    "비밀번호|암호|토큰|자격 증명|시크릿|api 키|환경 변수",
)
_PROMPT_OBJECT = _lexicon(
    r"\bsystem prompt\b|\b(?:your|the) (?:initial|hidden|original|full) (?:prompt|instructions)\b",
    r"\byour (?:instructions|prompt)\b|\bsystem message\b",
    r"prompt del sistema|prompt (?:du )?syst[èe]me|systemprompt|system-prompt|системн\w+ (?:промпт|подсказк|инструкци)",
    "系统提示|系統提示|システムプロンプト|시스템 프롬프트",
)
# "Show the user how to rotate API keys" teaches; it does not disclose.
_EXPLAINS = re.compile(r"\b(?:how|where|why|whether)\b|c[óo]mo|comment|\bwie\b|\bкак\b|如何|怎么|怎樣")


def _discloses(view: _View, verb: Span) -> bool:
    if not _affirmed(view, verb):
        return False
    return _EXPLAINS.search(view.text, verb[1], verb[1] + 30) is None


def _detect_secret_read(view: _View) -> bool:
    if view.has(_SECRET_FILE) and view.has(_DISCLOSE_VERB) and _together(
        view, _DISCLOSE_VERB, ((_SECRET_FILE, 40, 80),), _discloses):
        return True
    if view.has(_SECRET_WORD) and view.has(_DISCLOSE_VERB) and _together(
        view, _DISCLOSE_VERB, ((_SECRET_WORD, 30, 60),), _discloses):
        return True
    secret = _SECRET_FILE if view.has(_SECRET_FILE) else _SECRET_WORD
    return view.has(secret) and view.has(_ATTACH_VERB) and _together(
        view, _ATTACH_VERB, ((secret, 60, 60), (_REPLY_TARGET, 40, 60)), _affirmed)


def _detect_prompt_leak(view: _View) -> bool:
    return view.has(_PROMPT_OBJECT) and view.has(_DISCLOSE_VERB) and _together(
        view, _DISCLOSE_VERB, ((_PROMPT_OBJECT, 30, 50),), _discloses)


# -- remote code execution --------------------------------------------------------------------

_SHELL = r"(?:sudo\s+)?(?:/bin/|/usr/bin/)?(?:ba|z|k|da|fi|c|tc)?sh\b|python\d?\b|perl\b|ruby\b|node\b|iex\b|invoke-expression\b"
_FETCH_PIPE_SHELL = re.compile(
    r"\b(?:curl|wget|fetch|iwr|irm|invoke-webrequest|invoke-restmethod)\b([^|\n]{0,300}+)\|\s*(?:" + _SHELL + ")"
)
_HOST_IN_COMMAND = re.compile(r"https?://|\d{1,3}(?:\.\d{1,3}){3}|\b[\w-]+\.[a-z]{2,}\b")
_SHELL_OF_FETCH = re.compile(
    r"\b(?:ba|z|k)?sh\s+<\(\s*(?:curl|wget)\b|\b(?:bash|sh|zsh)\s+-c\s+[\"']?\$\(\s*(?:curl|wget)\b"
    r"|\beval\s+[\"']?\$\(\s*(?:curl|wget)\b|\b(?:source|\.)\s+<\(\s*(?:curl|wget)\b|\bpython\d?\s+<\(\s*(?:curl|wget)\b"
    r"|\biex\s*\(\s*(?:new-object|iwr|irm|invoke-webrequest)"
)
_DECODE_PIPE_SHELL = re.compile(
    r"\b(?:base64|b64)\s+(?:-d|--decode|-D)\b[^|\n]{0,100}+\|\s*(?:" + _SHELL + ")"
    r"|\bxxd\s+-r\b[^|\n]{0,100}+\|\s*(?:" + _SHELL + ")"
    r"|\bfrombase64string\b|\b-e(?:nc|ncodedcommand)?\s+[a-z0-9+/=]{24,}"
    r"|\bexec\s*\(\s*(?:base64\.)?b64decode|\beval\s*\(\s*(?:atob|base64_decode)\b"
)
_REVERSE_SHELL = re.compile(
    r"/dev/(?:tcp|udp)/[\w.-]+/\d+"
    r"|\b(?:nc|ncat|netcat)\b[^\n|;]{0,60}?\s-[a-z]*[ec]\s*\S*(?:sh|cmd|powershell)\b"
    r"|\b(?:ba|z)?sh\s+-i\s*(?:>&|&>|>\s*&)"
    r"|\bmkfifo\b[^\n]{0,120}?\b(?:nc|ncat|netcat|telnet)\b"
    r"|\bsocket\b[^\n]{0,300}?\bdup2\b|\bdup2\b[^\n]{0,300}?(?:/bin/|subprocess|pty\.spawn)"
    r"|\bpty\.spawn\(\s*[\"']/bin/|\bfsockopen\s*\(|\bnet\.sockets\.tcpclient\b|\bsocat\b[^\n]{0,80}?\bexec:"
    r"|\bruby\s+-rsocket\b"
)


def _detect_pipe_to_shell(view: _View) -> bool:
    if view.has(_SHELL_OF_FETCH):
        return True
    return any(_HOST_IN_COMMAND.search(match[1]) for match in _FETCH_PIPE_SHELL.finditer(view.text))


# -- concealment -------------------------------------------------------------------------------

_CONCEAL_PHRASE = _lexicon(
    r"\b(?:keep|kept) (?:this|these|it|that|the)(?: [\w-]+){0,2} (?:hidden|secret|private|confidential|quiet) from\b",
    r"\bhide (?:this|these|it|that|any|all|the|every|your)\b[^.\n;]{0,60}?\bfrom (?:the )?(?:user|human|owner)",
    r"\bwithout (?:informing|telling|notifying|alerting|letting) (?:the )?(?:user|human|owner)",
    r"\b(?:the )?user (?:must|should|will) (?:not|never) (?:know|find out|notice|learn|see|be told)",
    r"\bso (?:that )?the user (?:doesn't|does not|won't|will not|can't|cannot) (?:know|notice|find out|see)",
    r"\bbehind the user's back\b",
    r"\bsin (?:avisar|decir(?:le)?|informar|que (?:lo sepa|se entere))(?: al usuario)?",
    r"\bque el usuario no (?:se entere|lo sepa|lo note)|\boc[úu]lta(?:lo|le)? al usuario|\ben secreto\b",
    r"\bsans (?:pr[ée]venir|informer|avertir|le dire [àa]) (?:l'utilisat|l'usager)|\bcache[rz]? [^.\n]{0,40}[àa] l'utilisat",
    r"\bohne (?:den |die )?(?:be)?nutzer(?:in)? zu (?:informieren|benachrichtigen)|\bim verborgenen\b|\bvor dem (?:be)?nutzer (?:verbergen|geheim)",
    r"скрой от пользовател|скрыть от пользовател|пользователь не должен (?:знать|узнать)|без ведома пользовател|втайне от",
    "不要让用户知道|不要讓用戶知道|别让用户知道|別讓用戶知道|不让用户知道|不讓用戶知道|别让用户发现|不要让用户发现|不讓用戶發現|對用戶保密|对用户保密|瞒着用户|瞞著用戶|不要告诉用户|不要告訴用戶|别告诉用户|別告訴用戶",
    "ユーザーに(?:は)?(?:絶対に|決して)?(?:言わない|伝えない|知らせない|教えない|話さない|秘密|内緒)|ユーザーに知られない|ユーザーには黙って",
    "사용자(?:에게|한테)(?:는)? ?(?:절대 |절대로 )?(?:말하지 ?마|말하지 ?말|알리지 ?마|알리지 ?말|알려주지 ?마|비밀)|사용자가 모르게|사용자 몰래",
)
_HUSH_NEGATION = _lexicon(
    r"\bnever\b|\bdon'?t\b|\bdo not\b|\bmust not\b|\bshould not\b|\bshouldn't\b",
    r"\bno\b|\bnunca\b|\bjam[áa]s\b", r"\bne\b|\bjamais\b|\brien\b", r"\bniemals\b|\bnie\b|\bnicht\b|\bnichts\b",
    r"\bникогда\b|\bне\b",
)
_HUSH_VERB = _lexicon(
    r"\bmention|\btell\b|\binform|\breveal|\bdisclose|\bsay\b|\blet (?:the )?user know|\bnotify|\balert\b|\bbring up\b|\breport\b",
    r"\bdigas\b|\bdiga\b|\bcuentes\b|\bmenciones\b|\binformes\b|\bavises\b|\breveles\b",
    r"\bdis\b|\bdites\b|\bmentionne|\br[ée]v[èe]le|\bsignale|\bpr[ée]viens|\binforme",
    r"\berw[äa]hn|\bsag\b|\bsage\b|\berz[äa]hl|\bverrate|\binformier|\bmitteil",
    r"говори|сообщай|упоминай|рассказывай|информируй|показывай",
)
_HUSHED_MATTER = _lexicon(
    r"\bthis\b|\bthese\b|\bit\b|\bthat you\b|\bwhat you\b|\byou(?:'ve| have|'re| are| did)\b|\babout\b|\bany of\b",
    r"\bque\b|\bnada\b|\besto\b|\besta\b|\beste\b", r"\bque\b|\brien\b|\bcela\b|\bça\b|\bcette\b|\bces\b",
    r"\bdavon\b|\bdies|\bdas\b|\bdass\b|\bnichts\b", r"\bоб этом\b|\bэтой\b|\bэту\b|\bэто\b|\bчто\b",
)


def _detect_conceal(view: _View) -> bool:
    if view.has(_CONCEAL_PHRASE):
        return True
    return view.has(_HUSH_VERB) and view.has(_USER) and _together(
        view, _HUSH_VERB,
        ((_HUSH_NEGATION, 30, 30), (_USER, 30, 40), (_HUSHED_MATTER, 30, 50)),
    )


# -- configuration tampering and persistence ---------------------------------------------------

_EDIT_VERB = _lexicon(
    r"\bedit|\bmodify|\bchange|\bupdate|\bappend|\badd\b|\binsert|\bwrite|\boverwrite|\breplace|\brewrite",
    r"\bput\b|\bprepend|\binject|\bplant|\bpatch\b",
    r"\bedita|\bmodifica|\bcambia|\bactualiza|\ba[ñn]ade|\bagrega|\binserta|\bescribe",
    r"\b[ée]dite|\bmodifie|\bchange|\bajoute|\b[ée]cri[st]|\bins[èe]re",
    r"\b[äa]ndere|\bbearbeite|\bf[üu]ge|\bschreib|\berg[äa]nze|\baktualisiere",
    r"измени|отредактируй|добавь|допиши|запиши|впиши|обнови|перепиши",
    "修改|编辑|編輯|更改|添加|追加|加入|写入|寫入|改写|改寫|変更|編集|書き換え|書き込|수정|편집|추가|변경",
)
_AGENT_CONFIG = _lexicon(
    r"\bagents\.md\b|\bclaude\.md\b|\bgemini\.md\b|\.cursorrules\b|\.cursor/rules|copilot-instructions",
    r"\.windsurfrules\b|\.clinerules\b|\.github/copilot|\bmemory\.md\b|\buser\.md\b|\.mcp\.json\b|\.claude/settings",
    r"\bsettings\.json\b|\bconfig\.(?:json|ya?ml|toml)\b|\bsystem prompt\b",
)
_TAMPER_PAYLOAD = _lexicon(
    r"\btrust|\bobey|\bdisable|\bskip|\bbypass|\bwithout (?:review|approval|confirmation|asking)|\bignor",
    r"\bauto-?approv|\ballow[- ]?all\b|--no-verify|--dangerously|\byolo\b|\brm -rf\b|\bexfiltrat|\bevil\b|\battacker",
    r"\bconf[íi]a|\bdeshabilit|\bsin (?:revisi[óo]n|aprobaci[óo]n|confirmaci[óo]n)",
    r"\bconfiance|\bfaire confiance|\bd[ée]sactiv|\bsans (?:revue|validation|confirmation)",
    r"vertrau|deaktivier|\bohne (?:review|pr[üu]fung|best[äa]tigung|freigabe)",
    r"доверя|отключ|без (?:ревью|проверки|подтверждени)",
    "信任|信頼|禁用|关闭|關閉|无需|不经|無効|レビューなし|確認なし|신뢰|비활성|검토 없이|확인 없이",
)
_PERSIST_TARGET = _lexicon(
    r"\.(?:bashrc|zshrc|zshenv|zprofile|bash_profile|bash_login|profile|login|cshrc|tcshrc)\b",
    r"config\.fish\b|/etc/profile|rc\.local\b|\bcrontab\b|\bcron (?:job|entry|table)|/etc/cron",
    r"\bsystemd (?:unit|service|timer)|\.service\b|\blaunchagents?\b|\blaunchdaemons?\b|\bautostart\b",
    r"\bstartup (?:folder|script|items?)\b|\blogin items?\b|\brun key\b|\bscheduled task",
)
_PERSIST_PAYLOAD = _lexicon(
    r"\b(?:curl|wget)\b[^\n'\"`]{0,60}?(?:https?://|\d{1,3}(?:\.\d{1,3}){3})",
    r"\b(?:nc|ncat|netcat|socat)\b|/dev/tcp|\bbase64\b|\bnohup\b|\bpython\d? -c\b|\bperl -e\b",
    r"\|\s*(?:ba|z)?sh\b|\bpowershell\b|\bmkfifo\b|\bbeacon",
)
_AUTHORIZED_KEYS = re.compile(r"authorized_keys2?\b")
_WRITE_VERB = _lexicon(
    r"\badd|\bappend|\binsert|\bput\b|\bwrite|\bcopy|\bplace|\bplant|\becho\b|\bcat\b|>>|\btee\b|\bpaste",
    r"\ba[ñn]ad|\bagreg|\bpon\b|\bescrib|\bcopia", r"\bajout|\bmets\b|\b[ée]cri[st]|\bcopie|\bins[èe]re",
    r"\bf[üu]g|\bhinzu|\bschreib|\btrage|\bkopier", r"добав|допиш|запиш|впиш|скопируй|вставь",
    "追加|添加|加入|加到|写入|寫入|追記|書き込|入れ|추가|넣어|붙여|기록",
)


def _detect_config_tamper(view: _View) -> bool:
    return view.has(_AGENT_CONFIG) and view.has(_EDIT_VERB) and _together(
        view, _AGENT_CONFIG, ((_EDIT_VERB, 80, 40), (_TAMPER_PAYLOAD, 120, 140)))


def _detect_persistence(view: _View) -> bool:
    return view.has(_PERSIST_TARGET) and _together(view, _PERSIST_TARGET, ((_PERSIST_PAYLOAD, 140, 140),))


def _detect_ssh_key_plant(view: _View) -> bool:
    return view.has(_AUTHORIZED_KEYS) and _together(view, _AUTHORIZED_KEYS, ((_WRITE_VERB, 100, 40),))


# -- command and control -----------------------------------------------------------------------

_C2_SERVER = _lexicon(
    r"\bc2\b(?:[ -](?:server|endpoint|channel|host|node|infrastructure))?|\bc&c\b|\bcommand[- ](?:and|&)[- ]control\b",
    r"\bcommand server\b|\bcontrol server\b|\bcomando y control\b|\bcommande et contr[ôo]le\b",
    r"\bkommando-?server\b|\bsteuer(?:ungs)?-?server\b|сервер\w* управлени|c2-сервер|командн\w+ сервер",
    "指挥控制|指揮控制|命令与控制|命令控制|控制服务器|控制伺服器|c2サーバ|指令サーバ|コマンド&コントロール|명령 제어|명령 및 제어|c2 서버|지휘 통제",
)
_C2_ACTION = _lexicon(
    r"\bbeacon|\bcheck[- ]in\b|\bcheck in\b|\bphone home\b|\bcall home\b|\bregister|\bconnect|\breport\b",
    r"\bcontact|\bpoll|\bheartbeat|\bwait for\b|\breceive|\bfetch|\bevery \d+\b|\bpull",
    r"\bcon[ée]ct|\bregistr|\bcontacta|\brecib|\bcada \d+", r"\bconnecte|\bcontacte|\binscri|\btoutes les \d+|\brecevoir",
    r"\bmelde|\bverbind|\bregistrier|\balle \d+|\bempfang", r"связыв|подключ|регистр|каждые \d+|получа|свяжись",
    "连接|連接|注册|註冊|等待|每隔|接続|登録|ごとに|待機|등록|연결|접속|마다|대기",
)
_BEACON_PHRASE = _lexicon(
    r"\bbeacon(?:s|ing)? (?:back |home |out )?to\b",
    r"\bcheck in (?:with \S+ )?(?:every \S+ \S+ )?(?:for|to (?:get|receive|fetch)) (?:new )?(?:tasks|orders|commands|instructions)",
    r"\b(?:wait|poll|listen) for (?:new |further )?(?:orders|commands|tasks|instructions) from\b",
    r"\bregister (?:this|the) (?:agent|assistant|bot|machine|host) with\b",
)


def _detect_c2(view: _View) -> bool:
    if view.has(_BEACON_PHRASE):
        return True
    return view.has(_C2_SERVER) and _together(view, _C2_SERVER, ((_C2_ACTION, 100, 100),))


# -- hard-coded secrets (matched on the un-folded text: case tells a key from prose) ------------

_SECRET_PATTERNS: tuple[tuple[Finding, re.Pattern[str]], ...] = (
    (SECRET_AWS_KEY, re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b")),
    (SECRET_GITHUB_TOKEN, re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{40,}")),
    (SECRET_API_KEY, re.compile(
        r"\bsk-(?:proj-|live-|test-|ant-[a-z0-9]{2,8}-)?[A-Za-z0-9_\-]{20,}|\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}"
        r"|\bxox[abposr]-[A-Za-z0-9-]{10,}|\bAIza[0-9A-Za-z_\-]{35}\b|\bglpat-[A-Za-z0-9_\-]{20,}"
        r"|\bnpm_[A-Za-z0-9]{36}\b|\bhf_[A-Za-z0-9]{30,}")),
    (SECRET_PRIVATE_KEY, re.compile(
        r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY(?: BLOCK)?-----\s*+[A-Za-z0-9+/=\s]{16}|PuTTY-User-Key-File")),
    (SECRET_JWT, re.compile(
        r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}|\b[Bb]earer\s+[A-Za-z0-9._~+/-]{30,}")),
)
# "password = ..." and its translations, with a value that looks like a real secret.
_PASSWORD_ASSIGNMENT = re.compile(
    r"(?:password|passwd|pwd|passphrase|secret|api[_-]?key|access[_-]?key|token|contrase[ñn]a|mot de passe"
    r"|passwort|kennwort|пароль|密码|密碼|口令|パスワード|비밀번호|암호)\w{0,20}"
    r"\s*(?:[:=：]|\bis\b|\best\b|\bist\b|\bes\b|は|는|은|为|為|是)\s*[\"'「`]?([^\s\"'」`]{6,64})",
    re.IGNORECASE,
)
# Values that point at a secret rather than being one ("${DB_PASSWORD}", "1Password").
_SECRET_REFERENCE = re.compile(
    r"^(?:\$|<|\{|%|\(|\[|os\.|env|process\.|getenv|vault:|secret/|\*{3}|x{4}|\.{3})"
    r"|1password|bitwarden|lastpass|keepass|keychain|vault", re.I)


def _looks_like_secret(value: str) -> bool:
    if _SECRET_REFERENCE.search(value):
        return False
    classes = sum((
        any(ch.islower() for ch in value), any(ch.isupper() for ch in value),
        any(ch.isdigit() for ch in value), any(not ch.isalnum() for ch in value),
    ))
    return classes >= 2 and any(ch.isdigit() or not ch.isalnum() for ch in value)


def _hard_coded_secrets(clean: str) -> set[Finding]:
    found = {finding for finding, pattern in _SECRET_PATTERNS if pattern.search(clean)}
    if any(_looks_like_secret(match[1].rstrip(".,;)")) for match in _PASSWORD_ASSIGNMENT.finditer(clean)):
        found.add(SECRET_PASSWORD)
    return found


# -- encoded instructions ---------------------------------------------------------------------

# "Decode this base64 and do what it says": an order to run hidden text, whatever it decodes to.
_DECODE_AND_OBEY = _lexicon(
    r"\bdecode\b[^.\n;]{0,60}?\b(?:and|then)\b[^.\n;]{0,20}?\b(?:follow|obey|execute|run|do what|act on|carry out|apply)",
    r"\bdecodific\w*\b[^.\n;]{0,60}?\by\b[^.\n;]{0,20}?\b(?:sigue|s[íi]gue|ejecuta|haz|obedece|cumple)",
    r"\bd[ée]code\w*\b[^.\n;]{0,60}?\bet\b[^.\n;]{0,20}?\b(?:suis|suivez|ex[ée]cute|fais|faites|ob[ée]is|applique)",
    r"\bdekodier\w*\b[^.\n;]{0,60}?\bund\b[^.\n;]{0,20}?\b(?:befolge|f[üu]hre|tu|mach|gehorche)",
    r"(?:декодируй|расшифруй)[^.\n;]{0,60}?\bи\b[^.\n;]{0,20}?(?:выполни|следуй|сделай|исполни)",
    "(?:解码|解碼)[^。\n；]{0,40}?(?:执行|執行|照做|按照|遵循|服从|服從)",
    "デコード[^。\n]{0,40}?(?:実行|従って|従え|その通り)",
    "(?:디코딩|디코드)[^.\n]{0,40}?(?:실행|따라|따르)",
)


# -- putting it together -----------------------------------------------------------------------

_VIEW_DETECTORS: tuple[tuple[Finding, Callable[[_View], bool]], ...] = (
    (OVERRIDE, _detect_override),
    (OBEY_EXTERNAL, _detect_obey_external),
    (AUTO_APPROVE, _detect_auto_approve),
    (ROLE_HIJACK, _detect_role_hijack),
    (FAKE_SYSTEM, _detect_fake_system),
    (EXFIL_URL, lambda view: _detect_exfiltration(view, _URL) or _detect_exfiltration(view, _IP)),
    (EXFIL_EMAIL, lambda view: _detect_exfiltration(view, _EMAIL)),
    (MD_IMAGE_EXFIL, _detect_image_exfiltration),
    (SECRET_READ, _detect_secret_read),
    (PROMPT_LEAK, _detect_prompt_leak),
    (RCE_PIPE_SHELL, _detect_pipe_to_shell),
    (RCE_DECODE_SHELL, lambda view: view.has(_DECODE_PIPE_SHELL)),
    (REVERSE_SHELL, lambda view: view.has(_REVERSE_SHELL)),
    (CONCEAL, _detect_conceal),
    (CONFIG_TAMPER, _detect_config_tamper),
    (PERSISTENCE, _detect_persistence),
    (SSH_KEY_PLANT, _detect_ssh_key_plant),
    (C2_BEACON, _detect_c2),
    (ENCODED_PAYLOAD, lambda view: view.has(_DECODE_AND_OBEY)),
)


def _scan_clean(clean: str, depth: int) -> set[Finding]:
    """Findings in a text already stripped of invisible characters and NFKC-normalised."""
    found = _hard_coded_secrets(clean)
    for text in _views(clean):
        view = _View(text)
        found.update(finding for finding, detect in _VIEW_DETECTORS
                     if finding not in found and detect(view))
    if depth < MAX_DECODE_DEPTH:
        payload = _decoded_payloads(clean)
        if payload:
            inner = _scan_clean(_nfkc(_strip_hidden(payload)), depth + 1)
            if inner:
                found |= inner | {ENCODED_PAYLOAD}
    return found


def scan(text: str) -> tuple[Finding, ...]:
    """The threat patterns found in a memory entry; an empty tuple means clean."""
    if len(text) > MAX_SCAN_CHARS:
        return (TOO_LONG,)
    found = _scan_clean(_nfkc(_strip_hidden(text)), 0)
    return tuple(finding for finding in FINDING_ORDER if finding in found)
