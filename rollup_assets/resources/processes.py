"""Local processes: is a pid alive, and ending one once Python's exit work is done."""

import atexit
import os
import sys
import threading
from typing import NoReturn


def pid_alive(pid: int) -> bool:
    """Is there a process with this pid (one of another user's counts)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exit_after_python(code: int) -> NoReturn:
    """End the process with `code` once Python's own exit work is done (non-daemon threads
    joined, atexit handlers run, output flushed), without running the C++ static destructors of
    native libraries: Arrow's thread pools can abort a process in theirs (`terminate called
    without an active exception`, exit -6) after its work succeeded."""
    threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter runs at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # the interpreter's status when it cannot flush its output
    os._exit(code)
