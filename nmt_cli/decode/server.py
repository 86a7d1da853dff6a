"""`nmt serve`: an HTTP translation server (Starlette on uvicorn, the `serve` extra).

Endpoints: nmt's own `POST /v1/translate`, LibreTranslate's `POST /translate` and
`GET /languages`, `GET /health` and `GET /metrics` (Prometheus text). Each model has
its own queue and worker thread (`decode/batcher.py`); a handler validates the request,
encodes its sentences off the event loop, queues them and awaits its future.

Connections: each has --header-timeout to send a request's line and headers (then 408, closed);
at most --max-connections are served, fitted under the open-file limit (raised to its hard limit
at start), and a request beyond them gets 503; running out of descriptors anyway (a flood of
connections faster than the deadline closes them) is one warning per REPEATED_WARNING_SECONDS.

Status codes: 400 malformed body (not UTF-8, not JSON, or the client went away before
sending all of it), 401/403 missing or wrong key (403 on the LibreTranslate endpoint, as
LibreTranslate answers), 404 unknown model or language pair, 408 a body that stopped
arriving (or a head that came too slowly), 413 over a size limit, 422 wrong types or values,
500 the batch's decoding failed, 503 (with Retry-After) the queue is full or the server is
stopping (uvicorn's own, without it: over --max-connections).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any

from nmt_cli.api import Model, check_texts, load
from nmt_cli.config import DecodeConfig, ServeConfig
from nmt_cli.decode.batcher import Batcher, Done, QueueFull, Stopped
from nmt_cli.decode.metrics import Metrics
from nmt_cli.errors import NmtError

# Per-request decoding options: name -> the JSON types accepted (bool is refused apart).
REQUEST_OPTIONS: dict[str, tuple[type, ...]] = {
    "beam": (int,), "nbest": (int,), "lenpen": (int, float), "max_len_a": (int, float), "max_len_b": (int,),
}
LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish",
    "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}
RETRY_AFTER_SECONDS = 1
# A request body with no byte for this long is answered 408: a stalled client must not hold
# its handler, nor keep SIGTERM's shutdown waiting for it.
BODY_STALL_SECONDS = 10.0
# Body bytes per character at the most: a character beyond U+FFFF escaped in JSON as a
# surrogate pair (\ud83d\ude00) takes 12.
BODY_BYTES_PER_CHARACTER = 12
# A warning that can recur thousands of times a second (an accept failing for want of
# descriptors, a request over --max-connections) is said at most once per this many seconds.
REPEATED_WARNING_SECONDS = 10.0
# The open-file limit is raised toward its hard limit, but no further than this: each
# connection beyond it would only cost memory.
MOST_DESCRIPTORS = 65536
# Sent (raw: no request was parsed to answer through h11) to a connection whose head is late.
HEAD_TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                         b"content-length: 37\r\nconnection: close\r\n\r\nthe request's headers came too slowly")
_log = logging.getLogger("nmt_cli.serve")
# Beyond these an output is as long as the model's positions allow anyway; larger values
# only risk overflowing the length arithmetic.
MAX_LEN_A_LIMIT, MAX_LEN_B_LIMIT = 100.0, 1_000_000


class RequestError(Exception):
    """A request the server refuses: its status and message."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


@dataclass
class ServedModel:
    name: str
    model: Model
    batcher: Batcher

    @property
    def pair(self) -> tuple[str, str]:
        return self.model.source_lang, self.model.target_lang


def require_starlette() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise NmtError("nmt serve needs Starlette and uvicorn: pip install 'nmt-cli[serve]'") from None


def read_api_key(cfg: ServeConfig) -> str | None:
    if cfg.api_key_file is None:
        return cfg.api_key
    try:
        lines = Path(cfg.api_key_file).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise NmtError(f"cannot read --api-key-file {cfg.api_key_file}: {error}") from None
    if not lines or not lines[0].strip():
        raise NmtError(f"--api-key-file {cfg.api_key_file}: the first line is empty")
    return lines[0].strip()


