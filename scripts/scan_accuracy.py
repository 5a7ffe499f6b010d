"""How often the injection scanner is right on the project's corpus: the share of attacks it
blocks and of ordinary notes it refuses, on the development set (tuned and trained on, so
near-perfect by construction) and on each held-out slice, by language where a slice is labelled
so; each figure with, in brackets, the rules' alone (the learned model switched off); and the held-out
attacks that name a host, as written and with each host renamed to a plain company's. Prints figures
only.

Corpus files (tests/corpus/) hold one entry per line; "#" lines are comments, a line
"# ---- <title> ----" starts a slice and "# -- <label>" a section within it ("ja", "ja evasion");
lines starting with "E|" hold escapes (invisible characters) to expand.

Run from the repository root: python scripts/scan_accuracy.py
"""

from __future__ import annotations

import codecs
import math
import re
import sys
import zlib
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# After the path insert above, so the checkout is importable.
import memd.core.scan as scanner  # noqa: E402
from memd.core.learned import Model  # noqa: E402

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"
Slices = dict[str, dict[str, list[str]]]  # slice title -> section label -> entries
# In the titles of the development batches written for the learned model: trained on (and some
# rules were written from what the early ones showed).
LEARNED_BATCHES = "for the learned model"


def read_slices(path: Path) -> Slices:
    slices: Slices = defaultdict(lambda: defaultdict(list))
    title, label = "first slice", "all"
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# ----"):
            title, label = line.strip("#- ").strip(), "all"
        elif line.startswith("# -- "):
            label = line[len("# -- "):].strip()
        elif line.strip() and not line.startswith("#"):
            if line.startswith("E|"):
                line = codecs.decode(line[2:].encode("ascii", "backslashreplace"), "unicode_escape")
            slices[title][label].append(line)
    return slices


# A host name, by its last label. The corpus's attacks were written by people who name their hosts
# after the attack ("leak-desk.example"); a real attacker picks a harmless name. Renamed, they show
# how much the scanner owes to such names.
HOST = re.compile(
    r"(?<![\w.-])((?:[a-z0-9-]+\.)+)(example|com|org|net|edu|gov|io|dev|app|ai|co|uk|de|fr|es|it|nl|ru|jp|kr|cn"
    r"|eu|info|biz)\b", re.IGNORECASE)
PLAIN_NAMES = ("northwind.", "fabrikam.", "contoso.", "tailspin.", "mail.blueharbor.", "files.lakeside.")


def plainly_hosted(entry: str) -> str:
    """The entry with every host renamed to one of a few plain names (the same host, the same name)."""
    return HOST.sub(lambda host: PLAIN_NAMES[zlib.crc32(host[1].lower().encode()) % len(PLAIN_NAMES)] + host[2],
                    entry)


SILENT = Model(0.0, math.inf, math.inf, {}, "")  # a model that never objects: the rules alone


def rate(entries: list[str]) -> str:
    if not entries:
        return "     -"
    flagged = sum(1 for entry in entries if scanner.scan(entry))
    learned, scanner.MODEL = scanner.MODEL, SILENT
    try:
        by_rules = sum(1 for entry in entries if scanner.scan(entry))
    finally:
        scanner.MODEL = learned
    return f"{flagged / len(entries):6.1%} ({flagged}/{len(entries)}; rules alone {by_rules / len(entries):.1%})"


def entries_of(sections: dict[str, list[str]], wanted: str | None = None) -> list[str]:
    """The entries of every section, or of those whose label starts with the language `wanted`."""
    return [entry for label, entries in sections.items() if wanted in (None, label.split()[0]) for entry in entries]


def every_entry(slices: Slices) -> list[str]:
    return [entry for sections in slices.values() for entry in entries_of(sections)]


def main() -> None:
    attacks, benign = read_slices(CORPUS / "attacks.txt"), read_slices(CORPUS / "benign.txt")
    print(f"development set (tuned and trained on): attacks blocked {rate(every_entry(attacks))}"
          f"   ordinary notes refused {rate(every_entry(benign))}")
    attacks, benign = read_slices(CORPUS / "heldout_attacks.txt"), read_slices(CORPUS / "heldout_benign.txt")
    print(f"held-out, all slices: attacks blocked {rate(every_entry(attacks))}"
          f"   ordinary notes refused {rate(every_entry(benign))}")
    report_languages(list(attacks.values()), list(benign.values()))
    hosted = [entry for entry in every_entry(attacks) if HOST.search(entry)]
    print(f"held-out attacks that name a host: blocked {rate(hosted)};"
          f" with each host renamed plainly {rate([plainly_hosted(entry) for entry in hosted])}")
    for title in attacks:
        print(f"held-out, {title}: attacks blocked {rate(entries_of(attacks[title]))}"
              f"   ordinary notes refused {rate(entries_of(benign.get(title, {})))}")
        report_languages([attacks[title]], [benign.get(title, {})])


def languages_of(slices: list[dict[str, list[str]]]) -> list[str]:
    """The languages the slices' sections are labelled with ("ja", "ja evasion": "ja"), in order.
    (A section of evasions alone is not a language.)"""
    return list(dict.fromkeys(label.split()[0] for sections in slices for label in sections
                              if label != "all" and not label.startswith("evasion")))


def in_language(slices: list[dict[str, list[str]]], language: str) -> list[str]:
    return [entry for sections in slices for entry in entries_of(sections, language)]


def evasions_of(slices: list[dict[str, list[str]]]) -> list[str]:
    """The entries of the sections labelled as evasions, whatever their language."""
    return [entry for sections in slices for label, entries in sections.items() if "evasion" in label
            for entry in entries]


def report_languages(attack_slices: list[dict[str, list[str]]], benign_slices: list[dict[str, list[str]]]) -> None:
    """Rates per language (and for the evasions) over the given slices, where they are labelled."""
    for language in languages_of(attack_slices):
        print(f"    {language:<8} attacks blocked {rate(in_language(attack_slices, language))}"
              f"   ordinary notes refused {rate(in_language(benign_slices, language))}")
    evasions = evasions_of(attack_slices)
    if evasions:
        print(f"    {'evasions':<8} attacks blocked {rate(evasions)}")


if __name__ == "__main__":
    main()
