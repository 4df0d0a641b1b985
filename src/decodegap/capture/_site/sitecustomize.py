"""Put first on PYTHONPATH by `decodegap record`: wraps the record target in this Python process, then runs
the sitecustomize that would have run without us (if any), so the program's own start-up is unchanged."""

import os
import sys


def _decodegap_boot() -> None:
    root = os.environ.get("DECODEGAP_RECORD_PKG_ROOT", "")
    # Appended, and only while importing our stdlib-only hook: the program's own packages keep priority.
    added = bool(root) and root not in sys.path
    if added:
        sys.path.append(root)
    try:
        from decodegap.capture import inject

        inject.install_from_env()
    except Exception as exc:  # noqa: BLE001 - never stop the program from starting
        try:
            sys.stderr.write(
                f"decodegap: warning: record hook not installed in pid {os.getpid()} "
                f"({type(exc).__name__}: {exc}); the program runs unprofiled\n"
            )
        except Exception:  # noqa: BLE001, S110
            pass
    finally:
        if added:
            try:
                sys.path.remove(root)
            except ValueError:
                pass


def _decodegap_chain() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)  # its errors surface exactly as they would without us


_decodegap_boot()
_decodegap_chain()
