"""`nmt serve`: a real server in a subprocess on a free loopback port, called over HTTP.

Its translations must be those of `nmt translate` on the same lines and options; every
refused request gets its documented status code and the server answers the next one;
SIGTERM answers every queued request before the server exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from click.testing import CliRunner  # noqa: E402
from model_utils import ct2_installed  # noqa: E402

from nmt_cli.cli import main  # noqa: E402
from nmt_cli.decode.batcher import Batcher, QueueFull  # noqa: E402
from test_translate import FAST, generated_sentences, nmt, one_thread, run_dir  # noqa: E402,F401 (fixtures)

KEY = "s3cret"
DECODE = ["--max-len-a", "1", "--max-len-b", "5", "--threads", "1"]
AUTH = {"Authorization": f"Bearer {KEY}"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, method: str, path: str, body: bytes | dict | None = None, headers: dict | None = None,
            timeout: float = 60) -> tuple[int, dict, object]:
    """(status, headers, JSON or text) of one request on a connection of its own."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        connection.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        raw = response.read()
        kind = response.getheader("Content-Type", "")
        return response.status, dict(response.getheaders()), json.loads(raw) if "json" in kind else raw.decode()
    finally:
        connection.close()


class Server:
    def __init__(self, run_dir: Path, *flags: str, open_files: int | None = None) -> None:
        """`open_files`: the server's open-file limit, soft and hard (so it cannot raise it)."""
        self.port = free_port()

        def limit_open_files() -> None:  # in the child, before it runs nmt
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        self.process = subprocess.Popen(
            [sys.executable, "-m", "nmt_cli", "serve", "--path", str(run_dir), "--port", str(self.port), *DECODE, *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=None if open_files is None else limit_open_files)
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the server did not start: {self.process.stderr.read().decode()}")
            time.sleep(0.2)

    def request(self, method: str, path: str, body: bytes | dict | None = None, headers: dict | None = None,
                timeout: float = 60) -> tuple[int, dict, object]:
        return request(self.port, method, path, body, headers, timeout)

    def translate(self, texts: list[str], **options) -> tuple[int, dict, object]:
        return self.request("POST", "/v1/translate", {"text": texts, **options}, AUTH)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


@pytest.fixture(scope="module")
def server(run_dir):
    server = Server(run_dir, "--api-key", KEY, "--max-sentences", "40", "--max-chars", "120",
                    "--max-total-chars", "1500", "--max-beam", "5", "--max-wait-ms", "20")
    yield server
    server.stop()


def cli_lines(run_dir: Path, texts: list[str], *flags: str) -> list[str]:
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, *flags, input="".join(t + "\n" for t in texts))
    assert result.exit_code == 0, result.output
    return result.stdout.split("\n")[:-1]


def test_translations_equal_nmt_translate_on_the_same_input_and_options(server, run_dir):
    texts = generated_sentences(25, seed=11) + ["", "  "]
    for options, flags in (({}, ()), ({"beam": 3, "lenpen": 0.6}, ("--beam", "3", "--lenpen", "0.6"))):
        status, _, body = server.translate(texts, **options)
        assert status == 200, body
        assert body["translations"] == cli_lines(run_dir, texts, *flags)
        assert len(body["scores"]) == len(texts) and body["scores"][-1] is None
        assert body["timing"]["batch_sentences"] >= len(texts)
    status, _, body = server.translate(texts[:4], beam=3, nbest=3)
    jsonl = [json.loads(line) for line in cli_lines(run_dir, texts[:4], "--beam", "3", "--nbest", "3", "--output-format", "jsonl")]
    assert [[h["text"] for h in n] for n in body["nbest"]] == [[h["hyp"] for h in r["nbest"]] for r in jsonl]


def test_concurrent_clients_each_get_their_own_translations_in_order(server, run_dir):
    texts = generated_sentences(48, seed=12)
    expected = dict(zip(texts, cli_lines(run_dir, texts)))
    answers: dict[int, list[list[str]]] = {k: [] for k in range(12)}
    failures: list[object] = []

    def client(k: int) -> None:
        mine = texts[k * 4 : k * 4 + 4]
        for rotation in range(3):  # each client's requests, one after another, in different orders
            request = mine[rotation:] + mine[:rotation]
            status, _, body = server.translate(request)
            if status != 200:
                failures.append(body)
                return
            answers[k].append((request, body["translations"]))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    for k in range(12):
        assert len(answers[k]) == 3
        for request, translations in answers[k]:
            assert translations == [expected[t] for t in request]
    metrics = server.request("GET", "/metrics", headers=AUTH)[2]
    batches = [line for line in metrics.splitlines() if line.startswith("nmt_batch_sentences_count")]
    requests = [line for line in metrics.splitlines() if line.startswith('nmt_requests_total{model="en-de",endpoint="v1",status="200"}')]
    assert int(requests[0].split()[-1]) >= 36 and int(batches[0].split()[-1]) < int(requests[0].split()[-1]), metrics


