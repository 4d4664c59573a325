"""A throwaway S3 endpoint for the tests: moto's standalone server (``python -m moto.server``, what
the ``moto_server`` script runs; the dev extra's ``moto[server]``) in a process of its own on a free
port, so that boto3 talks real HTTP to it; stopped at the end. It takes any credentials: set
:data:`CREDENTIALS` in the environment so that boto3 finds some, and never real ones."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import IO

from tests.support.postgres import free_port
from tests.support.waiting import until

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
START_TIMEOUT_S = 30.0  # a bound for a stuck start (it takes about a second), not a measurement
STOP_TIMEOUT_S = 10.0


def _answers(endpoint: str, proc: subprocess.Popen, log: IO[str]) -> bool:
    if proc.poll() is not None:
        log.seek(0)
        raise AssertionError(f"moto's server exited ({proc.returncode}) before answering:\n{log.read()}")
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
            return True
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A started moto server; yields its endpoint URL (``http://127.0.0.1:PORT``)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    # its log goes to a file: it writes a line per request, and a pipe nobody reads would fill and stall it
    with tempfile.TemporaryFile("w+", prefix="lyre-moto-") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, text=True, env={**os.environ, **CREDENTIALS})
        try:
            until(lambda: _answers(endpoint, proc, log), timeout=START_TIMEOUT_S, what=f"moto's server on {endpoint}")
            yield endpoint
        finally:
            proc.terminate()  # (it exits on SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