def named_paths(paths: tuple[str, ...]) -> list[tuple[str | None, str]]:
    """`NAME=PATH` or `PATH` -> (NAME or None, PATH)."""
    out = []
    for item in paths:
        name, sep, path = item.partition("=")
        named = bool(sep and name and "/" not in name)
        if named and not path:
            raise NmtError(f"--path {item}: no path after {name}=")
        out.append((name, path) if named else (None, item))
    return out


def load_models(cfg: ServeConfig, metrics: Metrics) -> dict[str, ServedModel]:
    served: dict[str, ServedModel] = {}
    for name, path in named_paths(cfg.paths):
        model = load(path, device=cfg.device, precision=cfg.precision, threads=cfg.threads,
                     max_tokens=cfg.max_batch_tokens, engine=cfg.engine, **vars_of(cfg.decode))
        name = name or f"{model.source_lang}-{model.target_lang}"
        if name in served:
            raise NmtError(f"two models are named {name!r}: name them with --path NAME=PATH")
        observer = metrics.for_model(name)
        batcher = Batcher(model.translate_encoded, cfg.max_batch_tokens, cfg.max_wait_ms / 1000, cfg.queue_size,
                          observer, name)
        observer.queued = lambda b=batcher: b.queued_sentences
        served[name] = ServedModel(name, model, batcher)
    return served


def vars_of(decode: DecodeConfig) -> dict[str, Any]:
    return {name: getattr(decode, name) for name in decode.__dataclass_fields__}


