"""Fixtures for the codec tests: the demo SNAC with its noise off, random frames, one offline decode."""

from __future__ import annotations

import pytest

from lyre.codec import configure_noise
from lyre.model import checkpoint
from tests.support.engines import all_torch_threads


@pytest.fixture(scope="module")
def quiet_snac(snac_dir):
    return configure_noise(checkpoint.load_snac(snac_dir), enabled=False)


@pytest.fixture(scope="module", autouse=True)
def _all_cores():
    with all_torch_threads():  # (tests/support/engines.py: why)
        yield
