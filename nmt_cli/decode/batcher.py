"""Dynamic batching for the server: requests from many clients, translated together.

Requests wait in a bounded queue (counted in sentences). One worker thread per model
(the model is not async, and one search at a time uses the cores best) takes the oldest
request, waits up to `max_wait_s` for others with the same decoding settings to join, takes
them in arrival order up to `max_batch_tokens` source tokens, translates them as one
call and completes each request's future with its own results, in its own order.
Requests with other settings wait for a batch of their own. A failure of one call
fails only the requests of that batch.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Hashable

# (texts, their source ids, decoding settings) -> one result per text, in order
TranslateBatch = Callable[[list[str], list[Any], Any], list[Any]]


class QueueFull(Exception):
    """The queue holds too many sentences to take this request now."""


class Stopped(Exception):
    """The batcher is shutting down and takes no new requests."""


@dataclass(frozen=True)
class Done:
    """What a request's future holds: its results and where its time went."""

    results: list[Any]
    queue_seconds: float  # from submit until its batch started
    decode_seconds: float  # the batch's translation
    batch_sentences: int  # sentences in the batch it was part of


@dataclass
class _Job:
    texts: list[str]
    encoded: list[Any]
    settings: Hashable
    tokens: int
    submitted: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)


class BatchObserver:
    """Told about each batch (the server's metrics); the default does nothing."""

    def batch_done(self, sentences: int) -> None:
        pass


class Batcher:
    def __init__(self, translate: TranslateBatch, max_batch_tokens: int, max_wait_s: float, capacity: int,
                 observer: BatchObserver | None = None, name: str = "model") -> None:
        self._translate = translate
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_s
        self.capacity = capacity  # sentences
        self._observer = observer or BatchObserver()
        self._jobs: deque[_Job] = deque()
        self._queued_sentences = 0
        self._cond = threading.Condition()
        self._stopping = False
        # When the last batch ended, its settings, and how many sentences of them were queued
        # then and answered by it: its clients' next requests are on their way, and waiting
        # for them keeps batches whole (see _next_batch).
        self._last_done = -float("inf")
        self._last_settings: Hashable = None
        self._coming_back = 0
        self._thread = threading.Thread(target=self._run, name=f"nmt-batcher-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def queued_sentences(self) -> int:
        with self._cond:
            return self._queued_sentences

    def submit(self, texts: list[str], encoded: list[Any], tokens: int, settings: Hashable) -> Future:
        """Queue a request; its future gets a `Done` (or the exception its batch raised).
        Raises QueueFull when it does not fit, Stopped after `stop`."""
        job = _Job(texts, encoded, settings, tokens)
        with self._cond:
            if self._stopping:
                raise Stopped("the server is shutting down")
            if self._queued_sentences + len(texts) > self.capacity:
                raise QueueFull(f"the queue is full ({self._queued_sentences} sentences waiting)")
            self._jobs.append(job)
            self._queued_sentences += len(texts)
            self._cond.notify()
        return job.future

    def begin_stopping(self) -> None:
        """Take no more requests, and translate the queued ones without waiting for others."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Take no more requests, finish every queued one, then end the worker."""
        self.begin_stopping()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._translate_batch(batch)

    def _next_batch(self) -> list[_Job] | None:
        with self._cond:
            while not self._jobs:
                if self._stopping:
                    return None
                self._cond.wait()
            first = self._jobs[0]
            # Wait up to max_wait for others to join: from the first request's arrival, or just
            # after a batch of the same settings, from its end and only until as many of their
            # sentences are queued as were queued then plus those it answered (its clients'
            # next requests are on their way). Without that, requests queued while a batch ran
            # would leave at once, the answered clients' next ones would form the batch after,
            # and batches would stay split in two; with it, a lone client's next request
            # leaves as soon as it comes. Requests of other settings cannot join that batch:
            # they wait from their own arrival only.
            just_after_batch = (first.settings == self._last_settings
                                and time.monotonic() < self._last_done + self.max_wait_s)
            deadline = (self._last_done if just_after_batch else first.submitted) + self.max_wait_s
            while (not self._stopping and self._tokens_like(first.settings) < self.max_batch_tokens
                   and not (just_after_batch and self._sentences_like(first.settings) >= self._coming_back)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            taken, kept, tokens = [], deque(), 0
            for job in self._jobs:
                fits = not taken or tokens + job.tokens <= self.max_batch_tokens
                if job.settings == first.settings and fits:
                    taken.append(job)
                    tokens += job.tokens
                else:
                    kept.append(job)
            self._jobs = kept
            self._queued_sentences -= sum(len(job.texts) for job in taken)
            return taken

    def _tokens_like(self, settings: Hashable) -> int:
        return sum(job.tokens for job in self._jobs if job.settings == settings)

    def _sentences_like(self, settings: Hashable) -> int:
        return sum(len(job.texts) for job in self._jobs if job.settings == settings)

    def _translate_batch(self, batch: list[_Job]) -> None:
        # A request whose handler was cancelled (a forced exit) is not translated; the others'
        # futures can no longer be cancelled, so completing them below cannot fail.
        batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
        if not batch:
            return
        started = time.monotonic()
        texts = [text for job in batch for text in job.texts]
        encoded = [ids for job in batch for ids in job.encoded]
        try:
            results = self._translate(texts, encoded, batch[0].settings)
        except Exception as error:  # the batch's requests get it; the worker goes on
            for job in batch:
                job.future.set_exception(error)
            return
        seconds = time.monotonic() - started
        settings = batch[0].settings
        with self._cond:
            self._last_done, self._last_settings = time.monotonic(), settings
            self._coming_back = self._sentences_like(settings) + len(texts)
        self._observer.batch_done(len(texts))
        offset = 0
        for job in batch:
            own = results[offset : offset + len(job.texts)]
            offset += len(job.texts)
            job.future.set_result(Done(own, started - job.submitted, seconds, len(texts)))
