"""The § file format shared with Hermes: parsing, serialising, the budget figure, drift."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from memd.core.format import (
    append_entry,
    drift_reason,
    has_delimiter_line,
    normalise_entry,
    normalise_text,
    parse_entries,
    serialise_entries,
    total_chars,
    usage_text,
)

# Characters that matter to the format, mixed into arbitrary text so hypothesis meets them often.
FORMAT_CHARS = st.sampled_from(["\n", "§", " ", "\t", "\r", "\ufeff", "a", "b", "é", "中"])
ANY_TEXT = st.text(st.one_of(FORMAT_CHARS, st.characters(exclude_categories=("Cs",))), max_size=60)


def is_clean_entry(entry: str) -> bool:
    """An entry the format can hold as it is: non-empty, stripped, no CR or BOM (both normalised
    away on reading), and no line holding only '§' (a delimiter, or one once rewritten).

    Stricter than "contains no delimiter": ["a\\n§", "b"] contains no delimiter, yet serialises to
    "a\\n§\\n§\\nb", which any left-to-right split reads as ["a", "§\\nb"].
    """
    return (
        bool(entry) and entry == entry.strip() and "\r" not in entry and "\ufeff" not in entry
        and not has_delimiter_line(entry)
    )


CLEAN_ENTRY = (
    st.text(st.one_of(FORMAT_CHARS, st.characters(exclude_categories=("Cs",))), min_size=1, max_size=40)
    .map(lambda text: text.replace("\r", "").replace("\ufeff", "").strip())
    .filter(is_clean_entry)
)
CLEAN_STORE = st.lists(CLEAN_ENTRY, unique=True, max_size=8)


# -- reading ------------------------------------------------------------------------------------

def test_entries_are_split_on_the_delimiter_line_and_may_span_lines():
    text = "Deploys go through `make ship`.\nNever on Fridays.\n§\nUser is called Priya."
    assert parse_entries(text) == ["Deploys go through `make ship`.\nNever on Fridays.", "User is called Priya."]


def test_a_section_sign_inside_a_line_is_not_a_delimiter():
    assert parse_entries("See §4 of the contract.\n§\nx § y") == ["See §4 of the contract.", "x § y"]


def test_utf8_bom_is_stripped():
    assert parse_entries("\ufeffUser prefers tea.\n§\nUses vim.") == ["User prefers tea.", "Uses vim."]


def test_crlf_is_read_as_lf():
    assert parse_entries("one\r\nline two\r\n§\r\nthree") == ["one\nline two", "three"]


def test_a_lone_cr_is_read_as_lf_as_hermes_reads_it():
    # Hermes reads with Python's universal newlines, so it sees "a\r§\rb" as two entries too.
    assert parse_entries("a\r§\rb") == ["a", "b"]


def test_whitespace_around_entries_is_stripped():
    assert parse_entries("  first  \n\n§\n\tsecond\n\n") == ["first", "second"]


def test_empty_entries_are_dropped():
    assert parse_entries("\n§\nfirst\n§\n\n§\n   \n§\nsecond\n§\n") == ["first", "second"]


def test_exact_duplicates_keep_the_first_in_order():
    assert parse_entries("b\n§\na\n§\nb\n§\nc\n§\na") == ["b", "a", "c"]


def test_near_duplicates_are_distinct_entries():
    assert parse_entries("Uses vim.\n§\nUses vim!\n§\nuses vim.") == ["Uses vim.", "Uses vim!", "uses vim."]


def test_a_line_holding_only_a_section_sign_is_never_content():
    # Stray delimiters: an entry cannot start or end with such a line, nor be one.
    assert parse_entries("a\n§\n§\nb") == ["a", "b"]
    assert parse_entries("a\n§\nb\n§") == ["a", "b"]
    assert parse_entries("§\n \n§\na") == ["a"]
    assert parse_entries("§") == [] and parse_entries("\n§") == []
    assert parse_entries("a\n§ \nb") == ["a\n§ \nb"]  # '§ ' is not a delimiter line (as in Hermes)


def test_an_empty_or_blank_file_has_no_entries():
    assert parse_entries("") == []
    assert parse_entries(" \n\t\n") == []
    assert parse_entries("\ufeff") == []


# -- writing ------------------------------------------------------------------------------------

def test_serialise_joins_with_the_delimiter_and_no_trailing_delimiter():
    assert serialise_entries(["a", "b\nc", "d"]) == "a\n§\nb\nc\n§\nd"
    assert serialise_entries(["only"]) == "only"
    assert serialise_entries([]) == ""


def test_the_budget_counts_code_points_of_the_joined_text_delimiters_included():
    entries = ["héllo", "中文"]  # 5 + 3 (delimiter) + 2 code points; 13 bytes in UTF-8
    assert total_chars(entries) == 10
    assert total_chars([]) == 0


def test_usage_figure_has_percent_and_thousands_separators():
    assert usage_text(1234, 2200) == "56% — 1,234/2,200 chars"
    assert usage_text(0, 1375) == "0% — 0/1,375 chars"
    assert usage_text(999, 1000) == "99% — 999/1,000 chars"  # rounded down, never flatters


def test_usage_percent_is_capped_at_100():
    assert usage_text(5000, 2200) == "100% — 5,000/2,200 chars"


def test_normalise_entry_trims_and_normalises_newlines():
    assert normalise_entry("  \ufeffline one\r\nline two\r\n ") == "line one\nline two"


# -- drift -------------------------------------------------------------------------------------

def test_a_tool_written_file_has_not_drifted():
    assert drift_reason(serialise_entries(["User prefers tea.", "Uses vim.\nDaily."]), 2200) is None
    assert drift_reason("", 2200) is None


@pytest.mark.parametrize("text", [
    "a  \n§\n  b",            # spaces around the delimiter line
    "a\n\n§\n\nb\n",          # blank lines around it, trailing newline
    "\ufeffa\r\n§\r\nb\r\n",  # BOM and CRLF
    "\n\n a\n§\nb \n\n",      # whitespace around the whole file
])
def test_whitespace_bom_and_crlf_around_delimiters_are_forgiven(text):
    assert drift_reason(text, 2200) is None


@pytest.mark.parametrize("text", [
    "a\n§\n\n§\nb",   # an empty entry between two delimiters
    "a\n§\nb\n§\n",   # a trailing delimiter
    "\n§\na\n§\nb",   # a leading delimiter
    "a\n§\nb\n§",     # a stray '§' line ending the file: rewritten, it would fuse with the next delimiter
    "a\n§\n§\nb",     # a doubled delimiter
    "§",
])
def test_stray_delimiters_are_drift(text):
    assert drift_reason(text, 2200) is not None


def test_repeated_entries_are_drift():
    assert drift_reason("a\n§\nb\n§\na", 2200) is not None


def test_free_text_making_an_entry_longer_than_the_limit_is_drift():
    tool_written = serialise_entries(["Deploys use make ship.", "Staging is at staging.example."])
    appended = tool_written + "\nMeeting notes: " + "we agreed to move the release. " * 4
    assert drift_reason(tool_written, 100) is None
    reason = drift_reason(appended, 100)
    assert reason is not None
    assert "169" in reason and "100" in reason  # how long the entry is, against which limit


def test_an_entry_exactly_as_long_as_the_limit_is_not_drift():
    assert drift_reason("x" * 100, 100) is None
    assert drift_reason("x" * 101, 100) is not None


# -- properties ---------------------------------------------------------------------------------

@given(CLEAN_STORE)
@example(["a\n§ b", "x § y", "§4 applies.\n §"])
def test_serialise_then_parse_is_identity_on_clean_stores(entries):
    text = serialise_entries(entries)
    assert parse_entries(text) == entries
    assert serialise_entries(parse_entries(text)) == text
    assert drift_reason(text, 10**6) is None


@given(ANY_TEXT)
@example("x\n§ \n§\ny")       # an entry ending in a stray '§' line
@example("\ufeff \ufeffa")     # a second BOM after the stripped one
@example("a\r\r\nb\n§\nc")     # CR runs before LF
@settings(max_examples=300)
def test_parse_is_idempotent(text):
    entries = parse_entries(text)
    assert parse_entries(serialise_entries(entries)) == entries


def visible(text: str) -> str:
    """What someone wrote, ignoring whitespace and BOMs (which the format does not keep)."""
    return "".join(char for char in text if not char.isspace() and char != "\ufeff")


@given(ANY_TEXT)
@example("a\n§\nb\n§")
@settings(max_examples=300)
def test_rewriting_a_file_that_has_not_drifted_loses_nothing_written(text):
    if drift_reason(text, 10**6) is None:
        assert visible(serialise_entries(parse_entries(text))) == visible(text)


@given(ANY_TEXT, CLEAN_ENTRY)
@example("a\n§", "new")
@example("a\n§\n§", "new")
@example("a\n§\n§\n§", "new")
@example("a\n§\n\n§\n", "new")
@example("\n§\n", "new")            # a file holding only a stray delimiter
@example("\n§\nfoo", "new")         # a leading delimiter: trimming it would glue '§' to "foo"
@settings(max_examples=300)
def test_appending_to_any_file_keeps_its_text_and_adds_exactly_the_entry(text, entry):
    joined = append_entry(text, entry)
    assert parse_entries(joined) == list(dict.fromkeys([*parse_entries(text), entry]))
    written = normalise_text(text)
    while written and (written[-1].isspace() or written[-1] == "\ufeff"):
        written = written[:-1]
    assert joined.startswith(written)  # the file's text, as it was, up to its last visible character
    assert visible(joined) in (visible(text) + visible(entry), visible(text) + "§" + visible(entry))
