"""A small OpenAI-compatible HTTP server for tests: real sampling from a local model, switchable faults.

    with OpenAICompatibleServer(model_dir) as server:
        server.url                       # "http://127.0.0.1:PORT/v1"
        server.fail_next(429, times=2, retry_after=1)
        ...
        server.request_count             # completions requests seen (GET /models not counted)

It serves `POST /v1/chat/completions`, `POST /v1/completions` and `GET /v1/models` from a stdlib
`ThreadingHTTPServer` on a free port of 127.0.0.1. Text comes from `HFGenerator`, so a request with
`seed` s gives sample k the seed s + k, exactly as the hf backend would: the same model directory and
seed sampled through this server or locally give the same texts. Faults are consumed in the order they
were queued, one per completions request; `fail_always` applies to every request until cleared.

`ignore_n=True` answers one choice per prompt whatever `n` asks, as transformers' `serve` does;
`texts_next([...])` makes the next choices answer those texts (in order, one per choice) instead of the model's,
so a test can have the server return empty, blank or repeated completions.

Log-probs: chat `logprobs: true` (+ `top_logprobs: k`) and completions `logprobs: k` are answered in
OpenAI's formats from the model's own next-token distribution (temperature 1) at each generated token,
the text re-tokenised after the rendered prompt. `server.logprobs = False` makes the server ignore the
request and answer `"logprobs": null`, like servers that do not offer them.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from training.generation import GenerationError, GenerationParams, HFGenerator


@dataclass
class Fault:
    kind: str
    """"status" (answer `status`), "sleep" (wait `seconds`, then answer normally), "malformed"
    (a body that is not JSON) or "wrong_choices" (one choice more than asked for)."""
    status: int = 500
    retry_after: float | None = None
    seconds: float = 0.0


class OpenAICompatibleServer:
    """Serve `model_dir` under the model name `model_name`; requests must carry `api_key` when one is set.

    `max_n` caps `n` per request (answers 400 above it, as a server with a cap would).
    """

    def __init__(self, model_dir: str | Path, *, model_name: str = "tiny", api_key: str | None = None,
                 max_n: int | None = None, batch_size: int = 16, logprobs: bool = True,
                 ignore_n: bool = False) -> None:
        self.model_name = model_name
        self.ignore_n = ignore_n
        """Answer one choice per prompt whatever `n` is (transformers' `serve`)."""
        self._scripted: deque[str] = deque()
        self.logprobs = logprobs
        """Whether log-probs are returned when asked for (False: always `"logprobs": null`)."""
        self.api_key = api_key
        self.max_n = max_n
        self.generator = HFGenerator(model_dir, batch_size=batch_size)
        self.requests: list[dict[str, Any]] = []
        """Every completions request body received, in order (faulted ones included)."""
        self.max_in_flight = 0
        self._in_flight = 0
        self._faults: deque[Fault] = deque()
        self._always: Fault | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def __enter__(self) -> OpenAICompatibleServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        handler = type("Handler", (_Handler,), {"server_state": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="openai-test-server", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._closing.set()  # wakes handlers sleeping on a "sleep" fault
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.generator.close()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def in_flight(self) -> int:
        """Completions requests received and not yet answered."""
        with self._lock:
            return self._in_flight

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    # -- faults

    def fail_next(self, status: int, times: int = 1, retry_after: float | None = None) -> None:
        """The next `times` requests answer HTTP `status` (with a Retry-After header when given)."""
        self._queue(Fault("status", status=status, retry_after=retry_after), times)

    def fail_always(self, status: int) -> None:
        """Every request answers HTTP `status` until `clear_faults()`."""
        with self._lock:
            self._always = Fault("status", status=status)

    def sleep_next(self, seconds: float, times: int = 1) -> None:
        """The next `times` requests wait `seconds` before answering (to outlast a client timeout)."""
        self._queue(Fault("sleep", seconds=seconds), times)

    def malformed_next(self, times: int = 1) -> None:
        """The next `times` requests answer 200 with a body that is not JSON."""
        self._queue(Fault("malformed"), times)

    def wrong_choices_next(self, times: int = 1) -> None:
        """The next `times` requests answer with one choice more than `n`."""
        self._queue(Fault("wrong_choices"), times)

    def texts_next(self, texts: list[str]) -> None:
        """The next choices answered (across requests, in order) carry these texts instead of the model's."""
        with self._lock:
            self._scripted.extend(texts)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._always = None

    def _queue(self, fault: Fault, times: int) -> None:
        with self._lock:
            self._faults.extend([fault] * times)

    def _take_fault(self, body: dict[str, Any]) -> Fault | None:
        with self._lock:
            self.requests.append(body)
            if self._always is not None:
                return self._always
            return self._faults.popleft() if self._faults else None

    # -- generation

    def complete(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer) for one completions request, without faults."""
        if body.get("model") != self.model_name:
            return 404, _error(f"model {body.get('model')!r} does not exist", "NotFoundError")
        chat = path.endswith("/chat/completions")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return 400, _error("messages must be a non-empty list")
            prompts: list[Any] = [messages]
        else:
            prompt = body.get("prompt")
            prompts = [prompt] if isinstance(prompt, str) else prompt
            if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
                return 400, _error("prompt must be a string or a list of strings")
        n = body.get("n", 1)
        if not isinstance(n, int) or n < 1 or (self.max_n is not None and n > self.max_n):
            return 400, _error(f"n must be between 1 and {self.max_n or 'any'}")
        if self.ignore_n:
            n = 1
        top = body.get("top_logprobs", 0) if chat else body.get("logprobs")
        wanted = body.get("logprobs") is True if chat else top is not None
        if wanted and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20):
            return 400, _error("top_logprobs must be an integer from 0 to 20" if chat else
                               "logprobs must be an integer from 0 to 20")
        try:
            params = GenerationParams(
                temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                max_new_tokens=body.get("max_completion_tokens") or body.get("max_tokens") or 16,
                seed=body.get("seed"), stop=body.get("stop") or [])
            results = self.generator.generate(prompts, n, params)
        except GenerationError as exc:
            return 400, _error(str(exc))
        choices = []
        for j, samples in enumerate(results):
            for k, sample in enumerate(samples):
                choice: dict[str, Any] = {"index": j * n + k, "finish_reason": sample.finish_reason, "logprobs": None}
                if wanted and self.logprobs:
                    choice["logprobs"] = self._logprobs(prompts[j], sample.text, top, chat)
                text = self._scripted_text(sample.text)
                if chat:
                    choice["message"] = {"role": "assistant", "content": text}
                else:
                    choice["text"] = text
                choices.append(choice)
        prompt_tokens = sum(group[0].prompt_tokens or 0 for group in results)
        completion_tokens = sum(s.completion_tokens or 0 for group in results for s in group)
        return 200, {
            "id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": self.model_name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }

    def _scripted_text(self, generated: str) -> str:
        with self._lock:
            return self._scripted.popleft() if self._scripted else generated

    def _logprobs(self, prompt: Any, text: str, top: int, chat: bool) -> dict[str, Any]:
        """OpenAI log-probs of `text` after `prompt`: the chosen token's and the `top` most likely ones."""
        import torch

        generator = self.generator
        with generator._lock:
            generator._load()
            tokenizer, model = generator._tokenizer, generator._model
            rendered, templated = generator.render(prompt)
            prompt_ids = tokenizer(rendered, add_special_tokens=not templated)["input_ids"]
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt_ids + ids], device=generator._device)).logits[0]
            logp = torch.log_softmax(logits[len(prompt_ids) - 1:-1].float(), dim=-1).cpu()  # (T, V)
        entries = []
        for t, token_id in enumerate(ids):
            values, indices = logp[t].topk(top) if top else (torch.empty(0), torch.empty(0, dtype=torch.long))
            alternatives = [(tokenizer.decode([i]), v) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
            entries.append((tokenizer.decode([token_id]), logp[t, token_id].item(), alternatives))
        if chat:
            return {"content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode()),
                                 "top_logprobs": [{"token": a, "logprob": v, "bytes": list(a.encode())}
                                                  for a, v in alts]} for tok, lp, alts in entries]}
        offsets, position = [], len(prompt) if isinstance(prompt, str) else 0
        for tok, _, _ in entries:
            offsets.append(position)
            position += len(tok)
        return {"tokens": [tok for tok, _, _ in entries], "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [dict(alts) for _, _, alts in entries], "text_offset": offsets}


def _error(message: str, kind: str = "BadRequestError") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


class _Handler(BaseHTTPRequestHandler):
    server_state: OpenAICompatibleServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # keep test output clean

    def _send(self, status: int, payload: dict[str, Any] | bytes, headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self._leave()  # before the client can see the answer, so it may send the next request
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        key = self.server_state.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._send(401, _error("invalid api key", "AuthenticationError"))
        return False

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if self.path.rstrip("/") != "/v1/models":
            self._send(404, _error("not found", "NotFoundError"))
            return
        if self._authorised():
            state = self.server_state
            self._send(200, {"object": "list", "data": [{"id": state.model_name, "object": "model",
                                                         "owned_by": "preflab-tests"}]})

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        state = self.server_state
        path = self.path.rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._send(404, _error("not found", "NotFoundError"))
            return
        if not self._authorised():
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(400, _error("body is not JSON"))
            return
        with state._lock:
            state._in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state._in_flight)
        self._counted = True
        try:
            self._answer(state, path, body if isinstance(body, dict) else {})
        finally:
            self._leave()

    def _leave(self) -> None:
        if getattr(self, "_counted", False):
            self._counted = False
            with self.server_state._lock:
                self.server_state._in_flight -= 1

    def _answer(self, state: OpenAICompatibleServer, path: str, body: dict[str, Any]) -> None:
        fault = state._take_fault(body)
        if fault is not None and fault.kind == "status":
            headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
            self._send(fault.status, _error(f"injected HTTP {fault.status} SERVER-BODY-DETAIL", "InjectedError"),
                       headers)
            return
        if fault is not None and fault.kind == "sleep":
            if state._closing.wait(fault.seconds):
                return
        if fault is not None and fault.kind == "malformed":
            self._send(200, b"<html>upstream proxy error SERVER-BODY-DETAIL</html>")
            return
        status, payload = state.complete(path, body)
        if fault is not None and fault.kind == "wrong_choices" and status == 200:
            payload["choices"].append(dict(payload["choices"][-1], index=len(payload["choices"])))
        try:
            self._send(status, payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test); nothing to tell it
