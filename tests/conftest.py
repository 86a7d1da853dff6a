"""Fixtures shared by several test modules."""

import pytest

from model_utils import torch_threads


@pytest.fixture
def one_thread():
    """Run torch on one thread: tiny models gain nothing from more, and runs stay bit-reproducible."""
    with torch_threads(1):
        yield
