"""A scripted OpenAI-compatible model endpoint on loopback, so a real Hermes runs its own
agent loop (tool calls, tool results, final reply) without an LLM.

A script is a list of steps registered under a marker string; a request belongs to the
script whose marker occurs in the conversation's last user message (a continued session
carries earlier turns, so earlier user messages never choose). The step a request gets is the
number of assistant turns after that user message: stateless, so a retried request gets the
same step again. A step is a `ToolCall`, a list of them (parallel calls in one assistant
message) or a `Reply` (the final text, finish_reason `stop`).

    with ScriptedModel() as model:
        model.register("MARK-1", [ToolCall("terminal", {"command": "echo hi"}), Reply("done")])
        ... run Hermes with model.base_url ...
        assert model.tool_result("MARK-1", 0)["output"] == "hi"

Every request is recorded (its body, with the `tool` results Hermes fed back). Requests
without `tools` (auxiliary calls: titles, summaries) never advance a script; they get a
plain text answer. Serves `POST /v1/chat/completions` (JSON or, with `"stream": true`, SSE
chunks ending in `data: [DONE]`) and `GET /v1/models`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional, Union

import pytest

MODEL_ID = "scripted-model"
API_KEY = "sk-scripted-model-test"
NO_SCRIPT = "no script for this conversation"
AUXILIARY_REPLY = "Scripted title"


@dataclass
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)


@dataclass
class Reply:
    text: str


@dataclass
class Dynamic:
    """A step computed when its request comes, from what Hermes fed back so far in this turn:
    `make(results)` gets the tool results after the last user message, in order (parsed JSON
    where they are JSON), and returns a ToolCall, a list of them or a Reply. For arguments
    only known at run time (a background process's session id). Still stateless: a retried
    request computes the same step."""

    make: Any


Step = Union[ToolCall, Reply, list, Dynamic]


def _text(content: Any) -> str:
    """A message's content as text (plain string or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _call_id(marker: str, step: int, index: int) -> str:
    digest = hashlib.sha256(marker.encode()).hexdigest()[:10]
    return f"call_{digest}_{step}_{index}"


class ScriptedModel:
    def __init__(self, model_id: str = MODEL_ID) -> None:
        self.model_id = model_id
        self._scripts: dict[str, list[list[ToolCall] | Reply | Dynamic]] = {}
        self._lock = threading.Lock()
        #: Every request: {"path", "body", "marker", "step", "stream", "auxiliary", "auth"}.
        self.requests: list[dict] = []
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # -- scripts ----------------------------------------------------------------------------

    def register(self, marker: str, steps: list[Step]) -> str:
        normalized: list[list[ToolCall] | Reply | Dynamic] = []
        for step in steps:
            if isinstance(step, ToolCall):
                normalized.append([step])
            elif isinstance(step, list) and step and all(isinstance(s, ToolCall) for s in step):
                normalized.append(list(step))
            elif isinstance(step, (Reply, Dynamic)):
                normalized.append(step)
            else:
                raise TypeError(f"a step is a ToolCall, a list of them or a Reply, not {step!r}")
        with self._lock:
            self._scripts[marker] = normalized
        return marker

    def _find(self, messages: list[dict]) -> tuple[Optional[str], int]:
        """(marker, step) of a request: the marker in its last user message, the step the
        number of assistant turns after that message."""
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
        if last_user is None:
            return None, 0
        text = _text(messages[last_user].get("content"))
        with self._lock:
            markers = sorted((m for m in self._scripts if m in text), key=len, reverse=True)
        step = sum(1 for m in messages[last_user + 1:] if m.get("role") == "assistant")
        return (markers[0] if markers else None), step

    def _answer(self, body: dict) -> tuple[Optional[str], int, bool, dict]:
        """(marker, step, auxiliary, assistant message) for one request."""
        messages = body.get("messages") or []
        marker, step = self._find(messages)
        auxiliary = not body.get("tools")
        if auxiliary:
            return marker, step, True, {"role": "assistant", "content": AUXILIARY_REPLY}
        if marker is None:
            return None, step, False, {"role": "assistant", "content": NO_SCRIPT}
        with self._lock:
            script = self._scripts[marker]
        if step >= len(script):
            return marker, step, False, {"role": "assistant", "content": f"script {marker} is over (step {step})"}
        current = script[step]
        if isinstance(current, Dynamic):
            made = current.make(self._results_since_user(messages))
            current = [made] if isinstance(made, ToolCall) else made
        if isinstance(current, Reply):
            return marker, step, False, {"role": "assistant", "content": current.text}
        calls = [{"id": _call_id(marker, step, i), "type": "function",
                  "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                 for i, c in enumerate(current)]
        return marker, step, False, {"role": "assistant", "content": None, "tool_calls": calls}

    @staticmethod
    def _results_since_user(messages: list[dict]) -> list[Any]:
        """The tool results after the last user message, in order, parsed where JSON."""
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        results = []
        for message in messages[last_user + 1:]:
            if message.get("role") != "tool":
                continue
            content = _text(message.get("content"))
            try:
                results.append(json.loads(content))
            except ValueError:
                results.append(content)
        return results

    # -- what Hermes sent -------------------------------------------------------------------

    def conversation(self, marker: str) -> list[dict]:
        """The agent-loop requests of one script, in arrival order."""
        with self._lock:
            return [r for r in self.requests if r["marker"] == marker and not r["auxiliary"]]

    def tool_messages(self, marker: str) -> dict[str, str]:
        """tool_call_id -> the content of the `tool` message Hermes sent back for it."""
        found: dict[str, str] = {}
        for request in self.conversation(marker):
            for message in request["body"].get("messages") or []:
                if message.get("role") == "tool" and message.get("tool_call_id"):
                    found[message["tool_call_id"]] = _text(message.get("content"))
        return found

    def tool_result(self, marker: str, step: int, index: int = 0, *, raw: bool = False) -> Any:
        """The result Hermes fed back for the `index`th tool call of `step`: parsed JSON when it
        is JSON (and not `raw`), else the text. Fails when Hermes never sent it."""
        call_id = _call_id(marker, step, index)
        messages = self.tool_messages(marker)
        if call_id not in messages:
            raise AssertionError(f"no tool result for {marker} step {step} call {index}; "
                                 f"requests: {json.dumps(self.conversation(marker), indent=1)[:4000]}")
        content = messages[call_id]
        if raw:
            return content
        try:
            return json.loads(content)
        except ValueError:
            return content

    def finished(self, marker: str) -> bool:
        """Whether the script's final Reply was served."""
        with self._lock:
            script = self._scripts[marker]
        served = {r["step"] for r in self.conversation(marker)}
        return any(isinstance(script[s], Reply) for s in served if s < len(script))

    # -- HTTP -------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> "ScriptedModel":
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _json(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") in ("/v1/models", "/models"):
                    self._json(200, {"object": "list", "data": [
                        {"id": model.model_id, "object": "model", "created": 0, "owned_by": "tests",
                         "context_length": 131072}]})
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                    self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    self._json(400, {"error": {"message": "invalid JSON", "type": "invalid_request_error"}})
                    return
                marker, step, auxiliary, message = model._answer(body)
                stream = bool(body.get("stream"))
                with model._lock:
                    model.requests.append({"path": self.path, "body": body, "marker": marker, "step": step,
                                           "stream": stream, "auxiliary": auxiliary,
                                           "auth": self.headers.get("Authorization", ""), "time": time.time()})
                finish = "tool_calls" if message.get("tool_calls") else "stop"
                completion_id = f"chatcmpl-scripted-{len(model.requests)}"
                usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                if not stream:
                    self._json(200, {"id": completion_id, "object": "chat.completion", "created": int(time.time()),
                                     "model": model.model_id,
                                     "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                                     "usage": usage})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True

                def chunk(delta: dict, finish_reason: Optional[str] = None, **extra: Any) -> None:
                    payload = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
                               "model": model.model_id,
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}
                    self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
                    self.wfile.flush()

                chunk({"role": "assistant", "content": ""})
                if message.get("tool_calls"):
                    for index, call in enumerate(message["tool_calls"]):
                        chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                               "function": {"name": call["function"]["name"], "arguments": ""}}]})
                        arguments = call["function"]["arguments"]
                        half = len(arguments) // 2
                        for part in (arguments[:half], arguments[half:]):
                            if part:
                                chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
                else:
                    text = message["content"]
                    for start in range(0, len(text), 16):
                        chunk({"content": text[start:start + 16]})
                chunk({}, finish)
                if (body.get("stream_options") or {}).get("include_usage"):
                    payload = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
                               "model": model.model_id, "choices": [], "usage": usage}
                    self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="scripted-model", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = None

    def __enter__(self) -> "ScriptedModel":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- Hermes configuration ---------------------------------------------------------------

    def model_config(self) -> dict:
        """config.yaml's `model` section pointing Hermes at this endpoint."""
        return {"provider": "custom", "base_url": self.base_url, "default": self.model_id,
                "api_key": API_KEY, "context_length": 131072}


@pytest.fixture
def scripted_model():
    with ScriptedModel() as model:
        yield model
