"""PD's catalog snapshot at 100,000 streams: encode, restore and size, version 2 (the
positional rows of ``pd/catalogimage.py``) beside version 1 (a map per stream and range,
the format before; encoded here as it was, restored by today's reader). Copied into an
archive of an older commit (``git archive``), it times that commit's own format and restore.

    .venv/bin/python benchmarks/bench_pd_snapshot.py [--streams 100000] [--sealed-every 10]
        [--sealed 5] [--long 20000] [--rounds 3]

Builds a catalog in process through real catalog commands: ``--streams`` streams (each
created with a request id, its range open), every ``--sealed-every``-th with ``--sealed``
sealed ranges whose statistics are recorded, plus one stream of ``--long`` sealed ranges.
Prints, per format, the CPU seconds (this process's, the best of ``--rounds``: the machine
is shared, so wall time says more about the neighbours) to encode the image, to decode
the msgpack alone, to restore a catalog (and as PD does: the GC paused), and the size.
In-process, no servers, a few minutes at the defaults.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pd.catalog import Catalog  # noqa: E402
from pd.catalogimage import CatalogImage, image_fields  # noqa: E402
from pd.commands import (  # noqa: E402
    CreateStream,
    OpenWriter,
    RecordRangeStats,
    RegisterServer,
    SealRange,
)

try:
    from pd.shell.raftdump import restore_catalog
except ImportError:  # an older commit (see above): PD restored with the GC on
    restore_catalog = Catalog.restore

PLACEMENT = ("rs1", "rs2", "rs3")


def build(streams: int, sealed_every: int, sealed: int, long: int) -> Catalog:
    catalog = Catalog()
    for sid in PLACEMENT:
        catalog.apply(RegisterServer(sid, f"127.0.0.1:{7100 + int(sid[2:])}", "ssd"))

    def stream(name: str, count: int) -> None:
        catalog.apply(CreateStream(name, 3, 2, "", (), PLACEMENT, request_id=f"req-{name}"))
        if count:
            catalog.apply(OpenWriter(name))
        for i in range(count):
            catalog.apply(SealRange(name, 1, i, 100 * (i + 1), PLACEMENT))
            catalog.apply(RecordRangeStats(name, i, 100 * (i + 1), 1_700_000_000_000 + i,
                                           1_700_000_000_500 + i, 4096 * 100))

    for n in range(streams):
        stream(f"stream-{n:06d}", sealed if sealed_every and n % sealed_every == 0 else 0)
    if long:
        stream("long", long)
    return catalog


def encode_v1(image: CatalogImage) -> bytes:
    """The snapshot as version 1 wrote it: a map per stream (``StreamMeta.to_dict``)."""
    packer = msgpack.Packer(use_bin_type=True)
    small = image_fields(image, 1)
    parts = [packer.pack_map_header(len(small) + 1)]
    for key, value in small.items():
        parts += (packer.pack(key), packer.pack(value))
    parts += (packer.pack("streams"), packer.pack_array_header(len(image.streams)))
    parts.extend(packer.pack(stream.to_dict()) for stream in image.streams.values())
    return b"".join(parts)


def cpu_s(fn: Callable[[], object], rounds: int) -> tuple[float, Any]:
    """This process's CPU seconds for ``fn()``, the best of ``rounds``, and its result."""
    best, out = float("inf"), None
    for _ in range(rounds):
        t = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t)
    return best, out


def measure(encode: Callable[[], bytes], catalog: Catalog, rounds: int) -> dict[str, float]:
    """CPU seconds to encode, to decode the msgpack alone, to restore; the size in MiB."""
    enc_s, data = cpu_s(encode, rounds)
    unpack_s, _ = cpu_s(lambda: msgpack.unpackb(data, raw=False), rounds)
    restore_s, restored = cpu_s(lambda: Catalog.restore(data), rounds)
    assert restored.view().streams == catalog.view().streams
    assert restored.version == catalog.version
    del restored
    paused_s, _ = cpu_s(lambda: restore_catalog(data), rounds)
    return {"encode": enc_s, "unpack": unpack_s, "restore": restore_s, "paused": paused_s,
            "mib": len(data) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument("--sealed-every", type=int, default=10)
    parser.add_argument("--sealed", type=int, default=5)
    parser.add_argument("--long", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    t = time.monotonic()
    catalog = build(args.streams, args.sealed_every, args.sealed, args.long)
    view = catalog.view()
    print(f"built {len(view.streams):,} streams, {view.range_count():,} ranges "
          f"in {time.monotonic() - t:.1f} s")
    image = catalog.image()
    now = f"snapshot() v{msgpack.unpackb(catalog.snapshot(), raw=False)['v']}"
    rows = {"v1 (as written before)": measure(lambda: encode_v1(image), catalog, args.rounds),
            now: measure(catalog.snapshot, catalog, args.rounds)}
    print("| format | encode CPU s | msgpack decode CPU s | restore CPU s | restore, GC paused "
          "(as PD) | size MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        print(f"| {name} | {r['encode']:.2f} | {r['unpack']:.2f} | {r['restore']:.2f} | "
              f"{r['paused']:.2f} | {r['mib']:.1f} |")
    v1, v2 = rows.values()
    print(f"| {now} / v1 | " + " | ".join(
        f"{v2[k] / v1[k]:.2f}" for k in ("encode", "unpack", "restore", "paused", "mib")) + " |")


if __name__ == "__main__":
    main()
