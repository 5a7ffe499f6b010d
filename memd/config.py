"""Where the memory home is, and what `config.yaml` says about it."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs
import yaml

DEFAULT_LIMITS = {"memory": 2200, "user": 1375}
# config.yaml keys under `memory:`, the same names Hermes reads.
LIMIT_KEYS = {"memory": "memory_char_limit", "user": "user_char_limit"}
# Hermes's rule for a profile's directory name, which memd keeps so both find the same directory.
PROFILE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


class ConfigError(Exception):
    """The configuration cannot be used; the message says which file, which key and why."""


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    limits: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    # Sessions nobody has used for this long are closed, so abandoned agents cost nothing.
    session_idle_seconds: float = 6 * 3600.0
    # The periodic rescan that backs up drift even when a filesystem event was lost.
    rescan_seconds: float = 2.0
    # History is kept at least this long (the journal is rotated at start beyond it).
    journal_days: float = 30.0

    @property
    def memory_dir(self) -> Path:
        return self.home / "memories"


def default_home() -> Path:
    """`HERMES_HOME`, else where Hermes keeps its home on this platform."""
    configured = os.environ.get("HERMES_HOME")
    if configured:
        return Path(configured).expanduser()
    if sys.platform == "win32":
        return Path(platformdirs.user_data_dir("hermes", appauthor=False, roaming=False))
    return Path.home() / ".hermes"


def state_dir(home: Path) -> Path:
    """memd's own files in a home (daemon lock, CURVE keys, journal), created owner-only."""
    directory = home / "memd"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return directory


def profile_name(profile: str | None) -> str | None:
    """A profile's name as Hermes spells it on disk (`Work` is `profiles/work`), or None for the
    home itself: no name, or `default`, Hermes's name for the home."""
    if profile is None:
        return None
    name = profile.strip().lower()
    if name in ("", "default"):
        return None
    if not PROFILE_NAME.fullmatch(name):
        raise ConfigError(
            f"invalid profile name {profile!r}: a profile is named with letters, digits, '_' and '-', "
            "starting with a letter or digit, at most 64 characters (Hermes keeps it in lower case)"
        )
    return name


def profile_home(home: Path, profile: str | None) -> Path:
    """The home of an existing profile, `<home>/profiles/<name>`; the home itself for None.

    Profiles are made by Hermes (`hermes profile create NAME`) or by hand. A name with no
    directory is refused, so that a mistyped name never starts an empty memory of its own.
    """
    name = profile_name(profile)
    if name is None:
        return home
    profiles = home / "profiles"
    directory = profiles / name
    if not directory.is_dir():
        known = sorted(path.name for path in profiles.iterdir() if path.is_dir()) if profiles.is_dir() else []
        listed = f" (the profiles there: {', '.join(known[:12])}{', ...' if len(known) > 12 else ''})" if known else ""
        raise ConfigError(
            f"no profile {name!r}: {directory} does not exist{listed}; create it with "
            f"`hermes profile create {name}`, or `mkdir -p {directory}` to use memd alone"
        )
    return directory


def _positive_int(value: Any, where: str) -> int:
    """A positive whole number; strings of digits are accepted because YAML users quote them."""
    if isinstance(value, bool):
        raise ConfigError(f"{where} must be a whole number of characters, not {value!r}")
    if isinstance(value, str):
        value = value.strip().replace("_", "").replace(",", "")
        if not (value.isascii() and value.isdigit()):
            raise ConfigError(f"{where} must be a whole number of characters, not {value!r}")
        value = int(value)
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where} must be a positive whole number of characters, not {value!r}")
    return value


def _positive_number(value: Any, where: str, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{where} must be a number of {unit}, not {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{where} must be a number of {unit}, not {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise ConfigError(f"{where} must be a finite number of {unit} above 0, not {value!r}")
    return number


def _section(document: Mapping[str, Any], name: str, path: Path) -> Mapping[str, Any]:
    section = document.get(name)
    if section is None:  # absent, or a bare `name:` line
        return {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{path}: '{name}:' must be a mapping of keys to values")
    return section


def load_settings(home: Path, config_file: Path | None = None) -> Settings:
    """Settings for `home` from `config_file` (default `<home>/config.yaml`; absent is fine)."""
    path = config_file or home / "config.yaml"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if config_file is not None:
            raise ConfigError(f"config file {path} does not exist") from None
        return Settings(home=home)
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read {path}: {error}") from None
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(document, Mapping):
        raise ConfigError(f"{path} must hold a mapping at its top level")
    memory = _section(document, "memory", path)
    limits = dict(DEFAULT_LIMITS)
    for target, key in LIMIT_KEYS.items():
        if memory.get(key) is not None:
            limits[target] = _positive_int(memory[key], f"{path}: memory.{key}")
    memd = _section(document, "memd", path)
    settings = Settings(home=home, limits=limits)
    overrides: dict[str, float] = {}
    for key, unit in (("session_idle_seconds", "seconds"), ("rescan_seconds", "seconds"), ("journal_days", "days")):
        if memd.get(key) is not None:
            overrides[key] = _positive_number(memd[key], f"{path}: memd.{key}", unit)
    if overrides:
        settings = Settings(home=home, limits=limits, **overrides)
    return settings

