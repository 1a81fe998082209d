"""Local processes: is a pid alive."""

import os


def pid_alive(pid: int) -> bool:
    """Is there a process with this pid (one of another user's counts)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
