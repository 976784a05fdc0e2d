"""A throwaway PostgreSQL server on 127.0.0.1, from the Debian `postgresql` package's binaries.

initdb refuses to run as root, so as root the server runs as the package's `postgres` user in a
data directory that user owns. Password authentication (scram-sha-256) over TCP, as a production
instance is reached; the server is always stopped and its directory removed.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from onboarding.common.errors import OnboardingError

APT_HINT = "apt-get install -y postgresql"


def find_bin_dir() -> Path | None:
    """Directory holding initdb and pg_ctl: PATH first, then Debian's versioned directories."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[4]))
    for directory in reversed(candidates):
        if Path(directory, "initdb").is_file() and Path(directory, "pg_ctl").is_file():
            return Path(directory)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPostgres:
    def __init__(self, bin_dir: Path, user: str = "dagster", password: str = "onboarding-test"):
        self.bin_dir, self.user, self.password = bin_dir, user, password
        self.host, self.port = "127.0.0.1", _free_port()
        self._dir: Path | None = None
        self._started = False
        self._as_postgres = os.geteuid() == 0

    @property
    def data_dir(self) -> Path:
        assert self._dir is not None
        return self._dir / "data"

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise OnboardingError(
                f"PostgreSQL {args[0]} in {self._dir}",
                f"exit {result.returncode}: {(result.stderr or result.stdout).strip()[-2000:]}",
                f"Check {self._dir}/server.log; the binaries come from `{APT_HINT}`.",
            )
        return result

    def start(self) -> None:
        # Not under pytest's tmp (mode 0700, owned by root): the postgres user must reach it.
        self._dir = Path(tempfile.mkdtemp(prefix="onboarding-pg-", dir="/tmp"))
        pwfile = self._dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._as_postgres:
            shutil.chown(self._dir, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
        pwfile.chmod(0o600)
        self._run("initdb", "-D", str(self.data_dir), "-U", self.user, f"--pwfile={pwfile}",
                  "--auth=scram-sha-256", "--encoding=UTF8", "--no-sync")
        options = (f"-p {self.port} -c listen_addresses={self.host} "
                   f"-k {self._dir} -c fsync=off -c full_page_writes=off")
        self._started = True
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self._dir / "server.log"),
                  "-o", options, "-w", "-t", "60", "start")

    def create_database(self, name: str) -> None:
        import psycopg2

        conn = psycopg2.connect(host=self.host, port=self.port, user=self.user,
                                password=self.password, dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()

    def stop(self) -> None:
        try:
            if self._started:
                self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")
                self._started = False
        finally:
            if self._dir is not None:
                shutil.rmtree(self._dir)
                self._dir = None