@pytest.mark.parametrize("path, body, headers, status, message", [
    ("/v1/translate", {"text": ["a"]}, {}, 401, "API key"),
    ("/v1/translate", {"text": ["a"]}, {"X-API-Key": "wrong"}, 401, "API key"),
    ("/v1/translate", b'{"text": ["a"', AUTH, 400, "malformed JSON"),
    ("/v1/translate", b'{"text": ["\xff\xfe"]}', AUTH, 400, "not valid UTF-8"),
    ("/v1/translate", b"[" * 50000, AUTH, 400, "malformed JSON: nested too deeply"),
    ("/v1/translate", {"text": "a"}, AUTH, 422, "list of strings"),
    ("/v1/translate", {"text": ["a", 3]}, AUTH, 422, "item 2 is int"),
    ("/v1/translate", {"text": ["a"], "beam": "4"}, AUTH, 422, "beam must be an integer"),
    ("/v1/translate", {"text": ["a"], "beam": 6}, AUTH, 422, "at most 5"),
    ("/v1/translate", {"text": ["a"], "beam": 2, "nbest": 3}, AUTH, 422, "nbest must be between 1 and beam"),
    ("/v1/translate", {"text": ["a"], "beam": -3}, AUTH, 422, "beam must be >= 1 (got -3)"),
    ("/v1/translate", {"text": ["a"], "max_len_a": -1}, AUTH, 422, "max_len_a and max_len_b must be >= 0"),
    ("/v1/translate", b'{"text": ["a"], "beam": ' + b"9" * 4301 + b"}", AUTH, 400, "unreadable JSON"),
    ("/v1/translate", {"text": ["a"], "model": "fr-en"}, AUTH, 404, "no model named"),
    ("/v1/translate", b'{"text": ["a \\ud800"]}', AUTH, 422, "lone surrogate"),
    ("/v1/translate", {"text": ["a"], "max_len_a": 1e308}, AUTH, 422, "max_len_a may be at most"),
    ("/v1/translate", {"text": ["a"], "lenpen": float("nan")}, AUTH, 422, "finite"),
    ("/v1/translate", {"text": ["a"], "colour": 1}, AUTH, 422, "unknown field"),
    ("/v1/translate", {"text": ["a"] * 41}, AUTH, 413, "at most 40"),
    ("/v1/translate", {"text": ["a" * 121]}, AUTH, 413, "121 characters"),
    ("/v1/translate", {"text": ["a" * 100] * 16}, AUTH, 413, "1600 characters in the request"),
    ("/translate", {"q": "a", "source": "en", "target": "de", "api_key": "wrong"}, {}, 403, "Invalid API key"),
    ("/translate", {"q": "a", "source": "en", "target": "fr", "api_key": KEY}, {}, 400, "no model translates en to fr"),
    ("/translate", {"source": "en", "target": "de", "api_key": KEY}, {}, 400, "missing q"),
    ("/translate", {"q": "<b>a</b>", "source": "en", "target": "de", "format": "html", "api_key": KEY}, {}, 400, "html"),
    ("/translate", b"[" * 50000, {}, 400, "malformed JSON: nested too deeply"),
    ("/translate", {"q": ["a", "b\nc \ud800"], "source": "en", "target": "de", "api_key": KEY}, {}, 400,
     "sentence 3 is not valid Unicode (character 3 is a lone surrogate)"),
    ("/translate", {"q": "a", "source": "en", "target": "de", "alternatives": "\u00b2", "api_key": KEY}, {}, 400,
     "alternatives must be a non-negative integer"),
    ("/translate", f"q=a&source=en&target=de&alternatives=%C2%B2&api_key={KEY}".encode(), FORM, 400,
     "alternatives must be a non-negative integer"),
    ("/translate", f"q=a&source=en&target=de&alternatives={'1' * 4301}&api_key={KEY}".encode(), FORM, 422,
     "at most 5"),
    ("/translate", f"q=%FF%FE&source=en&target=de&api_key={KEY}".encode(), FORM, 400, "not valid UTF-8"),
    ("/translate", b'{"q": "a", "source": "en", "target": "de", "api_key": "\\ud800"}', {}, 403, "Invalid API key"),
    ("/translate", b"--x\r\nContent-Disposition: form-data\r\n\r\na\r\n--x--\r\n",
     {"Content-Type": "multipart/form-data; boundary=x"}, 400, "part 1 of the multipart form has no name"),
])
def test_refused_requests_get_their_status_and_the_server_answers_the_next(server, path, body, headers, status, message):
    got, _, answer = server.request("POST", path, body, headers)
    assert (got, message in answer["error"]) == (status, True), answer
    assert server.translate(["the dog runs"])[0] == 200


