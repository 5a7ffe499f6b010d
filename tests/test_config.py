"""Where the memory home is, and what config.yaml says about it (SPEC §2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memd.config import ConfigError, default_home, load_settings, profile_home, profile_name
from memd.engine import Engine


def write_yaml(home: Path, text: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# -- the home -------------------------------------------------------------------------------------

def test_hermes_home_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "custom"))
    assert default_home() == tmp_path / "custom"


def test_hermes_home_expands_a_tilde(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HERMES_HOME", "~/agents/hermes")
    assert default_home() == tmp_path / "agents" / "hermes"


@pytest.mark.parametrize("value", [None, ""])
def test_without_hermes_home_it_is_dot_hermes_in_the_home_directory(monkeypatch, tmp_path, value):
    monkeypatch.setenv("HOME", str(tmp_path))
    if value is None:
        monkeypatch.delenv("HERMES_HOME", raising=False)
    else:
        monkeypatch.setenv("HERMES_HOME", value)
    assert default_home() == tmp_path / ".hermes"


def test_the_memory_directory_is_memories_in_the_home(tmp_path):
    assert load_settings(tmp_path).memory_dir == tmp_path / "memories"


def test_a_profile_lives_under_profiles(tmp_path):
    for name in ("work", "team_2-dev-x"):
        (tmp_path / "profiles" / name).mkdir(parents=True)
    assert profile_home(tmp_path, "work") == tmp_path / "profiles" / "work"
    assert profile_home(tmp_path, "team_2-dev-x") == tmp_path / "profiles" / "team_2-dev-x"
    assert profile_home(tmp_path, None) == tmp_path
    assert profile_home(tmp_path, "") == tmp_path


def test_profile_names_are_spelled_as_hermes_spells_them(tmp_path):
    # Hermes keeps profiles in lower case and calls the home itself "default": `-p Work` and
    # `-p default` must reach the same directories through memd as through Hermes.
    (tmp_path / "profiles" / "work").mkdir(parents=True)
    assert profile_home(tmp_path, "Work") == profile_home(tmp_path, " WORK ") == tmp_path / "profiles" / "work"
    assert profile_home(tmp_path, "default") == profile_home(tmp_path, "Default") == tmp_path
    assert profile_name("Work") == "work" and profile_name("default") is None and profile_name(None) is None


def test_a_mistyped_profile_is_refused_and_the_existing_ones_are_named(tmp_path):
    for name in ("work", "personal"):
        (tmp_path / "profiles" / name).mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"no profile 'wrok'.*profiles there: personal, work.*hermes profile create wrok"):
        profile_home(tmp_path, "wrok")
    assert not (tmp_path / "profiles" / "wrok").exists()
    with pytest.raises(ConfigError, match=r"no profile 'work'.*does not exist; create it"):
        profile_home(tmp_path / "elsewhere", "work")


@pytest.mark.parametrize("name", ["..", "../etc", "a/b", "a\\b", ".hidden", "-rf", "a..b", "a b", "x" * 65, "wörk", "team.dev"])
def test_bad_profile_names_are_refused(tmp_path, name):
    (tmp_path / "profiles").mkdir()
    with pytest.raises(ConfigError, match="invalid profile name"):
        profile_home(tmp_path, name)


def test_a_profile_has_its_own_config_and_memories(tmp_path):
    (tmp_path / "profiles" / "work").mkdir(parents=True)
    work = profile_home(tmp_path, "work")
    write_yaml(work, "memory:\n  memory_char_limit: 500\n")
    settings = load_settings(work)
    assert settings.limits["memory"] == 500 and settings.memory_dir == tmp_path / "profiles" / "work" / "memories"
    assert load_settings(tmp_path).limits["memory"] == 2200  # the main home is untouched


# -- limits ---------------------------------------------------------------------------------------

def test_default_limits_without_a_config(tmp_path):
    assert dict(load_settings(tmp_path).limits) == {"memory": 2200, "user": 1375}


def test_limits_from_the_memory_section(tmp_path):
    write_yaml(tmp_path, "memory:\n  memory_char_limit: 3000\n  user_char_limit: 900\n")
    assert dict(load_settings(tmp_path).limits) == {"memory": 3000, "user": 900}


def test_one_limit_set_leaves_the_other_at_its_default(tmp_path):
    write_yaml(tmp_path, "memory:\n  user_char_limit: 2000\n")
    assert dict(load_settings(tmp_path).limits) == {"memory": 2200, "user": 2000}


@pytest.mark.parametrize("written, limit", [('"3000"', 3000), ("'3,000'", 3000), ('" 4_500 "', 4500)])
def test_a_string_number_is_accepted(tmp_path, written, limit):
    write_yaml(tmp_path, f"memory:\n  memory_char_limit: {written}\n")
    assert load_settings(tmp_path).limits["memory"] == limit


def test_unknown_keys_are_ignored(tmp_path):
    write_yaml(tmp_path, (
        "model: claude\n"
        "memory:\n  memory_enabled: true\n  memory_char_limit: 2500\n  nudge_interval: 10\n"
        "display:\n  skin: dark\n"
    ))
    assert dict(load_settings(tmp_path).limits) == {"memory": 2500, "user": 1375}


@pytest.mark.parametrize("text", ["", "# only a comment\n", "memory:\n", "memory:\n  memory_char_limit:\n"])
def test_empty_or_bare_sections_mean_defaults(tmp_path, text):
    write_yaml(tmp_path, text)
    assert dict(load_settings(tmp_path).limits) == {"memory": 2200, "user": 1375}


def test_configured_limits_are_what_the_engine_enforces(tmp_path):
    home = tmp_path / "home"
    write_yaml(home, "memory:\n  memory_char_limit: '50'\n")
    session = Engine(home).open_session("cli")
    assert session.memory(action="add", content="x" * 50)["usage"] == "100% — 50/50 chars"
    reply = session.memory(action="add", content="y")
    assert reply["code"] == "over_budget" and "50/50" in reply["error"]


# -- errors ---------------------------------------------------------------------------------------

def test_malformed_yaml_is_a_clear_error_naming_the_file(tmp_path):
    path = write_yaml(tmp_path, "memory:\n  memory_char_limit: [3000\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    assert str(path) in str(caught.value) and "not valid YAML" in str(caught.value)


@pytest.mark.parametrize("value", ["lots", "-5", "0", "12.5", "true", "[1]", "{a: 1}", "'²'", "'-5'", "2200.0"])
def test_a_limit_of_the_wrong_type_is_a_clear_error_naming_the_key(tmp_path, value):
    path = write_yaml(tmp_path, f"memory:\n  memory_char_limit: {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    message = str(caught.value)
    assert str(path) in message and "memory.memory_char_limit" in message and "whole number" in message


@pytest.mark.parametrize("text", ["memory: 2200\n", "memory: [1, 2]\n", "memory: nope\n", "memory: false\n"])
def test_a_memory_section_that_is_not_a_mapping_is_an_error(tmp_path, text):
    write_yaml(tmp_path, text)
    with pytest.raises(ConfigError, match="'memory:' must be a mapping"):
        load_settings(tmp_path)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_a_config_that_is_not_a_mapping_is_an_error(tmp_path, text):
    write_yaml(tmp_path, text)
    with pytest.raises(ConfigError, match="top level"):
        load_settings(tmp_path)


def test_a_config_that_is_not_utf8_is_an_error(tmp_path):
    (tmp_path / "config.yaml").write_bytes(b"memory:\n  memory_char_limit: 3000 # caf\xe9\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path)


def test_a_named_config_file_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path, tmp_path / "elsewhere.yaml")


def test_a_malformed_config_stops_the_engine_from_starting(tmp_path):
    home = tmp_path / "home"
    write_yaml(home, "memory: {memory_char_limit: lots}\n")
    with pytest.raises(ConfigError, match="memory_char_limit"):
        Engine(home)
