"""Turn the comparison's measurements into text: one line per measurement while it runs,
and the Markdown section of RESULTS.md (tables per scenario, ratios, targets met or missed).

Pure: no I/O, except :func:`write_section`, which replaces the comparison section of
RESULTS.md between its markers (or appends it) and keeps the rest of the file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from benchmarks.peers.stats import Measurement, percentile

BEGIN = "<!-- compare:begin (written by benchmarks/compare.py) -->"
END = "<!-- compare:end -->"
ESTREAM_PREFIX = "estream"
ESTREAM_SCENARIOS = (
    "1 append many in flight 1KiB", "1 append many in flight 100B",
    "2 append one in flight 1KiB", "3 catch-up read 1KiB", "3 tail latency 1KiB",
    "4 replica killed", "6 scaling",
)


def fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def line(m: Measurement) -> str:
    if m.pending:
        return f"[{m.scenario}] {m.system}: PENDING ({m.pending})"
    s = m.summary()
    return (f"[{m.scenario}] {m.system}: {fmt(s['rate'])}/s ops={m.ops} failed={m.failed} "
            f"p50={fmt(s['p50_ms'], 3)}ms p99={fmt(s['p99_ms'], 3)}ms "
            f"p99.9={fmt(s['p999_ms'], 3)}ms max={fmt(s['max_ms'], 3)}ms "
            + " ".join(f"{k}={fmt(v)}" for k, v in m.extra.items()) + f" {m.note}").rstrip()


def window_figures(sorted_latencies: list[float]) -> dict[str, float]:
    """Worst and p99.9 of the ops around a kill."""
    return {"kill_window_ops": float(len(sorted_latencies)),
            "kill_window_p999_ms": percentile(sorted_latencies, 99.9),
            "kill_window_worst_ms": sorted_latencies[-1] if sorted_latencies else math.nan}


def hot_frames(collapsed: str, top: int = 8) -> dict[str, list[tuple[str, float]]]:
    """The top frames of py-spy's raw (collapsed) stacks: share of samples spent in each
    function itself ("self") and under it ("total")."""
    self_count: dict[str, int] = {}
    total_count: dict[str, int] = {}
    samples = 0
    for row in collapsed.splitlines():
        stack, _, count_text = row.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith("process ")
                  and not f.startswith("thread ")]
        if not frames:
            continue
        samples += count
        self_count[frames[-1]] = self_count.get(frames[-1], 0) + count
        for frame in set(frames):
            total_count[frame] = total_count.get(frame, 0) + count

    def share(counts: dict[str, int]) -> list[tuple[str, float]]:
        best = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [(frame, count / samples) for frame, count in best]

    return {"self": share(self_count), "total": share(total_count)} if samples else {}


def _profiles(profiles: dict[str, Any]) -> list[str]:
    out = ["### Profiles of the missed targets (py-spy)", "",
           "Wall-clock flame graphs: `benchmarks/results/<name>.svg`; the lists below come "
           "from `<name>.txt`, py-spy's collapsed stacks of the samples holding the GIL "
           "(where the CPU goes; waits in fdatasync or epoll are not in them).", ""]
    for name, hot in profiles.items():
        if not hot:
            continue
        out += [f"`{name}`: most GIL-holding samples in (self time):", ""]
        out += [f"- {share:.0%} {frame}" for frame, share in hot["self"]]
        out.append("")
    return out


# --- the Markdown section ---------------------------------------------------------------------


def _rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [m["summary"] for m in data["measurements"]]


def _is_estream(row: dict[str, Any]) -> bool:
    return str(row["system"]).startswith(ESTREAM_PREFIX)


def _ratio(a: Any, b: Any) -> float:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return math.nan
    return float(a) / float(b)


def _table(rows: list[dict[str, Any]], ref: dict[str, Any] | None, key: str) -> list[str]:
    out = ["| system | records/s | p50 ms | p99 ms | p99.9 ms | max ms | failed | "
           "estream (first row) ÷ this, records/s | note |", "|" + " --- |" * 9]
    for r in rows:
        if r.get("pending"):
            out.append(f"| {r['system']} | pending | | | | | | | {r['pending']} |")
            continue
        ratio = _ratio(ref[key], r[key]) if ref and not ref.get("pending") else math.nan
        extra = ", ".join(f"{k}={fmt(r[k])}" for k in ("writers", "inflight", "written",
                                                          "fill_rate") if k in r)
        note = "; ".join(x for x in (extra, r.get("note", "")) if x)
        out.append(f"| {r['system']} | {fmt(r['rate'])} | {fmt(r['p50_ms'], 3)} | "
                   f"{fmt(r['p99_ms'], 3)} | {fmt(r['p999_ms'], 3)} | {fmt(r['max_ms'], 3)} | "
                   f"{r['failed']} | {fmt(ratio)}x | {note} |")
    return out


def _scenario_section(title: str, rows: list[dict[str, Any]]) -> list[str]:
    ref = next((r for r in rows if _is_estream(r)), None)
    out = [f"### {title}", ""]
    if title.startswith("4"):
        out += ["| system | failed | worst ms (±2.5 s of kill) | p99.9 ms (±2.5 s) | "
                "ops in window | p99.9 ms whole run | note |", "|" + " --- |" * 7]
        for r in rows:
            if r.get("pending"):
                out.append(f"| {r['system']} | pending: {r['pending']} | | | | | |")
                continue
            out.append(f"| {r['system']} | {r['failed']} | {fmt(r.get('kill_window_worst_ms'))}"
                       f" | {fmt(r.get('kill_window_p999_ms'))} | "
                       f"{int(r.get('kill_window_ops') or 0)} | {fmt(r['p999_ms'])} | "
                       + "; ".join(x for x in (f"rolls={int(r['rolls'])}" if r.get("rolls")
                                               is not None and not math.isnan(r["rolls"])
                                               else "", r.get("note", "")) if x) + " |")
    elif title.startswith("6"):
        for n in sorted({r.get("writers") for r in rows if r.get("writers")}):
            group = [r for r in rows if r.get("writers") == n or r.get("pending")]
            sub = next((r for r in group if _is_estream(r)), None)
            out += [f"{n} writer(s):", "", *_table(group, sub, "rate"), ""]
        if not any(r.get("writers") for r in rows):
            out += _table(rows, ref, "rate")
    else:
        out += _table(rows, ref, "rate")
    return [*out, ""]


def _find(rows: list[dict[str, Any]], scenario: str, system: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["scenario"] == scenario
                 and str(r["system"]).startswith(system) and not r.get("pending")), None)


def _best(rows: list[dict[str, Any]], scenario: str, system: str, key: str,
          pick: Any) -> dict[str, Any] | None:
    """The row of ``system`` (a name prefix) in ``scenario`` whose ``key`` is best by
    ``pick`` (max or min) among its variants; the first row when ``pick`` is None."""
    if pick is None:
        return _find(rows, scenario, system)
    found = [r for r in rows if r["scenario"] == scenario and not r.get("pending")
             and str(r["system"]).startswith(system)
             and isinstance(r.get(key), int | float) and not math.isnan(r[key])]
    return pick(found, key=lambda r: r[key]) if found else None


def targets(rows: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(target, estream figure, peer figure, verdict) for each target of issue 8: best
    variant against best variant (e.g. estream's batched appends against NATS's
    ``publish_async``), each system's variant named in the figure."""
    out: list[tuple[str, str, str, str]] = []

    def add(name: str, scenario: str, peer: str, key: str, ok: Any, unit: str,
            absolute: bool = False) -> None:
        est_sys = ESTREAM_PREFIX
        pick = max if key == "rate" else min if key.endswith("_ms") and "kill" not in key \
            else None
        est, other = _best(rows, scenario, est_sys, key, pick), _best(rows, scenario, peer,
                                                                        key, pick)
        if est is None:
            out.append((name, "pending", fmt(other[key]) + unit if other else "-", "pending"))
            return
        e, p = est[key], (other[key] if other else math.nan)
        if other is None and not absolute:
            out.append((name, f"{fmt(e, 3)}{unit} ({est['system']})", "-",
                        "no peer figure"))
            return
        verdict = "met" if ok(e, p) else "MISSED"
        ratio = _ratio(e, p)
        out.append((name, f"{fmt(e, 3)}{unit} ({est['system']})",
                    f"{fmt(p, 3)}{unit} ({other['system']})" if other else "-",
                    f"{verdict} (ratio {fmt(ratio)})" if other else verdict))

    for size in ("1KiB", "100B"):
        sc = f"1 append many in flight {size}"
        add(f"appends many in flight {size} >= 3x NATS R3 sync always", sc, "NATS JetStream R3 "
            "sync always", "rate", lambda e, p: e >= 3 * p, "/s")
        add(f"appends many in flight {size} >= 1x Redis fsync always", sc, "Redis", "rate",
            lambda e, p: e >= p, "/s")
    sc = "2 append one in flight 1KiB"
    add("one in flight p50 <= NATS R3's", sc, "NATS JetStream R3 sync always", "p50_ms",
        lambda e, p: e <= p, " ms")
    add("one in flight p99 < 1 ms", sc, "NATS JetStream R3 sync always", "p99_ms",
        lambda e, p: e < 1.0, " ms", absolute=True)
    add("catch-up reads >= 1x Redis XRANGE", "3 catch-up read 1KiB", "Redis", "rate",
        lambda e, p: e >= p, "/s")
    add("replica killed: no failed append", "4 replica killed", "NATS JetStream R3 sync always "
        "(follower", "failed", lambda e, p: e == 0, "", absolute=True)
    add("replica killed: worst < 50 ms", "4 replica killed", "NATS JetStream R3 sync always "
        "(follower", "kill_window_worst_ms", lambda e, p: e < 50.0, " ms", absolute=True)
    for kind in ("1", "many"):
        add(f"PD commits, in flight {kind}: >= 1x etcd", f"5 PD commits in flight {kind}",
            "etcd", "rate", lambda e, p: e >= p, "/s")
    return out


