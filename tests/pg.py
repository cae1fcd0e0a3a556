"""A real PostgreSQL for the tests, started on loopback in a temporary directory (initdb + pg_ctl from the installed
server, Debian's /usr/lib/postgresql/N/bin), with a password, on a free port; stopped (by pg_ctl, its own pid file)
at the end. PostgreSQL refuses to run as root, so as root it runs as the `postgres` user the package creates."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

PASSWORD = "s3cret-fleet-pw"


def bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or ([shutil.which("initdb")] if shutil.which(
        "initdb") else [])
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Postgres:
    bindir: Path
    data: Path
    port: int
    user: str = "fleet"

    def _run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout)

    def url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://{self.user}:{password}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w", "-t", "60", "-o",
                  f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data}", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop", check=False)

    def createdb(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def start_postgres() -> Postgres:
    bd = bindir()
    if bd is None:
        raise RuntimeError("PostgreSQL's server binaries (initdb, pg_ctl) are not installed: apt-get install -y "
                           "postgresql")
    root = Path(tempfile.mkdtemp(prefix="sglperf-pg-"))
    data = root / "data"
    pw = root / "pw"
    pw.write_text(PASSWORD + "\n")
    if os.geteuid() == 0:
        pg = pwd.getpwnam("postgres")
        for p in (root, pw):
            os.chown(p, pg.pw_uid, pg.pw_gid)
    server = Postgres(bd, data, free_port())
    server._run("initdb", "-D", str(data), "-U", server.user, "--pwfile", str(pw), "--auth", "scram-sha-256",
                "-E", "UTF8", "--no-sync", timeout=120)
    server.start()
    return server
