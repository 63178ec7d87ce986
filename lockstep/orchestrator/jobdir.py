"""Where a job's files live on the machine that runs its orchestrator.

``$LOCKSTEP_STATE_DIR`` (default ``/run/lockstep`` for root, else ``$XDG_RUNTIME_DIR/lockstep``,
else ``/tmp/lockstep-<uid>``) holds ``jobs/<name>/``, mode 0700:

* ``job.json`` -- name, orchestrator address and pid, world size, start time (for ``lockstep jobs``);
* ``state.json`` -- the orchestrator's journal (generation, ranks, spares, recoveries), rewritten
  atomically after every change; a restarted orchestrator resumes from it;
* ``control.sock`` -- the orchestrator's Unix socket for the CLI (its permissions are the access
  control: only the job's user reaches it).
"""

from __future__ import annotations

import json
import os
import re

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def state_dir() -> str:
    env = os.environ.get("LOCKSTEP_STATE_DIR")
    if env:
        return env
    if os.geteuid() == 0:
        return "/run/lockstep"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "lockstep")
    return f"/tmp/lockstep-{os.getuid()}"  # noqa: S108 (created 0700; job_dir refuses one not ours)


def check_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise ValueError(f"job name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return name


def job_dir(name: str, create: bool = False) -> str:
    path = os.path.join(state_dir(), "jobs", check_name(name))
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
        if os.stat(state_dir()).st_uid != os.getuid():
            raise PermissionError(f"{state_dir()} belongs to another user; set LOCKSTEP_STATE_DIR")
        os.chmod(path, 0o700)
    return path


def write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def list_jobs() -> list[tuple[str, dict]]:
    root = os.path.join(state_dir(), "jobs")
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        info = read_json(os.path.join(root, name, "job.json"))
        if info:
            out.append((name, info))
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
