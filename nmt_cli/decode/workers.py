"""Translation in several processes at once on a CPU (`nmt translate --workers N`).

One process with N threads splits each operator of a decoding step across the cores,
and a small model's step is hundreds of operators, many too small to split well. N
processes instead each decode batches of their own, as CTranslate2's `inter_threads`
do. With --workers N the main process and N - 1 worker processes, each with its own
copy of the model, translate a share of every chunk of input lines at the same time;
the shares are put back into input order before anything is written: one output line
per input line, in order. Each share is batched apart, so a sentence can meet other
batch companions than with one process; where its result depends on them (bf16
products round by the batch's shape; attention sums over the batch's padded length) a
few lines differ, as with another --max-tokens.
(Warnings about single lines come from the process that translates them, so they may
appear out of line order.) How it compares with threads: README.md and
benchmarks/HISTORY.md.

The workers are started with "spawn" (a fork of a process whose OpenMP threads have run
can hang), load the model once, and then answer one request per chunk over a pipe. A
worker's error comes back to the main process and is raised there: the CLI reports it
as it would its own. A worker whose main process is gone (killed by SIGKILL, which stops
no worker) ends on its own at once, saying nothing.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
from multiprocessing.connection import Connection
from typing import Any

from nmt_cli.config import TranslateConfig
from nmt_cli.decode.lines import InputLine
from nmt_cli.decode.translator import Translation, Translator, prepare_process
from nmt_cli.errors import NmtError
from nmt_cli.machine import exit_with_parent, workers_cannot_start
from nmt_cli.signals import workers_ignore_interrupts


def shares_by_length(lines: list[InputLine], count: int) -> list[list[int]]:
    """Indices of `lines` dealt into `count` shares of similar lengths: longest first, in
    turn, so that every share gets its part of the long and of the short lines."""
    order = sorted(range(len(lines)), key=lambda i: -len(lines[i].text))
    return [order[k::count] for k in range(count)]


class ParallelTranslator:
    """A Translator's `translate` and `format`, each chunk shared with worker processes.

    Made with `cfg`, it starts `cfg.workers - 1` processes, which load the model while the
    main process loads its own; `use(local)` then takes the main process's Translator
    (it translates the first share of each chunk) and waits for the workers. Use as a
    context manager: leaving it stops them.
    """

    def __init__(self, cfg: TranslateConfig) -> None:
        self.local: Translator | None = None
        context = multiprocessing.get_context("spawn")
        self.workers: list[tuple[Any, Connection]] = []
        with workers_ignore_interrupts():  # Ctrl-C is the main process's to handle
            for _ in range(cfg.workers - 1):
                ours, theirs = context.Pipe()
                process = context.Process(target=_serve, args=(theirs, cfg, os.getpid()), daemon=True,
                                          name="nmt translate worker")
                try:
                    process.start()
                except OSError as error:  # no process slots or memory left
                    ours.close()
                    theirs.close()
                    self.stop(finished=False)  # the workers already started
                    raise workers_cannot_start(error) from None
                theirs.close()
                self.workers.append((process, ours))

    def use(self, local: Translator) -> "ParallelTranslator":
        """Translate with `local` too, once every worker has loaded the model."""
        for process, connection in self.workers:
            _answer(process, connection)  # ready, or the error that stopped it
        self.local = local
        return self

    def __enter__(self) -> "ParallelTranslator":
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.stop(finished=exc_type is None)

    def stop(self, finished: bool) -> None:
        """Stop the workers: `finished`, they are told to and awaited; else terminated."""
        for process, connection in self.workers:
            if finished:
                try:
                    connection.send(None)  # finish
                except OSError:
                    pass
                process.join(timeout=10)
            if process.is_alive():  # on an error, or a worker that does not stop: no waiting
                process.terminate()
                process.join()
            connection.close()

    def format(self, translation: Translation) -> str:
        assert self.local is not None, "use() first"
        return self.local.format(translation)

    def translate(self, lines: list[InputLine], source_name: str) -> list[Translation]:
        assert self.local is not None, "use() first"
        shares = shares_by_length(lines, len(self.workers) + 1)
        busy = []
        for (process, connection), share in zip(self.workers, shares[1:]):
            if share:
                try:
                    connection.send(([lines[i] for i in share], source_name))
                except OSError:  # the worker is gone (else the CLI would take it for a closed stdout)
                    raise _stopped(process) from None
                busy.append((process, connection, share))
        translations: list[Translation | None] = [None] * len(lines)
        for i, translation in zip(shares[0], self.local.translate([lines[i] for i in shares[0]], source_name)):
            translations[i] = translation
        for process, connection, share in busy:
            for i, translation in zip(share, _answer(process, connection)):
                translations[i] = translation
        return translations  # type: ignore[return-value]  # every index is in one share


def _answer(process: Any, connection: Connection) -> Any:
    """A worker's next answer; its error raised here."""
    try:
        status, value = connection.recv()
    except (EOFError, OSError):
        raise _stopped(process) from None
    if status == "error":
        raise value
    return value


def _stopped(process: Any) -> NmtError:
    """The error for a worker that is gone, with its exit code once it is known."""
    process.join(timeout=5)
    return NmtError(f"a translation worker stopped unexpectedly (exit code {process.exitcode})")


def _serve(connection: Connection, cfg: TranslateConfig, parent: int) -> None:
    """A worker process of the main process `parent`: load the model, then translate each
    share sent until None. Once the main process is gone, it ends quietly, whatever it
    was doing: there is nobody left to answer."""
    import click

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited already where started in the main thread
    exit_with_parent(parent)  # killed (kill -9, the OOM killer), the main process stops no worker
    prepare_process(cfg)
    loading = True  # the main process gives the warnings that loading gives

    def warn(message: str) -> None:
        if not loading:
            click.echo(message, err=True)

    try:
        translator = Translator(cfg, warn)
    except BaseException as error:  # noqa: BLE001 - sent to the main process, which raises it
        _send(connection, ("error", _sendable(error)))
        return
    loading = False
    if not _send(connection, ("ready", None)):
        return
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):  # the main process is gone
            return
        if request is None:
            return
        try:
            answer = ("ok", translator.translate(*request))
        except BaseException as error:  # noqa: BLE001 - as above
            answer = ("error", _sendable(error))
        if not _send(connection, answer):
            return


def _send(connection: Connection, answer: tuple) -> bool:
    """Send `answer` to the main process; False if it is gone (its end of the pipe closed)."""
    try:
        connection.send(answer)
        return True
    except OSError:  # BrokenPipeError, ConnectionResetError
        return False


def _sendable(error: BaseException) -> BaseException:
    """`error` if it survives pickling (NmtError does), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any unpicklable exception
        return RuntimeError(f"{type(error).__name__}: {error}")
