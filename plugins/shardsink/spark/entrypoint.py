"""What every shardsink spark-submit application does around its ``run``: exit codes and log lines.

``report(run, argv, tag=...)`` runs ``run(argv)`` and returns the process exit code:
0 and one ``<tag> {json summary}`` line on stdout; the error class's exit code (2 for
invalid input, 1 otherwise) and one ``shardsink: error: <Class>: <message>`` line on
stderr. Errors raised on executors arrive wrapped in Spark's exceptions; the original
shardsink error is dug out of the text so the task log names it plainly.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

_ERR = re.compile(r"(MalformedInputError|LateDataError|InvalidUsageError|ReadFrontierError|CorruptionError): (.+)")


def die_with_parent() -> None:
    """Exit when spark-submit's JVM dies (Airflow's on_kill SIGKILLs only the JVM, which
    would otherwise orphan this driver process). Linux only; a no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def report(run: Callable[[Sequence[str] | None], dict[str, Any]], argv: Sequence[str] | None, *, tag: str) -> int:
    """Run ``run(argv)``; print its summary or the error; return the exit code (module docstring)."""
    from shardsink.errors import InvalidUsageError, ShardsinkError

    die_with_parent()
    try:
        summary = run(argv)
    except ShardsinkError as e:
        print(f"shardsink: error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except Exception as e:
        found = _ERR.findall(str(e))
        if not found:
            raise
        kind, msg = found[-1]
        print(f"shardsink: error: {kind}: {msg}", file=sys.stderr, flush=True)
        return InvalidUsageError.exit_code if kind != "CorruptionError" else 1
    print(f"{tag} " + json.dumps(summary, sort_keys=True), flush=True)
    return 0
