"""Pronunciation lexicons (issue 32) on a real server with two accounts: W3C PLS documents created,
listed, read back and deleted over REST; their aliases read in place of the caller's words (before
normalisation, on every protocol, by id or as the account's default); another account's lexicon is
404; a document that is not PLS gets a 400 naming its line; the limits hold; create and delete leave
audit rows. What the model read is seen in the prompt it was given (its token count)."""

from __future__ import annotations

import grpc
import pytest
import requests
import riva.client

from lyre.text.pls import Aliases, PlsError, parse
from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import same_speech, serve_in_process
from tests.support.waiting import until
from tests.support.ws import prompt_tokens

KEYS = {"acme": "k-acme", "other": "k-other"}
PLS = """<?xml version="1.0" encoding="UTF-8"?>
<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa" xml:lang="en-US">
  <lexeme><grapheme>Lyre</grapheme><alias>liar</alias></lexeme>
  <lexeme><grapheme>W3C</grapheme><alias>World Wide Web Consortium</alias></lexeme>
  <lexeme><grapheme>Zyx 9</grapheme><alias>zix 9</alias></lexeme>
  <lexeme><grapheme>tomato</grapheme><phoneme>təˈmeɪtoʊ</phoneme></lexeme>
</lexicon>"""


def auth(account: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[account]}"}


@pytest.fixture(scope="module")
def server():
    keys = ", ".join(f"{key}: {account}" for account, key in KEYS.items())
    with serve_in_process(f"server.api_keys={{{keys}}}", "voices.max_lexicons_per_account=3",
                          "voices.max_lexicon_bytes=4096") as srv:
        yield srv


def create(server, account: str, document: str = PLS, **extra) -> requests.Response:
    return requests.post(server.http + "/v1/lexicons", headers=auth(account), timeout=30,
                         json={"name": "brands", "pls": document, **extra})


def said(server, account: str, text: str, **extra) -> int:
    """The prompt tokens of one synthesis of ``text`` by ``account``."""
    return prompt_tokens(server, {"max_tokens": 7, "text": text, **extra}, auth(account))


def test_aliases_replace_whole_words_first_lexicon_first():
    first = parse(PLS)
    second = parse(PLS.replace("<alias>liar</alias>", "<alias>lyra</alias>"))
    aliases = Aliases([second, first])
    assert aliases.apply("Lyre (W3C), Lyres and Zyx 9 and Zyx 90; tomato.") == (
        "lyra (World Wide Web Consortium), Lyres and zix 9 and Zyx 90; tomato.")
    assert first.aliases == 3 and first.phonemes == 1


@pytest.mark.parametrize(("document", "message"), [
    (PLS.replace("<grapheme>W3C</grapheme>", ""), "line 4: a <lexeme> without a <grapheme>"),
    (PLS.replace("<alias>liar</alias>", ""), "line 3: a <lexeme> with neither an <alias> nor a <phoneme>"),
    (PLS.replace("liar</alias></lexeme>", "liar</alias></lexem>"), "mismatched tag: line 3"),
    (PLS.replace(' xml:lang="en-US"', ""), "line 2: <lexicon> needs xml:lang"),
    (PLS.replace("<lexeme><grapheme>W3C", "<entry><grapheme>W3C").replace("</alias></lexeme>\n  <lexeme><grapheme>Zyx",
                                                                          "</alias></entry>\n  <lexeme><grapheme>Zyx"),
     "line 4: <entry> is not a PLS element here"),
    ('<!DOCTYPE lexicon [<!ENTITY a "b">]>' + PLS.split("?>", 1)[1], "may not declare a document type"),
])
def test_a_document_that_is_not_pls_is_refused_naming_its_line(document, message):
    with pytest.raises(PlsError) as e:
        parse(document)
    assert message in str(e.value)


