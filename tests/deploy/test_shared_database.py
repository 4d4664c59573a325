"""Two replicas sharing one PostgreSQL: each sees the other's enrolments and deletions at once, a
PostgreSQL restart is reconnected to, and PostgreSQL down answers 503 for what needs it while
built-in voices go on (with audit.required false; with it true, nothing goes unrecorded). (That a
voice deleted elsewhere leaves a replica's kept prefixes at its sweep: tests/service/test_voices.py.)"""

from __future__ import annotations

import requests
import sqlalchemy as sa

from tests.support.postgres import fresh_schema
from tests.support.servers import NOT_SERVING, SERVING, HealthWatch, serve_in_process
from tests.support.voices import enroll

SPEECH = "/v1/audio/speech"


def kept(srv) -> float:
    return requests.get(srv.http + "/v1/stats", timeout=10).json()["engine"].get("prefix_cache_entries", 0)


def test_two_replicas_share_voices_and_deletions_and_survive_database_restarts(postgres):
    url = fresh_schema(postgres.url)
    common = (f"voices.database_url={url}", "voices.sweep_s=0.2", "audit.required=false")
    with serve_in_process(*common) as a, serve_in_process(*common) as b:  # two replicas (in-process here)
        r = enroll(a, "Shared")
        assert r.status_code == 201
        vid = r.json()["id"]
        assert vid in [v["id"] for v in requests.get(b.http + "/v1/voices", timeout=10).json()["voices"]]
        assert requests.post(b.http + SPEECH, json={"input": "On the other replica.", "voice": vid,
                                                   "response_format": "pcm"}, timeout=60).status_code == 200
        assert kept(b) == 1  # b computed and kept the voice's reference prefix
        assert requests.delete(a.http + f"/v1/voices/{vid}", timeout=10).status_code == 204
        assert requests.get(b.http + f"/v1/voices/{vid}", timeout=10).status_code == 404  # at once
        assert requests.post(b.http + SPEECH, json={"input": "gone", "voice": vid}, timeout=60).status_code == 404

        postgres.restart()  # while idle: the next request reconnects
        assert requests.get(a.http + "/v1/voices", timeout=30).status_code == 200
        assert enroll(b, "AfterRestart").status_code == 201

        postgres.stop()  # down: what needs it says so; built-in voices go on (audit.required false here)
        try:
            down = enroll(a, "WhileDown")
            assert down.status_code == 503 and down.json()["error"]["code"] == "database_unavailable"
            listed = requests.get(a.http + "/v1/voices", timeout=30)
            assert listed.status_code == 503
            for _ in range(2):
                ok = requests.post(a.http + SPEECH, json={"input": "Built-in voices go on.", "voice": "tara",
                                                         "response_format": "pcm"}, timeout=60)
                assert ok.status_code == 200 and len(ok.content) > 0
        finally:
            postgres.start()
        assert a.stop() == 0  # the rows kept while it was down are written once it is back (at the latest
        engine = sa.create_engine(url)  # as it stops)
        with engine.connect() as c:
            assert c.execute(sa.text("select count(*) from audit where voice = 'tara'")).scalar() >= 2
        engine.dispose()


def test_with_the_audit_required_a_database_down_refuses_synthesis_instead_of_losing_rows(postgres):
    url = fresh_schema(postgres.url)
    with serve_in_process(f"voices.database_url={url}") as srv:
        with HealthWatch(srv) as synthesis:
            postgres.stop()
            try:
                first = requests.post(srv.http + SPEECH, json={"input": "Its row waits.", "response_format": "pcm"},
                                      timeout=60)
                assert first.status_code == 200  # nobody knew yet; its row is kept and retried
                synthesis.until(NOT_SERVING)  # its row could not be written: no new callers
                refused = requests.post(srv.http + SPEECH, json={"input": "Refused."}, timeout=60)
                assert refused.status_code == 503
                assert "audit trail cannot be written" in refused.json()["error"]["message"]
                ready = requests.get(srv.http + "/ready", timeout=10)  # no new callers for a replica that refuses them
                assert ready.status_code == 503 and ready.json()["reason"] == "audit_unavailable"
            finally:
                postgres.start()
            synthesis.until(SERVING)  # the kept row written: accepted again
        back = requests.post(srv.http + SPEECH, json={"input": "Back.", "response_format": "pcm"}, timeout=60)
        assert back.status_code == 200
        assert srv.stop() == 0
