"""The agent's state directory: root-only files, written atomically.

Layout under ``LOCKSTEP_STATE_DIR`` (mode 0700)::

    credential.json      node credential and the parameters the console gave at enrollment (0600)
    commands/<id>.json   completed commands with their result (0600)
    commands/<id>.running  marker of a command being executed
    telemetry/           the telemetry disk buffer (segments and batch state)

Every file is written to a temporary file in the same directory, fsynced and
renamed over the old one, then the directory is fsynced: a crash leaves the old
or the new content, never a mix.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

CREDENTIAL_FILE = "credential.json"


class StateError(Exception):
    """The state directory or a file in it cannot be used; the message says which and why."""


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) with mode 0700, or tighten it to 0700 if it exists."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if stat.S_IMODE(path.stat().st_mode) != 0o700:
            os.chmod(path, 0o700)
    except OSError as exc:
        raise StateError(f"state directory {str(path)!r} cannot be created or secured: {exc}") from None
    return path


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (temp file, fsync, rename, fsync dir)."""
    directory = path.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync:
        _fsync_dir(directory)


def atomic_write_json(path: Path, obj: object, mode: int = 0o600, sync: bool = True) -> None:
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    atomic_write_bytes(path, data, mode=mode, sync=sync)


def read_json(path: Path) -> object | None:
    """The JSON in ``path``, or None when the file does not exist."""
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StateError(f"state file {str(path)!r} cannot be read: {exc}") from None


@dataclass(frozen=True)
class Credential:
    """What the console answered at enrollment (protocol §1), plus where it lives."""

    console_url: str
    node_id: int
    node_name: str
    cluster_id: int
    organization_id: int
    credential: str
    heartbeat_interval_s: float = 15.0
    poll_wait_s: float = 25.0
    telemetry_max_batch_bytes: int = 1048576
    telemetry_max_records: int = 5000
    enrolled_at: str = ""

    @classmethod
    def from_answer(cls, console_url: str, answer: dict, enrolled_at: str) -> Credential:
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in answer.items() if k in known}
        data["console_url"] = console_url
        data["enrolled_at"] = enrolled_at
        return cls(**data)


def credential_path(state_dir: Path) -> Path:
    return state_dir / CREDENTIAL_FILE


def save_credential(state_dir: Path, cred: Credential) -> Path:
    ensure_private_dir(state_dir)
    path = credential_path(state_dir)
    atomic_write_json(path, asdict(cred), mode=0o600)
    return path


def load_credential(state_dir: Path) -> Credential | None:
    path = credential_path(state_dir)
    data = read_json(path)
    if data is None:
        return None
    known = {f.name for f in fields(Credential)}
    try:
        if not isinstance(data, dict):
            raise TypeError("not an object")
        return Credential(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise StateError(
            f"credential file {str(path)!r} is damaged ({exc}); enroll the node again with a new token"
        ) from None
