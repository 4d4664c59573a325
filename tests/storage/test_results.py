"""The batch results stores on real parts: LocalStore on this filesystem, S3Store against moto's
standalone server over HTTP (tests/support/s3.py). The same behaviours on both (publish, open,
exists, keys, delete_prefix, key validation), then what only one of them has: the local store's
atomic rename and its root as a bound, S3's pagination and its failures as StorageError."""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from hypothesis import given
from hypothesis import strategies as st

from lyre.errors import StorageError
from lyre.storage.results import CHUNK, LocalStore, S3Store, check_key, open_store
from tests.support.postgres import free_port
from tests.support.s3 import CREDENTIALS, moto_server

BUCKET = "lyre-results"
BAD_KEYS = ["../x.wav", "batch/../../x.wav", "/etc/x.wav", "batch\\x.wav", "batch//x.wav", "batch/./x.wav",
            "", "batch/", ".", ".."]
FAST_FAILURE = Config(connect_timeout=2, retries={"max_attempts": 1})


@pytest.fixture(scope="module")
def s3_endpoint() -> str:
    """moto's server for this module, its bucket made, and boto3 pointed at test credentials only."""
    with pytest.MonkeyPatch.context() as mp, moto_server() as endpoint:
        for name, value in CREDENTIALS.items():
            mp.setenv(name, value)
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                     "LYRE_S3_ENDPOINT_URL"):
            mp.delenv(name, raising=False)
        for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):  # (a developer's ~/.aws stays out)
            mp.setenv(name, "/nonexistent")
        boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint


def s3_store(endpoint: str, scratch: Path, prefix: str | None = None, **kwargs) -> S3Store:
    """A store under a prefix of its own (one per test: they share the bucket)."""
    return S3Store(BUCKET, f"test-{uuid.uuid4().hex[:8]}" if prefix is None else prefix, endpoint_url=endpoint,
                   scratch=scratch, **kwargs)


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "batches")
    return s3_store(request.getfixturevalue("s3_endpoint"), tmp_path / "scratch")


def finished(store, data: bytes, name: str = "item.wav") -> Path:
    """A file written in the store's temp_dir, as a batch job writes its result."""
    path = store.temp_dir() / f"{uuid.uuid4().hex}-{name}"
    path.write_bytes(data)
    return path


def read(store, key: str) -> bytes:
    chunks, size = store.open(key)
    chunks = list(chunks)
    assert all(len(c) <= CHUNK for c in chunks)
    data = b"".join(chunks)
    assert len(data) == size
    return data


def test_a_result_round_trips(store):
    data = os.urandom(3 * CHUNK + 123)  # several chunks, the last one short
    source = finished(store, data)
    assert not store.exists("batch_abc/item_12.3.wav")
    store.publish(source, "batch_abc/item_12.3.wav")
    assert not source.exists()
    assert store.exists("batch_abc/item_12.3.wav")
    assert read(store, "batch_abc/item_12.3.wav") == data
    assert store.keys("batch_abc/") == ["batch_abc/item_12.3.wav"]


def test_publishing_again_replaces_the_object(store):
    store.publish(finished(store, b"first"), "b/x.wav")
    store.publish(finished(store, b"second"), "b/x.wav")
    assert read(store, "b/x.wav") == b"second"
    assert store.keys("") == ["b/x.wav"]


def test_keys_and_delete_prefix_go_by_string_prefix(store):
    for key in ["batch_a/item_1.wav", "batch_a/item_2.wav", "batch_a/sub/item_3.wav", "batch_ab/item_1.wav"]:
        store.publish(finished(store, key.encode()), key)
    assert store.keys("batch_a/") == ["batch_a/item_1.wav", "batch_a/item_2.wav", "batch_a/sub/item_3.wav"]
    assert store.keys("batch_a/item_") == ["batch_a/item_1.wav", "batch_a/item_2.wav"]
    assert len(store.keys("batch_a")) == 4  # (no "/": batch_ab too, as on S3)
    assert store.keys("batch_z/") == []
    assert store.delete_prefix("batch_a/") == 3
    assert store.keys("") == ["batch_ab/item_1.wav"]
    assert not store.exists("batch_a/item_1.wav")
    assert store.delete_prefix("batch_a/") == 0
    assert read(store, "batch_ab/item_1.wav") == b"batch_ab/item_1.wav"


