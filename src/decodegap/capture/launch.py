"""Run the recorded program as a child: environment with our sitecustomize first, signals forwarded."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

import decodegap

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
# The folder holding the `decodegap` package, for a program whose Python environment lacks it.
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(decodegap.__file__)))

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_SI_KERNEL = 0x80  # si_code of a signal the tty driver sent to the whole foreground process group


def child_env(base: Mapping[str, str], settings: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = SITE_DIR if not old else SITE_DIR + os.pathsep + old
    env["DECODEGAP_RECORD_PKG_ROOT"] = PKG_ROOT
    env.update(settings)
    return env


def run_forwarding_signals(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run argv to completion; forward FORWARDED signals to it; return its returncode (-N: killed by N).

    Signals are taken synchronously (sigtimedwait) so that we can see who sent them: a Ctrl-C from the
    terminal already reached the child (same process group) and is not sent a second time, which
    would turn a server's graceful shutdown into an abrupt one.
    """
    watched = set(FORWARDED) | {signal.SIGCHLD}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        # The child must not inherit our blocked mask; we have no threads, so preexec_fn is safe here.
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, old_mask),  # noqa: PLW1509
        )
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        raise
    try:
        while proc.poll() is None:
            # The timeout only guards against a SIGCHLD lost to a race; normally we wake on it.
            info = signal.sigtimedwait(watched, 1.0)
            if info is None or info.si_signo == signal.SIGCHLD:
                continue
            if info.si_code == _SI_KERNEL and _same_group(proc.pid):
                continue
            try:
                proc.send_signal(info.si_signo)
            except ProcessLookupError:
                pass
    finally:
        while signal.sigtimedwait(watched, 0) is not None:  # drop what arrived as the child ended
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return proc.returncode


def _same_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:
        return True


def exit_like(returncode: int) -> None:
    """Leave this process the way the child left: same exit code, or killed by the same signal."""
    if returncode < 0:
        sig = -returncode
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP have no handler to reset: they act by default anyway
        try:
            os.kill(os.getpid(), sig)
        except (OSError, ValueError):
            pass
        raise SystemExit(128 + sig)
    raise SystemExit(returncode)
