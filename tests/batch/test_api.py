"""Batch jobs on a real server (SQLite): a batch in each input shape is synthesised into files whose
sha256 the output file names; an Idempotency-Key answers the same batch; another account's batch is a
404; bad lines refuse the batch naming each line; an input over the limit is a 413; cancel and expiry
end items in the error file; a backlog leaves /ready alone and shows in the metrics; each item has
its audit row with its trace id."""

from __future__ import annotations

import io
import json

import pytest
import requests
import soundfile
import sqlalchemy as sa

from lyre.storage.db import audit
from tests.batch.conftest import audio_matches, items, jsonl, lines, submit, wait_final
from tests.support.servers import serve_in_process
from tests.support.waiting import until

KEYS = {"acme": "k-acme", "other": "k-other", "small": "k-small", "ops": "k-ops"}
QUOTAS = {"small": {"batch_input_bytes": 2048, "batch_items": 4}}


def auth(account: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[account]}"}


def keyed(*extra: str):
    keys = ", ".join(f"{key}: {account}" for account, key in KEYS.items())
    return serve_in_process(f"server.api_keys={{{keys}}}", f"accounts.quotas={json.dumps(QUOTAS)}",
                            "server.operator_accounts=[ops]", "batch.poll_s=0.2", *extra)


@pytest.fixture(scope="module")
def srv(demo_dir):
    with keyed() as server:
        yield server


@pytest.fixture(scope="module")
def idle(demo_dir):
    """A server that takes no batch items itself (batch.enabled false): batches wait in the database."""
    with keyed("batch.enabled=false") as server:
        yield server


def test_a_batch_of_each_input_shape_is_synthesised_into_the_files_its_output_names(srv):
    data = jsonl(
        {"custom_id": "plain", "input": "Hello Ann, your table is ready.", "voice": "tara", "response_format": "wav"},
        {"custom_id": "filled", "template": "Hello {name}, you owe {amount} dollars.",
         "variables": {"name": "Bob", "amount": 12}, "voice": "leo", "response_format": "mp3"},
        {"custom_id": "openai/1", "method": "POST", "url": "/v1/audio/speech",
         "body": {"model": "tts-1", "input": "Goodbye now.", "voice": "tara", "response_format": "flac"}},
    )
    r = submit(srv.http, data, auth("acme"), metadata=json.dumps({"campaign": "spring"}))
    assert r.status_code == 200, r.text
    batch = r.json()
    assert batch["object"] == "batch" and batch["status"] == "in_progress"
    assert batch["request_counts"]["total"] == 3 and batch["metadata"] == {"campaign": "spring"}
    done = wait_final(srv.http, batch["id"], auth("acme"))
    assert done["status"] == "completed" and done["request_counts"]["completed"] == 3
    assert done["completed_at"] >= done["created_at"]
    out = lines(srv.http, done["output_url"], auth("acme"))
    assert [line["custom_id"] for line in out] == ["plain", "filled", "openai/1"]  # input order
    assert lines(srv.http, done["error_url"], auth("acme")) == []
    for line in out:
        audio = audio_matches(srv.http, line, auth("acme"))
        if line["response_format"] in ("wav", "flac"):  # whole files with their lengths in their headers
            pcm, rate = soundfile.read(io.BytesIO(audio))
            assert rate == 24000 and len(pcm) / rate == pytest.approx(line["duration_s"], abs=0.01)
    assert out[1]["response_format"] == "mp3" and audio_matches(srv.http, out[1], auth("acme"))[:3] in (b"ID3", b"\xff\xfb")
    # each item has its audit row, traced to its batch and custom_id
    srv.service.audit.flush()
    with srv.service.database.connect() as c:
        traced = c.execute(sa.select(audit.c.trace, audit.c.outcome, audit.c.protocol, audit.c.account)
                           .where(audit.c.trace.like(batch["id"] + "/%"))).all()
    assert sorted(traced) == sorted((f"{batch['id']}/{cid}", "completed", "batch", "acme")
                                    for cid in ("plain", "filled", "openai/1"))


