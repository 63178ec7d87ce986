"""Build the agent package that the installer downloads: deterministic, offline, cached.

The package ``lockstep-agent-<version>.tar.gz`` holds, under ``lockstep-agent-<version>/``:

- ``wheels/lockstep_agent-<version>-py3-none-any.whl``: the agent, built here from ``agent/``
  in pure Python (``zipfile``; no setuptools, no network);
- ``wheels/*.whl``: the pinned runtime dependencies of ``requirements/agent-bundle.txt`` and the
  pip that installs them on the node, all pure-Python wheels;
- ``SHA256SUMS``: the sum of every wheel.

That base package runs anywhere (Python >= 3.10, any CPU). Clock sync needs numpy and scipy
(``requirements/agent-native.txt``), whose wheels are per Python and CPU, so for each target of
:data:`NATIVE_TARGETS` there is also ``lockstep-agent-<version>-<cpXY>-<arch>.tar.gz``: the base
package plus that target's manylinux wheels (about 50 MB rather than 300 MB for all of them).
``/install.sh`` carries the file name and sha256 of every variant and picks the one for the
node's Python and CPU, or the base package (the agent without clock sync) when there is none.

The same inputs always give the same bytes (fixed timestamps, owners, modes and order), so the
same sha256. Dependency wheels are fetched once, at console set-up, with ``pip download``
(:func:`download_wheels`, ``manage.py build_agent_package --download``) into the wheels
directory; requests never touch the network: a missing wheel is a :class:`PackageUnavailable`
that says what to run. A build is cached under ``<var>/agentdist/packages`` with the digest of
its inputs and rebuilt when ``agent/``, the pins or the wheels change.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

BUILDER_FORMAT = "1"  # bump when the layout of the package changes
PACKAGE_NAME = "lockstep-agent"
DIST_NAME = "lockstep_agent"
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
TAR_MTIME = 315532800  # 1980-01-01, as in the wheels
# The pins are for a node's Python, not the console's: pure-Python wheels for any Linux node.
DOWNLOAD_TARGET = ["--only-binary=:all:", "--platform", "any", "--implementation", "py", "--abi", "none",
                   "--python-version", "3.10"]
# (CPython tag, machine) of the nodes that get clock sync (numpy/scipy wheels). numpy 2.4 and
# scipy 1.17 need Python >= 3.11; a 3.10 node (or one not listed) gets the base package.
NATIVE_TARGETS = tuple((py, arch) for py in ("cp311", "cp312", "cp313") for arch in ("x86_64", "aarch64"))
# glibc 2.28 (RHEL 8, Debian 10, Ubuntu 18.10) and newer; numpy publishes manylinux_2_27/2_28 wheels.
NATIVE_PLATFORMS = ("manylinux_2_28_{arch}", "manylinux_2_17_{arch}", "manylinux2014_{arch}")

_PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([A-Za-z0-9.+!_-]+)$")


class PackageUnavailable(Exception):
    """The package cannot be built; the message says what the console's operator must do."""


@dataclass(frozen=True)
class Package:
    version: str
    filename: str
    path: Path
    sha256: str
    size: int
    target: str | None = None  # "cp311-x86_64" for a variant with native wheels, None for the base

    @property
    def sha256_line(self) -> str:
        return f"{self.sha256}  {self.filename}\n"


@dataclass(frozen=True)
class Layout:
    """Where the inputs are and where builds go (defaults: this checkout and its var/)."""

    agent_dir: Path
    requirements: Path
    wheels_dir: Path
    out_dir: Path
    native_requirements: Path | None = None  # numpy/scipy pins for the per-target variants

    @classmethod
    def default(cls) -> Layout:
        from django.conf import settings

        from console.env import env_str

        base = Path(settings.BASE_DIR)
        dist = Path(settings.VAR_DIR) / "agentdist"
        wheels = env_str("LOCKSTEP_AGENT_WHEELS_DIR", "") or str(dist / "wheels")
        return cls(base / "agent", base / "requirements" / "agent-bundle.txt", Path(wheels), dist / "packages",
                   base / "requirements" / "agent-native.txt")


