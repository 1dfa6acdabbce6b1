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
# how estream's row of scenario 1 driven as a typical application ends (issue 20)
TYPICAL_LOOP = "(typical loop: a task per append, wait_for)"
NATS = "NATS JetStream R3 sync always"
ESTREAM_SCENARIOS = (
    "1 append many in flight 1KiB", "1 append many in flight 100B",
    "2 append one in flight 1KiB", "3 catch-up read 1KiB", "3 tail latency 1KiB",
    "4 replica killed", "6 scaling", "7 append spread over many logs 1KiB",
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


def _profiles(profiles: dict[str, Any], top: int = 4) -> list[str]:
    out = ["Profiles of estream's missed targets (py-spy; share of the GIL-holding samples "
           "in each function itself; flame graphs `results/profile-*.svg`, generated, not "
           "committed):"]
    for name, hot in profiles.items():
        if hot:
            out.append(f"- `{name}`: " + ", ".join(f"{share:.0%} {frame}"
                                                   for frame, share in hot["self"][:top]))
    return [*out, ""]


# --- the Markdown section ---------------------------------------------------------------------


def _rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [m["summary"] for m in data["measurements"]]


def _is_estream(row: dict[str, Any]) -> bool:
    return str(row["system"]).startswith(ESTREAM_PREFIX)


def _ratio(a: Any, b: Any) -> float:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return math.nan
    return float(a) / float(b)


def _group(row: dict[str, Any]) -> str:
    """The table's scenario cell: the scaling rows are one group per writer count."""
    writers = row.get("writers")
    if not writers:
        return str(row["scenario"])
    return f"{row['scenario']}, {int(writers)} writer{'s' if writers > 1 else ''}"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not math.isnan(value)


def _ratio_cell(ref: dict[str, Any] | None, row: dict[str, Any]) -> str:
    """estream's first row of the group ÷ this row: records/s where the group has a rate,
    else the worst latency around the kill, else p50 (named in the cell)."""
    if ref is None or ref.get("pending") or row.get("pending"):
        return "-"
    if "kill_window_worst_ms" in ref:
        key, label = "kill_window_worst_ms", " (worst)"
    elif _finite(ref.get("rate")):
        key, label = "rate", ""
    else:
        key, label = "p50_ms", " (p50)"
    ratio = _ratio(ref.get(key), row.get(key))
    if math.isnan(ratio):
        return "-"
    return f"{ratio:.2f}x{label}" if ratio >= 0.1 else f"{ratio:.3f}x{label}"


def _note(row: dict[str, Any]) -> str:
    parts = [f"{k}={fmt(row[k])}" for k in ("inflight", "written", "fill_rate") if k in row]
    if "kill_window_worst_ms" in row:
        parts.append(f"±2.5 s of the kill: worst {fmt(row['kill_window_worst_ms'])} ms, "
                     f"p99.9 {fmt(row.get('kill_window_p999_ms'))} ms, "
                     f"{int(row.get('kill_window_ops') or 0)} ops")
    if _finite(row.get("rolls")):
        parts.append(f"rolls={int(row['rolls'])}")
    parts += dict.fromkeys(p for p in str(row.get("note", "")).split("; ") if p)
    return "; ".join(parts)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    """One table for every scenario, ordered by scenario; the ratio column compares each
    row with the first estream row of its group."""
    out = ["| scenario | system | records/s | p50 ms | p99 ms | p99.9 ms | max ms | failed | "
           "estream ÷ this | note |", "|" + " --- |" * 10]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (str(r["scenario"]), r.get("writers") or 0)):
        groups.setdefault(_group(r), []).append(r)
    for name, group in groups.items():
        ref = next((r for r in group if _is_estream(r) and not r.get("pending")), None)
        for r in group:
            if r.get("pending"):
                out.append(f"| {name} | {r['system']} | {r['pending']} | | | | | | - | |")
                continue
            out.append(f"| {name} | {r['system']} | {fmt(r['rate'])} | {fmt(r['p50_ms'], 3)} "
                       f"| {fmt(r['p99_ms'], 3)} | {fmt(r['p999_ms'], 3)} | "
                       f"{fmt(r['max_ms'], 3)} | {r['failed']} | {_ratio_cell(ref, r)} | "
                       f"{_note(r)} |")
    return out


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
            absolute: bool = False, typical: bool = False) -> None:
        pick = max if key == "rate" else min if key.endswith("_ms") and "kill" not in key \
            else None
        if typical:  # estream's typical-loop row beside the peer's own row, no variant
            est = next((r for r in rows if r["scenario"] == scenario and not r.get("pending")
                        and str(r["system"]).endswith(TYPICAL_LOOP)), None)
            other = next((r for r in rows if r["scenario"] == scenario
                          and r["system"] == peer and not r.get("pending")), None)
        else:
            est, other = _best(rows, scenario, ESTREAM_PREFIX, key, pick), _best(
                rows, scenario, peer, key, pick)
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
    add("typical loop >= 2x NATS R3 sync always", "1 append many in flight 1KiB", NATS,
        "rate", lambda e, p: e >= 2 * p, "/s", typical=True)
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
    out += _spread_target(rows)
    return out


