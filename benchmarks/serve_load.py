"""Load on `nmt serve`: many clients sending single sentences, against one batch job.

Starts `nmt serve` on a free loopback port and, for each number of concurrent clients
(1, 8, 32, 128 by default), sends the test sentences one per request (each client a
thread with its own keep-alive http.client connection, taking the next sentence until
--count sentences are done or --max-seconds have passed). It prints, per level,
sentences/s and p50/p95/p99 latency, and its ratio to `nmt translate` on the same
sentences as one batch job (its start-up, timed on one line, left out), and that job in
chunks of --ceiling lines (single-sentence clients can batch no more than their number),
also in chunks of lines whose outputs are alike in length (no chunk ends with one long
sentence decoding alone: the most that refilling a batch's finished places could gain). Then an overload
run: a second server with a tiny --queue-size under the most clients, counting 503
answers (with Retry-After) and checking that the server still answers afterwards.
Every translation the server gave must be the batch job's line for that sentence.
With --rounds N the batch job and the levels take turns N times, and a last line per
level gives the median of its rounds' ratios: a machine whose speed drifts by 10-20%
from minute to minute moves the ratio of one round as much.

    python3 benchmarks/serve_load.py RUN_OR_CKPT --input test.en --beam 4 --threads 1

Loopback only; bounded in count and time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import machine_line, result_line

from nmt_cli.checkpoints.names import resolve_checkpoint


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="checkpoint or run directory")
    p.add_argument("--input", type=Path, required=True, help="sentences, one per line")
    p.add_argument("--count", type=int, default=400, help="sentences per level (default: %(default)s)")
    p.add_argument("--clients", default="1,8,32,128", help="concurrency levels (default: %(default)s)")
    p.add_argument("--max-seconds", type=float, default=60.0, help="time limit per level (default: %(default)s)")
    p.add_argument("--beam", type=int, default=4, help="(default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server and the batch job (default: %(default)s)")
    p.add_argument("--max-batch-tokens", type=int, default=4096, help="(default: %(default)s)")
    p.add_argument("--max-wait-ms", type=float, default=50.0, help="(default: %(default)s)")
    p.add_argument("--engine", default="nmt", choices=("nmt", "ctranslate2"),
                   help="--engine of the server and the batch job (default: %(default)s)")
    p.add_argument("--ceiling", type=int, default=32,
                   help="also time the batch job in chunks of this many lines, the most N clients can batch (0: skip)")
    p.add_argument("--overload-queue", type=int, default=8, help="--queue-size of the overload run (0: skip it)")
    p.add_argument("--rounds", type=int, default=1,
                   help="batch job and levels in turns this many times, then each level's median ratio (default: %(default)s)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    return args


def nmt_command() -> list[str]:
    return [sys.executable, "-m", "nmt_cli"]


def model_path(args: argparse.Namespace) -> str:
    """The checkpoint of a run directory; with --engine ctranslate2 an export directory as it is."""
    return args.path if args.engine == "ctranslate2" else str(resolve_checkpoint(Path(args.path)))


def batch_job(args: argparse.Namespace, sentences: list[str], *more_flags: str) -> tuple[float, list[str]]:
    """sentences/s of `nmt translate` on all the sentences, its start-up (one line) left out."""
    flags = ["--path", model_path(args), "--beam", str(args.beam), "--threads", str(args.threads),
             "--device", "cpu", "--engine", args.engine, "--quiet", *more_flags]
    with tempfile.TemporaryDirectory() as tmp:
        def timed(lines: list[str]) -> tuple[float, list[str]]:
            source, out = Path(tmp) / "in.txt", Path(tmp) / "out.txt"
            source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            started = time.monotonic()
            subprocess.run([*nmt_command(), "translate", *flags, "-i", str(source), "-o", str(out)], check=True)
            return time.monotonic() - started, out.read_text(encoding="utf-8").split("\n")[:-1]

        startup, _ = timed(sentences[:1])
        seconds, hypotheses = timed(sentences)
    return len(sentences) / max(seconds - startup, 1e-9), hypotheses


class Server:
    def __init__(self, args: argparse.Namespace, *flags: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.process = subprocess.Popen(
            [*nmt_command(), "serve", "--path", args.path, "--port", str(self.port), "--beam", str(args.beam),
             "--threads", str(args.threads), "--max-batch-tokens", str(args.max_batch_tokens),
             "--max-wait-ms", str(args.max_wait_ms), "--engine", args.engine, *flags], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.2)

    def healthy(self) -> bool:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            connection.request("GET", "/health")
            return connection.getresponse().status == 200
        except OSError:
            return False

    def batches(self) -> tuple[float, float]:
        """(sentences, batches) translated so far, from /metrics."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
        sample = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("nmt_batch_sentences_sum") or line.startswith("nmt_batch_sentences_count")}
        return sample["nmt_batch_sentences_sum"], sample["nmt_batch_sentences_count"]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