def test_a_missing_object_is_a_key_error(store):
    with pytest.raises(KeyError):
        store.open("batch_abc/none.wav")
    store.publish(finished(store, b"x"), "batch_abc/sub/x.wav")
    with pytest.raises(KeyError):
        store.open("batch_abc/sub")  # (a folder, locally: no object either)
    assert not store.exists("batch_abc/sub")


@pytest.mark.parametrize("key", BAD_KEYS)
def test_keys_that_leave_the_store_are_refused(store, key):
    source = finished(store, b"x")
    for call in (lambda: store.publish(source, key), lambda: store.open(key), lambda: store.exists(key)):
        with pytest.raises(ValueError, match="relative paths"):
            call()
    assert source.exists()


@pytest.mark.parametrize("prefix", ["../", "/abs", "a/../", "a\\b", "a//b", ".."])
def test_prefixes_that_leave_the_store_are_refused(store, prefix):
    with pytest.raises(ValueError):
        store.keys(prefix)
    with pytest.raises(ValueError):
        store.delete_prefix(prefix)


@given(st.text(alphabet="ab./\\\0", max_size=12))
def test_any_key_accepted_stays_under_the_root(key):
    root = Path("/srv/batches")
    try:
        path = LocalStore(root)._path(key)
    except ValueError:
        return
    assert root in Path(os.path.normpath(path)).parents


# --------------------------------------------------------------------------------------------
# the local store


def test_a_local_result_appears_by_rename_on_one_filesystem(tmp_path):
    store = LocalStore(tmp_path / "batches")
    source = finished(store, b"RIFF....")
    assert source.parent == store.temp_dir() == tmp_path / "batches" / ".partial"
    assert source.stat().st_dev == store.root.stat().st_dev
    assert not store.exists("b/x.wav") and store.keys("") == []  # in progress: not a result, not listed
    inode = source.stat().st_ino
    store.publish(source, "b/x.wav")
    assert (tmp_path / "batches" / "b" / "x.wav").stat().st_ino == inode  # renamed, not copied
    assert list(store.temp_dir().iterdir()) == []


def test_a_reader_keeps_the_file_it_opened(tmp_path):
    store = LocalStore(tmp_path / "batches")
    store.publish(finished(store, b"old" * CHUNK), "b/x.wav")
    chunks, size = store.open("b/x.wav")
    store.publish(finished(store, b"new"), "b/x.wav")
    store.delete_prefix("b/")
    assert b"".join(chunks) == b"old" * CHUNK and size == 3 * CHUNK


def test_the_local_store_writes_nothing_outside_its_root_and_tidies_its_folders(tmp_path):
    store = LocalStore(tmp_path / "batches")
    for key in ("../escape.wav", ".partial/x.wav"):
        with pytest.raises(ValueError):
            store.publish(finished(store, b"x"), key)
    store.publish(finished(store, b"x"), "batch_a/sub/x.wav")
    assert store.delete_prefix("batch_a/") == 1
    folders = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_dir()}
    assert folders == {"batches", "batches/.partial"}  # the emptied batch folders are gone too
    assert not (tmp_path / "escape.wav").exists()


# --------------------------------------------------------------------------------------------
# S3


