"""A throwaway PostgreSQL server for the tests: a cluster under a temp dir (Debian's ``postgresql``
package, which ``./setup.sh --with-test-services`` installs when missing), on a free port, stopped
at the end. PostgreSQL refuses to run as root: as root, the cluster belongs to the ``postgres``
user the package creates."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


def _bin(name: str) -> str | None:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Postgres:
    data_dir: Path
    port: int
    user: str  # the OS user the server runs as

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://lyre@127.0.0.1:{self.port}/lyre"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        prefix = ["runuser", "-u", self.user, "--"] if os.geteuid() == 0 else []
        return subprocess.run([*prefix, *args], capture_output=True, text=True, check=check, timeout=120,
                              cwd=self.data_dir.parent)  # (a directory the server's user can read)

    def start(self) -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data_dir), "-l", str(self.data_dir / "server.log"), "-w", "-o",
                  f"-p {self.port} -k {self.data_dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "stop", check=False)

    def restart(self) -> None:
        self.stop()
        self.start()


def missing() -> str | None:
    """Why no test cluster can be made here, or None."""
    if _bin("initdb") is None or _bin("pg_ctl") is None:
        return "PostgreSQL is not installed (./setup.sh --with-test-services installs Debian's postgresql)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "the psycopg driver is not installed (./setup.sh installs the dev extra)"
    return None


def create() -> Postgres:
    """A new, started cluster with a database ``lyre`` owned by the role ``lyre`` (trust auth, loopback)."""
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "")
    root = Path(tempfile.mkdtemp(prefix="lyre-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, user)
    pg = Postgres(data, free_port(), user)
    pg._run(_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
    pg.start()
    psql = ["psql", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-v", "ON_ERROR_STOP=1", "-c"]
    pg._run(*psql, "CREATE ROLE lyre LOGIN")
    pg._run(*psql, "CREATE DATABASE lyre OWNER lyre")
    return pg


def destroy(pg: Postgres) -> None:
    pg.stop("immediate")
    shutil.rmtree(pg.data_dir.parent, ignore_errors=True)


def fresh_schema(url: str) -> str:
    """Empty the database at ``url`` (its public schema dropped and made anew); returns ``url``."""
    import sqlalchemy as sa

    engine = sa.create_engine(url.replace("//lyre@", "//postgres@", 1))  # (the superuser, on any PostgreSQL)
    with engine.begin() as c:
        c.execute(sa.text("DROP SCHEMA public CASCADE"))
        c.execute(sa.text("CREATE SCHEMA public AUTHORIZATION lyre"))
    engine.dispose()
    return url
