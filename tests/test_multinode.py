"""`nmt train` on two loopback "nodes" (gloo, one process each), each with its own --save-dir.

Only global rank 0 writes checkpoints, so node 1's directory stays empty: a restart must
give node 1 rank 0's state. Checked against an uninterrupted two-process run (exact
equality of the final weights and of the log), and the refusals of a rank whose own
checkpoint differs from rank 0's and of a rank 0 that has none while another rank has one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from databin_utils import reversal_data_bin

from nmt_cli.checkpoints.format import load_checkpoint

REPO = Path(__file__).resolve().parents[1]
# One thread: exact reproducibility between processes, and no oversubscription on small CI machines.
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
MAX_UPDATE = 24
ARGS = ["--arch", "transformer_tiny", "--max-tokens", "256", "--required-batch-size-multiple", "1",
        "--lr", "3e-3", "--warmup-updates", "20", "--log-interval", "2", "--dropout", "0.1",
        "--save-interval-updates", "4", "--validate-interval", "0", "--validate-interval-updates", "8",
        "--device", "cpu",
        # The EMA too: node 1's must be rank 0's after a restart (its validation runs on it).
        "--ema-decay", "0.9", "--ema-validate"]
TIMEOUT = 240  # seconds for any launch: a hang fails the test instead of blocking the suite

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*launcher_args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *launcher_args]


def train_command(data_bin: Path, save_dir: Path, max_update: int, extra: tuple[str, ...] = ()) -> list[str]:
    return ["-m", "nmt_cli", "train", str(data_bin), "--save-dir", str(save_dir), *ARGS,
            "--max-update", str(max_update), *extra]


@dataclass
class Finished:
    returncode: int
    output: str


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (Linux /proc): torchrun starts its workers in sessions of their own."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # ended meanwhile
            continue
        for child in children:
            found += [child, *descendants(child)]
    return found


class TwoNodes:
    """Two torchrun launchers, node ranks 0 and 1, rendezvous on 127.0.0.1."""

    launches = 0

    def __init__(self, tmp: Path, data_bin: Path, save_dirs: tuple[Path, Path], max_update: int = MAX_UPDATE,
                 node1_extra: tuple[str, ...] = ()) -> None:
        port = str(free_port())
        TwoNodes.launches += 1
        self.logs = [tmp / f"launch{TwoNodes.launches}-node{rank}.log" for rank in (0, 1)]
        self.procs = []
        for rank, save_dir in enumerate(save_dirs):
            command = torchrun("--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
                               "--master-addr", "127.0.0.1", "--master-port", port,
                               *train_command(data_bin, save_dir, max_update, node1_extra if rank else ()))
            with open(self.logs[rank], "wb") as log:
                self.procs.append(subprocess.Popen(command, env=SUBPROCESS_ENV, cwd=REPO, stdout=log,
                                                   stderr=subprocess.STDOUT))

    def kill(self) -> None:
        """SIGKILL every process of both nodes, as when the machines lose power."""
        pids = [pid for proc in self.procs for pid in (*descendants(proc.pid), proc.pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            proc.wait(timeout=60)

    def wait(self) -> list[Finished]:
        deadline = time.monotonic() + TIMEOUT
        try:
            for proc in self.procs:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"two-node training did not finish in {TIMEOUT} s:\n{self.logs[0].read_text()[-3000:]}")
        return [Finished(proc.returncode, log.read_text()) for proc, log in zip(self.procs, self.logs)]


def log_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]


def comparable(record: dict) -> dict:
    """A log record without the fields that depend on wall-clock time."""
    return {k: v for k, v in record.items() if k not in ("wall", "tokens_per_s")}


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory) -> Path:
    return reversal_data_bin(tmp_path_factory.mktemp("data") / "bin", train=240, valid=30)


@pytest.fixture(scope="module")
def resumed_nodes(tmp_path_factory, data_bin: Path) -> tuple[Path, Path, int, list[Finished]]:
    """Two nodes killed with SIGKILL mid-run and started again: (node 0 dir, node 1 dir,
    the update they resumed at, the restart's outcome per node)."""
    tmp = tmp_path_factory.mktemp("nodes")
    node_dirs = (tmp / "node0", tmp / "node1")
    nodes = TwoNodes(tmp, data_bin, node_dirs)
    log = node_dirs[0] / "train_log.jsonl"
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and all(p.poll() is None for p in nodes.procs):
        if log.is_file() and any(r.get("update", 0) >= 10 for r in log_records(node_dirs[0])):
            break
        time.sleep(0.05)
    running = all(p.poll() is None for p in nodes.procs)
    nodes.kill()
    assert running, f"the run ended before it could be killed:\n{nodes.logs[0].read_text()[-3000:]}"
    assert not (node_dirs[1] / "checkpoint_last.pt").exists()  # only global rank 0 writes
    interrupted_at = load_checkpoint(node_dirs[0] / "checkpoint_last.pt")["num_updates"]
    assert 4 <= interrupted_at < MAX_UPDATE
    finished = TwoNodes(tmp, data_bin, node_dirs).wait()
    return node_dirs[0], node_dirs[1], interrupted_at, finished


def test_two_nodes_killed_and_restarted_equal_an_uninterrupted_run(tmp_path: Path, data_bin: Path, resumed_nodes) -> None:
    node0, node1, interrupted_at, finished = resumed_nodes
    for node in finished:
        assert node.returncode == 0, node.output[-3000:]
    assert f"resumed from {node0 / 'checkpoint_last.pt'} at update {interrupted_at}" in finished[0].output
    assert not (node1 / "checkpoint_last.pt").exists()

    straight = tmp_path / "straight"
    command = torchrun("--nproc-per-node", "2", "--master-port", str(free_port()),
                       *train_command(data_bin, straight, MAX_UPDATE))
    proc = subprocess.run(command, env=SUBPROCESS_ENV, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [comparable(r) for r in log_records(node0)] == [comparable(r) for r in log_records(straight)]
    resumed, uninterrupted = load_checkpoint(node0 / "checkpoint_last.pt"), load_checkpoint(straight / "checkpoint_last.pt")
    assert resumed["num_updates"] == uninterrupted["num_updates"] == MAX_UPDATE
    for (name, p), q in zip(resumed["model"].items(), uninterrupted["model"].values()):
        assert torch.equal(p, q), name
    for (name, p), q in zip(resumed["ema"]["weights"].items(), uninterrupted["ema"]["weights"].values()):
        assert torch.equal(p, q), name


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error: ")]


def test_a_rank_with_a_stale_checkpoint_of_its_own_is_refused(tmp_path: Path, data_bin: Path, resumed_nodes) -> None:
    node0_done, _, _, _ = resumed_nodes
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    shutil.copytree(node0_done, node0)
    node1.mkdir()
    older = min(node0.glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.split("_")[-1]))
    stale_update = load_checkpoint(older)["num_updates"]
    shutil.copyfile(older, node1 / "checkpoint_last.pt")
    before = (node0 / "checkpoint_last.pt").read_bytes()
    finished = TwoNodes(tmp_path, data_bin, (node0, node1), max_update=MAX_UPDATE + 4).wait()
    for node in finished:
        assert node.returncode != 0, node.output[-3000:]
        [line] = error_lines(node.output)
        assert "rank(s) 1 disagree with rank 0 on the training state at start" in line, line
        assert f"rank 0 (its own {node0 / 'checkpoint_last.pt'}): update {MAX_UPDATE}" in line, line
        assert f"rank 1 (its own {node1 / 'checkpoint_last.pt'}): update {stale_update}" in line, line
    assert (node0 / "checkpoint_last.pt").read_bytes() == before  # refused before any update


def test_rank_0_without_a_checkpoint_while_another_rank_has_one_is_refused(tmp_path: Path, data_bin: Path,
                                                                          resumed_nodes) -> None:
    # The node ranks swapped between launches: the node holding the progress is now rank 1.
    node0_done, _, _, _ = resumed_nodes
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    node0.mkdir()
    shutil.copytree(node0_done, node1)
    finished = TwoNodes(tmp_path, data_bin, (node0, node1), max_update=MAX_UPDATE + 4).wait()
    for node in finished:
        assert node.returncode != 0, node.output[-3000:]
        [line] = error_lines(node.output)
        assert f"rank 0 has no checkpoint_last.pt in its --save-dir but rank 1 (update {MAX_UPDATE}) has one" in line
    assert not (node0 / "checkpoint_last.pt").exists()


def test_a_node_launched_with_other_settings_is_refused(tmp_path: Path, data_bin: Path) -> None:
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    finished = TwoNodes(tmp_path, data_bin, (node0, node1), max_update=2, node1_extra=("--lr", "1e-3")).wait()
    for node in finished:
        assert node.returncode != 0, node.output[-3000:]
        [line] = error_lines(node.output)
        assert "rank(s) 1 disagree with rank 0 on the training state at start" in line, line
        assert "rank 1 (no checkpoint): update 0" in line and "settings --lr 0.001 (rank 0: 0.003)" in line, line
    assert not (node0 / "checkpoint_last.pt").exists()


def test_rank_0_refusing_its_run_directory_stops_every_rank(tmp_path: Path, data_bin: Path, resumed_nodes) -> None:
    # Rank 0 checks its --save-dir before any rank reads a checkpoint: an earlier run without
    # checkpoint_last.pt is refused there, and the other node stops with the same line
    # instead of waiting for rank 0 in a later collective.
    node0_done, _, _, _ = resumed_nodes
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    shutil.copytree(node0_done, node0)
    (node0 / "checkpoint_last.pt").unlink()
    node1.mkdir()
    finished = TwoNodes(tmp_path, data_bin, (node0, node1), max_update=MAX_UPDATE + 4).wait()
    for node in finished:
        assert node.returncode != 0, node.output[-3000:]
        [line] = error_lines(node.output)
        assert f"rank 0: --save-dir {node0} holds an earlier run" in line, line
        assert "--reset-run" in line, line
    assert not (node0 / "checkpoint_last.pt").exists()


@pytest.mark.parametrize("launch, message", [
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
    ({"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     "RANK=5 is not one of the ranks 0..1"),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR is not set"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "70000"},
     "MASTER_PORT='70000' is not a port"),
])
def test_a_launch_setting_no_process_group_can_have_is_one_error_line_before_any_wait(tmp_path: Path, data_bin: Path,
                                                                                      launch, message) -> None:
    """A rank outside the world waited 30 minutes for its peers; the others failed inside torch."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    result = subprocess.run([sys.executable, "-m", "nmt_cli", "train", str(data_bin), "--arch", "transformer_tiny",
                             "--save-dir", str(tmp_path / "run"), "--cpu", "--max-update", "1"],
                            env={**env, **launch}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: environment variable ") and message in result.stderr, result.stderr


def launch_env(**launch: str) -> dict[str, str]:
    env = {k: v for k, v in SUBPROCESS_ENV.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                                 "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")}
    return {**env, "MASTER_ADDR": "127.0.0.1", **launch}


@contextlib.contextmanager
def waiting_ranks(save_root: Path, data_bin: Path, launches: dict[Any, dict[str, str]]) -> Iterator[dict]:
    """One `nmt train` process for each name -> launch environment, its stderr a pipe; all
    killed at the end, and by a watchdog after TIMEOUT: a rank that takes no signal would
    leave a test's readline waiting for ever."""
    ranks = {}
    for name, launch in launches.items():
        command = [sys.executable, "-m", "nmt_cli", "train", str(data_bin), "--arch", "transformer_tiny",
                   "--save-dir", str(save_root / str(name)), "--cpu", "--max-update", "1"]
        ranks[name] = subprocess.Popen(command, env=launch_env(**launch), stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(TIMEOUT, lambda: [rank.kill() for rank in ranks.values()])
    watchdog.start()
    try:
        yield ranks
    finally:
        watchdog.cancel()
        for rank in ranks.values():
            rank.kill()
            rank.wait()


def test_a_rank_waiting_for_rank_0_says_so_and_stops_at_ctrl_c_or_sigterm(tmp_path: Path, data_bin: Path) -> None:
    """torch waits for rank 0's store in C++, which retried through both signals (and printed
    a C++ stack at each): a rank started before rank 0 could only be killed."""
    launches = {sig: dict(WORLD_SIZE="2", RANK="1", LOCAL_RANK="0", MASTER_PORT=str(free_port()))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    with waiting_ranks(tmp_path, data_bin, launches) as ranks:
        for sig, rank in ranks.items():
            notice = rank.stderr.readline()  # after WAIT_NOTICE_SECONDS
            assert notice.startswith("rank 1 of 2: waiting for rank 0 at MASTER_ADDR:MASTER_PORT 127.0.0.1:"), notice
            rank.send_signal(sig)
            rest = rank.stderr.read()
            assert rank.wait(timeout=60) == 128 + sig, rest
            assert rest == ("interrupted\n" if sig == signal.SIGINT else "terminated\n"), rest


def test_ranks_waiting_for_missing_ranks_say_which_and_stop_at_ctrl_c_or_sigterm(tmp_path: Path,
                                                                                 data_bin: Path) -> None:
    """Ranks 0 to 2 of five, ranks 3 and 4 never started: torch's wait for them, in C++, took neither
    signal and said nothing; only SIGKILL ended them. A rank whose rank 0 stops says so in one line."""
    port = str(free_port())
    launches = {rank: dict(WORLD_SIZE="5", RANK=str(rank), LOCAL_RANK="0", MASTER_PORT=port) for rank in range(3)}
    with waiting_ranks(tmp_path, data_bin, launches) as ranks:
        for rank, process in ranks.items():
            notice = process.stderr.readline()  # after WAIT_NOTICE_SECONDS
            assert notice == f"rank {rank} of 5: waiting for ranks 3, 4 to join (for up to 30 minutes)\n", notice
        for rank, sig, code, said in ((2, signal.SIGTERM, 143, "terminated\n"),
                                      (0, signal.SIGINT, 130, "interrupted\n"),
                                      (1, None, 1, f"error: rank 1 of 5: rank 0's store at MASTER_ADDR:MASTER_PORT "
                                                   f"127.0.0.1:{port} closed while waiting for ranks 3, 4 to join; "
                                                   "did rank 0 stop?\n")):
            if sig is not None:
                ranks[rank].send_signal(sig)
            rest = ranks[rank].stderr.read()
            assert ranks[rank].wait(timeout=60) == code, rest
            assert rest == said, rest


def test_a_master_port_in_use_is_one_error_line(tmp_path: Path, data_bin: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "nmt_cli", "train", str(data_bin), "--arch", "transformer_tiny",
                                 "--save-dir", str(tmp_path / "run"), "--cpu", "--max-update", "1"],
                                env=launch_env(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_PORT=str(port)),
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr == (f"error: rank 0 cannot listen on MASTER_PORT {port}: the port is in use (by another "
                             "run?); choose another MASTER_PORT\n"), result.stderr
