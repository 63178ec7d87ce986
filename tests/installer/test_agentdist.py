"""The agent package the console builds and serves, and the /install.sh it renders."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import re
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from console.agentdist.build import (
    NATIVE_TARGETS,
    Layout,
    PackageUnavailable,
    build_package,
    build_wheel,
    current_package,
    current_packages,
    normalize,
    read_pins,
)
from tests.installer.installer_lib import repo_file


@pytest.fixture
def layout(agent_package, tmp_path) -> Layout:
    """A private copy of agent/ with the shared wheels, building into tmp_path."""
    default = Layout.default()
    agent_dir = tmp_path / "agent"
    shutil.copytree(default.agent_dir, agent_dir, ignore=shutil.ignore_patterns("__pycache__"))
    return Layout(agent_dir, default.requirements, default.wheels_dir, tmp_path / "packages")


def members(package: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(package), mode="r:gz") as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()}


def test_the_build_is_deterministic_and_follows_the_sources(layout, agent_package):
    first = build_package(layout)
    assert build_package(layout) == first
    assert hashlib.sha256(first).hexdigest() == agent_package.sha256  # a copy elsewhere: the same bytes
    (layout.agent_dir / "health.py").write_text((layout.agent_dir / "health.py").read_text() + "\n# changed\n")
    assert build_package(layout) != first
    (layout.agent_dir / "install" / "install.sh.in").write_text("# not part of the package\n")
    (layout.agent_dir / "README.md").write_text("neither\n")
    changed = build_package(layout)
    (layout.agent_dir / "health.py").write_text((layout.agent_dir / "health.py").read_text()[: -len("\n# changed\n")])
    assert build_package(layout) == first != changed


def test_the_build_is_cached_and_rebuilt_when_agent_changes(layout):
    package = current_package(layout)
    stamp = package.path.stat().st_mtime_ns
    again = current_package(layout)
    assert again == package and package.path.stat().st_mtime_ns == stamp, "rebuilt although nothing changed"
    assert (layout.out_dir / f"{package.filename}.sha256").read_text() == package.sha256_line
    assert hashlib.sha256(package.path.read_bytes()).hexdigest() == package.sha256
    init = layout.agent_dir / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "0.1.0"', '__version__ = "0.1.1"'))
    newer = current_package(layout)
    assert (newer.version, newer.filename) == ("0.1.1", "lockstep-agent-0.1.1.tar.gz") and newer.sha256 != package.sha256
    assert sorted(p.name for p in layout.out_dir.glob("lockstep-agent-*")) == [
        "lockstep-agent-0.1.1.tar.gz", "lockstep-agent-0.1.1.tar.gz.sha256"]


def test_the_package_holds_the_agent_wheel_and_every_pinned_dependency(agent_package):
    content = members(agent_package.path.read_bytes())
    top = f"lockstep-agent-{agent_package.version}"
    wheels = sorted(name.rsplit("/", 1)[1] for name in content if name.endswith(".whl"))
    pins = read_pins(repo_file("requirements", "agent-bundle.txt"))
    assert {normalize(w.split("-")[0]) for w in wheels} == set(pins) | {"lockstep-agent"}
    assert all(w.endswith("-py3-none-any.whl") for w in wheels), "a wheel for one platform only"
    sums = dict(reversed(line.split("  ")) for line in content[f"{top}/SHA256SUMS"].decode().splitlines())
    assert {name.rsplit("/", 1)[1] for name in sums} == set(wheels)
    for name, digest in sums.items():
        assert hashlib.sha256(content[f"{top}/{name}"]).hexdigest() == digest


def test_the_agent_wheel_is_a_valid_wheel_of_the_agent_only(layout):
    name, data = build_wheel(layout.agent_dir)
    assert name == "lockstep_agent-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(io.BytesIO(data)) as wheel:
        names = wheel.namelist()
        files = {n: wheel.read(n) for n in names}
    sources = sorted(str(p.relative_to(layout.agent_dir.parent)) for p in layout.agent_dir.rglob("*.py")
                     if "install" not in p.parts)
    assert sorted(n for n in names if n.startswith("agent/")) == sources
    meta = files["lockstep_agent-0.1.0.dist-info/METADATA"].decode()
    pyproject = (layout.agent_dir / "pyproject.toml").read_text()
    deps = re.findall(r'"([^"]+)"', re.search(r"^dependencies = \[(.*?)\]", pyproject, re.M | re.S).group(1))
    assert [d for d in re.findall(r"^Requires-Dist: (.+)$", meta, re.M) if "extra ==" not in d] == deps
    assert "Provides-Extra: clocksync" in meta
    assert 'Requires-Dist: numpy==2.4.6; extra == "clocksync"' in meta
    assert "Requires-Python: >=3.10" in meta and "Name: lockstep-agent" in meta
    assert files["lockstep_agent-0.1.0.dist-info/entry_points.txt"] == b"[console_scripts]\nlockstep-agent = agent.cli:main\n"
    for line in files["lockstep_agent-0.1.0.dist-info/RECORD"].decode().splitlines():
        path, digest, size = line.rsplit(",", 2)
        if path.endswith("RECORD"):
            continue
        expected = base64.urlsafe_b64encode(hashlib.sha256(files[path]).digest()).rstrip(b"=").decode()
        assert (digest, int(size)) == (f"sha256={expected}", len(files[path]))


def test_every_clock_sync_variant_is_the_base_package_plus_its_targets_wheels(agent_package):
    packages = current_packages(Layout.default())
    base, variants = packages[0], packages[1:]
    assert base == agent_package and base.target is None
    assert {v.target for v in variants} == {f"{py}-{arch}" for py, arch in NATIVE_TARGETS}
    base_wheels = {n.rsplit("/", 1)[1] for n in members(base.path.read_bytes()) if n.endswith(".whl")}
    native = read_pins(repo_file("requirements", "agent-native.txt"))
    for variant in variants:
        assert variant.filename == f"lockstep-agent-{base.version}-{variant.target}.tar.gz"
        wheels = {n.rsplit("/", 1)[1] for n in members(variant.path.read_bytes()) if n.endswith(".whl")}
        extra = wheels - base_wheels
        assert base_wheels <= wheels and {normalize(w.split("-")[0]) for w in extra} == set(native)
        py, arch = variant.target.split("-")
        assert all(f"-{py}-{py}-" in w and w.endswith(f"_{arch}.whl") and "manylinux" in w for w in extra)
        assert hashlib.sha256(variant.path.read_bytes()).hexdigest() == variant.sha256


def test_the_clock_sync_pins_are_the_consoles():
    native = read_pins(repo_file("requirements", "agent-native.txt"))
    console = read_pins(repo_file("requirements", "console.txt"))
    assert native and all(console[name] == pin for name, pin in native.items())
    pyproject = repo_file("agent", "pyproject.toml").read_text()
    assert all(f'"{name}=={version}"' in pyproject for name, version in native.values())


def test_the_bundle_pins_every_runtime_dependency_of_the_agent():
    pins = read_pins(repo_file("requirements", "agent-bundle.txt"))
    agent_pins = read_pins(repo_file("requirements", "agent.txt"))
    assert set(agent_pins) <= set(pins) and "pip" in pins
    todo, seen = list(agent_pins), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        assert name in pins, f"{name} (a dependency of the agent) is not pinned in agent-bundle.txt"
        for requirement in importlib.metadata.requires(name) or []:
            if "extra ==" in requirement:
                continue
            todo.append(normalize(re.match(r"[A-Za-z0-9._-]+", requirement).group(0)))


def test_missing_wheels_say_what_to_run(tmp_path, layout):
    empty = Layout(layout.agent_dir, layout.requirements, tmp_path / "no-wheels", tmp_path / "out")
    with pytest.raises(PackageUnavailable, match=r"build_agent_package --download"):
        current_package(empty)


# --- served by the console --------------------------------------------------------------------


def test_install_sh_is_rendered_with_the_console_url_version_and_checksum(client, agent_package, settings):
    response = client.get("/install.sh")
    assert response.status_code == 200 and response["Content-Type"] == "text/x-shellscript; charset=utf-8"
    assert response["Cache-Control"] == "no-store"
    script = response.content.decode()
    for line in ("CONSOLE_URL='http://testserver'", f"AGENT_VERSION='{agent_package.version}'",
                 f"PACKAGE_FILE='{agent_package.filename}'", f"PACKAGE_SHA256='{agent_package.sha256}'"):
        assert line in script
    for variant in current_packages()[1:]:
        assert f"{variant.target} {variant.filename} {variant.sha256}" in script
        assert client.get(f"/agent/{variant.filename}.sha256").content.decode() == variant.sha256_line
    assert "__LOCKSTEP_" not in script
    assert (repo_file("agent", "install", "supervise.sh").read_text().rstrip("\n") in script)
    settings.PUBLIC_URL = "https://console.example/lockstep"
    assert "CONSOLE_URL='https://console.example/lockstep'" in client.get("/install.sh").content.decode()
    settings.PUBLIC_URL = "https://console.example/x'$(reboot)'"
    assert client.get("/install.sh").status_code == 400


def test_the_package_and_its_checksum_are_served(client, agent_package):
    response = client.get(f"/agent/{agent_package.filename}")
    assert response.status_code == 200 and response["Content-Type"] == "application/gzip"
    assert hashlib.sha256(response.content).hexdigest() == agent_package.sha256
    assert response["ETag"] == f'"{agent_package.sha256}"'
    checksum = client.get(f"/agent/{agent_package.filename}.sha256")
    assert checksum.content.decode() == f"{agent_package.sha256}  {agent_package.filename}\n"
    other = client.get("/agent/lockstep-agent-0.0.1.tar.gz")
    assert other.status_code == 404 and agent_package.filename in other.content.decode()
    assert client.post(f"/agent/{agent_package.filename}").status_code == 405
    assert client.head("/install.sh").status_code == 200


def test_without_wheels_the_console_explains_and_the_script_exits_21(client, settings, monkeypatch, tmp_path):
    settings.VAR_DIR = tmp_path
    monkeypatch.setenv("LOCKSTEP_AGENT_WHEELS_DIR", str(tmp_path / "empty"))
    response = client.get("/install.sh")
    assert response.status_code == 200 and response["X-Lockstep-Error"] == "agent-package-unavailable"
    run = subprocess.run(["sh"], input=response.content.decode(), capture_output=True, text=True, check=False)
    assert run.returncode == 21
    assert "the console cannot serve the agent package" in run.stderr and "build_agent_package --download" in run.stderr
    package = client.get("/agent/lockstep-agent-0.1.0.tar.gz")
    assert package.status_code == 503 and b"build_agent_package --download" in package.content
    # Anonymous callers learn what to run, not the server's paths (issue 9, finding 10): those are logged.
    for shown in (response.content.decode(), package.content.decode()):
        assert str(tmp_path) not in shown and "/work/" not in shown and str(settings.BASE_DIR) not in shown
    with pytest.raises(CommandError, match="no wheel in"):
        call_command("build_agent_package")


def test_the_management_command_builds_and_reports(agent_package, capsys):
    call_command("build_agent_package")
    out = capsys.readouterr().out
    assert f"sha256 {agent_package.sha256}" in out and f"version {agent_package.version}" in out
    assert Path(out.split()[0]) == agent_package.path