def test_an_accounts_lexicon_is_read_by_its_requests_and_is_no_one_elses(server):
    made = create(server, "acme")
    assert made.status_code == 201, made.text
    lexicon = made.json()
    assert lexicon["id"].startswith("lex_") and (lexicon["aliases"], lexicon["unused_phonemes"]) == (3, 1)
    assert made.headers["Location"] == f"/v1/lexicons/{lexicon['id']}"
    got = requests.get(server.http + made.headers["Location"], headers=auth("acme"), timeout=30).json()
    assert got["pls"] == PLS and got["default"] is False
    listed = requests.get(server.http + "/v1/lexicons", headers=auth("acme"), timeout=30).json()["lexicons"]
    assert [x["id"] for x in listed] == [lexicon["id"]]
    # read in place of the words, before normalisation (its text still the caller's)
    read = said(server, "acme", "Lyre joined W3C.", lexicons=[lexicon["id"]])
    assert read == said(server, "acme", "liar joined World Wide Web Consortium.")
    assert read != said(server, "acme", "Lyre joined W3C.")  # (named by no request, not a default)
    # another account: 404 everywhere, worded as for an id never made
    for answer in (requests.get(server.http + made.headers["Location"], headers=auth("other"), timeout=30),
                   requests.delete(server.http + made.headers["Location"], headers=auth("other"), timeout=30),
                   requests.post(server.http + "/v1/audio/speech", headers=auth("other"), timeout=30,
                                 json={"input": "Lyre.", "lexicons": [lexicon["id"]]})):
        assert answer.status_code == 404 and "visible only to the account that created them" in answer.text
    assert requests.get(server.http + "/v1/lexicons", headers=auth("other"), timeout=30).json() == {"lexicons": []}
    gone = requests.delete(server.http + made.headers["Location"], headers=auth("acme"), timeout=30)
    assert gone.status_code == 204
    assert requests.get(server.http + made.headers["Location"], headers=auth("acme"), timeout=30).status_code == 404


def test_a_default_lexicon_is_read_on_every_protocol_unless_the_request_names_others(server):
    lexicon = create(server, "acme", default=True).json()
    try:
        plain = said(server, "acme", "liar joined World Wide Web Consortium.")
        assert said(server, "acme", "Lyre joined W3C.") == plain
        assert said(server, "acme", "<speak>Lyre joined <break time='100ms'/>W3C.</speak>") == (
            said(server, "acme", "<speak>liar joined <break time='100ms'/>World Wide Web Consortium.</speak>"))
        assert said(server, "acme", "Lyre joined W3C.", lexicons=[]) != plain  # none, this once
        key = [("authorization", f"Bearer {KEYS['acme']}")]
        with grpc.insecure_channel(server.grpc) as channel:
            stub = tts_pb2_grpc.TextToSpeechStub(channel)
            sampling = tts_pb2.SamplingOptions(max_tokens=7, seed=2)
            a = stub.Synthesize(tts_pb2.SynthesizeRequest(text="Lyre.", sampling=sampling), metadata=key).audio
            b = stub.Synthesize(tts_pb2.SynthesizeRequest(text="liar.", sampling=sampling), metadata=key).audio
            assert same_speech(a, b)
            with pytest.raises(grpc.RpcError) as e:
                stub.Synthesize(tts_pb2.SynthesizeRequest(text="Lyre.", lexicons=["lex_" + "x" * 16]), metadata=key)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
        tts = riva.client.SpeechSynthesisService(riva.client.Auth(uri=server.grpc, metadata_args=[
            ["authorization", f"Bearer {KEYS['acme']}"]]))
        riva_a = tts.synthesize("Lyre.", sample_rate_hz=24000, custom_configuration={
            "seed": "2", "max_tokens": "7", "lexicons": lexicon["id"]}).audio
        assert same_speech(riva_a, a)
    finally:
        requests.delete(server.http + f"/v1/lexicons/{lexicon['id']}", headers=auth("acme"), timeout=30)


def test_limits_and_bad_documents_get_clear_answers(server):
    bad = create(server, "acme", PLS.replace("<alias>liar</alias>", ""))
    assert bad.status_code == 400 and "line 3: a <lexeme> with neither" in bad.json()["error"]["message"]
    big = create(server, "acme", PLS.replace("</lexicon>", "<!--" + "x" * 5000 + "--></lexicon>"))
    assert big.status_code == 413 and "voices.max_lexicon_bytes" in big.json()["error"]["message"]
    made = [create(server, "other") for _ in range(4)]
    assert [m.status_code for m in made] == [201, 201, 201, 409]
    assert "voices.max_lexicons_per_account" in made[3].json()["error"]["message"]
    for m in made[:3]:
        requests.delete(server.http + m.headers["Location"], headers=auth("other"), timeout=30)


def test_create_and_delete_leave_audit_rows(server):
    from lyre.storage.db import audit

    lexicon = create(server, "acme").json()
    requests.delete(server.http + f"/v1/lexicons/{lexicon['id']}", headers=auth("acme"), timeout=30)
    engine = server.service.database

    def rows() -> list:
        with engine.connect() as c:
            return [(r.account, r.outcome, r.text_sha256) for r in c.execute(
                audit.select().where(audit.c.voice == f"lexicon:{lexicon['id']}").order_by(audit.c.id))]

    until(lambda: len(rows()) == 2, what="the lexicon's two audit rows")
    assert rows() == [("acme", "lexicon_created", lexicon["sha256"]), ("acme", "lexicon_deleted", lexicon["sha256"])]
