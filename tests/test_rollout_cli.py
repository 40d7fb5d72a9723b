"""``tandem rollout`` and ``tandem fleet list/show``: what the client does on its own.

Commands run through typer's test runner in this process (exit code, stdout
and stderr apart); the root entry point and the environment variables run in
real processes. Bad command lines are aimed at a listening socket of the
test's own (a tripwire) to prove nothing is sent; an unreachable CDN, the help
texts and odd status objects from the network need no server either. The
end-to-end cases against the real CDN are in ``test_rollout_cli_e2e.py``.
"""

from __future__ import annotations

import io
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._brokers import free_port
from ._cli import one_error_line, tandem, tandem_env

TOKEN = "t0ken-for-tests"


# -- validation: nothing is sent ------------------------------------------------


@pytest.fixture(scope="module")
def tripwire() -> Iterator[tuple[str, socket.socket]]:
    """A listening socket nobody answers on; any connection to it stays queued for accept()."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", sock
    finally:
        sock.close()


def assert_nothing_connected(sock: socket.socket) -> None:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return
    conn.close()
    raise AssertionError("the command connected to the CDN although its input was bad")


START = ["rollout", "start", "mnist@3", "--waves", "5%,25%,100%"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["rollout", "start", "mnist", "--waves", "100%"], "MODEL@VERSION"),
        (["rollout", "start", "mnist@0", "--waves", "100%"], "MODEL@VERSION"),
        (["rollout", "start", "mnist@x", "--waves", "100%"], "MODEL@VERSION"),
        (["rollout", "start", "../etc@3", "--waves", "100%"], "invalid model name"),
        (["rollout", "start", "mnist@3"], "--waves is required"),
        (["rollout", "start", "mnist@3", "--waves", "5%,x"], "--waves: item 2 ('x')"),
        (["rollout", "start", "mnist@3", "--waves", "50%,10%"], "must increase"),
        (["rollout", "start", "mnist@3", "--waves", "0%"], "not in (0%, 100%]"),
        (["rollout", "start", "mnist@3", "--waves", "100%,50"], "covers the whole fleet"),
        (["rollout", "start", "mnist@3", "--waves", ""], "--waves: expected"),
        ([*START, "--target", "site"], "LABEL=VALUE"),
        ([*START, "--target", "=a"], "LABEL=VALUE"),
        ([*START, "--target", "site=a", "--target", "site=b"], "two values"),
        ([*START, "--max-failure", "150%"], "between 0% and 100%"),
        ([*START, "--max-failure", "2"], "between 0% and 100%"),
        ([*START, "--max-failure", "lots"], "a percentage such as 2%"),
        ([*START, "--max-agreement-drop", "-1%"], "--max-agreement-drop takes a percentage"),
        ([*START, "--max-error-rate-increase", "1.5"], "--max-error-rate-increase must be"),
        ([*START, "--max-offload-increase", "nan"], "--max-offload-increase takes"),
        ([*START, "--max-p99-ratio", "0.9"], "ratio of at least 1"),
        ([*START, "--soak", "10x"], "--soak takes a duration such as 90s, 10m, 1h30m"),
        ([*START, "--soak", "-5"], "--soak takes a duration"),
        ([*START, "--soak", "h"], "--soak takes a duration"),
        ([*START, "--device-timeout", "0s"], "--device-timeout must be more than 0"),
        ([*START, "--interval", "0"], "--interval must be more than 0"),
        ([*START, "--min-reports", "0"], "--min-reports must be at least 1"),
        ([*START, "--min-health-samples", "-1"], "--min-health-samples"),
        ([*START, "--from", "3"], "--from must be a version"),
        ([*START, "--from", "0"], "--from must be a version"),
        (["rollout", "status", "../../v1/models"], "not a rollout id"),
        (["rollout", "status", "--watch", "--json"], "do not mix"),
        ([*START, "--watch", "--json"], "do not mix"),
        (["rollout", "status", "--interval", "soon"], "--interval takes a duration"),
        (["rollout", "pause", "ro-1/abort"], "not a rollout id"),
        (["rollout", "resume", ".."], "not a rollout id"),
        (["rollout", "abort", "a b"], "not a rollout id"),
        (["rollout", "rollback", "?x"], "not a rollout id"),
        (["rollout", "skip-gate", "?x", "--reason", "r"], "not a rollout id"),
        (["rollout", "skip-gate", "ro-1a2b3c4d5e6f"], "--reason is required"),
        (["rollout", "skip-gate", "ro-1a2b3c4d5e6f", "--reason", " "], "--reason is required"),
        (["fleet", "list", "--label", "site"], "--label takes LABEL=VALUE"),
        (["fleet", "list", "--version", "3"], "--version needs --model"),
        (["fleet", "list", "--model", "a/b"], "invalid model name"),
        (["fleet", "show", "../x"], "invalid device id"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_sends_nothing(
    args: list[str], needle: str, tripwire: tuple[str, socket.socket], tmp_path: Path
) -> None:
    url, sock = tripwire
    result = tandem(*args, "--cdn", url, "--token", TOKEN)
    one_error_line(result, 2, needle)
    assert_nothing_connected(sock)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--cdn", "ftp://cdn:21"], "http:// or https://"),
        (["--cdn", "http://"], "http:// or https://"),
        (["--cdn", "http://cdn:99999"], "bad port"),
        (["--cdn", "http://cdn:8700", "--ca", "ca.pem"], "https:// URLs only"),
        (["--cdn", "https://cdn:8700", "--ca", "missing-ca.pem"], "missing-ca.pem"),
        (["--cdn", "http://cdn:8700", "--token", "two words"], "admin token"),
    ],
)
def test_bad_connection_options_are_one_line_exit_2(
    args: list[str], needle: str, tmp_path: Path
) -> None:
    result = tandem("rollout", "list", *args, cwd=tmp_path)
    one_error_line(result, 2, needle)


def test_an_unreachable_cdn_is_one_line_naming_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (
        ["rollout", "list"],
        ["rollout", "status", "ro-000000000000"],
        [*START],
        ["fleet", "list"],
    ):
        result = tandem(*args, "--cdn", url, cwd=tmp_path)
        one_error_line(result, 1, f"cannot reach the CDN at {url}: connection refused")


def test_the_url_and_token_come_from_the_environment(
    tripwire: tuple[str, socket.socket], tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    env = tandem_env()
    env.update(TANDEM_CDN_URL=url, TANDEM_CDN_ADMIN_TOKEN="bad token")
    run = [sys.executable, "-m", "tandem.cli", "rollout", "list"]
    bad = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    one_error_line(bad, 2, "admin token")
    env["TANDEM_CDN_ADMIN_TOKEN"] = TOKEN
    down = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    one_error_line(down, 1, f"cannot reach the CDN at {url}")


@pytest.mark.parametrize(
    "command",
    [
        ("rollout", "start"),
        ("rollout", "status"),
        ("rollout", "pause"),
        ("rollout", "resume"),
        ("rollout", "abort"),
        ("rollout", "rollback"),
        ("rollout", "skip-gate"),
        ("rollout", "list"),
        ("fleet", "list"),
        ("fleet", "show"),
    ],
)
def test_help_teaches_with_an_example(command: tuple[str, ...]) -> None:
    result = tandem(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Example: tandem" in result.stdout
    for option in ("--cdn", "--token", "TANDEM_CDN_URL", "TANDEM_CDN_ADMIN_TOKEN"):
        assert option in result.stdout, option
    if command == ("rollout", "start"):
        for option in ("--waves", "--target", "--max-failure", "--soak", "--from", "--min-reports"):
            assert option in result.stdout, option
        assert "--dry-run" in result.stdout and "--accept-inconclusive" in result.stdout
    if command == ("rollout", "status"):
        assert "--watch" in result.stdout and "3 halted or aborted" in result.stdout


def test_rollout_is_a_tandem_command_listing_its_subcommands(tmp_path: Path) -> None:
    root = tandem("--help", cwd=tmp_path, process=True)  # the real entry point
    assert root.returncode == 0 and "rollout" in root.stdout
    group = tandem("rollout", "--help", cwd=tmp_path)
    assert group.returncode == 0, group.stderr
    for sub in ("start", "status", "pause", "resume", "skip-gate", "abort", "rollback", "list"):
        assert sub in group.stdout, sub
    fleet = tandem("fleet", "--help", cwd=tmp_path)
    for sub in ("provision", "list", "show"):
        assert sub in fleet.stdout, sub


@pytest.mark.parametrize(
    "status",
    [
        {},
        {"id": 3, "state": None, "waves": 5, "health": [], "spec": "x", "target": "site"},
        {"waves": [1, {"index": "x", "planned": "9"}, {}], "wave": True, "counts": 4},
        {"spec": {"waves": [{"fraction": 2}], "max_agreement_drop": "x"}, "health": {"3": 1}},
        {"reason": "[red]boom[/red] :x:", "target": {"site": "[b]a[/b]"}, "waves": []},
    ],
)
def test_odd_status_objects_render_without_crashing(status: dict[str, object]) -> None:
    from rich.console import Console

    from tandem.cli._rollout_view import list_table, render_progress, render_status

    out = io.StringIO()
    console = Console(file=out, width=120, markup=False, emoji=False)
    for renderable in (render_status(status), render_progress(status), list_table([status])):
        console.print(renderable)
    shown = out.getvalue()
    if "reason" in status:  # text from the network is shown as it is, never as markup
        assert "[red]boom[/red] :x:" in shown and "site=[b]a[/b]" in shown
