"""--parent-pid: a server that shuts down once the process that started it is gone (a supervisor, a
test harness), however that process ends; no orphan engine after a killed run."""

import os
import signal
import threading
import time


def add_parent_pid(parser) -> None:
    """--parent-pid on an argparse parser, for a server a supervisor or a test harness starts (see
    `exit_with_parent`)."""
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="shut down (as on SIGTERM) within a second of the process with this pid ending")


def exit_with_parent(parent_pid: int, interval_s: float = 1.0) -> None:
    """In a server: send itself SIGTERM (a clean shutdown) once its parent is gone, polled every
    `interval_s`; exit now if it already is. Unlike `rooftop.bench.subproc.die_with_parent` this holds whichever thread of
    the parent started the server (PR_SET_PDEATHSIG fires when that thread ends, e.g. a pool's)."""
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