def test_the_libretranslate_endpoint_has_its_request_and_response_shapes(server, run_dir):
    texts = generated_sentences(3, seed=13)
    expected = cli_lines(run_dir, texts)
    status, _, body = server.request("POST", "/translate", {"q": texts[0], "source": "en", "target": "de", "api_key": KEY})
    assert (status, body) == (200, {"translatedText": expected[0]})
    status, _, body = server.request("POST", "/translate", {"q": texts, "source": "auto", "target": "de",
                                                            "format": "text", "api_key": KEY})
    assert status == 200 and body["translatedText"] == expected
    assert body["detectedLanguage"] == [{"confidence": 100.0, "language": "en"}] * 3
    # A form-encoded request (as LibreTranslate also takes), with a text of two lines.
    form = f"q={texts[0]}%0A{texts[1]}&source=en&target=de&api_key={KEY}&alternatives=2".encode()
    status, _, body = server.request("POST", "/translate", form, FORM)
    assert status == 200 and body["translatedText"] == f"{expected[0]}\n{expected[1]}"
    assert isinstance(body["alternatives"], list) and len(body["alternatives"]) == 2
    # The same as a multipart form (curl -F), with q given twice: two texts. Media types are
    # case-insensitive.
    fields = [("q", texts[0]), ("q", texts[1]), ("source", "en"), ("target", "de"), ("api_key", KEY)]
    multipart = b"".join(f'--b0undary\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
                         for name, value in fields) + b"--b0undary--\r\n"
    status, _, body = server.request("POST", "/translate", multipart,
                                     {"Content-Type": "Multipart/Form-Data; boundary=b0undary"})
    assert (status, body) == (200, {"translatedText": expected[:2]})
    status, _, body = server.request("POST", "/translate", f"q={texts[2]}&source=en&target=de&api_key={KEY}".encode(),
                                     {"Content-Type": "Application/X-WWW-Form-Urlencoded; charset=UTF-8"})
    assert (status, body) == (200, {"translatedText": expected[2]})
    status, _, languages = server.request("GET", "/languages")
    assert status == 200 and {"code": "en", "name": "English", "targets": ["de"]} in languages
    assert all(set(entry) == {"code", "name", "targets"} for entry in languages)


# A sample line of Prometheus' text format: name, labels whose values escape \\, " and line
# feeds, a number.
PROMETHEUS_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
PROMETHEUS_SAMPLE = re.compile(rf"[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{{{PROMETHEUS_LABEL}(?:,{PROMETHEUS_LABEL})*\}})? \S+")


def test_metrics_are_prometheus_text(server):
    status, headers, text = server.request("GET", "/metrics", headers=AUTH)
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("nmt_requests_total", "nmt_sentences_total", "nmt_queue_sentences", "nmt_batch_sentences_bucket",
                 "nmt_request_latency_seconds_bucket", "nmt_request_latency_seconds_count"):
        assert any(line.startswith(name + "{") for line in text.splitlines()), name
    for line in text.splitlines():  # every sample line: name{labels} number
        if not line.startswith("#"):
            assert PROMETHEUS_SAMPLE.fullmatch(line), line
            float(line.rsplit(" ", 1)[1])


def test_metrics_escape_a_model_name_that_holds_quotes_backslashes_or_line_feeds():
    from nmt_cli.decode.metrics import Metrics

    metrics = Metrics()
    model = metrics.for_model('a"b\\c\nd')  # --path 'a"b\c<LF>d=run/'
    model.batch_done(3)
    model.request_done("v1", 200, 0.01)
    samples = [line for line in metrics.render().splitlines() if not line.startswith("#")]
    assert samples and all(PROMETHEUS_SAMPLE.fullmatch(line) for line in samples), samples
    assert 'nmt_sentences_total{model="a\\"b\\\\c\\nd"} 3' in samples


def test_api_keys_are_compared_as_the_bytes_sent():
    """A header arrives as bytes, which Starlette gives as latin-1 text; a key outside ASCII
    sent in UTF-8 (as curl sends it) must match, and a body's lone surrogate, which has no
    UTF-8, matches nothing."""
    from nmt_cli.decode.server import Service

    service = Service(None, {}, None, "clé")
    as_sent = "clé".encode().decode("latin-1")
    assert service.authorized({"x-api-key": as_sent}) and service.authorized({"authorization": f"Bearer {as_sent}"})
    assert service.authorized({}, "clé")
    assert not service.authorized({"x-api-key": "clé"}) and not service.authorized({}, "cl\ud800")
    assert not service.authorized({}, None) and not Service(None, {}, None, KEY).authorized({}, "\ud800")


