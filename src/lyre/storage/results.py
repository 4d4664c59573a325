"""Where batch jobs' finished audio is kept: a folder on this machine or an S3(-compatible) bucket.

Keys are relative POSIX paths (``batch_abc/item_12.3.wav``). A result appears atomically: a reader
sees the whole object or nothing (the local store renames a synced file into place; S3 shows an
upload, multipart included, only once it completes). Every method blocks: call them in worker threads.
S3 credentials come from boto3's usual chain (AWS_ACCESS_KEY_ID..., an instance role), never from
Lyre's configuration; S3 failing is a StorageError (503), a missing object a KeyError.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol
from urllib.parse import unquote, urlsplit

from botocore.exceptions import BotoCoreError, ClientError

from lyre.errors import StorageError

if TYPE_CHECKING:
    from botocore.config import Config

CHUNK = 64 * 1024
PARTIAL = ".partial"  # the local store's folder of in-progress files, inside its root (never a key)


class ResultStore(Protocol):
    where: str  # for messages and logs: "/data/batches", "s3://bucket/prefix"

    # the finished file ``source`` (written in temp_dir()) becomes the object ``key``, atomically; source goes
    def publish(self, source: Path, key: str) -> None: ...
    def open(self, key: str) -> tuple[Iterator[bytes], int]: ...  # 64 KiB chunks, size; KeyError if absent
    def exists(self, key: str) -> bool: ...
    # prefixes are string prefixes, as on S3: "batch_a" covers batch_ab/ too; end it with "/" for a folder
    def delete_prefix(self, prefix: str) -> int: ...  # how many objects went
    def keys(self, prefix: str) -> list[str]: ...
    def temp_dir(self) -> Path: ...  # a local folder for files being written


def check_key(key: str, *, prefix: bool = False) -> str:
    """``key`` if it is a relative POSIX path that stays inside the store, else ValueError. A ``prefix``
    may also be empty, end in "/" or end in part of a name ("batch_abc/item_")."""
    parts = key.split("/")
    whole = parts[:-1] if prefix else parts
    if (key.startswith("/") or "\\" in key or "\0" in key or parts[-1] in (".", "..")
            or any(part in ("", ".", "..") for part in whole)):
        raise ValueError(f"result {'prefix' if prefix else 'key'} {key!r}: keys are relative paths like "
                         "'batch_abc/item_1.wav', without '..', '.', empty parts or backslashes")
    return key


class LocalStore:
    """Results as files under ``root``; in-progress files in ``root/.partial``, on the same filesystem,
    so that ``os.replace`` into place is atomic."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.where = str(self.root)

    def _path(self, key: str) -> Path:
        if check_key(key).split("/")[0] == PARTIAL:
            raise ValueError(f"result key {key!r}: {PARTIAL}/ is the store's own folder of in-progress files")
        return self.root.joinpath(*key.split("/"))

    def publish(self, source: Path, key: str) -> None:
        path, source = self._path(key), Path(source)  # (source in temp_dir(): elsewhere, the rename may fail)
        with source.open("rb") as f:
            os.fsync(f.fileno())  # the data on disk before the name: a crash never leaves a named, short file
        for attempt in range(2):
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(source, path)
                break
            except FileNotFoundError:  # a delete_prefix removed the folder, emptied, in between: once more
                if attempt or not source.exists():
                    raise
        for folder in (path.parent, *path.parent.parents):  # the rename, and any folder made for it, on disk
            _fsync_dir(folder)
            if folder == self.root:
                break

    def open(self, key: str) -> tuple[Iterator[bytes], int]:
        try:  # opened now: a publish over it or a delete later leaves this reader its whole file
            f = self._path(key).open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise KeyError(key) from None
        return _read(f), os.fstat(f.fileno()).st_size

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def keys(self, prefix: str) -> list[str]:
        start = self.root.joinpath(*check_key(prefix, prefix=True).split("/")[:-1])  # (the folders it names whole)
        found = []
        for folder, dirs, files in os.walk(start):
            if folder == str(self.root):
                dirs[:] = [d for d in dirs if d != PARTIAL]
            relative = Path(folder).relative_to(self.root).as_posix()
            found += [name if relative == "." else f"{relative}/{name}" for name in files]
        return sorted(k for k in found if k.startswith(prefix) and not k.startswith(f"{PARTIAL}/"))

    def delete_prefix(self, prefix: str) -> int:
        deleted = []
        for key in self.keys(prefix):
            with contextlib.suppress(FileNotFoundError):
                self._path(key).unlink()
                deleted.append(key)
        # the folders emptied go too (a folder per batch would pile up otherwise); one not empty stays
        folders = {p for key in deleted for p in self._path(key).parents if self.root in p.parents}
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()
        return len(deleted)

    def temp_dir(self) -> Path:
        folder = self.root / PARTIAL
        folder.mkdir(parents=True, exist_ok=True)
        return folder