def _spread_target(rows: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """Issue 27's: appends spread over many logs at >= 0.5x the system's own one-log figure,
    each peer's own ratio beside estream's."""
    spread = [r for r in rows if r["scenario"] == ESTREAM_SCENARIOS[-1] and not r.get("pending")
              and _finite(r.get("one_log_rate")) and _finite(r.get("rate"))]
    est = next((r for r in spread if _is_estream(r)), None)
    if est is None:
        return []
    own = _ratio(est["rate"], est["one_log_rate"])
    peers = "; ".join(f"{r['system']} {fmt(_ratio(r['rate'], r['one_log_rate']))} "
                      f"({fmt(r['rate'])}/s)" for r in spread if not _is_estream(r))
    return [("appends spread over many logs >= 0.5x one log (issue 27; peers' own ratios)",
             f"{fmt(own)} ({fmt(est['rate'])}/s)", peers or "-",
             f"{'met' if own >= 0.5 else 'MISSED'} (ratio {fmt(own)})")]


METHOD = (
    "Same record sizes, fsync before ack (except the row marked not durable), 3 replicas "
    "where the system has replication, Python asyncio clients for all (`benchmarks/"
    "compare.py`, `drivers.py`, `scenarios.py`, `peers/`). Charts (`python -m "
    "benchmarks.charts`): [throughput](results/throughput.png), [latency CDFs]"
    "(results/latency_cdf.png), [kill timeline](results/kill_timeline.png), [scaling]"
    "(results/scaling.png), [PD commits](results/pd_commits.png). The ratio column is "
    "estream's first row of the scenario divided by the row: in records/s (above 1: estream "
    "faster), else in the latency named (above 1: estream slower).",
    "- Many in flight: 256 concurrent appends through one client (estream one writer; NATS "
    "`js.publish` awaiting each PubAck; Redis 8 pipelines of 32 XADDs); estream's typical "
    "loop row: a task per append awaited with `asyncio.wait_for`. Batched rows: 8 "
    "batches of 32 in flight (estream `append_batch`, NATS `publish_async`). One in flight: "
    "the next append starts when the previous one is acknowledged.",
    "- Catch-up: write N records of 1 KiB, read them from offset 0 (estream `Client.read` "
    "and `read_batches`, NATS ordered consumer, Redis XRANGE by 1,000). Tail: append call "
    "until a tailing reader has it.",
    "- Replica killed: appends paced open-loop at 1,000/s, latency from each append's due "
    "time. estream: `kill -9` of a replica of the open range (4 range servers), and a replica "
    "hung by SIGSTOP on exactly 3 range servers (no healthy placement for a new range); NATS: "
    "a stream follower, then the stream leader, the client retrying a failed publish for up "
    "to 10 s.",
    "- PD: `bench_pd.py`'s create_stream and seal-and-roll beside etcd put and "
    "compare-and-put through its JSON gateway. Scaling: 1 to 8 writers on different streams, "
    "32 in flight each. Spread: 1,000 logs (estream streams with a writer each, JetStream R3 "
    "streams, Redis keys), 256 single-record appends in flight, each on its own log (Redis: 8 "
    "pipelines of 32 XADDs to 32 keys); the note divides it by the system's own one-log row.",
)


def render(data: dict[str, Any]) -> str:
    rows = _rows(data)
    facts = data["machine"]
    out = [BEGIN, "## Comparison with the systems a user would pick instead "
           "(`make bench`)", "",
           f"Command: `{data['command']}` (`make bench`; scale `{data['scale']}`, "
           f"{data['elapsed_s']} s, finished {data['finished_utc']} UTC). `make bench-quick` "
           "runs a one-minute subset into `benchmarks/results/quick/` and leaves this file "
           "alone. Raw output (`results/compare.json`, `compare.md`, `profile-*`) is "
           "generated, not committed.",
           f"Machine: {facts['nproc']} cores ({facts['cpu']}), {facts['memory_gib']} GiB "
           f"memory, disk `{facts['disk']}`, Python {facts['python']}, kernel "
           f"{facts['kernel']}, load average at start {facts['load_at_start']}.",
           *([f"**Scale `{data['scale']}`: tiny or short runs that prove the code works; "
               "their figures are noise, not the benchmark (`make bench` runs the full "
               "scale).**"] if data["scale"] != "full" else []),
           "", *METHOD, "", *_table(rows), "",
           "Targets (issue 8; each system's best row):"]
    out += [f"- {v}: {t}; estream {e}, peer {p}" for t, e, p, v in targets(rows)]
    out.append("")
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