def test_an_idempotency_key_answers_the_same_batch_and_refuses_another_input(idle):
    first = submit(idle.http, items(2), {**auth("acme"), "Idempotency-Key": "campaign-7"})
    again = submit(idle.http, items(2), {**auth("acme"), "Idempotency-Key": "campaign-7"})
    assert first.status_code == again.status_code == 200 and first.json()["id"] == again.json()["id"]
    other = submit(idle.http, items(3), {**auth("acme"), "Idempotency-Key": "campaign-7"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_conflict"
    # keys are per account: the same key of another account is another batch
    theirs = submit(idle.http, items(2), {**auth("other"), "Idempotency-Key": "campaign-7"})
    assert theirs.status_code == 200 and theirs.json()["id"] != first.json()["id"]


def test_another_accounts_batch_is_not_found_however_it_is_asked_for(idle):
    batch = submit(idle.http, items(1), auth("acme")).json()
    for method, path in (("GET", ""), ("POST", "/cancel"), ("GET", "/output"), ("GET", "/errors"),
                         ("GET", "/items/r0/audio")):
        r = requests.request(method, f"{idle.http}/v1/batches/{batch['id']}{path}", headers=auth("other"), timeout=30)
        assert r.status_code == 404, (path, r.text)
        assert batch["id"] in r.json()["error"]["message"] or "that id" in r.json()["error"]["message"]
    assert batch["id"] not in json.dumps(requests.get(f"{idle.http}/v1/batches", headers=auth("other")).json())
    mine = requests.get(f"{idle.http}/v1/batches", headers=auth("acme"), params={"limit": 100}).json()
    assert batch["id"] in [b["id"] for b in mine["data"]]
    r = requests.get(f"{idle.http}/v1/batches/batch_not-even-an-id/output", headers=auth("acme"), timeout=30)
    assert r.status_code == 404


def test_bad_lines_refuse_the_whole_batch_naming_each_line(idle):
    data = b"\n".join([
        b'{"custom_id": "ok", "input": "Fine."}',
        b'{"custom_id": "broken", "input": ',  # not JSON
        json.dumps({"custom_id": "who", "input": "Hi.", "voice": "nobody"}).encode(),
        json.dumps({"custom_id": "tpl", "template": "Hi {name}, {surname}.", "variables": {"name": "A"}}).encode(),
        json.dumps({"custom_id": "long", "input": "word " * 2000}).encode(),
        json.dumps({"custom_id": "ok", "input": "Twice."}).encode(),
        json.dumps({"custom_id": "attr", "template": "{name.__class__}", "variables": {"name": "x"}}).encode(),
        b"[1, 2]",
    ])
    before = requests.get(f"{idle.http}/v1/batches", headers=auth("acme"), params={"limit": 100}).json()["data"]
    r = submit(idle.http, data, auth("acme"))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_batch" and "nothing was stored" in error["message"]
    bad = {entry["line"]: entry["message"] for entry in error["lines"]}
    assert sorted(bad) == [2, 3, 4, 5, 6, 7, 8]
    assert "nobody" in bad[3] and "surname" in bad[4] and "characters" in bad[5] and "line 1" in bad[6]
    assert "plain name" in bad[7] and "JSON object" in bad[8]
    after = requests.get(f"{idle.http}/v1/batches", headers=auth("acme"), params={"limit": 100}).json()["data"]
    assert len(after) == len(before)


def test_an_input_over_the_accounts_limit_is_413_naming_it_and_items_over_its_quota_429(idle):
    r = submit(idle.http, items(40), auth("small"))
    assert r.status_code == 413 and "accounts.batch_input_bytes" in r.json()["error"]["message"]
    assert submit(idle.http, items(3), auth("small")).status_code == 200
    r = submit(idle.http, items(2), auth("small"))  # 3 queued + 2 > batch_items 4
    assert r.status_code == 429 and "accounts.batch_items" in r.json()["error"]["message"]
    assert r.headers.get("Retry-After")
    r = requests.post(f"{idle.http}/v1/batches", data=items(1), headers={**auth("acme"), "Content-Type": "audio/wav"})
    assert r.status_code == 415


def test_cancel_ends_queued_items_in_the_error_file(idle):
    batch = submit(idle.http, items(5), auth("acme")).json()
    r = requests.post(f"{idle.http}/v1/batches/{batch['id']}/cancel", headers=auth("acme"), timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["cancelled_at"]
    errors = lines(idle.http, f"/v1/batches/{batch['id']}/errors", auth("acme"))
    assert [e["status"] for e in errors] == ["cancelled"] * 5 and errors[0]["error"]["code"] == "cancelled"
    r = requests.get(f"{idle.http}/v1/batches/{batch['id']}/items/r0/audio", headers=auth("acme"), timeout=30)
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_ready"


def test_items_not_done_within_the_completion_window_expire(idle):
    batch = submit(idle.http, items(3), auth("other"), completion_window="1s").json()
    assert batch["expires_at"] - batch["created_at"] == 1
    done = wait_final(idle.http, batch["id"], auth("other"), timeout=60)
    assert done["status"] == "expired" and done["request_counts"]["expired"] == 3 and done["expired_at"]
    errors = lines(idle.http, done["error_url"], auth("other"))
    assert {e["status"] for e in errors} == {"expired"} and "completion window" in errors[0]["error"]["message"]
    r = submit(idle.http, items(1), auth("other"), completion_window="2 weeks")
    assert r.status_code == 400 and "completion_window" in r.json()["error"]["message"]


def test_a_backlog_leaves_ready_alone_and_shows_in_the_metrics(idle):
    submit(idle.http, items(30), auth("acme"))
    assert requests.get(f"{idle.http}/ready", timeout=30).status_code == 200

    def metrics() -> dict | None:
        text = requests.get(f"{idle.http}/metrics", headers=auth("ops"), timeout=30).text
        found = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                 if line.startswith("lyre_batch_") or line.startswith("lyre_lane_")}
        return found if found.get('lyre_batch_items{state="queued"}', 0) >= 30 else None

    found = until(metrics, 30, "the backlog in the metrics")
    assert found["lyre_batch_oldest_queued_seconds"] >= 0 and found['lyre_lane_sessions{lane="batch"}'] == 0


def test_cancelling_a_running_batch_stops_its_items(srv):
    batch = submit(srv.http, items(12, text="This longer sentence number {i} keeps the batch lane busy a while."),
                   auth("other")).json()
    until(lambda: requests.get(f"{srv.http}/v1/batches/{batch['id']}", headers=auth("other")).json()
          ["request_counts"]["running"] > 0, 60, "an item to run", interval=0.05)
    requests.post(f"{srv.http}/v1/batches/{batch['id']}/cancel", headers=auth("other"), timeout=30)
    done = wait_final(srv.http, batch["id"], auth("other"))
    counts = done["request_counts"]
    assert done["status"] == "cancelled" and counts["cancelled"] >= 1
    assert counts["completed"] + counts["cancelled"] == 12 and counts["queued"] == counts["running"] == 0

    def idle() -> bool:  # nothing left holding a KV slot or waiting for one
        stats = requests.get(f"{srv.http}/v1/stats", headers=auth("ops"), timeout=30).json()
        return stats["kv_cache"]["used_slots"] == 0 and stats["scheduler"]["batch_sessions"] == 0 \
            and stats["scheduler"]["batch_waiting"] == 0

    until(idle, 60, "every KV slot to be free")


def test_hostile_items_are_refused_quickly_and_odd_but_valid_ones_accepted(idle):
    bomb = json.dumps({"custom_id": "bomb", "template": "{a}" * 30_000, "variables": {"a": "x" * 1000}})
    braces = json.dumps({"custom_id": "a{b}", "input": "Hi."})
    r = submit(idle.http, (bomb + "\n" + braces).encode(), auth("acme"))
    assert r.status_code == 400
    bad = {entry["line"]: entry["message"] for entry in r.json()["error"]["lines"]}
    assert "passes" in bad[1] and "braces" in bad[2]
    # a line separator inside a JSON string, a byte-order mark, CRLF line ends, SSML with an ampersand in a value
    odd = ("\ufeff" + json.dumps({"custom_id": "sep", "input": "One\u2028two."}, ensure_ascii=False) + "\r\n"
           + json.dumps({"custom_id": "ssml", "template": "<speak>Hello {name}</speak>",
                         "variables": {"name": "Tom & Jerry <3"}}) + "\r\n").encode()
    r = submit(idle.http, odd, auth("acme"))
    assert r.status_code == 200, r.text
    assert r.json()["request_counts"]["total"] == 2
    r = requests.get(f"{idle.http}/v1/batches", headers=auth("acme"), params={"limit": "²"}, timeout=30)
    assert r.status_code == 400