# --- inputs ---------------------------------------------------------------------------------


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path, _seen: frozenset = frozenset()) -> dict[str, tuple[str, str]]:
    """``{normalized name: (name, version)}`` from a requirements file with ``==`` pins and ``-r``."""
    path = path.resolve()
    if path in _seen:
        return {}
    pins: dict[str, tuple[str, str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            pins.update(read_pins(path.parent / line[3:].strip(), _seen | {path}))
            continue
        match = _PIN_RE.match(line)
        if not match:
            raise PackageUnavailable(f"{path.name}: {raw.strip()!r} is not an exact pin (name==version)")
        pins[normalize(match.group(1))] = (match.group(1), match.group(3))
    return pins


def agent_version(agent_dir: Path) -> str:
    text = (agent_dir / "__init__.py").read_text()
    match = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', text, re.M)
    if not match:
        raise PackageUnavailable(f"{agent_dir / '__init__.py'} has no __version__")
    return match.group(1)


def agent_sources(agent_dir: Path) -> list[tuple[str, bytes]]:
    """``[(path in the wheel, content)]`` of the agent's Python packages, sorted.

    A directory is a package when it has an ``__init__.py`` and its parent is one; anything
    else under ``agent/`` (the installer, pyproject.toml, caches) stays out of the wheel.
    """
    files: list[tuple[str, bytes]] = []

    def walk(directory: Path, prefix: str) -> None:
        for entry in sorted(directory.iterdir()):
            if entry.is_dir():
                if entry.name != "__pycache__" and (entry / "__init__.py").is_file():
                    walk(entry, f"{prefix}/{entry.name}")
            elif entry.suffix == ".py":
                files.append((f"{prefix}/{entry.name}", entry.read_bytes()))

    walk(agent_dir, "agent")
    return files


def _project_metadata(agent_dir: Path) -> dict:
    """Description, Python requirement and dependencies from ``agent/pyproject.toml``."""
    text = (agent_dir / "pyproject.toml").read_text()

    def field(name: str, default: str) -> str:
        match = re.search(rf'^{name}\s*=\s*"([^"]*)"', text, re.M)
        return match.group(1) if match else default

    deps_match = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, re.M | re.S)
    deps = re.findall(r'"([^"]+)"', deps_match.group(1)) if deps_match else []
    extras: dict[str, list[str]] = {}
    table = re.search(r"^\[project\.optional-dependencies\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if table:
        for name, body in re.findall(r"^([A-Za-z0-9_-]+)\s*=\s*\[(.*?)\]", table.group(1), re.M | re.S):
            extras[name] = re.findall(r'"([^"]+)"', body)
    return {"summary": field("description", "Lockstep node agent"),
            "requires_python": field("requires-python", ">=3.10"), "dependencies": deps, "extras": extras}


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(agent_dir: Path) -> tuple[str, bytes]:
    """The agent wheel's file name and bytes; same sources, same bytes."""
    version = agent_version(agent_dir)
    meta = _project_metadata(agent_dir)
    dist_info = f"{DIST_NAME}-{version}.dist-info"
    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {PACKAGE_NAME}",
        f"Version: {version}",
        f"Summary: {meta['summary']}",
        f"Requires-Python: {meta['requires_python']}",
        *(f"Requires-Dist: {dep}" for dep in meta["dependencies"]),
        *(line for extra, deps in sorted(meta["extras"].items())
          for line in [f"Provides-Extra: {extra}", *(f'Requires-Dist: {dep}; extra == "{extra}"' for dep in deps)]),
    ]
    files = agent_sources(agent_dir) + [
        (f"{dist_info}/METADATA", ("\n".join(metadata) + "\n").encode()),
        (f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: lockstep-agentdist 1\n"
                               b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{dist_info}/entry_points.txt", b"[console_scripts]\nlockstep-agent = agent.cli:main\n"),
        (f"{dist_info}/top_level.txt", b"agent\n"),
    ]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files)
    record += f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # Unix, so the mode above is honoured
            archive.writestr(info, data, compresslevel=9)
    return f"{DIST_NAME}-{version}-py3-none-any.whl", buffer.getvalue()


def wheel_name_version(filename: str) -> tuple[str, str] | None:
    parts = filename[: -len(".whl")].split("-") if filename.endswith(".whl") else []
    return (normalize(parts[0]), parts[1]) if len(parts) >= 5 else None


def dependency_wheels(layout: Layout) -> list[Path]:
    """The wheel of every pin, from the wheels directory; raises when one is missing."""
    pins = read_pins(layout.requirements)
    found: dict[str, Path] = {}
    if layout.wheels_dir.is_dir():
        for path in sorted(layout.wheels_dir.glob("*.whl")):
            nv = wheel_name_version(path.name)
            if nv and nv[0] in pins and pins[nv[0]][1] == nv[1] and path.name.endswith("-none-any.whl"):
                found.setdefault(nv[0], path)
    missing = [f"{name}=={version}" for key, (name, version) in sorted(pins.items()) if key not in found]
    if missing:
        raise PackageUnavailable(
            f"the agent package cannot be built: no wheel in {layout.wheels_dir} for {', '.join(missing)}. "
            "Run `python manage.py build_agent_package --download` on the console once (it needs access to "
            "PyPI or a mirror), or copy those py3-none-any wheels there (LOCKSTEP_AGENT_WHEELS_DIR)."
        )
    if "pip" not in found:
        raise PackageUnavailable(f"{layout.requirements.name} must pin pip: the installer runs it from its wheel")
    return [found[key] for key in sorted(found)]


def target_name(target: tuple[str, str]) -> str:
    return f"{target[0]}-{target[1]}"


def native_pins(layout: Layout) -> dict[str, tuple[str, str]]:
    if layout.native_requirements is None or not layout.native_requirements.is_file():
        return {}
    return read_pins(layout.native_requirements)


def native_wheels(layout: Layout) -> dict[str, list[Path]]:
    """``{"cp311-x86_64": [numpy wheel, scipy wheel], ...}``; raises when one is missing."""
    pins = native_pins(layout)
    if not pins:
        return {}
    out: dict[str, list[Path]] = {}
    missing = []
    candidates = sorted(layout.wheels_dir.glob("*.whl")) if layout.wheels_dir.is_dir() else []
    for target in NATIVE_TARGETS:
        py, arch = target
        chosen = []
        for key, (name, version) in sorted(pins.items()):
            match = next((p for p in candidates if wheel_name_version(p.name) == (key, version)
                          and f"-{py}-{py}-" in p.name and "manylinux" in p.name and p.name.endswith(f"_{arch}.whl")),
                         None)
            if match is None:
                missing.append(f"{name}=={version} ({py}, {arch})")
            else:
                chosen.append(match)
        out[target_name(target)] = chosen
    if missing:
        raise PackageUnavailable(
            f"the agent package cannot be built: no wheel in {layout.wheels_dir} for {', '.join(missing)}. "
            "Run `python manage.py build_agent_package --download` on the console once (it needs access to "
            "PyPI or a mirror), or copy those manylinux wheels there (LOCKSTEP_AGENT_WHEELS_DIR)."
        )
    return out


def download_wheels(layout: Layout) -> list[Path]:
    """``pip download`` the pinned wheels (set-up time only; the one step that uses the network)."""
    layout.wheels_dir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", *DOWNLOAD_TARGET,
         "-d", str(layout.wheels_dir), "-r", str(layout.requirements)],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise PackageUnavailable(
            f"pip download of the agent's dependencies failed (exit {result.returncode}): "
            f"{result.stderr.strip()[-2000:]}"
        )
    if native_pins(layout):
        for py, arch in NATIVE_TARGETS:
            platforms = [arg for plat in NATIVE_PLATFORMS for arg in ("--platform", plat.format(arch=arch))]
            result = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                 "--only-binary=:all:", *platforms, "--implementation", "cp", "--abi", py,
                 "--python-version", f"{py[2]}.{py[3:]}", "-d", str(layout.wheels_dir),
                 "-r", str(layout.native_requirements)],
                capture_output=True, text=True, check=False,
            )
            if result.returncode != 0:
                raise PackageUnavailable(
                    f"pip download of the clock-sync wheels for {py} {arch} failed (exit {result.returncode}): "
                    f"{result.stderr.strip()[-2000:]}"
                )
    native_wheels(layout)
    return dependency_wheels(layout)


