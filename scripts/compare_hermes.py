"""memd's injection scanner beside Hermes Agent's own memory scanner, on the same entries in the same
run: the median time of each on the benchmark's ordinary entries and hostile inputs, and the share of
the held-out corpus's attacks each blocks and of its ordinary notes each refuses, overall, by
language and by slice. Prints figures only.

Hermes is no dependency of memd, so this script is run by hand, in a scratch virtualenv that holds it
(memd's scanner needs nothing but the standard library):

    python -m venv /tmp/hermes && /tmp/hermes/bin/pip install hermes-agent==0.19.0
    /tmp/hermes/bin/python scripts/compare_hermes.py

Run from the repository root. Hermes's scanner is its memory tool's `_scan_memory_content` (a
private function, as of hermes-agent 0.19.0): it returns the refusal's text, or None.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# After the path insert above, so the checkout is importable.
from bench_scan import ADVERSARIAL, ENTRY_LENGTH, ORDINARY_ENTRY, PROSE_ENTRY, report, timings  # noqa: E402
from memd.core.scan import scan  # noqa: E402
from scan_accuracy import (  # noqa: E402 - a script beside this one
    CORPUS, entries_of, evasions_of, every_entry, in_language, languages_of, read_slices)

try:
    from tools.memory_tool import _scan_memory_content as hermes_scan
except ImportError:
    sys.exit("compare_hermes.py needs Hermes Agent importable: pip install hermes-agent==0.19.0 in a scratch "
             "virtualenv, then run this script with that virtualenv's python")

Scanner = Callable[[str], object]
SCANNERS: tuple[tuple[str, Scanner], ...] = (("memd", scan), ("Hermes", hermes_scan))


def share(scanner: Scanner, entries: list[str]) -> str:
    if not entries:
        return "-"
    flagged = sum(1 for entry in entries if scanner(entry))
    return f"{flagged / len(entries):.1%} ({flagged}/{len(entries)})"


def compare_rates(label: str, attacks: list[str], notes: list[str]) -> None:
    figures = "   ".join(f"{name}: blocked {share(scanner, attacks)}, refused {share(scanner, notes)}"
                         for name, scanner in SCANNERS)
    print(f"  {label:<10} {figures}")


def main() -> None:
    print(f"Python {sys.version.split()[0]}, hermes-agent {metadata.version('hermes-agent')}")
    for name, note in (("technical note", ORDINARY_ENTRY), ("prose profile", PROSE_ENTRY)):
        entry = (note * 4)[:ENTRY_LENGTH]
        verdicts = ", ".join(f"{scanner_name} {'refuses' if scanner(entry) else 'saves'} it"
                             for scanner_name, scanner in SCANNERS)
        print(f"Ordinary {name}, {len(entry):,} characters ({verdicts}):")
        # (In turns, so that a change in the machine's speed during the run falls on both alike.)
        for _ in range(2):
            for scanner_name, scanner in SCANNERS:
                report(scanner_name, timings(scanner, entry, 2_000), 1e-6, "µs")
    print("Hostile 100,000-character inputs (Hermes scans only the first 65,536 characters of any text):")
    for label, text in ADVERSARIAL.items():
        for scanner_name, scanner in SCANNERS:
            report(f"{label}, {scanner_name}", timings(scanner, text, 10), 1e-3, "ms")
    attacks, notes = read_slices(CORPUS / "heldout_attacks.txt"), read_slices(CORPUS / "heldout_benign.txt")
    print("Held-out corpus: attacks blocked and ordinary notes refused")
    compare_rates("all", every_entry(attacks), every_entry(notes))
    attack_slices, note_slices = list(attacks.values()), list(notes.values())
    for language in languages_of(attack_slices):
        compare_rates(language, in_language(attack_slices, language), in_language(note_slices, language))
    compare_rates("evasions", evasions_of(attack_slices), [])
    # (Numbered as README's table of held-out slices lists them.)
    for number, title in enumerate(attacks, 1):
        compare_rates(f"slice {number}", entries_of(attacks[title]), entries_of(notes.get(title, {})))


if __name__ == "__main__":
    main()
