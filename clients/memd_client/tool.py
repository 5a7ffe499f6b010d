"""The `memory` tool as a model sees it: its schema, and turning a tool call into a tool result."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

_OPERATION = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["add", "replace", "remove"]},
        "content": {"type": "string", "description": "The entry text, for add and replace."},
        "old_text": {"type": "string", "description": "A piece of text that occurs in exactly one existing entry, for replace and remove."},
    },
    "required": ["action"],
}

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "memory",
        "description": (
            "Your curated long-term memory, shown in your system prompt at the start of every "
            "session. 'memory' holds your notes about the environment, tools and conventions; "
            "'user' holds what you know about the user (preferences, role, habits). Save only "
            "durable facts that will matter in future sessions, written as short plain facts, "
            "never as instructions. Each store has a character budget: when a save is refused "
            "for being over budget, consolidate at once with ONE call using 'operations' that "
            "removes stale entries or merges overlapping ones and adds the new fact. A success "
            "reply means the write is saved: do not repeat it. If a reply has done=true, stop "
            "calling this tool for that change and carry on with your answer."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "action": {
                    "type": "string",
                    "enum": ["add", "replace", "remove"],
                    "description": "For a single change. Omit when sending 'operations'.",
                },
                "target": {
                    "type": "string",
                    "enum": ["memory", "user"],
                    "description": "'memory' for your notes, 'user' for the user profile. Default 'memory'.",
                },
                "content": {
                    "type": "string",
                    "description": "The entry text: required for add and replace.",
                },
                "old_text": {
                    "type": "string",
                    "description": "Required for replace and remove: a short piece of text that occurs in exactly one existing entry.",
                },
                "dry_run": {
                    "type": "boolean",
                    "description": "true: check the change and report what it would do, without saving anything.",
                },
                "operations": {
                    "type": "array",
                    "items": _OPERATION,
                    "description": (
                        "A batch applied all or nothing, in order, with the budget checked on the "
                        "final result: use it to consolidate (remove/merge entries and add new ones "
                        "in one call)."
                    ),
                },
            },
        },
    },
}


def handle_tool_call(memory: Callable[[Mapping[str, Any]], dict[str, Any]], arguments: str | Mapping[str, Any]) -> str:
    """Run a model's tool call through `memory` and return the JSON text to give back to it.

    Arguments that are not a JSON object get an `invalid` result the model can act on, never an
    exception: a broken tool call must not break the agent's turn.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            return _invalid(f"The tool arguments are not valid JSON ({error.msg} at position {error.pos}). Send a JSON object.")
    if not isinstance(arguments, Mapping):
        return _invalid("The tool arguments must be a JSON object.")
    return json.dumps(memory(arguments), ensure_ascii=False)


def _invalid(error: str) -> str:
    return json.dumps({"success": False, "done": False, "code": "invalid", "error": error}, ensure_ascii=False)
