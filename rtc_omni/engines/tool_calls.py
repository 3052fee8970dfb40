"""Qwen's hermes tool-call format, for the engine that runs the model itself (vLLM-Omni).

Qwen models, Qwen2.5-Omni and Qwen3-Omni among them, are trained on the format vLLM's `hermes`
tool parser reads: the tools as JSON lines in `<tools></tools>` in the system turn, a call answered
as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, a tool's result as
`<tool_response>` in a user turn. The format is written here once: the prompt for a chat template
without a tool section, the streaming parser of the thinker's text, and the JSON schemas that
force a call with structured outputs. docs/vllm.md ("Tool calling") says what each costs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .engine import EngineError, ForcedTool, FunctionArguments, FunctionCallStarted, FunctionTool, ToolChoice

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_CLOSING = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call>'
)


@dataclass(frozen=True)
class ToolCall:
    """A call the model made, checked against the turn's tools."""

    name: str
    arguments: dict[str, Any]


def offered(tools: Sequence[FunctionTool], choice: ToolChoice) -> bool:
    """Whether the model sees the tools: there are some and `tool_choice` is not "none"."""
    return bool(tools) and choice != "none"


def in_prompt(tools: Sequence[FunctionTool], history: list[dict[str, Any]]) -> bool:
    """Whether a prompt has tools or tool history for the chat template to render."""
    return bool(tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in history)


def openai_tools(tools: Sequence[FunctionTool]) -> list[dict[str, Any]]:
    """The tools as a chat-completions request's `tools`, which chat templates render."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]


def hermes_messages(messages: list[dict[str, Any]], tools: Sequence[FunctionTool]) -> list[dict[str, Any]]:
    """Chat-completions messages, tools and tool history written out as hermes text, for a chat
    template that renders neither (Qwen2.5-Omni's; QwenLM/Qwen3-VL #914). `tools` empty: only the
    history is rewritten."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            calls = [hermes_call(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
            text = "\n".join(filter(None, [message.get("content") or "", *calls]))
            out.append({"role": "assistant", "content": text})
        elif role == "tool":
            response = f"<tool_response>\n{message.get('content', '')}\n</tool_response>"
            if i and messages[i - 1]["role"] == "tool":  # consecutive results share one user turn
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response})
        else:
            out.append(message)
    if not tools:
        return out
    block = TOOLS_PREAMBLE + "\n".join(json.dumps(t) for t in openai_tools(tools)) + TOOLS_CLOSING
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": f"{out[0]['content']}\n\n{block}"}, *out[1:]]
    return [{"role": "system", "content": block}, *out]


def hermes_call(name: str, arguments: str | dict[str, Any]) -> str:
    """One call as the model writes it."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments else {}
        except ValueError:
            pass  # a client's malformed history stays as it was written
    return f"{CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CALL_CLOSE}"


def parse_call(text: str, tools: Sequence[FunctionTool]) -> ToolCall:
    """`{"name": ..., "arguments": {...}}` as a call of one of `tools`; EngineError otherwise."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise EngineError(f"The model's tool call is not valid JSON ({exc}): {text[:200]!r}") from exc
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise EngineError(f"The model's tool call names no function: {text[:200]!r}")
    name = value["name"]
    if name not in {tool.name for tool in tools}:
        raise EngineError(f"The model called {name!r}, which is not one of this response's tools")
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        raise EngineError(f"The model's arguments for {name!r} are not a JSON object: {text[:200]!r}")
    return ToolCall(name, arguments)


def parse_arguments(text: str, name: str) -> ToolCall:
    """A forced call's output, which is the arguments object alone."""
    try:
        arguments = json.loads(text)
    except ValueError as exc:
        # Structured outputs only let a complete object end the answer: this one was cut (max_tokens).
        raise EngineError(f"The model's arguments for {name!r} were cut off ({exc}): {text[:200]!r}") from exc
    if not isinstance(arguments, dict):
        raise EngineError(f"The model's arguments for {name!r} are not a JSON object: {text[:200]!r}")
    return ToolCall(name, arguments)


def call_outputs(call: ToolCall) -> list[FunctionCallStarted | FunctionArguments]:
    """A call as an engine yields it, under a new call id."""
    call_id = f"call_{uuid.uuid4().hex[:16]}"
    return [FunctionCallStarted(call_id, call.name), FunctionArguments(call_id, json.dumps(call.arguments))]


def forced_call(tools: Sequence[FunctionTool], choice: ToolChoice, text: str) -> ToolCall:
    """The call in the answer `forced_schema` shaped."""
    return parse_arguments(text, choice.name) if isinstance(choice, ForcedTool) else parse_call(text, tools)


def forced_schema(tools: Sequence[FunctionTool], choice: ToolChoice) -> dict[str, Any] | None:
    """The JSON schema that makes the answer a call, for structured outputs; None for a choice
    that forces nothing. Named: the tool's parameters (the answer is the arguments); required:
    one of `{"name": <a tool>, "arguments": <its parameters>}`."""
    if isinstance(choice, ForcedTool):
        tool = next((t for t in tools if t.name == choice.name), None)
        if tool is None:
            raise EngineError(f"tool_choice names {choice.name!r}, which is not one of this response's tools")
        return object_schema(tool.parameters)
    if choice != "required" or not tools:
        return None
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": object_schema(t.parameters)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }


def object_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters as a schema of an object: `{}` would let any JSON value through."""
    return parameters if "type" in parameters else {"type": "object", **parameters}


class CallStream:
    """Splits the thinker's text deltas at `<tool_call>`: the text before it is delivered, nothing
    from it on; once `</tool_call>` closes the body, the call is parsed. The marker may arrive in
    pieces: a delta's tail that could begin it (and the whitespace before it) waits for the next."""

    def __init__(self, tools: Sequence[FunctionTool]) -> None:
        self.tools = tools
        self.held = ""  # text that may be the start of a marker
        self.body: str | None = None  # the call's text, from the marker on

    @property
    def calling(self) -> bool:
        """The marker has been seen: no more text or speech belongs to the answer."""
        return self.body is not None

    def feed(self, delta: str) -> tuple[str, ToolCall | None]:
        """The text to deliver now, and the call once its closing tag has arrived."""
        if self.body is not None:
            self.body += delta
            return "", self._closed()
        text = self.held + delta
        start = text.find(CALL_OPEN)
        if start >= 0:
            self.held, self.body = "", text[start + len(CALL_OPEN) :]
            return text[:start].rstrip(), self._closed()
        # Held back: a tail that may begin the marker, and the whitespace before it, which the
        # text before a call loses ("Sure." for "Sure. <tool_call>").
        cut = len(text[: len(text) - marker_prefix(text)].rstrip())
        self.held = text[cut:]
        return text[:cut], None

    def end(self) -> str:
        """What is left to deliver when the answer ended without a call."""
        if self.body is not None:
            raise EngineError(f"The model's tool call ended before {CALL_CLOSE}: {self.body[:200]!r}")
        held, self.held = self.held, ""
        return held

    def _closed(self) -> ToolCall | None:
        assert self.body is not None
        end = self.body.find(CALL_CLOSE)
        return None if end < 0 else parse_call(self.body[:end].strip(), self.tools)


def marker_prefix(text: str) -> int:
    """The length of the longest tail of `text` that `<tool_call>` begins with."""
    for size in range(min(len(text), len(CALL_OPEN) - 1), 0, -1):
        if CALL_OPEN.startswith(text[-size:]):
            return size
    return 0