def test_s3_keys_are_relative_to_the_prefix(s3_endpoint, tmp_path):
    one = s3_store(s3_endpoint, tmp_path, prefix="/shared/one/")
    other = s3_store(s3_endpoint, tmp_path, prefix="shared/one-more")
    assert one.where == f"s3://{BUCKET}/shared/one"
    one.publish(finished(one, b"1"), "b/x.wav")
    other.publish(finished(other, b"2"), "b/x.wav")
    assert one.keys("") == ["b/x.wav"] and read(one, "b/x.wav") == b"1"
    assert one.delete_prefix("") == 1 and other.keys("") == ["b/x.wav"]
    assert other.delete_prefix("") == 1


@pytest.mark.slow  # (1,001 uploads to moto: 5 s)
def test_s3_lists_and_deletes_past_one_page(s3_endpoint, tmp_path):
    store = s3_store(s3_endpoint, tmp_path)
    client = boto3.session.Session().client("s3", endpoint_url=s3_endpoint)
    keys = [f"batch_big/item_{i:04d}.wav" for i in range(1003)]  # (a page and a delete_objects call: 1000)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=BUCKET, Key=f"{store.prefix}/{k}", Body=b"x"), keys))
    assert store.keys("batch_big/") == keys
    assert store.delete_prefix("batch_big/") == 1003
    assert store.keys("") == []


def test_an_unreachable_s3_endpoint_is_a_storage_error(tmp_path, monkeypatch):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    store = s3_store(f"http://127.0.0.1:{free_port()}", tmp_path, prefix="p", config=FAST_FAILURE)
    source = finished(store, b"x")
    with pytest.raises(StorageError, match=f"s3://{BUCKET}/p/b/x.wav") as caught:
        store.publish(source, "b/x.wav")
    assert caught.value.code == "storage_unavailable"
    assert source.exists()  # (kept for another try)
    for call in (lambda: store.open("b/x.wav"), lambda: store.exists("b/x.wav"), lambda: store.keys("b/"),
                 lambda: store.delete_prefix("b/")):
        with pytest.raises(StorageError, match=BUCKET):
            call()


def test_a_missing_bucket_is_a_storage_error(s3_endpoint, tmp_path):
    store = S3Store("no-such-bucket", endpoint_url=s3_endpoint, scratch=tmp_path, config=FAST_FAILURE)
    with pytest.raises(StorageError, match="no-such-bucket"):
        store.publish(finished(store, b"x"), "b/x.wav")
    with pytest.raises(StorageError, match="no-such-bucket"):
        store.keys("")


# --------------------------------------------------------------------------------------------
# open_store


def test_open_store_reads_the_setting(tmp_path, s3_endpoint, monkeypatch):
    assert open_store(None, tmp_path).where == str(tmp_path / "batches")
    assert open_store("", tmp_path).where == str(tmp_path / "batches")
    assert open_store(f"file://{tmp_path}/out%20put", tmp_path).where == str(tmp_path / "out put")
    assert open_store(str(tmp_path / "plain"), tmp_path).where == str(tmp_path / "plain")
    monkeypatch.setenv("LYRE_S3_ENDPOINT_URL", s3_endpoint)
    store = open_store(f"s3://{BUCKET}/via/setting/", tmp_path)
    assert isinstance(store, S3Store) and store.where == f"s3://{BUCKET}/via/setting"
    assert store.temp_dir() == tmp_path / "batches-partial"
    store.publish(finished(store, b"x"), "b/x.wav")
    assert read(store, "b/x.wav") == b"x" and store.delete_prefix("") == 1


@pytest.mark.parametrize("url", ["gs://bucket/x", "s3://", "s3:///x", "s3://bucket/x?y=1", "file://host/x",
                                 "file:relative", "https://example.com/x"])
def test_open_store_refuses_other_urls(tmp_path, url):
    with pytest.raises(ValueError, match="results store"):
        open_store(url, tmp_path)


def test_check_key_allows_prefixes_a_key_would_not():
    assert check_key("", prefix=True) == "" and check_key("batch_a/", prefix=True) == "batch_a/"
    with pytest.raises(ValueError):
        check_key("batch_a/")
