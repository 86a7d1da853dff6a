"""keep_freed_memory: freed blocks stay with the process for reuse, until release_freed_memory
gives them back (checked in a fresh process); physical_memory_bytes where the system cannot say."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nmt_cli.host_memory import physical_memory_bytes

# Prints how much resident memory (MiB) freeing a written 16 MiB block gives back.
# Modes: "default", "keep" (keep_freed_memory first), "keep-release" (then release_freed_memory
# once the block is freed).
FREED_MIB = """
import sys
from nmt_cli.host_memory import keep_freed_memory, release_freed_memory
if sys.argv[1].startswith("keep") and not keep_freed_memory():
    print("unsupported")
    sys.exit()
def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
block = b"\\x01" * (16 * 2**20)
before = resident_mib()
del block
if sys.argv[1] == "keep-release" and not release_freed_memory():
    print("unsupported")
    sys.exit()
print(before - resident_mib())
"""


def freed_mib(mode: str) -> str:
    return subprocess.run([sys.executable, "-c", FREED_MIB, mode], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_freed_memory_stays_with_the_process() -> None:
    kept = freed_mib("keep")
    if kept == "unsupported":
        pytest.skip("the C library is not glibc")
    assert float(freed_mib("default")) > 12  # the default: the block goes back to the system
    assert float(kept) < 4


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_released_memory_goes_back_to_the_system() -> None:
    released = freed_mib("keep-release")
    if released == "unsupported":
        pytest.skip("the C library is not glibc")
    assert float(released) > 12


def test_physical_memory_is_none_where_the_system_does_not_say(monkeypatch: pytest.MonkeyPatch) -> None:
    memory = physical_memory_bytes()
    assert memory is None or memory > 0
    if hasattr(os, "sysconf"):
        monkeypatch.setattr(os, "sysconf", lambda name: -1)  # undetermined
        assert physical_memory_bytes() is None

        def unknown_name(name: str) -> int:
            raise ValueError(f"unrecognized configuration name {name}")

        monkeypatch.setattr(os, "sysconf", unknown_name)
        assert physical_memory_bytes() is None
    monkeypatch.delattr(os, "sysconf", raising=False)  # as on Windows
    assert physical_memory_bytes() is None
