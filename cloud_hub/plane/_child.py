"""``python -m cloud_hub.plane._child ROLE INDEX``: one child process of a multi-process hub.

ROLE is ``executor``, ``llm``, ``mqtt`` or ``http``; INDEX picks the executor
(in the plan's list of executors, or of language executors) or numbers the
ingress. The plan (``PlaneSpec``) comes in the
``TANDEM_HUB_PLANE`` environment variable; ``TANDEM_READY_FD`` names a pipe to
write one line to once serving. The process asks the kernel for SIGTERM when
its parent (the supervisor) dies, so no child outlives a hub killed with
SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import sys
from collections.abc import Callable

from shared import TandemError

from ._llm_executor import run_language_executor
from ._roles import run_executor, run_http_ingress, run_mqtt_ingress
from ._spec import ENV, PlaneSpec

__all__ = ["READY_FD_ENV", "main"]

READY_FD_ENV = "TANDEM_READY_FD"
_PR_SET_PDEATHSIG = 1
_ROLES = {
    "executor": run_executor,
    "llm": run_language_executor,
    "mqtt": run_mqtt_ingress,
    "http": run_http_ingress,
}

log = logging.getLogger(__name__)


def _die_with_parent(parent_pid: int) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if parent_pid and os.getppid() != parent_pid:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _ready_signal() -> Callable[[], None]:
    fd = int(os.environ.pop(READY_FD_ENV, "-1"))

    def ready() -> None:
        nonlocal fd
        if fd >= 0:
            with contextlib.suppress(OSError):  # nobody waits (a restart): nothing to tell
                os.write(fd, b"ready\n")
            os.close(fd)
            fd = -1

    return ready


def main(argv: list[str] | None = None) -> None:
    from shared import configure_logging

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in _ROLES or not args[1].isdecimal():
        raise SystemExit("usage: python -m cloud_hub.plane._child executor|llm|mqtt|http INDEX")
    spec = PlaneSpec.from_json(os.environ.pop(ENV))
    configure_logging(spec.log_level, json=spec.log_format == "json")
    _die_with_parent(spec.parent_pid)
    role, index = args[0], int(args[1])
    try:
        _ROLES[role](spec, index, _ready_signal())
    except TandemError as e:  # expected (a model that does not load, a bad setting): one line
        log.error("hub %s process %d: %s", role, index, e)
        raise SystemExit(1) from None
    except Exception:
        log.exception("hub %s process %d failed", role, index)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
