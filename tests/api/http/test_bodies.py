"""Request bodies and headers a client gets wrong get a 4xx with the API's error body, never a 500:
an encoded body (415), a malformed multipart body (400), two Authorization headers (400 on REST,
UNAUTHENTICATED on gRPC). Part of issue 25."""

from __future__ import annotations

import http.client
import json

import grpc
import pytest

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import serve_in_process

KEY = "k-body"


@pytest.fixture(scope="module")
def keyed(demo_dir):
    with serve_in_process(f"server.api_key={KEY}") as s:
        yield s
        assert s.stop() == 0


def post(server, path: str, body: bytes, headers: list[tuple[str, str]]) -> tuple[int, dict]:
    host, port = server.http.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.putrequest("POST", path)
    for name, value in [*headers, ("Content-Length", str(len(body)))]:
        conn.putheader(name, value)
    conn.endheaders(body)
    r = conn.getresponse()
    status, data = r.status, r.read()
    conn.close()
    return status, json.loads(data)


AUTH = ("Authorization", f"Bearer {KEY}")


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "x-unknown"])
def test_an_encoded_body_is_refused_with_415(keyed, encoding):
    """aiohttp's own decoding is off: a body that is not what its Content-Encoding says (deflate) no
    longer resets the connection, and br no longer gets aiohttp's plain-text 400."""
    status, body = post(keyed, "/v1/audio/speech", json.dumps({"input": "Hello there."}).encode(),
                        [AUTH, ("Content-Type", "application/json"), ("Content-Encoding", encoding)])
    assert status == 415 and body["error"]["code"] == "unsupported_content_encoding"


def test_two_authorization_headers_are_refused(keyed):
    status, body = post(keyed, "/v1/audio/speech", json.dumps({"input": "hi"}).encode(),
                        [AUTH, AUTH, ("Content-Type", "application/json")])
    assert status == 400 and body["error"]["code"] == "duplicate_authorization"
    with grpc.insecure_channel(keyed.grpc) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(
                tts_pb2.SynthesizeRequest(text="hi"),
                metadata=(("authorization", f"Bearer {KEY}"), ("authorization", f"Bearer {KEY}")))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED and "one authorization" in refused.value.details()


MALFORMED = [
    b"--b\r\nContent-Disposition: form-data; name=\"audio\"\r\nContent-Type: \x00bad\r\n\r\nxx\r\n--b--\r\n",
    b"--b\r\nContent-Disposition: form-data; name=\"audio\"; filename*=unknown''x\r\n\r\nxx\r\n--b--\r\n",
    b"--b\r\nContent-Type: text/plain; charset=no-such-charset\r\nContent-Disposition: form-data; "
    b"name=\"transcript\"\r\n\r\nxx\r\n--b--\r\n",
    b"--b\r\nContent-Transfer-Encoding: bogus\r\nContent-Disposition: form-data; name=\"audio\"\r\n\r\nxx\r\n--b--\r\n",
    b"--c\r\nContent-Disposition: form-data; name=\"audio\"\r\n\r\nxx\r\n--c--\r\n",  # another boundary
    b"--b\r\nno header line\r\n\r\nxx",
    b"",
]


@pytest.mark.parametrize("path", ["/v1/voices", "/v1/audio/verify"])
@pytest.mark.parametrize("body", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_multipart_body_is_a_400(keyed, path, body):
    status, answer = post(keyed, path, body, [AUTH, ("Content-Type", "multipart/form-data; boundary=b")])
    assert 400 <= status < 500, (status, answer)
    assert set(answer["error"]) == {"message", "type", "code"}
