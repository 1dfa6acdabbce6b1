"""PNG charts of the comparison run (``benchmarks/results/compare.json``), with matplotlib:

- ``throughput.png``: records/s per system: appends with many in flight (1 KiB, 100 B)
  and catch-up reads;
- ``latency_cdf.png``: latency CDFs per system: one in flight, many in flight, tail;
- ``kill_timeline.png``: append latency over time around the kill of a replica;
- ``scaling.png``: append throughput against the number of writers;
- ``pd_commits.png``: placement-driver commits per second beside etcd.

Systems that were not measured ("pending") are named on the chart, never drawn.

    python -m benchmarks.charts [--input benchmarks/results/compare.json]

Side effect: writes PNG files next to the input.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DPI = 110


def _by_scenario(data: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return [m for m in data["measurements"] if m["summary"]["scenario"].startswith(prefix)]


def _label(system: str) -> str:
    return textwrap.fill(system, 16)


def _pending_note(ax: Axes, rows: list[dict[str, Any]]) -> None:
    pending = [m["summary"]["system"] for m in rows if m["summary"].get("pending")]
    if pending:
        ax.text(0.5, -0.22, "not measured: " + ", ".join(pending), transform=ax.transAxes,
                ha="center", va="top", fontsize=7, color="firebrick", wrap=True)


def _bars(ax: Axes, rows: list[dict[str, Any]], key: str, title: str, unit: str) -> None:
    done = [m["summary"] for m in rows if not m["summary"].get("pending")]
    names = [_label(r["system"]) for r in done]
    values = [r.get(key) or 0.0 for r in done]
    colors = ["tab:blue" if r["system"].startswith("estream") else "tab:gray" for r in done]
    bars = ax.bar(range(len(done)), values, color=colors)
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=7)
    ax.set_xticks(range(len(done)), names, fontsize=6)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(unit)
    _pending_note(ax, rows)


def throughput(data: dict[str, Any], out: Path, stamp: str) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    _bars(axes[0], _by_scenario(data, "1 append many in flight 1KiB"), "rate",
          "appends, many in flight, 1 KiB", "records/s")
    _bars(axes[1], _by_scenario(data, "1 append many in flight 100B"), "rate",
          "appends, many in flight, 100 B", "records/s")
    _bars(axes[2], _by_scenario(data, "3 catch-up read"), "rate",
          "catch-up read, 1 KiB", "records/s")
    return _save(fig, out / "throughput.png", stamp)


def _cdf(ax: Axes, rows: list[dict[str, Any]], title: str) -> None:
    for m in rows:
        lat = sorted(x for x in m["latencies_ms"] if x is not None)
        if not lat:
            continue
        ys = [(i + 1) / len(lat) for i in range(len(lat))]
        style = "-" if m["summary"]["system"].startswith("estream") else "--"
        ax.plot(lat, ys, style, label=m["summary"]["system"], linewidth=1.2)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("latency, ms (log)")
    ax.set_ylabel("fraction of ops")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, loc="lower right")
    _pending_note(ax, rows)


def latency_cdf(data: dict[str, Any], out: Path, stamp: str) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    _cdf(axes[0], _by_scenario(data, "2 append one in flight"), "append, one in flight, 1 KiB")
    _cdf(axes[1], _by_scenario(data, "1 append many in flight 1KiB"),
         "append, many in flight, 1 KiB")
    _cdf(axes[2], _by_scenario(data, "3 tail latency"), "tail: append -> visible to a reader")
    return _save(fig, out / "latency_cdf.png", stamp)


def kill_timeline(data: dict[str, Any], out: Path, stamp: str) -> Path:
    rows = _by_scenario(data, "4 replica killed")
    done = [m for m in rows if m["timeline"]]
    fig, axes = plt.subplots(max(1, len(done)), 1, figsize=(12, 3 * max(1, len(done))),
                             squeeze=False)
    for ax, m in zip(axes[:, 0], done, strict=False):
        ts = [t for t, _ in m["timeline"]]
        lat = [max(x, 1e-3) for _, x in m["timeline"]]
        ax.scatter(ts, lat, s=2)
        kill_s = m["events"].get("kill_s")
        if kill_s is not None:
            fault = "SIGSTOP" if "SIGSTOP" in m["summary"]["system"] else "kill -9"
            ax.axvline(kill_s, color="firebrick", label=fault)
            ax.axvspan(kill_s - 2.5, kill_s + 2.5, color="firebrick", alpha=0.07)
        s = m["summary"]
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        # (minor ticks at 2 and 5 labelled, as plain numbers: an axis within a decade)
        ax.yaxis.set_minor_formatter(FuncFormatter(
            lambda v, _pos: f"{v:g}" if f"{v:g}".lstrip("0.")[:1] in ("2", "5") else ""))
        ax.set_ylabel("append latency, ms")
        ax.set_title(f"{s['system']}: failed {s['failed']}, worst around the fault "
                     f"{s.get('kill_window_worst_ms') or 0:.1f} ms", fontsize=9)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("time since start, s")
    _pending_note(axes[0, 0], rows)
    return _save(fig, out / "kill_timeline.png", stamp)


def scaling(data: dict[str, Any], out: Path, stamp: str) -> Path:
    rows = _by_scenario(data, "6 scaling")
    fig, ax = plt.subplots(figsize=(8, 5))
    systems = dict.fromkeys(m["summary"]["system"] for m in rows
                            if not m["summary"].get("pending"))
    for system in systems:
        points = sorted((m["summary"]["writers"], m["summary"]["rate"]) for m in rows
                        if m["summary"]["system"] == system and not m["summary"].get("pending"))
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=system)
    ax.set_xlabel("writers (one stream each)")
    ax.set_ylabel("appends/s, 1 KiB")
    ax.set_title("scaling with concurrent writers", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    _pending_note(ax, rows)
    return _save(fig, out / "scaling.png", stamp)


def pd_commits(data: dict[str, Any], out: Path, stamp: str) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    _bars(axes[0], _by_scenario(data, "5 PD commits in flight 1"), "rate",
          "placement commits, one at a time", "commits/s")
    _bars(axes[1], _by_scenario(data, "5 PD commits in flight many"), "rate",
          "placement commits, many in flight", "commits/s")
    return _save(fig, out / "pd_commits.png", stamp)


def _save(fig: Any, path: Path, stamp: str) -> Path:
    fig.suptitle(stamp, fontsize=8, color="dimgray", x=0.99, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="charts of benchmarks/results/compare.json")
    parser.add_argument("--input", type=Path, default=RESULTS / "compare.json")
    args = parser.parse_args(argv)
    data = json.loads(args.input.read_text())
    out = args.input.parent
    stamp = f"run {data['finished_utc']} UTC, scale {data['scale']}"
    if data["scale"] != "full":
        stamp += ": a smoke/quick run, NOT the benchmark's figures"
    for chart in (throughput, latency_cdf, kill_timeline, scaling, pd_commits):
        print(f"wrote {chart(data, out, stamp)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
