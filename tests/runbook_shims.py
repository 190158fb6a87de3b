"""Stand-ins for ``docker``, ``curl`` and ``airflow`` while tests/test_runbooks.py runs the runbooks.

No Docker engine, API server or scheduler runs in the tests, so the runbooks' commands
meet these instead, each checking what it is given against the real configuration:

* ``docker compose <exec|logs|run|up|ps> … SERVICE [CMD…]``: SERVICE must be a service of
  docker-compose.yaml (also in ``--scale SERVICE=N``); an absolute path in CMD must lie
  under one of that service's volume mounts or a path its environment sets; CMD
  ``airflow …`` goes to the ``airflow`` stand-in, ``shardsink …`` is parsed by the real
  CLI parser, ``python -``/``python -c`` code is compiled. Prints nothing.
* ``curl … URL``: URL must be the API address compose publishes (``airflow-apiserver``'s
  port) and METHOD + path an operation of Airflow's own OpenAPI documents (the REST API
  and the simple auth manager's token endpoint). Prints nothing.
* ``airflow …``: sent to the test's warm Airflow CLI process (:mod:`shardsink_dev.dagrunner`)
  over a Unix socket; commands that would start or clear runs are only parsed there.

A refused command is recorded (one line in ``$RUNBOOK_VIOLATIONS``) and exits 2.
Settings come from the environment: ``RUNBOOK_SOCK``, ``RUNBOOK_VIOLATIONS``, ``RUNBOOK_REPO``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

_PATH = re.compile(r"(?<![\w.$])/(?:opt|tmp|var|home|data)/[^\s'\"|;)]*")


def _violation(what: str) -> int:
    with open(os.environ["RUNBOOK_VIOLATIONS"], "a") as f:
        f.write(what.replace("\n", " ") + "\n")
    print(f"runbook check: {what}", file=sys.stderr)
    return 2


def _compose() -> dict[str, Any]:
    return yaml.safe_load((Path(os.environ["RUNBOOK_REPO"]) / "docker-compose.yaml").read_text())


# --- airflow -------------------------------------------------------------------------------


def airflow_main(argv: list[str]) -> int:
    """Send ``argv`` to the test's Airflow CLI process; print what it printed, exit with its code."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(os.environ["RUNBOOK_SOCK"])
        s.sendall(json.dumps({"argv": argv}).encode() + b"\n")
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    got = json.loads(data)
    sys.stdout.write(got["out"])
    sys.stderr.write(got["err"])
    return int(got["rc"])


# --- docker compose ------------------------------------------------------------------------

_EXEC_FLAGS = {"-T": 0, "-d": 0, "--index": 1, "-e": 1, "--env": 1, "-u": 1, "--user": 1, "-w": 1, "--workdir": 1,
               "--rm": 0, "--entrypoint": 1, "--no-deps": 0, "--since": 1, "--tail": 1, "-f": 0, "--follow": 0,
               "-t": 0, "--timestamps": 0, "-q": 0, "--quiet": 0, "-a": 0, "--all": 0, "--scale": 1,
               "--build": 0, "--wait": 0}


def docker_main(argv: list[str]) -> int:
    if not argv or argv[0] != "compose":
        return _violation(f"docker {' '.join(argv)}: only `docker compose` is used by the runbooks")
    spec = _compose()
    services = spec["services"]
    sub, rest = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    if sub not in ("exec", "logs", "run", "up", "ps"):
        return _violation(f"docker compose {sub}: not a subcommand the runbooks use")
    positional: list[str] = []
    i = 0
    while i < len(rest):
        a = rest[i]
        if positional and sub in ("exec", "run"):
            break  # the command inside the container starts after the service
        if a in _EXEC_FLAGS:
            if a == "--scale" and rest[i + 1].split("=")[0] not in services:
                return _violation(f"--scale {rest[i + 1]}: no such service in docker-compose.yaml")
            i += 1 + _EXEC_FLAGS[a]
            continue
        if a.startswith("-"):
            return _violation(f"docker compose {sub} {a}: an option the runbook checker does not know")
        positional.append(a)
        i += 1
    named = positional if sub in ("logs", "up", "ps") else positional[:1]
    for name in named:
        if name not in services:
            return _violation(f"docker compose {sub} {name}: no such service in docker-compose.yaml")
    if sub in ("exec", "run"):
        if not positional:
            return _violation(f"docker compose {sub}: no service named")
        return _inside(positional[0], services[positional[0]], rest[i:])
    return 0


