"""How often the injection scanner is right on the project's corpus: the share of attacks it
blocks and of ordinary notes it refuses, on the development set (tuned on, so near-perfect by
construction) and on each held-out slice, by language where a slice is labelled so. Prints
figures only.

Corpus files (tests/corpus/) hold one entry per line; "#" lines are comments, a line
"# ---- <title> ----" starts a slice and "# -- <label>" a section within it ("ja", "ja evasion");
lines starting with "E|" hold escapes (invisible characters) to expand.

Run from the repository root: python scripts/scan_accuracy.py
"""

from __future__ import annotations

import codecs
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memd.core.scan import scan  # after the path insert above, so the checkout is importable

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"
Slices = dict[str, dict[str, list[str]]]  # slice title -> section label -> entries


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


def rate(entries: list[str]) -> str:
    flagged = sum(1 for entry in entries if scan(entry))
    return f"{flagged / len(entries):6.1%} ({flagged}/{len(entries)})" if entries else "     -"


def entries_of(sections: dict[str, list[str]], wanted: str | None = None) -> list[str]:
    """The entries of every section, or of those whose label starts with the language `wanted`."""
    return [entry for label, entries in sections.items() if wanted in (None, label.split()[0]) for entry in entries]


def main() -> None:
    attacks, benign = read_slices(CORPUS / "attacks.txt"), read_slices(CORPUS / "benign.txt")
    print(f"development set (tuned on): attacks blocked {rate([e for s in attacks.values() for e in entries_of(s)])}"
          f"   ordinary notes refused {rate([e for s in benign.values() for e in entries_of(s)])}")
    attacks, benign = read_slices(CORPUS / "heldout_attacks.txt"), read_slices(CORPUS / "heldout_benign.txt")
    for title in attacks:
        attack_sections, benign_sections = attacks[title], benign.get(title, {})
        print(f"held-out, {title}: attacks blocked {rate(entries_of(attack_sections))}"
              f"   ordinary notes refused {rate(entries_of(benign_sections))}")
        languages = dict.fromkeys(label.split()[0] for label in attack_sections if label != "all")
        for language in languages:
            print(f"    {language:<8} attacks blocked {rate(entries_of(attack_sections, language))}"
                  f"   ordinary notes refused {rate(entries_of(benign_sections, language))}")
        evasions = [entry for label, entries in attack_sections.items() if "evasion" in label for entry in entries]
        if evasions:
            print(f"    {'evasions':<8} attacks blocked {rate(evasions)}")


if __name__ == "__main__":
    main()