def render(data: dict[str, Any]) -> str:
    rows = _rows(data)
    facts = data["machine"]
    out = [BEGIN, "## Comparison with the systems a user would pick instead", "",
           f"Command: `{data['command']}` (scale `{data['scale']}`, {data['elapsed_s']} s, "
           f"finished {data['finished_utc']} UTC).", "",
           f"Machine: {facts['nproc']} cores ({facts['cpu']}), {facts['memory_gib']} GiB "
           f"memory, disk `{facts['disk']}`, Python {facts['python']}, kernel "
           f"{facts['kernel']}, load average at start {facts['load_at_start']}.", "",
           *([f"**Scale `{data['scale']}`: tiny or short runs that prove the code works; "
               "their figures are noise, not the benchmark (`make bench` runs the full "
               "scale).**", ""] if data["scale"] != "full" else []),
           "Same record sizes, fsync before ack (except the row marked not durable), "
           "3 replicas where the system has replication, Python asyncio clients for all. "
           "Charts: `benchmarks/results/*.png` (`python -m benchmarks.charts`).", "",
           "How each figure is taken (`benchmarks/compare.py`, `benchmarks/drivers.py`, "
           "`benchmarks/peers/`):", "",
           "- Many in flight: 256 concurrent appends through one client (estream: one "
           "writer; NATS: `js.publish` awaiting each PubAck; Redis: 8 concurrent pipelines "
           "of 32 XADDs, a record's latency being its pipeline's). Batched rows do the same "
           "as 8 batches of 32 in flight: estream `append_batch`, NATS `publish_async` then "
           "the batch's acks. The same bounded loop drives every system; "
           "`bench_append.py`'s own loop is a cross-check row. A target compares each "
           "system's best row (named beside the figure).",
           "- One in flight: the next append starts when the previous one is acknowledged.",
           "- Catch-up: write N records of 1 KiB, then read them from offset 0 (estream "
           "`Client.read`, NATS ordered push consumer, Redis XRANGE by 1,000). Tail: one "
           "append at a time, time from the append call until a tailing reader has it "
           "(estream `follow=True`, NATS ordered consumer, Redis XREAD BLOCK). estream also "
           "reads with `Client.read_batches` (the batch-level API: per stored batch, the "
           "values in one buffer with their offsets).",
           "- Kill: appends paced open-loop (latency from each append's due time, so a "
           "stall also counts against the appends queued behind it), `kill -9` of one "
           "replica's server; worst and p99.9 over the appends due within 2.5 s of the "
           "kill. estream kills a replica of the open range (4 range servers, so the "
           "writer can roll onto 3 live ones); NATS kills a stream follower that is not the "
           "client's server, and, in a second cluster, the stream leader; the NATS client "
           "retries a failed publish for up to 10 s (the estream client gets no help).",
           "- PD commits: `benchmarks/bench_pd.py` (create_stream / seal-and-roll beside "
           "etcd put / compare-and-put txn through etcd's JSON gateway).",
           "- Ratios are estream ÷ the row's system (records/s: above 1 is estream faster).",
           "",
           "### Targets (issue 8)", "", "| target | estream | peer | verdict |",
           "| --- | --- | --- | --- |"]
    out += [f"| {t} | {e} | {p} | {v} |" for t, e, p, v in targets(rows)]
    out.append("")
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        out += _scenario_section(scenario, [r for r in rows if r["scenario"] == scenario])
    if data.get("profiles"):
        out += _profiles(data["profiles"])
    out.append(END)
    return "\n".join(out) + "\n"


def write_section(path: Path, section: str) -> None:
    """Replace the text between BEGIN and END in ``path`` (or append the section)."""
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
