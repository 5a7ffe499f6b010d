"""memd: one daemon that owns the curated memory of every AI agent of a user."""

__version__ = "0.1.0"
