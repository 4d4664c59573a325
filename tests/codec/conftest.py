"""Fixtures for the codec tests: the demo SNAC with its noise off, random frames, one offline decode."""

from __future__ import annotations

import pytest

from lyre.codec import configure_noise
from lyre.model import checkpoint


@pytest.fixture(scope="module")
def quiet_snac(demo_dir):
    return configure_noise(checkpoint.load_snac(demo_dir / "snac"), enabled=False)






