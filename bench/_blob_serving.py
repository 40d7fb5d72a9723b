"""Part (e), blob serving: how fast ``tandem cdn serve`` sends a blob, against nginx.

One random blob is put into a ``LocalBlobStore`` by its digest and served by
``tandem cdn serve`` (a subprocess, as shipped), by the same server with
Starlette's default 64 KiB file chunk instead of the CDN's own (what it
shipped with before), and by nginx (one worker, sendfile, a generated
config) from the same file. Keep-alive clients repeat full GETs; rounds
interleave the servers (order rotated), the figure is the median of
per-round ratios. A cProfile of the shipped server's event-loop thread
during a few GETs says where its time goes.

Also the report helpers the other modules of part (e) share: ``target``,
``spread`` and ``pyplot``.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ._procs import free_port

__all__ = [
    "TARGET_THROUGHPUT_SHARE",
    "blob_serving",
    "plot_throughput",
    "pyplot",
    "spread",
    "target",
    "throughput_section",
]

TARGET_THROUGHPUT_SHARE = 0.50  # the CDN against nginx, same file
_BLOB_BYTES = 32 * 2**20
_ROUNDS = 9
_LOADS = ((1, 4), (4, 2))  # (concurrent clients, full GETs each) per measurement
_OLD_CHUNK_BYTES = 64 * 1024  # Starlette's FileResponse default, what the CDN sent with before
_OLD = "cdn, 64 KiB chunks"
_PROFILE_GETS = 4
_REPO = Path(__file__).resolve().parent.parent
_MB = 1e6


def blob_serving(work: Path) -> dict[str, Any]:
    """Throughput rounds, nginx's version and the CDN's profile; or ``{"skipped": why}``."""
    from model_cdn.http import BLOB_FILE_CHUNK_BYTES
    from shared.server.store import LocalBlobStore

    nginx = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if nginx is None:
        return {
            "skipped": "nginx is not installed (`apt-get install -y nginx`), so there is "
            "nothing to compare the CDN with"
        }
    work.mkdir(parents=True, exist_ok=True)
    store = LocalBlobStore(work / "blobs")
    blob = np.random.default_rng(0).bytes(_BLOB_BYTES)  # model blobs are compressed: random-like
    blob_digest = store.put(blob)
    file = store.local_path(blob_digest)
    assert file is not None
    cdn_args = [
        "cdn",
        "serve",
        "--host",
        "127.0.0.1",
        "--registry",
        f"sqlite:///{work / 'registry.db'}",
        "--store",
        str(work / "blobs"),
        "--log-level",
        "warning",
    ]
    patched = (
        "import sys, model_cdn.http._blobs as s; "
        f"s._BlobFileResponse.chunk_size = {_OLD_CHUNK_BYTES}; "
        "from tandem.cli import main; sys.argv[0] = 'tandem'; main()"
    )
    cdn_path = f"/v1/blobs/{blob_digest}"
    servers = {
        "cdn": ([sys.executable, "-m", "tandem.cli", *cdn_args], cdn_path),
        _OLD: ([sys.executable, "-c", patched, *cdn_args], cdn_path),
        "nginx": ([nginx], "/" + file.relative_to(work / "blobs").as_posix()),
    }
    rounds: list[dict[str, dict[str, dict[str, float]]]] = []
    with contextlib.ExitStack() as stack:
        ports = {}
        for name, (argv, path) in servers.items():
            port = free_port()
            if name == "nginx":
                argv = [*argv, *_nginx_config(work / "nginx", port, work / "blobs")]
            else:
                argv = [*argv, "--port", str(port)]
            log = work / f"{name[:5]}-{port}.log"
            try:
                proc = stack.enter_context(_serving(argv, port, path, log))
            except RuntimeError as e:
                if name != "nginx":
                    raise  # the CDN failing to serve is a finding, not a skip
                return {"skipped": f"nginx is installed but did not serve the blob: {e}"}
            _check_body(port, path, blob_digest)
            ports[name] = (port, path, proc.pid)
        names = list(servers)
        for r in range(_ROUNDS):
            order = names[r % len(names) :] + names[: r % len(names)]
            measured: dict[str, dict[str, dict[str, float]]] = {}
            for name in order:
                port, path, pid = ports[name]
                measured[name] = {
                    str(clients): _measure(port, path, clients, gets, pid)
                    for clients, gets in _LOADS
                }
            rounds.append(measured)
    profile = _profile_cdn(cdn_args, cdn_path, work)
    return {
        "blob_bytes": _BLOB_BYTES,
        "chunk_bytes": BLOB_FILE_CHUNK_BYTES,
        "nginx": _version([nginx, "-v"]),
        "rounds": rounds,
        "profile": profile,
    }


def _nginx_config(directory: Path, port: int, root: Path) -> list[str]:
    """A minimal nginx.conf in ``directory``; returns nginx's arguments to run it."""
    directory.mkdir(parents=True, exist_ok=True)
    temp = "\n".join(
        f"    {kind}_temp_path {directory / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    # As root the worker would switch to "nobody", who cannot enter a 0700 temp directory.
    user = f"user {_user_name()};\n" if os.geteuid() == 0 else ""
    (directory / "nginx.conf").write_text(
        f"""{user}daemon off;
worker_processes 1;
pid {directory / "nginx.pid"};
error_log {directory / "error.log"} warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    default_type application/octet-stream;
{temp}
    server {{
        listen 127.0.0.1:{port};
        root {root};
    }}
}}
"""
    )
    return [
        "-p",
        str(directory),
        "-c",
        str(directory / "nginx.conf"),
        "-e",
        str(directory / "error.log"),
    ]


def _user_name() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


@contextlib.contextmanager
def _serving(argv: list[str], port: int, path: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run a server until the ``with`` ends; stop it by its PID (SIGTERM, then SIGKILL)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=_REPO)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with {proc.returncode}: {_tail(log)}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("HEAD", path)
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    break
            except (OSError, http.client.HTTPException):
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} did not answer on port {port}: {_tail(log)}")
            time.sleep(0.2)
        yield proc
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes], how: signal.Signals = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(how)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-800:].strip()
    except OSError:
        return "(no log)"


