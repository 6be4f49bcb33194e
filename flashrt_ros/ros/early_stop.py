"""A stop signal in a node process's first second, while Python imports rclpy, torch and the
node's modules: Python's defaults would end it with a KeyboardInterrupt traceback (SIGINT) or
status 143 and no word (SIGTERM). The entry scripts install this before those imports; the node's
own handling (process.interrupt_on_signals) takes over in main(). Standard library only: it must
load in milliseconds."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

# A hang-up too: a closed terminal or a dropped ssh session would kill the node without its stop
# (the trajectory controllers left playing the last chunk); unless ignored at start (nohup).
_HANGUP = () if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else (signal.SIGHUP,)
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, *_HANGUP)
"""The signals that stop our nodes cleanly."""


def stop_cleanly_while_importing(executable: str, status: int = 0) -> None:
    """Until main() takes the signals over, a stop signal (STOP_SIGNALS) ends the process with
    `status` and one line, as a stop while the pipeline is built does (status 0 for the nodes; 1
    for flashrt_echo, whose 0 says a chunk arrived). At once (os._exit): nothing is made yet that
    needs closing, and an exception raised into an import can be caught there and lost."""

    def stopped(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        print(f"[{executable}] not starting: stopped by {name} while starting", file=sys.stderr, flush=True)
        os._exit(status)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stopped)
