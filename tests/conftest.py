"""Fixtures shared by several test modules."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Run torch on one thread: tiny models gain nothing from more, and runs stay bit-reproducible."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