def test_the_body_limit_fits_the_most_characters_escaped_as_json_does_by_default():
    from types import SimpleNamespace

    from nmt_cli.decode.server import Service

    cfg = SimpleNamespace(max_total_chars=50_000)
    widest = json.dumps({"text": ["\U0001F600" * 2_000] * 25, "beam": 5})  # 50,000 characters, 12 bytes each
    assert len(widest.encode()) <= Service(cfg, {}, None, None).body_limit()


def test_a_body_that_stops_arriving_is_408_and_one_cut_short_is_400_without_a_traceback():
    from starlette.requests import ClientDisconnect

    from nmt_cli.decode.server import RequestError, read_body

    class Stream:
        def __init__(self, end: BaseException | None) -> None:
            self.end = end

        async def stream(self):
            yield b'{"text": '
            if self.end is None:
                await asyncio.sleep(3600)
            raise self.end

    for end, status, message in ((None, 408, "no byte of the request body came for 0.05 s"),
                                 (ClientDisconnect(), 400, "closed the connection")):
        with pytest.raises(RequestError, match=re.escape(message)) as refused:
            asyncio.run(read_body(Stream(end), 1000, stall_seconds=0.05))
        assert refused.value.status == status


def test_sigterm_does_not_wait_for_a_client_whose_body_stopped_arriving(run_dir):
    """uvicorn waits for every open request before it exits; one whose body stalls is
    answered 408 after BODY_STALL_SECONDS, and the server exits then."""
    from nmt_cli.decode.server import BODY_STALL_SECONDS

    server = Server(run_dir)
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as stalled:
            stalled.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 100\r\n\r\n{\"text\":")
            time.sleep(0.5)
            server.process.send_signal(signal.SIGTERM)
            stalled.settimeout(BODY_STALL_SECONDS + 30)
            assert stalled.recv(4096).startswith(b"HTTP/1.1 408 ")
            assert server.process.wait(30) in (0, 128 + signal.SIGTERM, -signal.SIGTERM)
        assert "Traceback" not in server.process.stderr.read().decode()
    finally:
        server.stop()


def slow_head(port: int) -> socket.socket:
    """A connection that has sent the start of a request's head, not all of it."""
    connection = socket.create_connection(("127.0.0.1", port))
    connection.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\n")
    return connection


def closed_by_server(connection: socket.socket, timeout: float) -> bytes:
    """What the server sent before closing `connection`; fails if it stays open past `timeout`."""
    connection.settimeout(timeout)
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := connection.recv(4096):
            received += chunk
    return received


def test_a_connection_slow_to_send_its_head_gets_408_and_is_closed_while_others_are_served(run_dir):
    """A header line now and then does not keep a connection open past --header-timeout,
    counted from connecting or, on a kept-alive connection, from the previous response."""
    server = Server(run_dir, "--header-timeout", "1.5")
    try:
        slow = [slow_head(server.port) for _ in range(20)]
        kept_alive = socket.create_connection(("127.0.0.1", server.port))
        kept_alive.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        kept_alive.settimeout(30)
        response = b""
        while not response.endswith(b"]}"):  # all of /health's response
            response += kept_alive.recv(4096)
        assert response.startswith(b"HTTP/1.1 200 ")
        kept_alive.sendall(b"GET /health HTTP/1.1\r\n")
        idle = socket.create_connection(("127.0.0.1", server.port))  # served, then silent: closed, no 408
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        idle.settimeout(30)
        answered = b""
        while not answered.endswith(b"]}"):
            answered += idle.recv(4096)
        started = time.monotonic()
        for _ in range(3):  # meanwhile other clients are served, and the slow ones trickle headers
            assert server.translate(["a test ."])[0] == 200
            for connection in slow:
                connection.sendall(b"X-A: b\r\n")
            time.sleep(0.3)
        for connection in [*slow, kept_alive]:
            assert closed_by_server(connection, timeout=10).startswith(b"HTTP/1.1 408 Request Timeout\r\n")
            connection.close()
        # A 408 there could be read as the answer to the next request a client's pool sends on it.
        assert closed_by_server(idle, timeout=10) == b""
        idle.close()
        assert 1.0 < time.monotonic() - started < 8
        assert server.translate(["a test ."])[0] == 200
    finally:
        server.stop()
    assert "Traceback" not in server.process.stderr.read().decode()


def test_beyond_max_connections_a_request_gets_503_and_the_next_is_served(run_dir):
    server = Server(run_dir, "--max-connections", "3")
    try:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
        time.sleep(0.5)  # accepted
        for _ in range(5):
            status, headers, body = server.translate(["a test ."])
            assert (status, headers.get("connection")) == (503, "close"), body
        held.pop().close()
        time.sleep(0.5)
        assert server.translate(["a test ."])[0] == 200
        for connection in held:
            connection.close()
    finally:
        server.stop()
    warnings = [line for line in server.process.stderr.read().decode().splitlines() if "503" in line]
    assert len(warnings) == 1 and "request(s) over --max-connections answered 503" in warnings[0], warnings


