"""Enrollment: exchange an enrollment token for this node's credential (protocol §1).

Exit codes of ``python -m agent enroll`` (and of ``run`` when it enrolls first):

==  ======================================================================
0   enrolled; the credential is stored
2   usage or configuration error (bad flag, bad value, missing host facts)
3   the console cannot be reached (connection, DNS, TLS, timeout, 502-504)
4   the token is refused: invalid, expired, revoked, exhausted, wrong cluster
5   conflict: the host name is bound to another machine in the cluster
6   any other error (unexpected answer, the credential cannot be stored)
==  ======================================================================
"""

from __future__ import annotations

from pathlib import Path

from agent import __version__
from agent.client import Client, ConsoleError, Unreachable
from agent.inventory import HostPaths, iso_now
from agent.inventory.host import host_facts
from agent.state import Credential, StateError, credential_path, load_credential, save_credential

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_REFUSED = 4
EXIT_CONFLICT = 5
EXIT_OTHER = 6

_REFUSALS = {
    "enrollment_token_invalid": "is not valid. Copy the install line again from the console's enrollment page",
    "enrollment_token_expired": "has expired. Create a new enrollment token in the console and use it",
    "enrollment_token_revoked": "was revoked. Ask for a new enrollment token in the console and use it",
    "enrollment_token_exhausted": (
        "has been used as many times as it allows. Create a new token (or raise its use limit) in the console"
    ),
}


class EnrollError(Exception):
    def __init__(self, exit_code: int, message: str):
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message


def explain(exc: ConsoleError, console_url: str, hostname: str, cluster_id: int | None) -> EnrollError:
    """Turn a console refusal into an exit code and a message that says what to do next."""
    if isinstance(exc, Unreachable) or exc.status in (502, 503, 504):
        return EnrollError(
            EXIT_UNREACHABLE,
            f"Cannot reach the console at {console_url} ({exc.detail or exc.code}). Check the URL and that this "
            "node can reach it (DNS, firewall, proxy), then run the command again.",
        )
    if exc.code in _REFUSALS:
        return EnrollError(
            EXIT_REFUSED, f"The console refused the enrollment token ({exc.code}): the token {_REFUSALS[exc.code]}."
        )
    if exc.code == "enrollment_token_wrong_cluster":
        return EnrollError(
            EXIT_REFUSED,
            f"The enrollment token belongs to another cluster than {cluster_id} ({exc.code}). Use a token of "
            f"cluster {cluster_id}, or leave out --cluster to join the token's cluster.",
        )
    if exc.code == "node_already_enrolled":
        return EnrollError(
            EXIT_CONFLICT,
            f"The console already has node {hostname!r} enrolled with an active credential, and this node "
            f"cannot prove it holds it ({exc.code}). If this is that node, restore its state directory; "
            "otherwise have an operator reset the node's credential in the console (or retire it), then "
            "enroll again.",
        )
    if exc.code == "hostname_taken" or exc.status == 409:
        return EnrollError(
            EXIT_CONFLICT,
            f"The host name {hostname!r} is already bound to another machine in this cluster ({exc.code}). "
            "Give this node another name (--hostname or LOCKSTEP_HOSTNAME), or retire the other node in the "
            "console, then enroll again.",
        )
    if exc.status == 400:
        fields = exc.body.get("fields") if isinstance(exc.body, dict) else None
        where = f" ({', '.join(f'{k}: {v}' for k, v in fields.items())})" if isinstance(fields, dict) else ""
        return EnrollError(
            EXIT_USAGE,
            f"The console refused the enrollment request: {exc.detail or exc.code}{where}. Fix the value "
            "(--hostname, --machine-id, --cluster) and run the command again.",
        )
    if exc.status == 401 or exc.status == 403:
        return EnrollError(
            EXIT_REFUSED,
            f"The console refused the enrollment token ({exc.code}: {exc.detail}). Get a new token from the console.",
        )
    return EnrollError(
        EXIT_OTHER,
        f"Enrollment failed: the console answered {exc.status} {exc.code} ({exc.detail}). Check the console's "
        "logs, then run the command again.",
    )


def enroll(
    console_url: str,
    token: str,
    state_dir: Path,
    cluster_id: int | None = None,
    hostname: str | None = None,
    machine_id: str | None = None,
    paths: HostPaths | None = None,
    timeout: float = 20.0,
) -> tuple[Credential, Path]:
    """Enroll and store the credential; raises :class:`EnrollError` with an exit code."""
    host, errors = host_facts(paths or HostPaths(), hostname=hostname, machine_id=machine_id)
    if not host["hostname"] or not host["machine_id"]:
        raise EnrollError(EXIT_USAGE, "; ".join(errors) or "host facts are missing")
    host["agent_version"] = __version__
    try:  # re-enrolling: the credential held proves this is the node (protocol §1)
        held = load_credential(state_dir)
    except StateError:
        held = None
    proof = held.credential if held and held.console_url.rstrip("/") == console_url.rstrip("/") else None
    client = Client(console_url, credential=proof, timeout=timeout)
    try:
        answer = client.enroll(token, host, cluster_id)
    except ConsoleError as exc:
        raise explain(exc, console_url, host["hostname"], cluster_id) from None
    finally:
        client.close()
    try:
        cred = Credential.from_answer(console_url, answer, iso_now())
    except TypeError as exc:
        raise EnrollError(EXIT_OTHER, f"The console's enrollment answer is incomplete ({exc}).") from None
    try:
        path = save_credential(state_dir, cred)
    except (StateError, OSError) as exc:
        raise EnrollError(
            EXIT_OTHER,
            f"Enrolled, but the credential could not be stored in {state_dir} ({exc}). Make the directory "
            "writable by root and enroll again (the console issues a new credential and revokes this one).",
        ) from None
    return cred, path


def success_line(cred: Credential, path: Path | None = None) -> str:
    where = path or credential_path(Path("."))
    return (
        f"Enrolled {cred.node_name} as node {cred.node_id} in cluster {cred.cluster_id} "
        f"(organization {cred.organization_id}); credential stored in {where}. "
        "Start the agent with: python -m agent run"
    )
