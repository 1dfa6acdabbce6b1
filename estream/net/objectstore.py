"""The object store behind the object-storage tier: one small async client over obstore.

:class:`ObjectStore` is what the PD offloader writes through and what readers (the SDK,
Spark executors) read through. ``ObjectStore.from_url(url, endpoint=None)`` accepts

- ``file:///abs/dir``: objects are files under that directory (created if missing). A
  put is durable when it returns: the bytes go to a temporary file beside the object
  (``name#<digits>``, which a listing skips), which is fsynced, renamed over the key, and
  then the directory and every directory the put created, up to the store's root, are
  fsynced (:func:`put_file`); a crash leaves the old object or the new one under a key,
  never part of one;
- ``s3://bucket/prefix``: any S3-compatible store; ``endpoint`` (``http://H:P`` or
  ``https://...``) names it (AWS's own endpoint when None). Credentials come from
  ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (both required: obstore's default
  credential chain would otherwise probe a cloud metadata address), optional
  ``AWS_SESSION_TOKEN``, and the region from ``AWS_REGION`` (default ``us-east-1``).
  Plain http is allowed only when the endpoint says ``http://`` explicitly; requests
  use path-style addressing (``endpoint/bucket/key``), which every S3-compatible store
  understands.

Keys are relative to the URL's directory or prefix. Every call has a deadline
(``timeout_s``, also given to obstore's own HTTP client, whose retries are bounded below
it), so no call waits forever. obstore's errors become typed estream errors:
:class:`~estream.wire.errors.ObjectStoreError` (``not_found`` True for a missing object,
retriable otherwise) and :class:`~estream.wire.errors.Timeout`; a bad URL or missing
credentials raise :class:`~estream.wire.errors.InvalidArgument` at construction.

A request, once made, runs on the store's own threads to its end: a caller cancelled (or
past its deadline) stops waiting, not the request. :meth:`ObjectStore.close` waits for the
requests still running, so that none calls back into an interpreter that is shutting down
(which aborts the process); a process that reads or writes objects closes its stores. The
thread that hands an answer over may still need the interpreter for a moment after the
answer is in, so at exit the process waits until ``exit_quiet_s`` has passed since the last
answer (pyo3-async-runtimes, under which obstore runs, has no shutdown of its own). One
store runs at most ``requests_in_flight_max`` requests at once (each a thread of that
runtime for a ``file://`` store); more callers wait for a slot, within their deadline.

Side effects: network (S3) or files (``file://``), through obstore's Rust runtime.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import NotFoundError
from obstore.store import LocalStore, S3Store

from estream.wire.errors import InvalidArgument, ObjectStoreError, Timeout

request_timeout_s: Final = 30.0  # one PUT/GET/HEAD/DELETE/LIST page, retries included
# A PUT of more than this is a multipart upload in parts of this size (obstore's default is 5
# MiB: 205 part requests per GiB; 16 MiB makes it 64, and an object up to 16 MiB one PUT).
put_part_bytes: Final = 16 * 1024 * 1024
list_objects_max: Final = 10_000  # keys one list() call returns at most
# Requests one store runs at once: obstore runs a file:// request on a thread of its Rust
# runtime's blocking pool (up to 512 threads), so without a bound a burst of deletes or
# reads would start a thread each. Callers beyond it wait their turn (within their deadline).
requests_in_flight_max: Final = 32
close_wait_s: Final = 5.0  # close(): how long the requests still running may take
exit_quiet_s: Final = 0.05  # at exit: the time after the last answer its thread may need
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object of a listing: its key (relative to the store's prefix), size and age."""

    key: str
    size: int
    modified_s: float  # seconds since the Unix epoch


