"""Ctrl-C and SIGTERM end a measurement cleanly (servers torn down, partial results kept), also in a background job.

Why: a shell runs `cmd &` with SIGINT ignored, and children inherit that; Python then installs no KeyboardInterrupt
handler and asyncio none of its own, so SIGINT (and SIGTERM forwarded as SIGINT, which is what CI's cancel sends)
would be swallowed and a run would go on to its end. Seen: `sglperf bench` under a test run started from a script.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def interrupt_on_sigterm() -> None:
    """In the main thread: SIGINT raises KeyboardInterrupt even where it was ignored, and SIGTERM does the same."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))


class _Deferred:
    previous = None
    active = False
    noted = False
    what = ""


def defer(what: str) -> None:
    """From now until `resume()`, Ctrl-C (and SIGTERM, which raises it) is noted, not raised: what the first one
    interrupted (`what`: the partial level, then the interrupted run's files) is written before the run ends, however
    often the user presses it. Where a second one raised, the level it was saving was lost. Called again while
    deferred, it only names what is being saved now."""
    if threading.current_thread() is not threading.main_thread():
        return
    _Deferred.what = what
    if _Deferred.active:
        return

    def note(signum, frame):
        if not _Deferred.noted:
            print(f"\nsglperf: saving {_Deferred.what} first; the run ends as soon as it is written", file=sys.stderr,
                  flush=True)
        _Deferred.noted = True

    _Deferred.previous = signal.signal(signal.SIGINT, note)
    _Deferred.active, _Deferred.noted = True, False


def resume() -> None:
    """Ctrl-C raises again (the caller ends the run: it was interrupted once already)."""
    if not _Deferred.active:
        return
    previous = _Deferred.previous
    signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
    _Deferred.active = False
