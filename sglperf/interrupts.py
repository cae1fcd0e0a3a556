"""Ctrl-C and SIGTERM end a measurement cleanly (servers torn down, partial results kept), also in a background job.

Why: a shell runs `cmd &` with SIGINT ignored, and children inherit that; Python then installs no KeyboardInterrupt
handler and asyncio none of its own, so SIGINT (and SIGTERM forwarded as SIGINT, which is what CI's cancel sends)
would be swallowed and a run would go on to its end. Seen: `sglperf bench` under a test run started from a script.
"""

from __future__ import annotations

import os
import signal


def interrupt_on_sigterm() -> None:
    """In the main thread: SIGINT raises KeyboardInterrupt even where it was ignored, and SIGTERM does the same."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
