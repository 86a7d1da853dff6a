"""The `nmt` command: a click group whose subcommands live in `nmt_cli/commands/`.

Subcommands are imported only when used, so `nmt score` never pays for torch and
`nmt --help` is instant. Library code raises `NmtError` for bad input; here it
becomes one `error: ...` line on stderr and exit status 1.
"""

from __future__ import annotations

import errno
import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

from nmt_cli import __version__
from nmt_cli.errors import NmtError, one_line
from nmt_cli.signals import (EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, import_torch, signals_held,
                             terminate_by_exception)
from nmt_cli.streams import guard_standard_streams, utf8_stdout

# name -> (module under nmt_cli.commands, one-line help shown by `nmt --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "preprocess": ("preprocess", "Raw parallel text -> tokenized, BPE-segmented, binarized data-bin/."),
    "learn-bpe": ("bpe", "Learn a sentencepiece BPE model from text."),
    "apply-bpe": ("bpe", "Segment text with a BPE model (or undo it with --decode)."),
    "binarize": ("binarize", "Binarize already-segmented text with an existing dictionary."),
    "info": ("info", "Print an architecture or checkpoint: layers, sizes, parameter count."),
    "train": ("train", "Train a Transformer on a data-bin/ directory."),
    "translate": ("translate", "Translate raw text (file or stdin) with beam search."),
    "generate": ("generate", "Decode a binarized split; fairseq-generate's S-/T-/H-/D-/P- lines and BLEU."),
    "score": ("score", "BLEU / chrF / TER as sacreBLEU reports them, and tokenized BLEU."),
    "average": ("average", "Average the parameters of several checkpoints."),
    "import-fairseq": ("import_fairseq", "Convert a fairseq Transformer checkpoint into an nmt run directory."),
    "import-marian": ("import_marian", "Convert a Hugging Face MarianMTModel (OPUS-MT) directory into an nmt run directory."),
    "plot": ("plot", "Draw the learning curves of training runs (train_log.jsonl) as PNG, SVG or HTML."),
    "export": ("export", "Export a checkpoint to CTranslate2 or fairseq."),
    "serve": ("serve", "Serve models over HTTP (nmt's JSON API and LibreTranslate's) with dynamic batching."),
}

# The commands that load torch: it is imported before they run (once their options are
# parsed, so that --help stays quick), with Ctrl-C and SIGTERM held (signals.import_torch).
LOADS_TORCH = frozenset({"info", "train", "translate", "generate", "average", "import-fairseq", "import-marian",
                         "export", "serve"})

# OS errors that report the state of the machine (disk full, read-only, no permission, no
# file descriptors left) or a path given that cannot name a file (too long, a loop of links,
# a file as a directory).
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG, errno.EACCES, errno.EPERM,
                                errno.EMFILE, errno.ENFILE, errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR})


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (module, _) in COMMANDS.items() if _module_exists(module)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or not _module_exists(COMMANDS[name][0]):
            return None
        with signals_held():  # some command modules load torch (see LOADS_TORCH)
            module = importlib.import_module(f"nmt_cli.commands.{COMMANDS[name][0]}")
        command = getattr(module, name.replace("-", "_"))
        if name in LOADS_TORCH and not hasattr(command.callback, "imports_torch_first"):
            command.callback = _importing_torch_first(command.callback)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if not rows:
            return
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, *args, **kwargs):
        guard_standard_streams()
        utf8_stdout()
        # Here too, not only in invoke: the group's own options (--help, --version)
        # write to stdout while click parses them, before invoke runs.
        with terminate_by_exception(), _one_error_line():
            return super().main(*args, **kwargs)

    def invoke(self, ctx: click.Context):
        try:
            os.getcwd()
        except FileNotFoundError:  # every relative path would fail, each with a traceback of its own
            _report("the current directory no longer exists (`nmt preprocess --destdir .`, say, "
                    "replaces it with a new one): cd into it again")
            sys.exit(1)
        with _one_error_line():  # within click's main, which would turn Ctrl-C into "Aborted!"
            return super().invoke(ctx)


def _importing_torch_first(callback: Callable) -> Callable:
    """`callback`, run once torch is loaded with the signals held (a LOADS_TORCH command's)."""
    @functools.wraps(callback)
    def run(*args, **kwargs):
        import_torch()
        return callback(*args, **kwargs)

    run.imports_torch_first = True
    return run


def _report(message: str) -> None:
    """The one `error:` line on stderr (a newline in a file name would split it)."""
    click.echo(f"error: {one_line(message)}", err=True)


@contextmanager
def _one_error_line() -> Iterator[None]:
    """Bad input, the machine's state or an interrupt within the block: one line on
    stderr and the exit status; a bug keeps its traceback."""
    try:
        yield
    except NmtError as error:
        _report(str(error))
        sys.exit(1)
    except BrokenPipeError:
        # `nmt translate ... | head`: the reader went away; that is not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)
    except OSError as error:
        # The machine's state or the user's path, not a bug: one line, no traceback.
        if error.errno not in ENVIRONMENT_ERRNOS:
            raise
        location = f": {error.filename}" if error.filename else ""
        _report(f"{error.strerror or error}{location}")
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Terminated:
        click.echo("terminated", err=True)
        sys.exit(EXIT_TERMINATED)
    except RuntimeError as error:  # torch's out-of-memory errors (CPU and GPU) are RuntimeErrors
        if not _is_out_of_memory(error):
            raise
        _report(f"out of memory ({str(error).splitlines()[0][:300]}); smaller batches "
                "(--max-tokens, --batch-size) or a smaller --beam need less")
        sys.exit(1)


def _is_out_of_memory(error: RuntimeError) -> bool:
    return type(error).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(error)


def _module_exists(module: str) -> bool:
    return importlib.util.find_spec(f"nmt_cli.commands.{module}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="nmt")
def main() -> None:
    """nmt: neural machine translation with the Transformer (Vaswani et al., 2017).

    \b
    A typical run:
      nmt preprocess -s en -t de --trainpref raw/train --validpref raw/valid \\
          --testpref raw/test --destdir data-bin --joined-dictionary --bpe-size 8000
      nmt train data-bin --arch transformer_small --save-dir run --max-update 2000
      nmt translate --path run/checkpoint_best.pt < raw/test.en > hyp.de
      nmt score --ref raw/test.de --hyp hyp.de
    """
