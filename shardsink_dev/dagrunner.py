"""A warm ``airflow dags test``: the same CLI command, run again and again in one process.

Each ``airflow dags test`` process spends about 11.6 s of CPU before and around the run
itself (imports, the in-process execution API building its versioned routes, syncing the
DAG bag); a second run in the same process costs under a second of it. The Airflow tests
run several DAG runs each, so they send them to one of these processes instead of
starting a CLI per run (tests/airflow/af_helpers.py).

What stays the same as the CLI: the command is parsed by Airflow's own CLI parser and run
by its own ``dags test`` function, which parses the DAG file again each time (the DAG
file's module is re-executed, so a DAG built from environment variables sees the run's),
and the tasks run in this process, as they do under the CLI. Each request carries the
run's whole environment: ``os.environ`` is replaced by it for the run (tasks and their
spark-submit children see exactly it), and its stdout and stderr go to the request's log
file at the file-descriptor level, so children write there too.

SUBTLE: some variables only act when a process starts: Airflow reads its configuration
(``AIRFLOW_*``: home, metadata DB, folders) once, at import, and the interpreter reads
``PYTHON*`` (``PYTHONPATH``: a test's ``sitecustomize`` fault injection) at start. A request
whose such variables (:func:`start_level`) differ from the ones this process started
with is refused (exit code 90); the caller starts another runner for them.

Protocol: one JSON object per line on stdin, ``{"argv": [...], "env": {...}, "log": path}``
with argv the words after ``airflow``; one JSON line back on the original stdout,
``{"rc": exit_code}``. End of input ends the process.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, TextIO

REFUSED = 90
_START_LEVEL = ("AIRFLOW", "PYTHON", "SHARDSINK_TEST_FAULTS")


def start_level(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that only act when a process starts."""
    return {k: v for k, v in env.items() if k.startswith(_START_LEVEL)}


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)  # as the interpreter does for SystemExit("message")
    return 1


def _run(parser: Any, argv: list[str]) -> int:
    try:
        args = parser.parse_args(argv)
        args.func(args)
    except SystemExit as e:
        return _exit_code(e)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _serve(parser: Any, started_with: dict[str, str], reply: TextIO) -> None:
    for line in sys.stdin:
        req = json.loads(line)
        env: dict[str, str] = req["env"]
        if start_level(env) != started_with:
            rc = REFUSED
        else:
            os.environ.clear()
            os.environ.update(env)
            sys.stdout.flush()
            sys.stderr.flush()
            fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            try:
                rc = _run(parser, req["argv"])
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)
                os.dup2(null, 2)
                os.close(null)
        reply.write(json.dumps({"rc": rc}) + "\n")
        reply.flush()


def main() -> None:
    reply = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # Airflow's import-time output must not reach the reply channel
    os.close(null)
    from airflow.cli import cli_parser

    _serve(cli_parser.get_parser(), start_level(dict(os.environ)), reply)


if __name__ == "__main__":
    main()