def test_out_of_descriptors_is_one_warning_line_and_the_server_serves_once_connections_close(run_dir):
    """With its open-file limit too low for the connections, accepts fail: asyncio logged a
    traceback for each, thousands a second; the head deadline frees the descriptors too."""
    server = Server(run_dir, "--header-timeout", "1", open_files=64)
    try:
        slow = [slow_head(server.port) for _ in range(300)]  # past the limit: the rest wait in the backlog
        time.sleep(2.5)
        assert server.process.poll() is None
        assert closed_by_server(slow[0], timeout=5).startswith(b"HTTP/1.1 408 ")
        for connection in slow:
            connection.close()
        deadline = time.monotonic() + 15
        while (status := server.translate(["a test ."])[0]) != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status == 200
    finally:
        server.stop()
    stderr = server.process.stderr.read().decode()
    assert len(stderr) < 2000 and "Traceback" not in stderr, stderr
    assert "cannot accept connections: [Errno 24] Too many open files" in stderr


def test_a_full_queue_answers_503_then_sigterm_answers_every_queued_request(run_dir):
    server = Server(run_dir, "--queue-size", "6", "--max-sentences", "3", "--max-wait-ms", "1000")
    try:
        texts = generated_sentences(30, seed=14)
        expected = dict(zip(texts, cli_lines(run_dir, texts)))
        results: list[tuple[int, dict, object, list[str]]] = []

        def client(k: int) -> None:
            request = texts[k * 3 : k * 3 + 3]
            status, headers, body = server.translate(request)
            results.append((status, headers, body, request))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        full = [r for r in results if r[0] == 503]
        assert full and all(r[1].get("retry-after") == "1" and "queue is full" in r[2]["error"] for r in full)
        for status, _, body, request in results:
            assert status in (200, 503)
            if status == 200:
                assert body["translations"] == [expected[t] for t in request]
        assert server.translate(texts[:3])[0] == 200  # and it serves the next request

        # Two requests wait in the queue (--max-wait-ms, from the first one's arrival once the
        # server has been idle that long) when SIGTERM arrives: both are answered.
        time.sleep(1.2)
        queued: list[Future] = []
        for k in range(2):
            future: Future = Future()
            request = texts[k * 3 : k * 3 + 3]
            threading.Thread(target=lambda f=future, r=request: f.set_result((server.translate(r), r))).start()
            queued.append(future)
        deadline = time.monotonic() + 10
        while server.request("GET", "/health")[2]["models"][0]["queued_sentences"] < 6:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        server.process.send_signal(signal.SIGTERM)
        for future in queued:
            (status, _, body), request = future.result(timeout=60)
            assert status == 200 and body["translations"] == [expected[t] for t in request]
        assert server.process.wait(30) in (0, 128 + signal.SIGTERM, -signal.SIGTERM)
        with pytest.raises(OSError):
            server.translate(texts[:1])
    finally:
        server.stop()


@pytest.mark.parametrize("flags, device", [((), "cuda"), (("--precision", "int8"), "cpu"), (("--device", "cpu"), "cpu")])
def test_the_device_is_picked_as_nmt_translate_picks_it(run_dir, monkeypatch, flags, device):
    import torch

    from nmt_cli.decode import server as server_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with a GPU
    chosen: list[str] = []
    monkeypatch.setattr(server_module, "serve", lambda cfg, announce: chosen.append(cfg.device))
    result = CliRunner().invoke(main, ["serve", "--path", str(run_dir), *flags])
    assert result.exit_code == 0, result.output
    assert chosen == [device]


def test_non_loopback_needs_a_key_and_a_missing_extra_is_one_line(run_dir, monkeypatch):
    from nmt_cli.decode import server as server_module

    result = CliRunner().invoke(main, ["serve", "--path", str(run_dir), "--host", "0.0.0.0"])
    assert result.exit_code == 1 and "is not a loopback address" in result.output and "--api-key" in result.output
    result = CliRunner().invoke(main, ["serve", "--path", "en-de="])
    assert result.exit_code == 1 and result.output == "error: --path en-de=: no path after en-de=\n"
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    result = CliRunner().invoke(main, ["serve", "--path", str(run_dir)])
    assert result.exit_code == 1
    assert result.output.strip() == "error: nmt serve needs Starlette and uvicorn: pip install 'nmt-cli[serve]'"
    assert server_module.named_paths(("en-de=runs/a", "runs/b=c")) == [("en-de", "runs/a"), (None, "runs/b=c")]