class Service:
    """The request handling, apart from Starlette's routing."""

    def __init__(self, cfg: ServeConfig, models: dict[str, ServedModel], metrics: Metrics, api_key: str | None) -> None:
        self.cfg = cfg
        self.models = models
        self.metrics = metrics
        self.api_key = api_key

    # --- checks shared by the endpoints ----------------------------------------------

    def authorized(self, headers: Any, body_key: Any = None) -> bool:
        if self.api_key is None:
            return True
        given = headers.get("x-api-key")
        auth = headers.get("authorization", "")
        if given is None and auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        # Compared as bytes: a header as it came (Starlette decodes headers as latin-1),
        # a body's key in UTF-8 (a lone surrogate, which has none, matches no key).
        given_bytes = _encoded(given, "latin-1") if isinstance(given, str) else None
        if given is None and isinstance(body_key, str):
            given_bytes = _encoded(body_key, "utf-8")
        key = self.api_key.encode("utf-8", "surrogateescape")  # argv's own bytes
        return given_bytes is not None and hmac.compare_digest(given_bytes, key)

    def body_limit(self) -> int:
        return BODY_BYTES_PER_CHARACTER * self.cfg.max_total_chars + 65536  # and room for the options

    def check_sizes(self, texts: list[str]) -> None:
        cfg = self.cfg
        if len(texts) > cfg.max_sentences:
            raise RequestError(413, f"{len(texts)} sentences; a request may have at most {cfg.max_sentences}")
        for number, text in enumerate(texts, 1):
            if len(text) > cfg.max_chars:
                raise RequestError(413, f"sentence {number} has {len(text)} characters; at most {cfg.max_chars}")
        total = sum(len(t) for t in texts)
        if total > cfg.max_total_chars:
            raise RequestError(413, f"{total} characters in the request; at most {cfg.max_total_chars}")

    def checked_texts(self, texts: list[Any], status: int, item: str) -> list[str]:
        """`check_texts` for both endpoints, its "texts item N" named as the endpoint names them."""
        try:
            return check_texts(texts)
        except (TypeError, ValueError) as error:
            raise RequestError(status, str(error).replace("texts item", item)) from None

    def decode_settings(self, served: ServedModel, body: dict[str, Any]) -> DecodeConfig:
        options = {}
        for name, types in REQUEST_OPTIONS.items():
            if name in body and body[name] is not None:
                value = body[name]
                if isinstance(value, bool) or not isinstance(value, types):
                    kind = "an integer" if types == (int,) else "a number"
                    raise RequestError(422, f"{name} must be {kind} (got {json.dumps(value)[:50]})")
                options[name] = value
        if options.get("max_len_a", 0) > MAX_LEN_A_LIMIT or options.get("max_len_b", 0) > MAX_LEN_B_LIMIT:
            raise RequestError(422, f"max_len_a may be at most {MAX_LEN_A_LIMIT:g} and max_len_b at most {MAX_LEN_B_LIMIT}")
        if options.get("beam", 1) > self.cfg.max_beam or options.get("nbest", 1) > self.cfg.max_beam:
            raise RequestError(422, f"beam and nbest may be at most {self.cfg.max_beam} on this server")
        if "nbest" in options and "beam" not in options:
            options["beam"] = max(served.model.cfg.decode.beam, options["nbest"])
        try:
            return served.model.decode_config(**options)
        except NmtError as error:  # it names the command line's flags: "--max-len-a" -> "max_len_a"
            message = re.sub(r"--([a-z][a-z0-9-]*)", lambda flag: flag[1].replace("-", "_"), str(error))
            raise RequestError(422, message) from None

    async def translate(self, served: ServedModel, texts: list[str], settings: DecodeConfig) -> Done:
        from starlette.concurrency import run_in_threadpool

        encoded = await run_in_threadpool(served.model.encode, texts)
        tokens = sum(len(ids) for ids in encoded if ids is not None)
        try:
            future = served.batcher.submit(texts, encoded, tokens, settings)
        except QueueFull as error:
            raise RequestError(503, f"{error}; retry later", {"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
        except Stopped as error:
            raise RequestError(503, str(error), {"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
        try:
            done = await asyncio.wrap_future(future)
        except Exception as error:  # the batch's decoding failed: this request fails, the server goes on
            raise RequestError(500, f"translation failed: {type(error).__name__}: {error}") from None
        return done

    # --- nmt's own API ---------------------------------------------------------------

    async def v1_translate(self, headers: Any, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise RequestError(422, "the body must be a JSON object with \"text\": [sentences]")
        served = self.pick_model(body.get("model"))
        texts = body.get("text")
        if not isinstance(texts, list):
            raise RequestError(422, "\"text\" must be a list of strings")
        texts = self.checked_texts(texts, 422, "text item")
        self.check_sizes(texts)
        settings = self.decode_settings(served, body)
        unknown = sorted(set(body) - {"text", "model", *REQUEST_OPTIONS})
        if unknown:
            raise RequestError(422, f"unknown field(s) {', '.join(unknown)}; known: text, model, "
                                    f"{', '.join(REQUEST_OPTIONS)}")
        started = time.monotonic()
        done = await self.translate(served, texts, settings)
        results = done.results
        response: dict[str, Any] = {
            "model": served.name,
            "translations": [r.text for r in results],
            "scores": [r.score for r in results],
        }
        if settings.nbest > 1:
            response["nbest"] = [[{"text": h.text, "score": h.score} for h in r.hypotheses] for r in results]
        response["timing"] = {
            "queue_ms": round(done.queue_seconds * 1000, 3),
            "decode_ms": round(done.decode_seconds * 1000, 3),
            "total_ms": round((time.monotonic() - started) * 1000, 3),
            "batch_sentences": done.batch_sentences,
        }
        return response

    def route(self, body: Any, libre: bool) -> ServedModel:
        """The model a request is for (RequestError if none is)."""
        if not isinstance(body, dict):
            raise RequestError(422, "the body must be a JSON object")
        return self.pick_pair(body.get("source"), body.get("target"))[0] if libre else self.pick_model(body.get("model"))

    def pick_model(self, name: Any) -> ServedModel:
        if name is None:
            if len(self.models) == 1:
                return next(iter(self.models.values()))
            raise RequestError(422, f"several models are served: give \"model\" (one of {', '.join(self.models)})")
        if not isinstance(name, str):
            raise RequestError(422, "\"model\" must be a string")
        if name not in self.models:
            raise RequestError(404, f"no model named {name!r} (served: {', '.join(self.models)})")
        return self.models[name]

    # --- LibreTranslate --------------------------------------------------------------

    def pick_pair(self, source: Any, target: Any) -> tuple[ServedModel, bool]:
        """The model for a language pair; and whether the source was "auto"."""
        if not isinstance(source, str) or not isinstance(target, str) or not source or not target:
            raise RequestError(400, "Invalid request: missing source or target parameter")
        auto = source == "auto"
        matches = [m for m in self.models.values() if m.pair[1] == target and (auto or m.pair[0] == source)]
        if not matches:
            pairs = ", ".join(f"{a}-{b}" for a, b in (m.pair for m in self.models.values()))
            raise RequestError(400, f"no model translates {source} to {target}; served: {pairs}")
        if len(matches) > 1:
            names = ", ".join(f"{m.name} ({m.pair[0]}-{m.pair[1]})" for m in matches)
            raise RequestError(400, f"several models translate {source} to {target}: {names}; give source, or "
                                    "pick one by name with POST /v1/translate")
        return matches[0], auto

    async def libre_translate(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise RequestError(400, "Invalid request: the body must be an object")
        q = body.get("q")
        if q is None:
            raise RequestError(400, "Invalid request: missing q parameter")
        items = q if isinstance(q, list) else [q]
        if not all(isinstance(item, str) for item in items):
            raise RequestError(400, "Invalid request: q must be a string or a list of strings")
        text_format = body.get("format", "text")
        if text_format != "text":
            raise RequestError(400, f"format {text_format!r} is not supported (only \"text\")")
        served, auto = self.pick_pair(body.get("source"), body.get("target"))
        alternatives = body.get("alternatives", 0)
        if isinstance(alternatives, str):  # a form field
            alternatives = form_count(alternatives, self.cfg.max_beam)
        if isinstance(alternatives, bool) or not isinstance(alternatives, int) or alternatives < 0:
            raise RequestError(400, "Invalid request: alternatives must be a non-negative integer")
        # LibreTranslate keeps a text's line breaks: each line is one sentence here.
        lines = [item.replace("\r\n", "\n").replace("\r", "\n").split("\n") for item in items]
        flat = self.checked_texts([line for item in lines for line in item], 400, "Invalid request: sentence")
        self.check_sizes(flat)
        settings = self.decode_settings(served, {"nbest": alternatives + 1} if alternatives else {})
        done = await self.translate(served, flat, settings)
        results, at, texts, others = done.results, 0, [], []
        for item in lines:
            own = results[at : at + len(item)]
            at += len(item)
            texts.append("\n".join(r.text for r in own))
            others.append(["\n".join(r.hypotheses[k].text if k < len(r.hypotheses) else r.text for r in own)
                           for k in range(1, alternatives + 1)])
        response: dict[str, Any] = {"translatedText": texts if isinstance(q, list) else texts[0]}
        if alternatives:
            response["alternatives"] = others if isinstance(q, list) else others[0]
        if auto:
            detected = {"confidence": 100.0, "language": served.pair[0]}
            response["detectedLanguage"] = [detected] * len(items) if isinstance(q, list) else detected
        return response

    def languages(self) -> list[dict[str, Any]]:
        targets: dict[str, list[str]] = {}
        for source, target in (m.pair for m in self.models.values()):
            targets.setdefault(source, [])
            targets.setdefault(target, [])
            if target not in targets[source]:
                targets[source].append(target)
        return [{"code": code, "name": LANGUAGE_NAMES.get(code, code), "targets": sorted(ts)}
                for code, ts in sorted(targets.items())]


def _encoded(text: str, encoding: str) -> bytes | None:
    try:
        return text.encode(encoding)
    except UnicodeEncodeError:
        return None


def form_count(text: str, limit: int) -> int | str:
    """A form field of ASCII digits as an int (one above `limit` as limit + 1: int() refuses
    more than 4300 digits); any other text as it is, for the caller to refuse."""
    if not (text.isascii() and text.isdigit()):  # "²" is a digit too, but not int's
        return text
    digits = text.lstrip("0") or "0"
    return int(digits) if len(digits) <= len(str(limit)) else limit + 1


async def read_body(request: Any, limit: int, stall_seconds: float = BODY_STALL_SECONDS) -> bytes:
    from starlette.requests import ClientDisconnect

    size, chunks = 0, []
    stream = request.stream()
    while True:
        try:
            chunk = await asyncio.wait_for(anext(stream), stall_seconds)
        except StopAsyncIteration:
            return b"".join(chunks)
        except asyncio.TimeoutError:
            raise RequestError(408, f"no byte of the request body came for {stall_seconds:g} s") from None
        except ClientDisconnect:  # nobody reads the answer; no traceback for it either
            raise RequestError(400, "the client closed the connection before its body was complete") from None
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the request body is larger than {limit} bytes")
        chunks.append(chunk)


def parse_body(raw: bytes, content_type: str, forms: bool) -> Any:
    """JSON; with `forms` (LibreTranslate's clients send all three), also a URL-encoded or a
    multipart form, by the Content-Type."""
    media_type = content_type.partition(";")[0].strip().lower()
    if forms and media_type == "multipart/form-data":
        return parse_multipart(raw, content_type)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(400, f"the request body is not valid UTF-8 (byte {error.start})") from None
    if forms and media_type == "application/x-www-form-urlencoded":
        try:  # percent-escapes may spell invalid UTF-8 too: refused, not replaced by U+FFFD
            fields = urllib.parse.parse_qs(text, keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            raise RequestError(400, "the form is not valid UTF-8 (once its %-escapes are decoded)") from None
        return form_fields(fields)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(400, f"malformed JSON: {error}") from None
    except RecursionError:  # "[[[[..." deeper than Python's stack
        raise RequestError(400, "malformed JSON: nested too deeply") from None
    except ValueError as error:  # a number of over 4300 digits, which int() refuses
        raise RequestError(400, f"unreadable JSON: {error}") from None


def parse_multipart(raw: bytes, content_type: str) -> dict[str, Any]:
    """A multipart/form-data body (`curl -F`) -> its fields, as form_fields gives them."""
    head = b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n"
    message = BytesParser(policy=HTTP).parsebytes(head + raw)
    if not message.is_multipart() or message.defects:
        raise RequestError(400, "malformed multipart form (no boundary, or a part that does not end)")
    fields: dict[str, list[str]] = {}
    for number, part in enumerate(message.iter_parts(), 1):
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            raise RequestError(400, f"part {number} of the multipart form has no name")
        try:
            value = (part.get_payload(decode=True) or b"").decode("utf-8")
        except UnicodeDecodeError as error:
            raise RequestError(400, f"form field {name} is not valid UTF-8 (byte {error.start})") from None
        fields.setdefault(name, []).append(value)
    return form_fields(fields)


def form_fields(fields: dict[str, list[str]]) -> dict[str, Any]:
    """A form's fields: each its last value, but a repeated `q` a list (several texts)."""
    return {key: values if key == "q" and len(values) > 1 else values[-1] for key, values in fields.items()}


def build_app(service: Service, on_shutdown: Callable[[], None]) -> Any:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    def error_response(error: RequestError) -> JSONResponse:
        return JSONResponse({"error": str(error)}, status_code=error.status, headers=error.headers)

    def endpoint(name: str, libre: bool, handle: Callable[[Any, Any], Awaitable[Any]]):
        async def run(request):
            started = time.monotonic()
            model_metrics = None
            try:
                if not libre and not service.authorized(request.headers):  # before reading the body
                    raise RequestError(401, "a valid API key is needed (Authorization: Bearer KEY or X-API-Key)")
                raw = await read_body(request, service.body_limit())
                body = parse_body(raw, request.headers.get("content-type", ""), forms=libre)
                key = body.get("api_key") if isinstance(body, dict) else None
                if libre and not service.authorized(request.headers, key):
                    raise RequestError(403, "Invalid API key")
                with contextlib.suppress(RequestError):
                    model_metrics = service.metrics.models.get(service.route(body, libre).name)
                response = JSONResponse(await handle(request.headers, body))
            except RequestError as error:
                response = error_response(error)
            except asyncio.CancelledError:  # a second Ctrl-C: uvicorn ends without waiting for this request
                response = error_response(RequestError(503, "the server was stopped before this request was "
                                                            "translated", {"Retry-After": str(RETRY_AFTER_SECONDS)}))
            except Exception as error:  # a bug, not the client's fault: 500, logged, and the server goes on
                _log.exception("error handling %s", request.url.path)
                response = error_response(RequestError(500, f"internal error: {type(error).__name__}: {error}"))
            if model_metrics is not None:
                model_metrics.request_done(name, response.status_code, time.monotonic() - started)
            else:
                service.metrics.refused(name, response.status_code)
            return response
        return run

    async def v1(headers, body):
        return await service.v1_translate(headers, body)

    async def libre(headers, body):
        return await service.libre_translate(body)

    async def languages(request):
        return JSONResponse(service.languages())

    async def health(request):
        return JSONResponse({"status": "ok", "models": [
            {"name": m.name, "source": m.pair[0], "target": m.pair[1], "queued_sentences": m.batcher.queued_sentences}
            for m in service.models.values()]})

    async def metrics(request):
        if not service.authorized(request.headers):
            return JSONResponse({"error": "a valid API key is needed"}, status_code=401)
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        try:
            yield
        except asyncio.CancelledError:  # a second Ctrl-C: uvicorn ends at once, and serve() stops the batchers
            return
        # uvicorn has stopped accepting and answered every open request; finish what is queued.
        await asyncio.get_running_loop().run_in_executor(None, on_shutdown)

    return Starlette(routes=[
        Route("/v1/translate", endpoint("v1", False, v1), methods=["POST"]),
        Route("/translate", endpoint("libre", True, libre), methods=["POST"]),
        Route("/languages", languages, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ], lifespan=lifespan)


def serve(cfg: ServeConfig, announce: Callable[[str], None]) -> None:
    """Load the models, listen, and serve until SIGTERM/SIGINT; then drain the queues."""
    require_starlette()
    import uvicorn

    api_key = read_api_key(cfg)
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    addresses = resolve(cfg.host, cfg.port, f"{host}:{cfg.port}")  # a bad --host before the models load
    metrics = Metrics()
    models = load_models(cfg, metrics)
    listeners = listen(addresses, cfg.port, f"{host}:{cfg.port}")
    port = listeners[0].getsockname()[1]  # --port 0: the one the system chose
    for served in models.values():
        served.batcher.start()

    def stop_batchers() -> None:
        for served in models.values():
            served.batcher.stop()

    def stop_waiting() -> None:
        for served in models.values():
            served.batcher.begin_stopping()

    app = build_app(Service(cfg, models, metrics, api_key), stop_batchers)
    names = ", ".join(f"{m.name} ({m.pair[0]}->{m.pair[1]})" for m in models.values())
    announce(f"serving {names} on http://{host}:{port}")
    bound = max_connections(cfg.max_connections, raise_descriptor_limit())
    # h11, not "auto" (httptools where installed): the head deadline reads h11's parser state,
    # and parsing speed is nothing next to decoding. uvicorn refuses a request with 503 once the
    # open connections, the asking one counted, reach limit_concurrency.
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=None,
                            http=head_deadline_protocol(cfg.header_timeout),
                            limit_concurrency=None if bound is None else bound + 1)
    logging.getLogger("uvicorn.error").addFilter(ThrottledWarning("Exceeded concurrency limit.",
                                                                  "request(s) over --max-connections answered 503"))
    server = draining_server(config, stop_waiting)
    try:
        server.run(sockets=listeners)
    finally:
        for listener in listeners:
            listener.close()
        stop_batchers()


def draining_server(config: Any, stop_waiting: Callable[[], None]) -> Any:
    """A uvicorn server whose SIGTERM (or Ctrl-C) also has the batchers translate what is
    queued without waiting for more: uvicorn stops them (the lifespan's end) only once every
    open request is answered, and those wait on them, up to --max-wait-ms for each batch."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def serve(self, sockets: Any = None) -> None:
            asyncio.get_running_loop().set_exception_handler(accept_error_handler())
            await super().serve(sockets=sockets)

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            # From a thread: the signal may arrive while the event loop's thread holds a batcher's lock.
            threading.Thread(target=stop_waiting, name="nmt-stop-waiting", daemon=True).start()

    return DrainingServer(config)


def head_deadline_protocol(header_timeout: float) -> type:
    """uvicorn's h11 protocol, closing a connection whose request line and headers have not all
    come within `header_timeout` of its connecting or of its previous response (a 408 first
    where a head has begun and no response is under way). uvicorn's own keep-alive timeout stops at the first byte,
    so without this a client sending a header line now and then holds its connection forever."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadDeadlineProtocol(H11Protocol):
        head_timer: asyncio.TimerHandle | None = None
        head_begun = False  # bytes of a request's head came since connecting or the last response

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.await_head()

        def data_received(self, data: bytes) -> None:
            self.head_begun = True
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:  # the head came (or was refused): no deadline for it now
                self.cancel_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.IDLE:  # keep-alive: the next request's head has its own deadline
                self.await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self.cancel_head_timer()
            super().connection_lost(exc)

        def await_head(self) -> None:
            self.cancel_head_timer()
            self.head_begun = False
            if not self.transport.is_closing():
                self.head_timer = self.loop.call_later(header_timeout, self.head_overdue)

        def cancel_head_timer(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def head_overdue(self) -> None:
            self.head_timer = None
            if self.transport.is_closing():
                return
            # A 408 only to a client that began a head and has no response under way: one idle
            # between requests might take it for the answer to the next request it sends.
            if self.head_begun and self.conn.our_state is h11.IDLE and self.conn.their_state is h11.IDLE:
                self.transport.write(HEAD_TIMEOUT_RESPONSE)
            self.transport.close()

    return HeadDeadlineProtocol


def raise_descriptor_limit() -> int | None:
    """The soft limit on open descriptors, first raised to the hard one (at most MOST_DESCRIPTORS),
    as nginx and others do: each connection holds a descriptor. None where there is no such
    limit to read (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MOST_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, MOST_DESCRIPTORS)
    if soft == resource.RLIM_INFINITY:
        return MOST_DESCRIPTORS
    if soft < wanted:
        with contextlib.suppress(ValueError, OSError):  # macOS refuses more than kern.maxfilesperproc
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    return soft


def max_connections(asked: int | None, descriptor_limit: int | None) -> int | None:
    """The connections to serve at most: --max-connections, or what the descriptors not yet open
    allow, less a tenth kept free: a connection over the bound holds one until its 503 is sent,
    and the server opens a few more files and sockets as it runs."""
    if descriptor_limit is None:
        return asked
    try:
        already_open = len(os.listdir("/dev/fd"))
    except OSError:
        already_open = 0
    fits = max(1, (descriptor_limit - already_open) * 9 // 10)
    if asked is not None and asked > fits:
        raise NmtError(f"--max-connections {asked} does not fit under the open-file limit ({descriptor_limit}, "
                       f"ulimit -n): at most {fits}")
    return fits if asked is None else asked


class Throttle:
    """Counts a recurring event and says when to report it: at most once per REPEATED_WARNING_SECONDS."""

    def __init__(self) -> None:
        self.count = 0
        self.reported = -float("inf")

    def due(self) -> int | None:
        """None, or how many times the event came since the last report (this one included)."""
        self.count += 1
        now = time.monotonic()
        if now - self.reported < REPEATED_WARNING_SECONDS:
            return None
        count, self.count, self.reported = self.count, 0, now
        return count


class ThrottledWarning(logging.Filter):
    """A log filter letting a recurring message through once per REPEATED_WARNING_SECONDS, with a count."""

    def __init__(self, message: str, counted: str) -> None:
        super().__init__()
        self.message, self.counted, self.throttle = message, counted, Throttle()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != self.message:
            return True
        count = self.throttle.due()
        if count is None:
            return False
        record.msg, record.args = f"{count} {self.counted} (said at most once per {REPEATED_WARNING_SECONDS:g} s)", ()
        return True


def accept_error_handler() -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """An event loop exception handler saying "out of descriptors" once per REPEATED_WARNING_SECONDS:
    asyncio logs a traceback for each accept that fails so, thousands a second (it retries
    each second, and the waiting connections stay in the listen backlog until then)."""
    throttle = Throttle()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message, error = context.get("message", ""), context.get("exception")
        if "._start_serving(" in message and isinstance(error, ValueError) and "file descriptor" in str(error):
            # Each failed accept also scheduled a retry of its own (CPython gh-151615); those
            # still due when shutdown closes the listener find no descriptor: nothing is wrong.
            return
        if message != "socket.accept() out of system resource":
            loop.default_exception_handler(context)
            return
        count = throttle.due()
        if count is not None:
            _log.warning("cannot accept connections: %s (%d time(s); said at most once per %g s); they wait "
                         "until open ones close", context.get("exception"), count, REPEATED_WARNING_SECONDS)

    return handle


def resolve(host: str, port: int, shown: str) -> list[tuple]:
    """The addresses to listen on for host:port, each once, in getaddrinfo's order: one
    name may have several ("localhost": 127.0.0.1 and ::1), and asyncio binds them all."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP,
                                       flags=socket.AI_PASSIVE)
    except OSError as error:
        raise NmtError(f"cannot listen on {shown}: {error.strerror or error}") from None
    except UnicodeError as error:  # a name the IDNA codec refuses: an empty label, or one over 63 characters
        raise NmtError(f"cannot listen on {shown}: not a valid host name ({error})") from None
    return list(dict.fromkeys(addresses))


def listen(addresses: list[tuple], port: int, shown: str) -> list[socket.socket]:
    """Sockets listening on `resolve`'s addresses; with port 0, all on the port the system
    chose for the first. Bound here rather than by uvicorn: a port in use is one `error:`
    line before anything is announced (uvicorn logs it and exits 3)."""
    listeners: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in addresses:
            if listeners and port == 0:
                address = (address[0], listeners[0].getsockname()[1], *address[2:])
            listeners.append(_listening_socket(family, kind, proto, address))
    except OSError as error:
        for listener in listeners:
            listener.close()
        raise NmtError(f"cannot listen on {shown}: {error.strerror or error}") from None
    return listeners


def _listening_socket(family: int, kind: int, proto: int, address: tuple) -> socket.socket:
    """A socket bound to `address` and listening, set up as uvicorn sets up its own."""
    # Made with proto IPPROTO_TCP, not 0 (as socket.create_server makes it): only then does
    # asyncio turn Nagle's algorithm off on each connection, without which a response's
    # body waits for the client's delayed ACK of its headers, 40 ms on Linux.
    listener = socket.socket(family, kind, proto)
    try:
        if os.name != "nt":  # no waiting out TIME_WAIT (on Windows it would share the port)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        listener.bind(address)
        listener.listen(2048)  # uvicorn's backlog
        return listener
    except BaseException:
        listener.close()
        raise
