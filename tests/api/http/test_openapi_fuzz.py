"""``/openapi.json`` held to the live server by generated requests: schemathesis (its ``st`` command)
reads the document the server serves, generates requests from it (the schema's examples, boundary
values of every field, then hypothesis draws: valid and invalid data) and fails on any 5xx, any
answer whose status the document does not list for that operation, whose content type, headers or
body do not match it, any invalid request accepted, and a wrong answer to an unlisted method.

What it does not check: that every request the schema allows is accepted. Some limits cannot be
put in JSON Schema (a clip that decodes as audio, the consent field's JSON, ``min_tokens`` <=
``max_tokens``, a sample rate the format supports); those answers are documented 4xx.

Hypothesis' ``filter_too_much`` health check is off: it judges the generator (how many drawn requests it
threw away as not negative enough), not the server, and it fired on one CI machine but nowhere else.
The suite runs a fixed budget with a fixed seed (:data:`EXAMPLES` per operation, seed
:data:`SEED`). A longer run: ``LYRE_SCHEMATHESIS_EXAMPLES=2000 .venv/bin/python -m pytest
tests/api/http/test_openapi_fuzz.py`` (any seed with ``LYRE_SCHEMATHESIS_SEED``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lyre.api.http.openapi import document
from tests.support.paths import REPO_ROOT
from tests.support.servers import serve_in_process

EXAMPLES = int(os.environ.get("LYRE_SCHEMATHESIS_EXAMPLES", "15"))
SEED = int(os.environ.get("LYRE_SCHEMATHESIS_SEED", "1"))
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance", "negative_data_rejection",
          "missing_required_header", "unsupported_method", "allow_header_conformance")


def schemathesis(location: str, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    """``st run location`` with the suite's checks, budget and seed (one worker: reproducible)."""
    st = Path(sys.executable).with_name("st")
    with tempfile.TemporaryDirectory(prefix="lyre-fuzz-") as cwd:  # (a fresh hypothesis database each run: the
        return subprocess.run(                                        # same seed draws the same requests anywhere)
            [str(st), "run", location, "--checks", ",".join(CHECKS), "--max-examples", str(EXAMPLES),
             "--seed", str(SEED), "--phases", "examples,coverage,fuzzing", "--workers", "1",
             "--request-timeout", "120", "--continue-on-failure", "--no-color",
             "--suppress-health-check", "filter_too_much", *args],
            cwd=cwd, capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.support.openapi_hooks", "PYTHONPATH": str(REPO_ROOT),
                 "NO_COLOR": "1"})


def generated(run: subprocess.CompletedProcess) -> int:
    m = re.search(r"(\d+) generated", run.stdout)
    assert m, run.stdout[-3000:] + run.stderr[-3000:]
    return int(m.group(1))


@pytest.fixture(scope="module")
def server():
    with serve_in_process() as srv:
        yield srv


def test_generated_requests_get_the_answers_the_document_describes(server):
    run = schemathesis(server.http + "/openapi.json")
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-3000:]
    operations = sum(len(item) for item in document()["paths"].values()) - 1  # (all but /openapi.json itself)
    assert f"{operations} selected / {operations} total" in run.stdout and f"Tested: {operations}" in run.stdout
    assert generated(run) >= operations * 10  # it ran: every operation got requests


@pytest.mark.slow  # (the fuzz's own check that it can fail, ~16 s)
def test_an_answer_the_document_does_not_list_fails_the_run(server, tmp_path):
    """The check can fail: with 422 taken out of the document, speech's out-of-range answers are caught."""
    doc = json.loads(json.dumps(document()))
    del doc["paths"]["/v1/audio/speech"]["post"]["responses"]["422"]
    path = tmp_path / "openapi.json"
    path.write_text(json.dumps(doc))
    run = schemathesis(str(path), "--url", server.http, "--include-path", "/v1/audio/speech", "--max-failures", "1")
    assert run.returncode != 0
    assert "Undocumented status code" in run.stdout and "Received: 422" in run.stdout, run.stdout[-6000:]