def _inside(name: str, service: dict[str, Any], cmd: list[str]) -> int:
    """A command run inside ``service``: its paths must exist there; known programs are checked."""
    roots = [str(v).split(":")[1] for v in service.get("volumes") or () if ":" in str(v)]
    roots += [str(v) for v in (service.get("environment") or {}).values() if str(v).startswith("/")]
    for arg in cmd:
        for path in _PATH.findall(arg):
            if not any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots):
                return _violation(f"{path} (in {name}): under none of its mounts or configured paths {roots}")
    if not cmd:
        return 0
    if cmd[0] == "airflow":
        return airflow_main(cmd[1:])
    if cmd[0] == "shardsink":
        from shardsink.cli_args import build_parser

        try:
            build_parser().parse_args(cmd[1:])
        except SystemExit as e:
            return 0 if e.code == 0 else _violation(f"shardsink {' '.join(cmd[1:])}: refused by its parser")
        return 0
    if cmd[0] == "python":
        code = sys.stdin.read() if cmd[1:2] == ["-"] else cmd[2] if cmd[1:2] == ["-c"] else None
        if code is None:
            return _violation(f"python {' '.join(cmd[1:])}: neither `-` nor `-c`")
        try:
            compile(code, "<runbook>", "exec")
        except SyntaxError as e:
            return _violation(f"python code does not compile: {e}")
    return 0


# --- curl: the REST API --------------------------------------------------------------------


def _operations() -> list[tuple[str, re.Pattern[str]]]:
    import importlib.util

    spec = importlib.util.find_spec("airflow")  # found, not imported (importing Airflow takes seconds)
    assert spec is not None and spec.submodule_search_locations
    base = Path(spec.submodule_search_locations[0]) / "api_fastapi"
    ops = []
    for doc in (base / "core_api/openapi/v2-rest-api-generated.yaml",
                base / "auth/managers/simple/openapi/v2-simple-auth-manager-generated.yaml"):
        for path, methods in yaml.safe_load(doc.read_text())["paths"].items():
            pattern = re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path)) + "$")
            ops += [(m.upper(), pattern) for m in methods]
    return ops


def curl_main(argv: list[str]) -> int:
    method, data, get, url = None, False, False, None
    takes = {"-X", "-H", "-d", "--data", "--data-urlencode", "-o", "-u", "-w"}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-X":
            method = argv[i + 1]
        elif a in ("-d", "--data", "--data-urlencode"):
            data = True
        elif a == "-G":
            get = True
        elif not a.startswith("-"):
            url = a
        i += 2 if a in takes else 1
    if url is None:
        return _violation(f"curl {' '.join(argv)}: no URL")
    method = method or ("GET" if get or not data else "POST")
    parts = urlsplit(url)
    published = [str(p).split(":")[-1] for p in _compose()["services"]["airflow-apiserver"].get("ports") or ()]
    if parts.hostname not in ("localhost", "127.0.0.1") or str(parts.port) not in published:
        return _violation(f"{url}: not the API address compose publishes (ports {published})")
    if not any(m == method and p.match(parts.path) for m, p in _operations()):
        return _violation(f"{method} {parts.path}: no such operation in Airflow's OpenAPI documents")
    return 0


if __name__ == "__main__":
    tool = Path(sys.argv[0]).name
    sys.exit({"docker": docker_main, "curl": curl_main, "airflow": airflow_main}[tool](sys.argv[1:]))