def _read(f: BinaryIO) -> Iterator[bytes]:
    with f:
        while chunk := f.read(CHUNK):
            yield chunk


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)  # the rename itself is on disk, not only the file's data
    finally:
        os.close(fd)


class S3Store:
    """Results as objects under ``prefix`` in ``bucket``; in-progress files in the local ``scratch`` folder.
    ``config`` (botocore) replaces the timeouts and retries below."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, scratch: Path, config: Config | None = None):
        import boto3  # (here: a server with a local store never loads it)
        from botocore.config import Config

        self.bucket, self.prefix, self.scratch = bucket, check_key(prefix.strip("/"), prefix=True), Path(scratch)
        self.where = f"s3://{bucket}/{self.prefix}".rstrip("/")
        # botocore's default connect timeout (60 s, retried) would hold a worker thread for minutes
        # while the endpoint is down; its own session, as boto3's default one is not thread-safe
        config = config or Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 4, "mode": "standard"})
        self._client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region,
                                                      config=config)

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    @contextlib.contextmanager
    def _failing(self, what: str, key: str) -> Iterator[None]:
        from boto3.exceptions import Boto3Error  # (upload_file's S3UploadFailedError)

        try:
            yield
        except (BotoCoreError, ClientError, Boto3Error) as e:
            raise StorageError(f"the results store cannot {what} s3://{self.bucket}/{self._full(key)}: {e}") from e

    def publish(self, source: Path, key: str) -> None:
        with self._failing("write", key):
            # multipart above 8 MiB: S3 shows the object only when the upload completes, and s3transfer
            # aborts a failed one (a bucket lifecycle rule should still reap parts a crash leaves)
            self._client.upload_file(str(source), self.bucket, self._full(check_key(key)))
        Path(source).unlink(missing_ok=True)

    def open(self, key: str) -> tuple[Iterator[bytes], int]:
        with self._failing("read", key):
            try:
                reply = self._client.get_object(Bucket=self.bucket, Key=self._full(check_key(key)))
            except ClientError as e:
                if _missing(e):
                    raise KeyError(key) from None
                raise
        return self._chunks(reply["Body"], key), reply["ContentLength"]

    def _chunks(self, body: Any, key: str) -> Iterator[bytes]:
        try:
            with self._failing("read", key):
                yield from body.iter_chunks(CHUNK)
        finally:
            body.close()

    def exists(self, key: str) -> bool:
        with self._failing("look up", key):
            try:
                self._client.head_object(Bucket=self.bucket, Key=self._full(check_key(key)))
                return True
            except ClientError as e:
                if _missing(e):
                    return False
                raise

    def keys(self, prefix: str) -> list[str]:
        skip = len(self._full(""))
        with self._failing("list", prefix):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._full(check_key(prefix, prefix=True)))
            return [item["Key"][skip:] for page in pages for item in page.get("Contents", [])]

    def delete_prefix(self, prefix: str) -> int:
        keys = self.keys(prefix)
        for start in range(0, len(keys), 1000):  # (delete_objects takes at most 1000 keys)
            with self._failing("delete under", prefix):
                reply = self._client.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": self._full(k)} for k in keys[start:start + 1000]], "Quiet": True})
            if errors := reply.get("Errors"):
                raise StorageError(f"the results store cannot delete {len(errors)} objects under "
                                   f"s3://{self.bucket}/{self._full(prefix)}: {errors[0]}")
        return len(keys)

    def temp_dir(self) -> Path:
        self.scratch.mkdir(parents=True, exist_ok=True)
        return self.scratch


def _missing(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") in ("NoSuchKey", "NotFound", "404")


def open_store(cfg_url: str | None, data_dir: Path) -> ResultStore:
    """The store a setting names: None or "" for ``data_dir/batches``; ``s3://bucket/prefix`` (the
    endpoint from LYRE_S3_ENDPOINT_URL or AWS_ENDPOINT_URL, else AWS's); ``file:///abs/path`` or a path."""
    if not cfg_url:
        return LocalStore(Path(data_dir) / "batches")
    url = urlsplit(cfg_url)
    if url.scheme == "s3" and url.netloc and not (url.query or url.fragment):
        endpoint = os.environ.get("LYRE_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL") or None
        return S3Store(url.netloc, url.path.strip("/"), endpoint_url=endpoint, scratch=Path(data_dir) / "batches-partial")
    if url.scheme == "file" and url.netloc in ("", "localhost") and url.path.startswith("/"):
        return LocalStore(Path(unquote(url.path)))
    if not url.scheme:
        return LocalStore(Path(cfg_url).expanduser())
    raise ValueError(f"results store {cfg_url!r}: write s3://bucket/prefix, file:///absolute/path or a local path")
