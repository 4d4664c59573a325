"""Shared fixtures: the demo checkpoint, its tokenizer and SNAC, a PostgreSQL server, and one real Lyre
server for the whole run."""

from __future__ import annotations

import logging
import os
from pathlib import Path

# Under pytest-xdist (the README's test command runs two workers): each worker's share of the cores
# for torch's and OpenMP's thread pools, set before torch is first imported (below). Each worker's
# pool otherwise takes every core, and the oversubscribed pools spin: the suite then took twice
# the CPU time and no less wall time than one process.
if (_workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))

import pytest
from hypothesis import settings

from lyre.config import load_config
from lyre.model import checkpoint, demo
from tests.support.paths import CONFIG_PATH, REPO_ROOT

# CI (CI=true) replays a fixed set of examples so a landing is reproducible; local runs keep exploring
# new ones and store any failure in .hypothesis/ for the next run.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def shipped_config():
    return load_config(CONFIG_PATH)


@pytest.fixture(scope="session")
def demo_dir(shipped_config) -> Path:
    """The repository's demo checkpoint (setup.sh prepares it; written here if missing)."""
    return demo.ensure_demo(REPO_ROOT / shipped_config.model.demo_dir)


@pytest.fixture(scope="session")
def demo_tokenizer(demo_dir):
    return checkpoint.load_tokenizer(demo_dir / "llama")


@pytest.fixture(scope="session")
def demo_snac(demo_dir):
    return checkpoint.load_snac(demo_dir / "snac")


@pytest.fixture(scope="session")
def snac_dir() -> Path:
    """The tests' narrow SNAC (tests/support/narrow_codec.py): what the codec tests decode with."""
    from tests.support.narrow_codec import narrow_codec

    return narrow_codec()


@pytest.fixture(autouse=True)
def _quiet_lyre_logs(caplog):
    caplog.set_level(logging.INFO, logger="lyre")


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL server for the whole run (tests/support/postgres.py)."""
    from tests.support import postgres as pg

    server = pg.create()
    yield server
    pg.destroy(server)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path) -> str:
    """An empty database of each kind the registry and audit trail run on."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lyre.db'}"
    from tests.support.postgres import fresh_schema

    return fresh_schema(request.getfixturevalue("postgres").url)  # a clean schema for every test


@pytest.fixture(scope="session")
def server(demo_dir):
    """A real Lyre server with the test settings (tests.support.servers), shared by the whole run: in
    this process (its listeners on free ports, an event loop of its own), stopped by the drain."""
    from tests.support.servers import serve_in_process

    with serve_in_process() as s:
        yield s
        assert s.stop() == 0