class ObjectStore:
    """Async put/get/get_range/head/delete/list with deadlines and typed errors."""

    def __init__(self, store: Any, url: str, endpoint: str | None, timeout_s: float,
                 root: Path | None = None) -> None:
        self._store = store
        self._root = root  # a file:// store's directory: puts are written by put_file
        self.url = url
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._running: set[asyncio.Future[Any]] = set()  # requests the store still runs
        self._slots = asyncio.Semaphore(requests_in_flight_max)  # held until each has

    @classmethod
    def from_url(
        cls,
        url: str,
        endpoint: str | None = None,
        *,
        timeout_s: float = request_timeout_s,
        env: Mapping[str, str] | None = None,
    ) -> ObjectStore:
        """A client for ``url`` (see the module docstring); ``env`` defaults to the
        process environment (the AWS credential variables)."""
        parts = urlsplit(url)
        if parts.scheme == "file":
            if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
                raise InvalidArgument(f"object store URL {url!r}: use file:///absolute/dir",
                                      argument="object_store")
            Path(parts.path).mkdir(parents=True, exist_ok=True)
            return cls(LocalStore(parts.path, mkdir=True), url, None, timeout_s,
                       Path(parts.path))
        if parts.scheme == "s3":
            return cls(_s3_store(url, endpoint, timeout_s, os.environ if env is None else env),
                       url, endpoint, timeout_s)
        raise InvalidArgument(f"object store URL {url!r}: expected file:// or s3://",
                              argument="object_store")

    def describe(self) -> dict[str, str | None]:
        """What PD publishes to range servers and clients: ``{"url", "endpoint"}``."""
        return {"url": self.url, "endpoint": self.endpoint}

    async def _request(self, start: Callable[[], Awaitable[_T]]) -> _T:
        """The answer of the request ``start()`` makes (obstore starts it at once), once
        one of ``requests_in_flight_max`` slots is free, shielded: cancelling the caller
        leaves the request to finish, and it is kept in ``_running``, holding its slot,
        until it has."""
        await self._slots.acquire()
        try:
            request = asyncio.ensure_future(start())
        except BaseException:
            self._slots.release()
            raise
        self._running.add(request)
        request.add_done_callback(self._running.discard)
        request.add_done_callback(self._release)
        request.add_done_callback(_answered)
        return await asyncio.shield(request)

    def _release(self, _: object) -> None:
        self._slots.release()

    async def close(self, wait_s: float = close_wait_s) -> None:
        """Wait (at most ``wait_s``) for the requests still running, such as those of
        callers that were cancelled. The store stays usable."""
        if self._running:
            await asyncio.wait(set(self._running), timeout=wait_s)

    async def _call(self, key: str, work: Awaitable[_T]) -> _T:
        try:
            return await asyncio.wait_for(work, self.timeout_s)
        except TimeoutError:
            raise Timeout(f"object store request for {key!r} took over {self.timeout_s} s",
                          address=self.url) from None
        except (NotFoundError, FileNotFoundError):
            raise ObjectStoreError(f"object {key!r} not found in {self.url}", key=key,
                                   not_found=True) from None
        except (obstore.exceptions.BaseError, OSError, ValueError) as exc:
            raise ObjectStoreError(f"object store {self.url}: {type(exc).__name__}: "
                                   f"{_first_line(exc)}", key=key, not_found=False) from None

    async def put(self, key: str, data: bytes | memoryview | Sequence[bytes | memoryview]
                  ) -> None:
        """Store ``data`` (bytes, or parts to concatenate) under ``key``, replacing what
        was there: one PUT up to ``put_part_bytes``, else a multipart upload (where the
        store has one) in parts of ``put_part_bytes``, streamed from ``data``."""
        size = len(data) if isinstance(data, bytes | memoryview) else sum(
            len(p) for p in data)
        root = self._root
        if root is not None:
            chunks = [data] if isinstance(data, bytes | memoryview) else list(data)
            await self._call(key, self._request(lambda: asyncio.to_thread(
                put_file, root, key, chunks)))
            return
        body: Any
        if size <= put_part_bytes:
            body = data if isinstance(data, bytes | memoryview) else b"".join(data)
            work = self._request(lambda: obstore.put_async(self._store, key, body,
                                                             use_multipart=False))
        else:
            body = data if isinstance(data, bytes | memoryview) else iter(data)
            work = self._request(lambda: obstore.put_async(self._store, key, body,
                                                           use_multipart=True,
                                                           chunk_size=put_part_bytes))
        await self._call(key, work)

    @staticmethod
    def put_requests(size: int) -> int:
        """The HTTP requests :meth:`put` makes for ``size`` bytes on S3: one PUT, or a
        multipart upload's create, its part PUTs and its completion."""
        return 1 if size <= put_part_bytes else 2 + -(-size // put_part_bytes)

    async def get(self, key: str) -> bytes:
        """The whole object."""
        async def work() -> bytes:
            result = await self._request(lambda: obstore.get_async(self._store, key))
            return bytes(await self._request(result.bytes_async))
        return await self._call(key, work())

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object (ObjectStoreError past its end)."""
        return bytes(await self.get_range_view(key, start, end))

    async def get_range_view(self, key: str, start: int, end: int) -> memoryview:
        """:meth:`get_range` without the copy: a read-only view of the buffer the store
        answered into (for large reads whose bytes are only parsed, never kept whole)."""
        if not 0 <= start < end:
            raise InvalidArgument(f"bad byte range [{start}, {end})", argument="range")
        data = await self._call(key, self._request(
            lambda: obstore.get_range_async(self._store, key, start=start, end=end)))
        view = memoryview(data)
        if view.nbytes != end - start:
            raise ObjectStoreError(f"object {key!r}: asked bytes [{start}, {end}), got "
                                   f"{view.nbytes}", key=key, not_found=False)
        return view

    async def get_ranges(self, key: str, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """Several byte ranges of one object in one call (obstore coalesces near ones)."""
        if not spans:
            return []
        for start, end in spans:
            if not 0 <= start < end:
                raise InvalidArgument(f"bad byte range [{start}, {end})", argument="range")
        data = await self._call(key, self._request(lambda: obstore.get_ranges_async(
            self._store, key, starts=[s for s, _ in spans], ends=[e for _, e in spans])))
        return [bytes(d) for d in data]

    async def head(self, key: str) -> int:
        """The object's size in bytes (ObjectStoreError with ``not_found`` if missing)."""
        meta = await self._call(key, self._request(
            lambda: obstore.head_async(self._store, key)))
        return int(meta["size"])

    size = head

    async def delete(self, key: str) -> None:
        """Delete the object; a missing one is not an error (deletes are retried)."""
        try:
            await self._call(key, self._request(
                lambda: obstore.delete_async(self._store, key)))
        except ObjectStoreError as exc:
            if not exc.fields.get("not_found"):
                raise

    async def list(self, prefix: str = "", *, limit: int = list_objects_max,
                   after: str | None = None) -> list[ObjectInfo]:
        """Up to ``limit`` objects whose keys start with ``prefix`` (a directory-like
        prefix: ``"a/b"`` lists ``a/b/...``), with ``after``: only keys sorting after it
        (to page through a large store; S3 lists in key order, a ``file://`` store may
        not)."""
        async def work() -> list[ObjectInfo]:
            out: list[ObjectInfo] = []
            stream = obstore.list(self._store, prefix or None, offset=after, chunk_size=1000)
            while True:
                try:
                    chunk = await self._request(stream.__anext__)
                except StopAsyncIteration:
                    break
                for meta in chunk:
                    out.append(ObjectInfo(str(meta["path"]), int(meta["size"]),
                                          meta["last_modified"].timestamp()))
                if len(out) >= limit:
                    break
            return out[:limit]
        return await self._call(prefix, work())


_tmp_ids = itertools.count(1)  # temporary files' suffixes (with the process id)


def put_file(root: Path, key: str, chunks: Sequence[bytes | memoryview], *,
             sync: Callable[[int], None] | None = None) -> None:
    """Write ``chunks`` as the object ``key`` under ``root``, durable on return: a
    temporary file beside it (``name#<digits>``: obstore's listing skips such names),
    fsynced (``sync``), renamed over the key, then the directories fsynced: the object's,
    and the parent of each directory this put created, up to ``root``. A failure removes
    the temporary file; the key keeps what it held. ``sync`` defaults to ``os.fsync``."""
    sync = sync or os.fsync
    path = _key_path(root, key)
    created = _make_dirs(root, path.parent)
    tmp = path.with_name(f"{path.name}#{os.getpid()}{next(_tmp_ids):06d}")
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            sync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    for directory in [path.parent, *(d.parent for d in created)]:
        _fsync_dir(directory, sync)


def _key_path(root: Path, key: str) -> Path:
    """The file of ``key`` (ValueError for a key that is not a plain relative path)."""
    segments = key.split("/")
    if any(s in ("", ".", "..") or "#" in s or "\\" in s for s in segments):
        raise ValueError(f"bad object key {key!r}")
    return root.joinpath(*segments)


def _make_dirs(root: Path, directory: Path) -> list[Path]:
    """Create ``directory`` (under ``root``) and its missing parents; returns those
    created, innermost first."""
    missing: list[Path] = []
    d = directory
    while d != root and not d.is_dir():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
    return missing


def _fsync_dir(directory: Path, sync: Callable[[int], None]) -> None:
    """Sync a directory: the names created or renamed in it become durable (the file
    ring's twin of estream.server.durable.fsync_dir, which this ring may not import)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        sync(fd)
    finally:
        os.close(fd)


def _s3_store(url: str, endpoint: str | None, timeout_s: float,
              env: Mapping[str, str]) -> S3Store:
    parts = urlsplit(url)
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if not bucket:
        raise InvalidArgument(f"object store URL {url!r}: no bucket", argument="object_store")
    key_id, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if not key_id or not secret:
        raise InvalidArgument("an s3:// object store needs AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY", argument="object_store")
    config: dict[str, Any] = {
        "access_key_id": key_id,
        "secret_access_key": secret,
        "region": env.get("AWS_REGION") or "us-east-1",
        "virtual_hosted_style_request": False,
    }
    if env.get("AWS_SESSION_TOKEN"):
        config["session_token"] = env["AWS_SESSION_TOKEN"]
    if endpoint:
        scheme = urlsplit(endpoint).scheme
        if scheme not in ("http", "https"):
            raise InvalidArgument(f"object store endpoint {endpoint!r}: expected http(s)://H:P",
                                  argument="object_store_endpoint")
        config["endpoint"] = endpoint.rstrip("/")
    client = {
        "allow_http": bool(endpoint) and endpoint.startswith("http://"),  # type: ignore[union-attr]
        "timeout": timedelta(seconds=timeout_s),
        "connect_timeout": timedelta(seconds=min(timeout_s, 5.0)),
    }
    retry = {"max_retries": 2, "retry_timeout": timedelta(seconds=timeout_s / 2)}
    try:
        return S3Store(bucket, prefix=prefix or None, config=config,  # type: ignore[arg-type]
                       client_options=client, retry_config=retry)  # type: ignore[arg-type]
    except (obstore.exceptions.BaseError, ValueError) as exc:
        raise InvalidArgument(f"object store {url!r}: {_first_line(exc)}",
                              argument="object_store") from None


_last_answer_s: float | None = None  # time.monotonic() of the last answer in this process


def _answered(request: asyncio.Future[Any]) -> None:
    """When the answer came (for :func:`_settle_at_exit`). Its error is its caller's news,
    or nobody's (a caller that stopped waiting)."""
    global _last_answer_s
    _last_answer_s = time.monotonic()
    if not request.cancelled():
        request.exception()


@atexit.register
def _settle_at_exit() -> None:
    """Before the interpreter finalizes: let the threads that handed the last answers over
    finish with the interpreter (one still at it once it is finalizing aborts the process)."""
    if _last_answer_s is not None:
        time.sleep(max(0.0, _last_answer_s + exit_quiet_s - time.monotonic()))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