@dataclass
class Level:
    latencies: list[float] = field(default_factory=list)
    refused: int = 0  # 503 answers
    retry_after: set[str] = field(default_factory=set)
    wrong: int = 0  # answers other than the batch job's line
    other_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def run_level(port: int, clients: int, sentences: list[str], expected: list[str], max_seconds: float) -> Level:
    level, lock, next_index = Level(), threading.Lock(), [0]
    deadline = time.monotonic() + max_seconds

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=max_seconds + 60)
        while time.monotonic() < deadline:
            with lock:
                i = next_index[0]
                if i >= len(sentences):
                    return
                next_index[0] += 1
            body = json.dumps({"text": [sentences[i]]}).encode()
            started = time.monotonic()
            try:
                connection.request("POST", "/v1/translate", body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = json.loads(response.read())
            except (OSError, http.client.HTTPException, ValueError) as error:
                with lock:
                    level.other_errors.append(f"{type(error).__name__}: {error}")
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=max_seconds + 60)
                continue
            elapsed = time.monotonic() - started
            with lock:
                if response.status == 200:
                    level.latencies.append(elapsed)
                    level.wrong += answer["translations"] != [expected[i]]
                elif response.status == 503:
                    level.refused += 1
                    level.retry_after.add(response.getheader("Retry-After", ""))
                else:
                    level.other_errors.append(f"{response.status}: {answer}")
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    level.seconds = time.monotonic() - started
    return level


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def serve_level(server: Server, clients: int, sentences: list[str], expected: list[str], args: argparse.Namespace,
                batch_rate: float) -> float:
    """One level of clients against the running server: prints its line, returns its ratio to the batch job."""
    before = server.batches()
    level = run_level(server.port, clients, sentences, expected, args.max_seconds)
    after = server.batches()
    mean_batch = (after[0] - before[0]) / max(after[1] - before[1], 1)
    done = len(level.latencies)
    rate = done / level.seconds
    print(result_line(f"nmt serve, {clients} client(s)", {
        "sentences/s": f"{rate:.1f}", "ratio to batch": f"{rate / batch_rate:.2f}x",
        "p50 ms": f"{percentile(level.latencies, 0.5) * 1000:.0f}",
        "p95 ms": f"{percentile(level.latencies, 0.95) * 1000:.0f}",
        "p99 ms": f"{percentile(level.latencies, 0.99) * 1000:.0f}",
        "mean batch": f"{mean_batch:.1f}", "answered": f"{done}", "differing from batch": f"{level.wrong}", "errors": f"{len(level.other_errors) + level.refused}",
    }), flush=True)
    for error in level.other_errors[:3]:
        print(f"#   error: {error}")
    return rate / batch_rate


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sentences = [line.rstrip("\n") for line in args.input.read_text(encoding="utf-8").splitlines() if line.strip()]
    sentences = sentences[: args.count]
    levels = [int(c) for c in args.clients.split(",")]
    print(machine_line())
    print(f"# {len(sentences)} sentences, beam {args.beam}, {args.threads} thread(s), --engine {args.engine}; server "
          f"--max-batch-tokens {args.max_batch_tokens} --max-wait-ms {args.max_wait_ms:g}")
    ratios: dict[int, list[float]] = {clients: [] for clients in levels}
    chunk_ratios: dict[str, list[float]] = {"": [], ", outputs alike in length": []}
    server = None
    try:
        for round_number in range(1, args.rounds + 1):
            if args.rounds > 1:
                print(f"# round {round_number} of {args.rounds}")
            batch_rate, expected = batch_job(args, sentences)
            print(result_line("nmt translate (one batch job)", {"sentences/s": f"{batch_rate:.1f}"}), flush=True)
            if args.ceiling:
                # C clients with one sentence each put at most C sentences in a batch: the same job in
                # chunks of C input lines (each sorted and translated as one batch) bounds the server.
                # In chunks of lines whose outputs are alike in length, no chunk's last steps run one long
                # sentence alone: the bound of batching that would refill a finished sentence's place at once.
                by_length = sorted(range(len(sentences)), key=lambda i: len(expected[i].split()))
                for name, lines in (("", sentences), (", outputs alike in length", [sentences[i] for i in by_length])):
                    rate, _ = batch_job(args, lines, "--buffer-size", str(args.ceiling))
                    chunk_ratios[name].append(rate / batch_rate)
                    print(result_line(f"nmt translate --buffer-size {args.ceiling}{name}", {
                        "sentences/s": f"{rate:.1f}", "ratio to batch": f"{rate / batch_rate:.2f}x"}), flush=True)
            if server is None:  # started once, after the first job: it idles while the later ones run
                server = Server(args)
            for clients in levels:
                ratios[clients].append(serve_level(server, clients, sentences, expected, args, batch_rate))
    finally:
        if server is not None:
            server.stop()
    if args.rounds > 1:
        medians = [(f"{clients} client(s)", ratios[clients]) for clients in levels]
        if args.ceiling:
            medians += [(f"--buffer-size {args.ceiling}{name}", chunk) for name, chunk in chunk_ratios.items()]
        for name, each in medians:
            print(result_line(f"median of {args.rounds} rounds, {name}", {
                "ratio to batch": f"{statistics.median(each):.2f}x", "rounds": " ".join(f"{r:.2f}x" for r in each)}))
    if args.overload_queue > 0:
        clients = max(levels)
        server = Server(args, "--queue-size", str(args.overload_queue), "--max-sentences", "1")
        try:
            level = run_level(server.port, clients, sentences, expected, args.max_seconds)
            healthy = server.healthy()
        finally:
            server.stop()
        print(result_line(f"overload: {clients} clients, --queue-size {args.overload_queue}", {
            "answered 200": f"{len(level.latencies)}", "refused 503": f"{level.refused}",
            "Retry-After": ",".join(sorted(level.retry_after)) or "-", "other errors": f"{len(level.other_errors)}",
            "p99 ms (200s)": f"{percentile(level.latencies, 0.99) * 1000:.0f}",
            "healthy after": "yes" if healthy else "NO", "differing from batch": f"{level.wrong}",
        }))


if __name__ == "__main__":
    main()