@pytest.mark.parametrize("host", ["bad..host", "x" * 64 + ".example"])
def test_a_host_name_that_cannot_be_encoded_is_one_error_line_before_the_models_load(run_dir, host, monkeypatch):
    from nmt_cli.decode import server as server_module

    monkeypatch.setattr(server_module, "load_models", lambda *args: pytest.fail("loaded the models first"))
    result = CliRunner().invoke(main, ["serve", "--path", str(run_dir), "--host", host, "--api-key", KEY])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"error: cannot listen on {host}:8000: not a valid host name (")
    assert result.output.count("\n") == 1


def test_a_port_in_use_is_one_error_line_before_anything_is_announced(run_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "nmt_cli", "serve", "--path", str(run_dir), "--port", str(port),
                                 *DECODE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}: ") and "in use" in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == "", result.stderr


def test_connections_to_the_listening_socket_send_without_nagles_delay():
    """A response goes out as two writes, headers then body. With Nagle's algorithm on, the
    body waits for the client's ACK of the headers, which a client delays by 40 ms (Linux):
    every answer 40 ms late. asyncio's transports, which uvicorn serves on, turn it off on
    each accepted connection, but only for a socket whose protocol is TCP, not 0."""
    from nmt_cli.decode import server as server_module

    (listener,) = server_module.listen(server_module.resolve("127.0.0.1", 0, "127.0.0.1:0"), 0, "127.0.0.1:0")
    port = listener.getsockname()[1]

    async def accept_one() -> int:
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connection, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            nodelay = await asyncio.wait_for(accepted, 30)
            writer.close()
            return nodelay

    assert asyncio.run(accept_one()) != 0



