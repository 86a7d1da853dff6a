"""Helpers shared by the benchmark scripts: paths, the peer environment, timed commands
with peak memory, and the result lines every benchmark prints.

Standard library only: the scripts also run inside the peer environment
(benchmarks/.venv, made by setup_peers.sh), where nmt_cli is not installed.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS_DIR.parent
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
PEER_VENV = BENCHMARKS_DIR / ".venv"
PEER_PYTHON = PEER_VENV / "bin" / "python"


def peer_has(*modules: str) -> bool:
    """True when the peer environment exists and imports all `modules`."""
    if not PEER_PYTHON.is_file():
        return False
    probe = subprocess.run([str(PEER_PYTHON), "-c", "import " + ", ".join(modules)], capture_output=True)
    return probe.returncode == 0


def peer_bin(name: str) -> str:
    """A console script of the peer environment (fairseq-preprocess, ct2-fairseq-converter, ...)."""
    return str(PEER_VENV / "bin" / name)


def peer_env(threads: int | None = None) -> dict[str, str]:
    """Environment for peer subprocesses: fairseq's pickled checkpoints need the
    pre-2.6 torch.load default, and thread counts are fixed when asked."""
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "PYTHONPATH": str(BENCHMARKS_DIR)}
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def json_result(command: list[str], env: dict[str, str] | None = None) -> dict | str:
    """Run a benchmark's subprocess (a peer, or one system in a process of its own): its
    last stdout line parsed as JSON, or "failed: <its last error line>"."""
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return f"failed: {lines[-1] if lines else proc.returncode}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_or_exit(command: list[str], env: dict[str, str] | None = None) -> None:
    """Run `command`; if it fails, exit with its last error line."""
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        sys.exit(f"error: {Path(command[0]).name} {' '.join(command[1:3])} failed: {lines[-1] if lines else proc.returncode}")


def convert_fairseq_checkpoint(checkpoint: Path, dict_dir: Path, source_lang: str, target_lang: str, out: Path) -> None:
    """A fairseq checkpoint for the other systems: converted for CTranslate2 into out/ct2
    (the peer environment's ct2-fairseq-converter) and imported into nmt as out/nmt-run
    (`nmt import-fairseq`, with this process's python)."""
    run_or_exit([peer_bin("ct2-fairseq-converter"), "--model_path", str(checkpoint), "--data_dir", str(dict_dir),
                 "--source_lang", source_lang, "--target_lang", target_lang, "--output_dir", str(out / "ct2"),
                 "--unsafe_deserialization"], peer_env())
    run_or_exit([sys.executable, "-m", "nmt_cli", "import-fairseq", str(checkpoint), "--dict-dir", str(dict_dir),
                 "--out", str(out / "nmt-run"), "-s", source_lang, "-t", target_lang])


# ---------------------------------------------------------------- memory of a process tree


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def status_kib(pid: int, fields: tuple[str, ...]) -> dict[str, int]:
    """Fields of /proc/PID/status in KiB (e.g. VmRSS, RssAnon); 0 where the process is gone."""
    values = dict.fromkeys(fields, 0)
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name = line.split(":", 1)[0]
                if name in values:
                    values[name] = int(line.split()[1])
    except OSError:
        pass
    return values


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants (those still running)."""
    pids, stack = [], [root]
    while stack:
        pid = stack.pop()
        pids.append(pid)
        stack.extend(_children(pid))
    return pids


class PeakTreeRss:
    """Samples, every `interval` seconds in a thread, the resident memory of `pid` and all its
    descendants, summed (worker pools count in full): `.peak_mib` the largest VmRSS sum,
    `.peak_anon_mib` the largest RssAnon sum (memory not backed by files, such as mmaps)."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid, self.interval = pid, interval
        self.peak_mib = self.peak_anon_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = anon = 0
            for pid in process_tree(self.pid):
                status = status_kib(pid, ("VmRSS", "RssAnon"))
                rss, anon = rss + status["VmRSS"], anon + status["RssAnon"]
            self.peak_mib, self.peak_anon_mib = max(self.peak_mib, rss / 1024), max(self.peak_anon_mib, anon / 1024)
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakTreeRss":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def self_peak_rss_mib() -> float:
    """Peak resident memory of this process so far: VmHWM, which starts afresh at exec
    (getrusage's ru_maxrss would include the parent's memory at fork time)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


@dataclass
class CommandRun:
    seconds: float
    peak_tree_rss_mib: float  # sampled sum over the whole process tree
    peak_single_rss_mib: float  # largest single process (getrusage of waited-for children)
    stdout: str


class CommandFailed(RuntimeError):
    pass


def run_measured(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> CommandRun:
    """Run `command`, timing it and sampling the summed RSS of its process tree."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    with open(os.devnull, "rb") as stdin:
        proc = subprocess.Popen(command, env=env, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        with PeakTreeRss(proc.pid) as sampler:
            stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise CommandFailed(f"{' '.join(command[:3])} ... exited {proc.returncode}:\n{stderr[-3000:]}")
    # RUSAGE_CHILDREN's ru_maxrss is a maximum over all children ever waited for;
    # it only tells about this command when the command set a new maximum.
    single = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    single_mib = single / 1024 if single > before else float("nan")
    return CommandRun(seconds, sampler.peak_mib, single_mib, stdout)


# ---------------------------------------------------------------- machine and result lines


def machine_line() -> str:
    """CPU model, core count and load average: every result says what it ran on."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"# {time.strftime('%Y-%m-%d %H:%M %Z')}; {os.cpu_count()} cores ({model}); load average {load}"


def result_line(system: str, fields: dict[str, str]) -> str:
    return f"{system:<34} " + "   ".join(f"{value} {name}" for name, value in fields.items())


def ratio_line(metric: str, ours: float, peers: dict[str, float], higher_is_better: bool = True) -> str:
    """nmt's ratio to the best peer on `metric` (> 1: nmt is better)."""
    if not peers:
        return f"ratio: no peer measured ({metric})"
    best_name = (max if higher_is_better else min)(peers, key=peers.get)
    best = peers[best_name]
    ratio = ours / best if higher_is_better else best / ours
    return f"ratio nmt / best peer ({best_name}), {metric}: {ratio:.2f}x"
