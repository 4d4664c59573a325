"""What the batch tests share: JSONL inputs, waiting for a batch to end, reading its files."""

from __future__ import annotations

import hashlib
import json

import requests

from tests.support.waiting import until

FINAL = ("completed", "cancelled", "expired", "failed")


def jsonl(*items: dict) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


def items(n: int, text: str = "Hello number {i}, this is a batch item.", **extra) -> bytes:
    return jsonl(*({"custom_id": f"r{i}", "input": text.format(i=i), "voice": "tara", "response_format": "wav",
                    **extra} for i in range(n)))


def submit(http: str, data: bytes, headers: dict | None = None, **params) -> requests.Response:
    return requests.post(f"{http}/v1/batches", data=data, params=params,
                         headers={"Content-Type": "application/jsonl", **(headers or {})}, timeout=120)


def wait_final(http: str, batch_id: str, headers: dict | None = None, timeout: float = 240.0) -> dict:
    def final() -> dict | None:
        batch = requests.get(f"{http}/v1/batches/{batch_id}", headers=headers, timeout=30).json()
        return batch if batch["status"] in FINAL else None

    return until(final, timeout, f"batch {batch_id} to end", interval=0.2)


def lines(http: str, path: str, headers: dict | None = None) -> list[dict]:
    r = requests.get(http + path, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/jsonl")
    return [json.loads(line) for line in r.text.splitlines()]


def audio_matches(http: str, line: dict, headers: dict | None = None) -> bytes:
    """The item's audio, checked against its output line (sha256 and size)."""
    r = requests.get(http + line["audio_url"], headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert hashlib.sha256(r.content).hexdigest() == line["sha256"] and len(r.content) == line["bytes"]
    return r.content