# --- the package ----------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def input_digest(layout: Layout, target: str | None = None) -> tuple[str, str, list[Path]]:
    """(digest of everything the package is made of, agent version, dependency wheels)."""
    version = agent_version(layout.agent_dir)
    wheels = dependency_wheels(layout)
    if target is not None:
        natives = native_wheels(layout)
        if target not in natives:
            raise PackageUnavailable(f"no clock-sync build for {target!r}: the targets are {', '.join(natives)}")
        wheels = wheels + natives[target]
    digest = hashlib.sha256(f"format={BUILDER_FORMAT}\nversion={version}\ntarget={target}\n".encode())
    for name, data in agent_sources(layout.agent_dir):
        digest.update(f"src {name} {_sha256(data)}\n".encode())
    digest.update(f"pyproject {_sha256((layout.agent_dir / 'pyproject.toml').read_bytes())}\n".encode())
    for path in wheels:
        digest.update(f"wheel {path.name} {_sha256(path.read_bytes())}\n".encode())
    return digest.hexdigest(), version, wheels


def package_filename(version: str, target: str | None = None) -> str:
    return f"{PACKAGE_NAME}-{version}.tar.gz" if target is None else f"{PACKAGE_NAME}-{version}-{target}.tar.gz"


def build_package(layout: Layout, target: str | None = None) -> bytes:
    """The package's bytes (deterministic)."""
    _, version, wheels = input_digest(layout, target)
    agent_name, agent_wheel = build_wheel(layout.agent_dir)
    members = [(agent_name, agent_wheel)] + [(p.name, p.read_bytes()) for p in wheels]
    members.sort()
    top = f"{PACKAGE_NAME}-{version}"
    sums = "".join(f"{_sha256(data)}  wheels/{name}\n" for name, data in members).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, data: bytes | None) -> None:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = TAR_MTIME, 0, 0, "root", "root"
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))

        add(top, None)
        add(f"{top}/SHA256SUMS", sums)
        add(f"{top}/wheels", None)
        for name, data in members:
            add(f"{top}/wheels/{name}", data)
    out = io.BytesIO()
    with gzip.GzipFile(filename="", fileobj=out, mode="wb", compresslevel=9, mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _build_info(layout: Layout, target: str | None) -> Path:
    return layout.out_dir / ("build.json" if target is None else f"build-{target}.json")


def _cached(layout: Layout, key: str, target: str | None = None) -> Package | None:
    try:
        info = json.loads(_build_info(layout, target).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("key") != key:
        return None
    path = layout.out_dir / str(info.get("filename", ""))
    try:
        size = path.stat().st_size
    except OSError:
        return None
    return Package(info["version"], info["filename"], path, info["sha256"], size, target)


def current_package(layout: Layout | None = None, force: bool = False, target: str | None = None) -> Package:
    """The package for the current inputs: the cached build, or a new one (no network).

    ``target`` (``"cp311-x86_64"``) asks for that variant with the clock-sync wheels.
    """
    layout = layout or Layout.default()
    key, version, _ = input_digest(layout, target)
    if not force and (package := _cached(layout, key, target)) is not None:
        return package
    layout.out_dir.mkdir(parents=True, exist_ok=True)
    with open(layout.out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several console processes: one builds, the others wait
        if not force and (package := _cached(layout, key, target)) is not None:
            return package
        data = build_package(layout, target)
        filename = package_filename(version, target)
        sha = _sha256(data)
        _atomic_write(layout.out_dir / filename, data)
        _atomic_write(layout.out_dir / f"{filename}.sha256", f"{sha}  {filename}\n".encode())
        info = {"key": key, "version": version, "filename": filename, "sha256": sha}
        _atomic_write(_build_info(layout, target), json.dumps(info, indent=1, sort_keys=True).encode())
        current = {filename}
        for other in [None, *native_wheels(layout)]:
            if other != target and (cached := _cached_info(layout, other)) is not None:
                current.add(cached)
        for stale in layout.out_dir.glob(f"{PACKAGE_NAME}-*.tar.gz*"):
            if stale.name.removesuffix(".sha256") not in current:
                stale.unlink(missing_ok=True)
    return Package(version, filename, layout.out_dir / filename, sha, len(data), target)


def _cached_info(layout: Layout, target: str | None) -> str | None:
    try:
        return str(json.loads(_build_info(layout, target).read_text())["filename"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def current_packages(layout: Layout | None = None, force: bool = False) -> list[Package]:
    """The base package and every clock-sync variant, built when their inputs changed."""
    layout = layout or Layout.default()
    base = current_package(layout, force)
    return [base, *(current_package(layout, force, target) for target in native_wheels(layout))]
