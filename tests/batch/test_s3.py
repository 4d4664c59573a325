"""Batch results in an S3-compatible store (moto's standalone server, spoken to over HTTP by boto3):
items' audio is published there and served back through the API; after batch.retention_days the
batch and its objects are deleted."""

from __future__ import annotations

import boto3
import pytest
import requests

from tests.batch.conftest import audio_matches, items, lines, submit, wait_final
from tests.support.s3 import CREDENTIALS, moto_server
from tests.support.servers import serve_in_process
from tests.support.waiting import until

BUCKET = "lyre-batches"


@pytest.fixture(scope="module")
def s3():
    with moto_server() as endpoint, pytest.MonkeyPatch.context() as mp:
        for name, value in CREDENTIALS.items():
            mp.setenv(name, value)
        mp.setenv("LYRE_S3_ENDPOINT_URL", endpoint)
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        yield client


def keys(client, prefix: str) -> list[str]:
    return [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


def test_items_are_published_to_s3_served_back_and_deleted_after_retention(s3, demo_dir):
    # retention of 3 s (in days): the batch is deleted a few upkeeps after it ends
    with serve_in_process(f"batch.results_url=s3://{BUCKET}/campaigns", "batch.poll_s=0.2",
                          f"batch.retention_days={3 / 86400}") as srv:
        batch = submit(srv.http, items(3, response_format="mp3")).json()
        done = wait_final(srv.http, batch["id"])
        assert done["status"] == "completed", done
        out = lines(srv.http, done["output_url"])
        stored = keys(s3, f"campaigns/{batch['id']}/")
        assert len(stored) == 3
        for line in out:
            assert line["location"].startswith(f"s3://{BUCKET}/campaigns/{batch['id']}/")
            audio = audio_matches(srv.http, line)
            key = line["location"].removeprefix(f"s3://{BUCKET}/")
            assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == audio
        until(lambda: requests.get(f"{srv.http}/v1/batches/{batch['id']}", timeout=30).status_code == 404, 60,
              "the batch to be deleted after its retention")
        assert keys(s3, f"campaigns/{batch['id']}/") == []
