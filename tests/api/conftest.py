"""A real Lyre server (production_server.py) on free ports with the demo checkpoint."""

from __future__ import annotations

import pytest

from lyre.benchmarks.servers import ManagedServer, free_port  # noqa: F401  (free_port is used by tests)
from tests.support.servers import start_server, stop_server


@pytest.fixture(scope="session")
def server(demo_dir):
    s = start_server()
    yield s
    assert stop_server(s) == 0


