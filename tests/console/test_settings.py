from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from console.env import database_from_url, env_bool, env_int, env_str

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_env_helpers_parse_strictly_and_name_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("X_BOOL", "maybe")
    with pytest.raises(ImproperlyConfigured, match="X_BOOL='maybe' is not a boolean"):
        env_bool("X_BOOL", False)
    monkeypatch.setenv("X_BOOL", "True")
    assert env_bool("X_BOOL", False) is True
    monkeypatch.setenv("X_INT", "12s")
    with pytest.raises(ImproperlyConfigured, match="X_INT='12s' is not an integer"):
        env_int("X_INT", 1)
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    monkeypatch.setenv("X_SECRET_FILE", str(secret))
    assert env_str("X_SECRET") == "from-a-file"


def test_database_urls_become_postgresql_settings():
    db = database_from_url("postgresql://lock:p%40ss@db.internal:6432/lockstep?sslmode=require")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == ("lock", "p@ss", "db.internal", "6432", "lockstep")
    assert db["OPTIONS"] == {"sslmode": "require"}
    with pytest.raises(ImproperlyConfigured, match="scheme 'mysql'"):
        database_from_url("mysql://x/y")


def _manage(*args, env):
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def _production_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECRET_KEY", "DATABASE_URL", "REDIS_URL")}
    env.update(DEBUG="false", SECRET_KEY="x" * 60 + "-Production-Key-0123456789", ALLOWED_HOSTS="console.example.com",
               **extra)
    return env


def test_production_settings_pass_the_deploy_checks():
    result = _manage("check", "--deploy", "--fail-level", "WARNING", env=_production_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_a_secret_key_is_required_outside_debug():
    env = _production_env()
    env.pop("SECRET_KEY")
    result = _manage("check", env=env)
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_without_debug_asked_for_the_console_is_production_even_without_a_secret_key():
    # Issue 9, finding 7: no SECRET_KEY used to mean DEBUG=true and ALLOWED_HOSTS=* in silence.
    env = _production_env()
    env.pop("SECRET_KEY")
    env.pop("DEBUG")
    env.pop("ALLOWED_HOSTS")
    result = _manage("check", env=env)
    assert result.returncode != 0 and "SECRET_KEY must be set (or DEBUG=true" in result.stderr
    env["SECRET_KEY"] = "y" * 60
    shown = _manage("shell", "-c", "from django.conf import settings; print(settings.DEBUG, settings.ALLOWED_HOSTS)",
                    env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip().splitlines()[-1] == "False ['localhost', '127.0.0.1']"
