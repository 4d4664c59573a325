"""client.py batch, run as the script it is against one in-process server: submit a JSONL file and wait
(progress bar), then every item's audio downloaded and checked against the output file's sha256; a
refused input names its bad lines on stderr and exits 1; status shows a finished batch; the plain
``--text`` call is still routed to speech, even to say the word "batch"."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys

import pytest

from lyre.tools.batch_client import download
from tests.support.paths import REPO_ROOT
from tests.support.servers import serve_in_process

ITEMS = [  # Lyre's shape twice, OpenAI's Batch line once (its custom_id needs sanitising as a file name)
    {"custom_id": "a", "input": "Hi.", "response_format": "mp3"},
    {"custom_id": "b", "input": "Hello.", "response_format": "wav"},
    {"custom_id": "greeting/3", "method": "POST", "url": "/v1/audio/speech",
     "body": {"input": "Hey.", "response_format": "flac"}},
]
FILES = {"a": "a.mp3", "b": "b.wav", "greeting/3": "greeting_3.flac"}
MAGIC = {"a.mp3": (b"ID3", b"\xff"), "b.wav": (b"RIFF",), "greeting_3.flac": (b"fLaC",)}


@pytest.fixture(scope="module")
def server():
    with serve_in_process() as srv:
        yield srv


def client(server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "client.py", "--url", server.http, *args], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=300)


@pytest.fixture(scope="module")
def finished(server, tmp_path_factory):
    """A batch submitted with --wait --output: (the run, its batch id, the download folder)."""
    folder = tmp_path_factory.mktemp("batch")
    source = folder / "requests.jsonl"
    source.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    out = folder / "results"
    run = client(server, "batch", "submit", str(source), "--wait", "--output", str(out),
                 "--metadata", '{"campaign": "test"}')
    return run, run.stdout.splitlines()[0] if run.stdout else "", out


def test_submit_waits_then_downloads_every_item_checked_against_its_sha256(finished):
    run, batch_id, out = finished
    assert run.returncode == 0, run.stderr
    assert batch_id.startswith("batch_"), run.stdout
    assert f"{batch_id}: completed" in run.stdout and "3 completed, 0 failed" in run.stdout
    assert "3/3" in run.stderr  # the progress bar's end
    lines = [json.loads(line) for line in (out / "output.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == [item["custom_id"] for item in ITEMS]
    assert (out / "errors.jsonl").read_text() == ""
    for line in lines:
        data = (out / FILES[line["custom_id"]]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == line["sha256"] and len(data) == line["bytes"]
        assert data.startswith(MAGIC[FILES[line["custom_id"]]]), line
    assert sorted(p.name for p in out.iterdir()) == sorted([*FILES.values(), "errors.jsonl", "output.jsonl"])


def test_status_shows_a_finished_batch(server, finished):
    _, batch_id, _ = finished
    run = client(server, "batch", "status", batch_id)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == f"{batch_id}: completed"
    assert "items: 3 (3 completed, 0 failed" in run.stdout and '"campaign": "test"' in run.stdout
    listed = client(server, "batch", "list")
    assert listed.returncode == 0 and batch_id in listed.stdout, listed.stderr


def test_a_refused_input_names_its_bad_lines_and_exits_1(server, tmp_path):
    source = tmp_path / "bad.jsonl"
    source.write_text('{"custom_id": "x"}\n{"custom_id": "y", "input": "Fine."}\n')
    run = client(server, "batch", "submit", str(source), "--wait")
    assert run.returncode == 1 and run.stdout == ""
    assert "the server answered 400" in run.stderr
    assert "\n  line 1: give one of 'input', 'text' or 'template'" in run.stderr, run.stderr
    assert "line 2" not in run.stderr


def test_an_unknown_batch_is_an_error_and_text_is_still_spoken(server, tmp_path):
    run = client(server, "batch", "status", "batch_nope")
    assert run.returncode == 1 and run.stderr.startswith("error: the server answered 404"), run.stderr
    out = tmp_path / "batch.wav"
    run = client(server, "--text", "batch", "--output", str(out))  # the word, not the command
    assert run.returncode == 0 and out.read_bytes().startswith(b"RIFF"), run.stderr


class TamperedAPI:
    """A stand-in for lyre.tools.batch_client.Batches whose audio of item "b" differs from what the output file says."""

    def __init__(self):
        self.lines = [{"custom_id": cid, "response_format": "wav", "sha256": hashlib.sha256(cid.encode()).hexdigest(),
                       "audio_url": f"/audio/{cid}"} for cid in ("a", "b", ".a")]  # (".a" is also a.wav once sanitised)

    async def json(self, method, path, **kw):
        return {"id": "batch_x", "status": "completed"}

    async def save(self, path, target):
        data = {"/v1/batches/batch_x/output": "".join(json.dumps(line) + "\n" for line in self.lines),
                "/v1/batches/batch_x/errors": "", "/audio/b": "not b"}.get(path, path.removeprefix("/audio/"))
        target.write_text(data)
        return hashlib.sha256(data.encode()).hexdigest()


def test_download_keeps_no_file_whose_sha256_differs_and_exits_1(tmp_path, capsys):
    assert asyncio.run(download(TamperedAPI(), "batch_x", tmp_path)) == 1
    assert "error: the audio of 'b' has sha256" in capsys.readouterr().err
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "a-" + hashlib.sha256(b".a").hexdigest()[:10] + ".wav"
    assert names[1:] == ["a.wav", "errors.jsonl", "output.jsonl"]
