"""FakeHub: a stand-in for the Hugging Face Hub (unreachable from this machine) on loopback.

It serves a repository's files through the same HTTP endpoints ``huggingface_hub`` uses
(revision info, recursive tree listing, resolve HEAD/GET) and records every request, so tests can
run the real download code and see exactly which files it fetched.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class FakeHub:
    commit = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hub._answer(self, head=False)

            def do_HEAD(self):
                hub._answer(self, head=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def fetched(self, repo_id: str) -> set[str]:
        """Files of ``repo_id`` whose contents were downloaded (GET)."""
        prefix = f"/{repo_id}/resolve/{self.commit}/"
        return {path[len(prefix):] for method, path in self.requests if method == "GET" and path.startswith(prefix)}

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    @staticmethod
    def files_of(directory: Path, **extra: bytes) -> dict[str, bytes]:
        files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}
        return {**files, **extra}

    def _answer(self, req: BaseHTTPRequestHandler, head: bool) -> None:
        self.requests.append((req.command, req.path))
        path = req.path.split("?")[0]
        for repo_id, files in self.repos.items():
            if path == f"/api/models/{repo_id}/revision/main":
                info = {"id": repo_id, "sha": self.commit, "siblings": [{"rfilename": f} for f in files]}
                return self._send(req, 200, json.dumps(info).encode(), head, {"Content-Type": "application/json"})
            if path == f"/api/models/{repo_id}/tree/{self.commit}":
                tree = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                        for f, b in files.items()]
                return self._send(req, 200, json.dumps(tree).encode(), head, {"Content-Type": "application/json"})
            prefix = f"/{repo_id}/resolve/{self.commit}/"
            if path.startswith(prefix) and path[len(prefix):] in files:
                body = files[path[len(prefix):]]
                headers = {"X-Repo-Commit": self.commit, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'}
                return self._send(req, 200, body, head, headers)
        self._send(req, 404, b"{}", head, {"X-Error-Code": "RepoNotFound"})

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, code: int, body: bytes, head: bool, headers: dict[str, str]) -> None:
        req.send_response(code)
        for k, v in headers.items():
            req.send_header(k, v)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        if not head:
            req.wfile.write(body)