def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_a_host_name_with_two_addresses_is_served_on_both(monkeypatch):
    """"localhost" is 127.0.0.1 and ::1 on many machines: the server listens on each (as
    uvicorn and asyncio bind a name), with --port 0 on one port, and takes connections on
    both."""
    from nmt_cli.decode import server as server_module

    def both(host, port, *args, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port)),
                (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("::1", port, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", both)
    listeners = server_module.listen(server_module.resolve("localhost", 0, "localhost:0"), 0, "localhost:0")
    try:
        assert [s.family for s in listeners] == [socket.AF_INET, socket.AF_INET6]
        port = listeners[0].getsockname()[1]
        assert listeners[1].getsockname()[1] == port
        for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.socket(family, socket.SOCK_STREAM) as client:
                client.connect((address, port))
    finally:
        for listener in listeners:
            listener.close()


# --- the batcher alone ------------------------------------------------------------------


def test_a_failing_batch_fails_only_its_requests_and_batches_keep_settings_apart():
    calls: list[tuple[list[str], str]] = []
    release = threading.Event()

    def translate(texts, encoded, settings):
        release.wait(10)
        calls.append((list(texts), settings))
        if "boom" in texts:
            raise RuntimeError("decoding failed")
        return [t.upper() for t in texts]

    batcher = Batcher(translate, max_batch_tokens=5, max_wait_s=0.5, capacity=10)
    batcher.start()
    futures = [batcher.submit(["a", "b"], [None, None], 2, "beam4"),
               batcher.submit(["boom"], [None], 1, "beam1"),
               batcher.submit(["c"], [None], 1, "beam4"),
               batcher.submit(["d", "e", "f"], [None] * 3, 3, "beam4"),  # over the 5-token budget with the others
               batcher.submit(["g"], [None], 1, "beam1")]
    with pytest.raises(QueueFull):
        batcher.submit(list("uvwxyz"), [None] * 6, 6, "beam4")  # 8 queued (5 once a batch is taken) + 6 > 10
    release.set()
    assert futures[0].result(10).results == ["A", "B"] and futures[2].result(10).results == ["C"]
    assert futures[3].result(10).results == ["D", "E", "F"]
    for failed in (futures[1], futures[4]):  # the same batch (same settings)
        with pytest.raises(RuntimeError, match="decoding failed"):
            failed.result(10)
    assert sorted(calls) == sorted([(["a", "b", "c"], "beam4"), (["boom", "g"], "beam1"), (["d", "e", "f"], "beam4")])
    assert batcher.submit(["h"], [None], 1, "beam4").result(10).results == ["H"]  # the worker goes on
    batcher.stop()


def test_under_steady_load_batches_stay_whole():
    sizes: list[int] = []

    def translate(texts, encoded, settings):
        sizes.append(len(texts))
        time.sleep(0.02)
        return list(texts)

    batcher = Batcher(translate, max_batch_tokens=4096, max_wait_s=0.3, capacity=100)
    batcher.start()

    def client(k: int) -> None:  # a closed loop: the next request once the last is answered
        for i in range(8):
            assert batcher.submit([f"{k}.{i}"], [None], 1, "beam4").result(10).results == [f"{k}.{i}"]

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.stop()
    # 64 sentences from 8 clients: whole batches of 8 (the first wait gathers them all, and each
    # batch waits for the clients it answered), never a batch split in two halves that alternate.
    assert sum(sizes) == 64 and len(sizes) <= 10, sizes


def test_requests_of_other_settings_wait_from_their_own_arrival_not_for_the_last_batchs_clients():
    """After a batch, requests of its settings wait for its clients' next ones; requests of
    other settings cannot join those, and each group waited a whole --max-wait-ms more
    (the k-th group about k times it)."""
    def translate(texts, encoded, settings):
        time.sleep(0.05)
        return list(texts)

    batcher = Batcher(translate, max_batch_tokens=4096, max_wait_s=1.0, capacity=100)
    batcher.start()
    futures = []
    for settings in ("beam5", "beam1", "beam4", "beam3"):
        futures.append(batcher.submit([settings], [None], 1, settings))
        time.sleep(0.02)
    waits = [future.result(30).queue_seconds for future in futures]
    batcher.stop()
    # Each leaves once the worker is free: about 1.0 s, then 0.05 s of decoding more each
    # (not 2, 3 and 4 s).
    assert waits[0] >= 0.9 and all(wait < 1.6 for wait in waits), waits


def test_stopping_translates_the_queue_at_once_and_skips_cancelled_requests():
    """SIGTERM's begin_stopping: queued requests leave without waiting for others; one whose
    handler was cancelled (a second Ctrl-C) is not translated, nor does it end the worker."""
    translated: list[list[str]] = []

    def translate(texts, encoded, settings):
        translated.append(list(texts))
        return list(texts)

    batcher = Batcher(translate, max_batch_tokens=4096, max_wait_s=60.0, capacity=100)
    batcher.start()
    abandoned = batcher.submit(["gone"], [None], 1, "beam1")
    kept = batcher.submit(["kept"], [None], 1, "beam4")
    assert abandoned.cancel()
    batcher.begin_stopping()
    assert kept.result(10).results == ["kept"] and translated == [["kept"]]
    batcher.stop(10)
    assert not batcher._thread.is_alive()


def test_sigterm_answers_a_request_queued_for_a_long_batching_wait_at_once(run_dir):
    server = Server(run_dir, "--max-wait-ms", "60000")
    try:
        answer: Future = Future()
        threading.Thread(target=lambda: answer.set_result(server.translate(["the dog runs"]))).start()
        deadline = time.monotonic() + 10
        while server.request("GET", "/health")[2]["models"][0]["queued_sentences"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        server.process.send_signal(signal.SIGTERM)
        status, _, body = answer.result(timeout=30)  # not after the 60 s wait
        assert status == 200 and body["translations"] == cli_lines(run_dir, ["the dog runs"])
        assert server.process.wait(30) in (0, 128 + signal.SIGTERM, -signal.SIGTERM)
    finally:
        server.stop()


def test_the_load_generator_runs_and_its_ratios_are_its_lines_quotients(run_dir, tmp_path):
    source = tmp_path / "test.en"
    source.write_text("".join(s + "\n" for s in generated_sentences(8, seed=15)), encoding="utf-8")
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "serve_load.py"), str(run_dir), "--input", str(source),
         "--clients", "1,4", "--count", "8", "--max-seconds", "30", "--beam", "2", "--ceiling", "4",
         "--overload-queue", "0", "--rounds", "2"], capture_output=True, text=True, timeout=240)  # overload: the queue-full test
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    rounds = "\n".join(lines).split("# round ")[1:]
    assert [r.split("\n")[0] for r in rounds] == ["1 of 2", "2 of 2"], lines
    printed: dict[int, list[float]] = {1: [], 4: []}
    for round_text in rounds:  # each round's ratios are quotients of its own lines
        round_lines = round_text.split("\n")
        batch = float(next(line for line in round_lines if line.startswith("nmt translate (one batch job)")).split()[5])
        for clients in (1, 4):
            line = next(line for line in round_lines if line.startswith(f"nmt serve, {clients} client(s)"))
            fields = line.split()
            rate, ratio = float(fields[4]), float(fields[6].rstrip("x"))
            # Both figures are printed to 0.1: the ratio is their quotient within that rounding.
            assert ratio == pytest.approx(rate / batch, abs=0.006 + 0.05 / batch + 0.05 * rate / batch**2), lines
            assert "8 answered   0 differing from batch   0 errors" in line, lines
            printed[clients].append(ratio)
        for name in ("nmt translate --buffer-size 4 ", "nmt translate --buffer-size 4, outputs alike in length "):
            fields = next(line for line in round_lines if line.startswith(name))[len(name):].split()
            rate, ratio = float(fields[0]), float(fields[2].rstrip("x"))
            assert ratio == pytest.approx(rate / batch, abs=0.006 + 0.05 / batch + 0.05 * rate / batch**2), lines
    assert any(line.startswith("median of 2 rounds, --buffer-size 4, outputs alike in length") for line in lines)
    for clients in (1, 4):  # the median of two rounds is their mean (of the unrounded ratios)
        line = next(line for line in lines if line.startswith(f"median of 2 rounds, {clients} client(s)"))
        median, *each = (float(field.rstrip("x")) for field in line.split() if field.endswith("x"))
        assert each == printed[clients] and median == pytest.approx(sum(each) / 2, abs=0.0051), line


