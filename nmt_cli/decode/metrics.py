"""The server's counters, written in Prometheus' text exposition format.

The format is a few lines of text (`# TYPE`, `name{label="v"} value`), so it is written
here rather than adding prometheus_client as a dependency of the extra.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nmt_cli.decode.batcher import BatchObserver

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def label(value: str) -> str:
    """A label value as the text format writes it: in quotes, with \\, " and line feeds escaped
    (a model's name, from `--path NAME=PATH`, may hold any of them)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


@dataclass
class Histogram:
    buckets: Sequence[float]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last: above all
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, cumulative = [], 0
        for bound, n in zip([*self.buckets, "+Inf"], self.counts):
            cumulative += n
            le = bound if bound == "+Inf" else f"{bound:g}"
            out.append(f'{name}_bucket{{{labels}{"," if labels else ""}le="{le}"}} {cumulative}')
        braces = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{braces} {self.total:.6f}", f"{name}_count{braces} {self.count}"]
        return out


class ModelMetrics(BatchObserver):
    """One served model's counters; the batcher reports its batches here."""

    def __init__(self, name: str, lock: threading.Lock) -> None:
        self.name = name
        self._lock = lock
        self.requests: defaultdict[tuple[str, int], int] = defaultdict(int)  # (endpoint, status) -> count
        self.sentences = 0
        self.batches = Histogram(BATCH_BUCKETS)
        self.latency = Histogram(LATENCY_BUCKETS)
        self.queued: Callable[[], int] = lambda: 0

    def batch_done(self, sentences: int) -> None:
        with self._lock:
            self.sentences += sentences
            self.batches.observe(sentences)

    def request_done(self, endpoint: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[endpoint, status] += 1
            if status == 200:
                self.latency.observe(seconds)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.models: dict[str, ModelMetrics] = {}
        self.unrouted: defaultdict[tuple[str, int], int] = defaultdict(int)  # requests refused before a model was chosen

    def for_model(self, name: str) -> ModelMetrics:
        self.models[name] = ModelMetrics(name, self._lock)
        return self.models[name]

    def refused(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.unrouted[endpoint, status] += 1

    def render(self) -> str:
        queued = {name: m.queued() for name, m in self.models.items()}  # outside the lock: the batcher has its own
        lines = ["# HELP nmt_requests_total HTTP translation requests by model, endpoint and status.",
                 "# TYPE nmt_requests_total counter"]
        with self._lock:
            for (endpoint, status), n in sorted(self.unrouted.items()):
                lines.append(f'nmt_requests_total{{model="",endpoint={label(endpoint)},status="{status}"}} {n}')
            for name, m in self.models.items():
                for (endpoint, status), n in sorted(m.requests.items()):
                    lines.append(f'nmt_requests_total{{model={label(name)},endpoint={label(endpoint)},status="{status}"}} {n}')
            lines += ["# HELP nmt_sentences_total Sentences translated.", "# TYPE nmt_sentences_total counter"]
            lines += [f'nmt_sentences_total{{model={label(name)}}} {m.sentences}' for name, m in self.models.items()]
            lines += ["# HELP nmt_queue_sentences Sentences waiting for a batch.", "# TYPE nmt_queue_sentences gauge"]
            lines += [f'nmt_queue_sentences{{model={label(name)}}} {queued[name]}' for name in self.models]
            lines += ["# HELP nmt_batch_sentences Sentences per translated batch.", "# TYPE nmt_batch_sentences histogram"]
            for name, m in self.models.items():
                lines += m.batches.lines("nmt_batch_sentences", f"model={label(name)}")
            lines += ["# HELP nmt_request_latency_seconds Time from a request's arrival to its answer (200 only).",
                      "# TYPE nmt_request_latency_seconds histogram"]
            for name, m in self.models.items():
                lines += m.latency.lines("nmt_request_latency_seconds", f"model={label(name)}")
        return "\n".join(lines) + "\n"