def _check_body(port: int, path: str, expected: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        body = conn.getresponse().read()
    finally:
        conn.close()
    if "sha256:" + hashlib.sha256(body).hexdigest() != expected:
        raise RuntimeError(f"the server on port {port} sent other bytes than the blob")


def _get(port: int, path: str, gets: int, errors: list[BaseException]) -> None:
    """``gets`` full GETs on one keep-alive connection, read into a reused buffer."""
    buffer = memoryview(bytearray(2**20))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        for _ in range(gets):
            conn.request("GET", path)
            response = conn.getresponse()
            got = 0
            while n := response.readinto(buffer):
                got += n
            if response.status != 200 or got != _BLOB_BYTES:
                raise RuntimeError(f"GET {path}: status {response.status}, {got} bytes")
    except BaseException as e:
        errors.append(e)
    finally:
        conn.close()


def _measure(port: int, path: str, clients: int, gets: int, pid: int) -> dict[str, float]:
    """Aggregate MB/s of ``clients`` connections, and CPU seconds per GB on each side."""
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_get, args=(port, path, gets, errors)) for _ in range(clients)
    ]
    server_cpu, client_cpu = _cpu_s(pid), time.process_time()
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"download from port {port} failed: {errors[0]}") from errors[0]
    gb = clients * gets * _BLOB_BYTES / 1e9
    return {
        "mb_s": gb * 1e9 / _MB / elapsed,
        "server_cpu_s_per_gb": (_cpu_s(pid) - server_cpu) / gb,
        "client_cpu_s_per_gb": (time.process_time() - client_cpu) / gb,
    }


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children (nginx's worker)."""
    total, ticks = 0, os.sysconf("SC_CLK_TCK")
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for p in [str(pid), *children]:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / ticks


_PROFILED = """
import cProfile, signal, sys
profiler = cProfile.Profile()
signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())  # runs on the event-loop thread
sys.argv[0] = "tandem"
from tandem.cli import main
try:
    main()
finally:
    profiler.disable()
    profiler.dump_stats({out!r})
"""


def _profile_cdn(cdn_args: list[str], path: str, work: Path) -> list[list[Any]]:
    """Own time per function on the CDN's event-loop thread while it sends blobs (cProfile).

    The profiler starts on SIGUSR1, once the server is up, so start-up and
    imports stay out; it writes its file when the server exits.
    """
    out = work / "cdn.prof"
    port = free_port()
    code = _PROFILED.format(out=str(out))
    with _serving(
        [sys.executable, "-c", code, *cdn_args, "--port", str(port)],
        port,
        path,
        work / "cdn-profile.log",
    ) as proc:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        errors: list[BaseException] = []
        _get(port, path, _PROFILE_GETS, errors)
        if errors:
            raise RuntimeError(f"profiled download failed: {errors[0]}") from errors[0]
        # uvicorn re-raises the signal it shut down on: SIGINT ends in a KeyboardInterrupt,
        # so the finally above still writes the profile (SIGTERM would kill it first).
        _stop(proc, signal.SIGINT)
    if not out.exists():
        return []
    stats = pstats.Stats(str(out))
    rows = []
    for (file, line, func), (_cc, calls, own, cumulative, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = (
            f"{Path(file).parent.name}/{Path(file).name}:{line}({func})" if file != "~" else func
        )
        rows.append([where, calls / _PROFILE_GETS, own / _PROFILE_GETS, cumulative / _PROFILE_GETS])
    rows.sort(key=lambda r: -r[2])
    return rows[:10]


def _version(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return (done.stderr or done.stdout).strip().rsplit("/", 1)[-1]


def plot_throughput(throughput: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rounds = throughput["rounds"]
    servers = list(rounds[0])
    colors = ("tab:blue", "tab:cyan", "tab:grey")
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    width = 0.8 / len(servers)
    for i, server in enumerate(servers):
        for j, (clients, _) in enumerate(_LOADS):
            values = [r[server][str(clients)]["mb_s"] for r in rounds]
            x, mid = j + (i - (len(servers) - 1) / 2) * width, statistics.median(values)
            ax.bar(x, mid, width * 0.9, color=colors[i % 3], label=None if j else server)
            ax.scatter([x] * len(values), values, s=8, color="black", zorder=3)
            ax.annotate(
                f"{mid:,.0f}",
                (x, 0),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=8,
                color="white",
                weight="bold",
            )
    ax.set_xticks(range(len(_LOADS)), [f"{c} keep-alive client(s)" for c, _ in _LOADS])
    ax.set_ylabel("MB/s (bars: median, dots: rounds)")
    mib = throughput["blob_bytes"] / 2**20
    ax.set_title(f"Full GETs of a {mib:.0f} MiB blob on loopback, one server process", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def spread(values: list[float], fmt: str = "{:.0%}") -> str:
    """Min to max for up to three values, the interquartile range beyond."""
    if len(values) < 2:
        return fmt.format(values[0]) if values else "n/a"
    low, high = (
        (min(values), max(values)) if len(values) < 4 else (statistics.quantiles(values, n=4)[::2])
    )
    return f"{fmt.format(low)} to {fmt.format(high)}"


def target(name: str, goal: str, measured: str, met: bool | None, limit: str) -> dict[str, Any]:
    return {
        "name": name,
        "target": goal,
        "measured": measured,
        "met": met,
        "limited_by": None if met or met is None else limit,
    }


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def throughput_section(
    throughput: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(targets, tables, notes) for the result."""
    name = "`tandem cdn serve` blob throughput against nginx"
    goal = f">= {TARGET_THROUGHPUT_SHARE:.0%}"
    if "skipped" in throughput:
        why = throughput["skipped"]
        return (
            [target(name, goal, f"skipped: {why}", None, "")],
            [],
            [f"Throughput: skipped — {why}."],
        )
    rounds = throughput["rounds"]
    kib = throughput["chunk_bytes"] // 1024
    reads = throughput["blob_bytes"] // throughput["chunk_bytes"]
    targets, rows = [], []
    for clients, gets in _LOADS:
        at = [{s: r[s][str(clients)] for s in r} for r in rounds]
        ratio = {s: [m[s]["mb_s"] / m["nginx"]["mb_s"] for m in at] for s in at[0]}
        cpu = {s: statistics.median(m[s]["server_cpu_s_per_gb"] for m in at) for s in at[0]}
        for server in at[0]:
            mb_s = [m[server]["mb_s"] for m in at]
            rows.append(
                [
                    f"{server} ({kib:,} KiB chunks, as shipped)" if server == "cdn" else server,
                    clients,
                    f"{statistics.median(mb_s):,.0f}",
                    spread(mb_s, "{:,.0f}"),
                    "—"
                    if server == "nginx"
                    else f"{statistics.median(ratio[server]):.0%} ({spread(ratio[server])})",
                    f"{cpu[server]:.2f}",
                    f"{statistics.median(m[server]['client_cpu_s_per_gb'] for m in at):.2f}",
                ]
            )
        cdn, old = statistics.median(ratio["cdn"]), statistics.median(ratio[_OLD])
        targets.append(
            target(
                f"{name}, {clients} keep-alive client(s) x {gets} GETs (median of {len(rounds)} "
                "per-round ratios)",
                goal,
                f"{cdn:.0%} (IQR {spread(ratio['cdn'])}): "
                f"{statistics.median(m['cdn']['mb_s'] for m in at):,.0f} vs "
                f"{statistics.median(m['nginx']['mb_s'] for m in at):,.0f} MB/s "
                f"(with 64 KiB chunks: {old:.0%})",
                cdn >= TARGET_THROUGHPUT_SHARE,
                f"CPU in the CDN's Python send loop: it reads {kib:,} KiB at a time, one "
                f"worker-thread hop and one event-loop pass per chunk ({reads} per blob), and "
                "copies every byte through user space: "
                f"{cpu['cdn']:.2f} CPU s per GB against nginx's {cpu['nginx']:.2f} (sendfile); "
                f"with 64 KiB chunks {cpu[_OLD]:.2f}. Matching nginx needs sendfile",
            )
        )
    tables = [
        {
            "title": f"Blob throughput, {throughput['blob_bytes'] / 2**20:.0f} MiB random blob on "
            f"loopback ({len(rounds)} interleaved rounds)",
            "columns": [
                "server",
                "clients",
                "MB/s (median)",
                "IQR",
                "of nginx (per-round median)",
                "server CPU s / GB",
                "client CPU s / GB",
            ],
            "rows": rows,
        }
    ]
    if throughput["profile"]:
        tables.append(
            {
                "title": "Where the CDN's event-loop thread spends one "
                f"{_BLOB_BYTES // 2**20} MiB GET (cProfile, own time; the file reads run in "
                "worker threads, not shown; a coroutine counts a call per resume)",
                "columns": ["function", "calls / GET", "own ms / GET", "cumulative ms / GET"],
                "rows": [
                    [f"`{f}`", f"{c:.0f}", f"{o * 1e3:.1f}", f"{cu * 1e3:.1f}"]
                    for f, c, o, cu in throughput["profile"]
                ],
            }
        )
    mib = throughput["blob_bytes"] / 2**20
    calls = {row[0].rsplit("(", 1)[-1].rstrip(")"): row[1] for row in throughput["profile"]}
    passes = f"{calls['_run_once']:,.0f}" if "_run_once" in calls else "one or more"
    notes = [
        f"nginx {throughput['nginx']} with one worker (`tandem cdn serve` runs one process), "
        "sendfile on, access log off, sending the CDN store's own blob file; the bench starts "
        "it in the foreground from a generated config in a temporary directory. Clients are "
        "Python threads (http.client, readinto a reused 1 MiB buffer) on the same small, "
        "shared box, so the absolute figures (nginx's most) also carry the client's limits "
        "and other load; the per-round ratios are the figure to read.",
        f"The CDN's blob responses read {kib:,} KiB per chunk (`_BlobFileResponse.chunk_size` "
        "in model_cdn/http/_blobs.py); the '64 KiB chunks' rows are the same server with "
        "Starlette's default, as it shipped before. A sweep with this harness (5 rounds) gave "
        "256 KiB about twice the CPU per GB of 1 MiB and 4 MiB no gain over 1 MiB.",
        f"Reading the profile: per {mib:.0f} MiB GET the event loop makes {passes} passes "
        f"and hands {reads:,} reads to worker threads (one per chunk). Matching nginx needs "
        "sendfile: front the store with nginx or a CDN (LocalBlobStore's layout is servable "
        "as is), or serve with an ASGI server that offers `http.response.pathsend`, which "
        "Starlette's FileResponse then uses.",
    ]
    return targets, tables, notes