def test_a_decoding_error_is_a_500_for_its_batch_and_the_server_goes_on(run_dir):
    """In-process (to make decoding fail on purpose): uvicorn in a thread on a free port."""
    import uvicorn

    from nmt_cli.config import ServeConfig
    from nmt_cli.decode.metrics import Metrics
    from nmt_cli.decode.server import Service, build_app, load_models

    cfg = ServeConfig(paths=(str(run_dir),), threads=1)
    metrics = Metrics()
    models = load_models(cfg, metrics)
    served = models["en-de"]
    translate = served.model.translate_encoded

    def failing(texts, encoded, settings):
        if "boom" in texts:
            raise RuntimeError("the model broke")
        return translate(texts, encoded, settings)

    served.batcher._translate = failing  # the real translation, but for the poisoned batch
    served.batcher.start()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(Service(cfg, models, metrics, None), served.batcher.stop),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status, _, body = request(port, "POST", "/v1/translate", {"text": ["the dog", "boom"]})
        assert status == 500 and "the model broke" in body["error"]
        status, _, body = request(port, "POST", "/v1/translate", {"text": ["the dog"]})
        assert status == 200 and body["translations"] == served.model.translate(["the dog"])
    finally:
        server.should_exit = True
        thread.join(30)


def test_several_models_are_picked_by_name_and_by_language_pair(run_dir, tmp_path):
    server = Server(run_dir, "--path", f"copy={run_dir}", "--max-wait-ms", "0")
    try:
        texts = generated_sentences(4, seed=16)
        expected = cli_lines(run_dir, texts)
        for name in ("en-de", "copy"):
            status, _, body = server.request("POST", "/v1/translate", {"text": texts, "model": name})
            assert (status, body["model"], body["translations"]) == (200, name, expected)
        status, _, body = server.request("POST", "/v1/translate", {"text": texts})
        assert status == 422 and "several models are served" in body["error"]
        status, _, body = server.request("POST", "/translate", {"q": texts[0], "source": "en", "target": "de"})
        assert status == 400 and "several models translate en to de" in body["error"]
        health = server.request("GET", "/health")[2]
        assert [m["name"] for m in health["models"]] == ["en-de", "copy"]
    finally:
        server.stop()


@ct2_installed
def test_the_ctranslate2_engine_serves_what_nmt_translate_gives_with_it(run_dir, tmp_path):
    export = tmp_path / "ct2"
    exported = CliRunner().invoke(main, ["export", "--format", "ctranslate2", str(run_dir), str(export)])
    assert exported.exit_code == 0, exported.output
    texts = generated_sentences(12, seed=17) + [""]

    def cli(lines: list[str], *flags: str) -> list[str]:
        result = nmt("--engine", "ctranslate2", "--path", str(export), *FAST, *flags,
                     input="".join(t + "\n" for t in lines))
        assert result.exit_code == 0, result.output
        return result.stdout.split("\n")[:-1]

    server = Server(export, "--engine", "ctranslate2", "--max-wait-ms", "0")
    try:
        for options, flags in (({}, ()), ({"beam": 3, "lenpen": 0.6}, ("--beam", "3", "--lenpen", "0.6"))):
            status, _, body = server.request("POST", "/v1/translate", {"text": texts, **options})
            assert status == 200 and body["translations"] == cli(texts, *flags), body
        # Per-request settings reach CTranslate2: two hypotheses each, as `nmt translate --nbest 2` gives.
        status, _, body = server.request("POST", "/v1/translate", {"text": texts[:3], "beam": 3, "nbest": 2})
        jsonl = [json.loads(line) for line in cli(texts[:3], "--beam", "3", "--nbest", "2", "--output-format", "jsonl")]
        assert status == 200 and [[h["text"] for h in n] for n in body["nbest"]] == [
            [h["hyp"] for h in record["nbest"]] for record in jsonl]
        assert all(len(n) == 2 for n in body["nbest"])
    finally:
        server.stop()
