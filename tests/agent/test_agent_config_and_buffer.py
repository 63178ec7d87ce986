"""Configuration parsing, backoff, and the telemetry disk buffer (without a console)."""

from __future__ import annotations

import json
import stat

import pytest

from agent.backoff import Backoff, retry_after_s
from agent.config import ConfigError, from_values, load, parse_env_file
from agent.state import Credential, load_credential, save_credential
from agent.telemetry import TelemetryBuffer

TOKEN = "lse_AbCdEfGhIjKl.s3cr3t-Value_1"


def test_env_file_then_environment(tmp_path):
    path = tmp_path / "agent.env"
    path.write_text(
        "# comment\n; another\n\n"
        "LOCKSTEP_CONSOLE_URL=https://console.example/\n"
        'export LOCKSTEP_CLUSTER_ID="7"\n'
        "LOCKSTEP_TELEMETRY_BUFFER_BYTES='8M'\n"
        "LOCKSTEP_LOG_LEVEL=debug\n"
        "LOCKSTEP_FUTURE_KEY=1\n"
    )
    assert parse_env_file(path)["LOCKSTEP_CLUSTER_ID"] == "7"
    config = load(path, environ={"LOCKSTEP_CLUSTER_ID": "9", "LOCKSTEP_STATE_DIR": str(tmp_path), "HOME": "/x"})
    assert config.console_url == "https://console.example"
    assert config.cluster_id == 9  # the environment overrides the file
    assert config.telemetry_buffer_bytes == 8 * 1024 * 1024
    assert config.log_level == "debug" and config.state_dir == tmp_path
    assert config.unknown_keys == ("LOCKSTEP_FUTURE_KEY",)
    assert config.sysfs_root.as_posix() == "/sys"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("LOCKSTEP_CONSOLE_URL", "ftp://x", "LOCKSTEP_CONSOLE_URL='ftp://x' is not a console URL"),
        ("LOCKSTEP_CLUSTER_ID", "seven", "LOCKSTEP_CLUSTER_ID='seven' is not an integer"),
        ("LOCKSTEP_CLUSTER_ID", "0", "LOCKSTEP_CLUSTER_ID='0' must be a positive integer"),
        ("LOCKSTEP_STATE_DIR", "relative/dir", "LOCKSTEP_STATE_DIR='relative/dir' must be an absolute path"),
        ("LOCKSTEP_TELEMETRY_BUFFER_BYTES", "lots", "LOCKSTEP_TELEMETRY_BUFFER_BYTES='lots' is not a size"),
        ("LOCKSTEP_TELEMETRY_BUFFER_BYTES", "100", "LOCKSTEP_TELEMETRY_BUFFER_BYTES='100' is too small"),
        ("LOCKSTEP_LOG_LEVEL", "loud", "LOCKSTEP_LOG_LEVEL='loud' is not a level"),
        ("LOCKSTEP_ENROLL_TOKEN", "lse_short.x", "LOCKSTEP_ENROLL_TOKEN='lse_short.…' is not an enrollment token"),
        ("LOCKSTEP_HOSTNAME", "bad name", "LOCKSTEP_HOSTNAME='bad name' is not a valid host name"),
        ("LOCKSTEP_MACHINE_ID", "a b", "LOCKSTEP_MACHINE_ID='a b' is not a valid machine id"),
        ("LOCKSTEP_SYSFS_ROOT", "/nonexistent/sys", "LOCKSTEP_SYSFS_ROOT='/nonexistent/sys' is not a directory"),
        ("LOCKSTEP_BACKOFF_MAX_S", "-1", "LOCKSTEP_BACKOFF_MAX_S='-1' must be between"),
        ("LOCKSTEP_COMMAND_MODULES", "ok.mod, bad-mod", "'bad-mod' is not a module name"),
    ],
)
def test_bad_values_name_key_and_value(key, value, message):
    with pytest.raises(ConfigError) as info:
        from_values({key: value})
    assert message in str(info.value)


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "missing.env", environ={})
    bad = tmp_path / "bad.env"
    bad.write_text("LOCKSTEP_LOG_LEVEL=info\nthis is not a pair\n")
    with pytest.raises(ConfigError, match="line 2: expected KEY=VALUE"):
        load(bad, environ={})
    assert from_values({"LOCKSTEP_ENROLL_TOKEN": TOKEN}).enroll_token == TOKEN


def test_credential_is_private_and_atomic(tmp_path):
    state = tmp_path / "state"
    cred = Credential("http://c", 42, "n0", 7, 3, "lsn_AbCdEfGhIjKl.x", 15, 25, 1048576, 5000, "2026-01-01T00:00:00Z")
    path = save_credential(state, cred)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_credential(state) == cred
    assert [p.name for p in state.iterdir()] == ["credential.json"]  # no temp files left behind
    path.write_text("[1]")
    with pytest.raises(Exception, match="enroll the node again"):
        load_credential(state)


def test_backoff_is_exponential_full_jitter_and_capped():
    draws = iter([1.0] * 10 + [0.5])
    b = Backoff(base=0.5, cap=4.0, rand=lambda: next(draws))
    assert [b.next_delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    b.reset()
    assert b.ceiling() == 0.5
    real = Backoff(base=1, cap=8)
    delays = [real.next_delay() for _ in range(200)]
    assert all(0 <= d <= 8 for d in delays) and len(set(delays)) > 100


def test_a_retry_after_from_the_console_is_waited_out_up_to_the_cap():
    b = Backoff(base=0.5, cap=30.0, rand=lambda: 0.0)
    assert b.after(retry_after_s("10")) == 10.0
    assert b.after(retry_after_s("3600")) == 30.0  # never longer than the cap
    assert b.after(retry_after_s(None)) == 0.0
    assert retry_after_s("Wed, 21 Oct 2026 07:28:00 GMT") == 0.0 and retry_after_s("-5") == 0.0


# -- telemetry buffer --------------------------------------------------------------------------


def make_buffer(path, max_bytes=64 * 1024, batch_bytes=4096, batch_records=50) -> TelemetryBuffer:
    return TelemetryBuffer(path, max_bytes, batch_max_bytes=batch_bytes, batch_max_records=batch_records,
                           linger_s=0, sync=False)


def test_emit_validation(tmp_path):
    buf = make_buffer(tmp_path / "t")
    with pytest.raises(ValueError, match="dotted name"):
        buf.emit("Bad Kind", {})
    with pytest.raises(ValueError, match="must be an object"):
        buf.emit("probe.window", [1])
    with pytest.raises(ValueError, match="not JSON"):
        buf.emit("probe.window", {"x": float("nan")})
    with pytest.raises(ValueError, match="aggregate it"):
        buf.emit("probe.window", {"blob": "x" * 5000})
    assert buf.stats()["buffered"] == 0


def test_batches_have_persisted_increasing_seq_and_survive_restart(tmp_path):
    buf = make_buffer(tmp_path / "t")
    for i in range(120):
        buf.emit("test.sample", {"i": i}, ts=1000.0 + i)
    first = buf.next_batch()
    assert first["seq"] == 1 and first["dropped"] == 0
    assert [r["data"]["i"] for r in first["records"]] == list(range(len(first["records"])))
    assert buf.next_batch() is first  # re-sent unchanged until acknowledged
    body = json.loads(TelemetryBuffer.encode(first))
    assert set(body) == {"seq", "dropped", "records"} and len(TelemetryBuffer.encode(first)) <= 4096
    buf.close()

    again = make_buffer(tmp_path / "t")  # a restart before the console answered
    assert again.next_batch() == first
    seen, seqs = [], []
    while (batch := again.next_batch(force=True)) is not None:
        seqs.append(batch["seq"])
        seen.extend(r["data"]["i"] for r in batch["records"])
        again.ack(batch["seq"])
    assert seen == list(range(120)) and seqs == list(range(1, len(seqs) + 1))
    again.emit("test.sample", {"i": 999})
    again.close()
    third = make_buffer(tmp_path / "t")
    assert third.next_batch(force=True)["seq"] == seqs[-1] + 1


def test_bound_drops_the_oldest_and_counts_exactly(tmp_path):
    buf = make_buffer(tmp_path / "t", max_bytes=8192)
    emitted = 600
    for i in range(emitted):
        buf.emit("test.sample", {"i": i})
    stats = buf.stats()
    assert stats["bytes"] <= 8192
    dropped = stats["dropped_total"]
    assert dropped > 0 and stats["dropped_unreported"] == dropped
    assert stats["buffered"] + dropped == emitted
    received, reported = [], 0
    while (batch := buf.next_batch(force=True)) is not None:
        received.extend(r["data"]["i"] for r in batch["records"])
        reported += batch["dropped"]
        buf.ack(batch["seq"])
    assert reported == dropped  # reported once, in the next batch
    assert received == list(range(dropped, emitted))  # the oldest went, the rest in order
    assert buf.stats()["dropped_unreported"] == 0 and buf.stats()["dropped_total"] == dropped


def test_torn_last_line_and_split_on_413(tmp_path):
    buf = make_buffer(tmp_path / "t")
    for i in range(10):
        buf.emit("test.sample", {"i": i})
    buf.close()
    segment = sorted((tmp_path / "t").glob("seg-*.jsonl"))[-1]
    with open(segment, "ab") as fh:
        fh.write(b'{"kind":"test.sample","ts":1,"da')  # a crash in the middle of a write
    buf = make_buffer(tmp_path / "t")
    assert buf.stats()["buffered"] == 10
    head = buf.next_batch(force=True)
    assert buf.split_head()
    first = buf.next_batch()
    assert first["seq"] == head["seq"] and len(first["records"]) == 5
    buf.ack(first["seq"])
    second = buf.next_batch()
    assert second["seq"] == head["seq"] + 1 and [r["data"]["i"] for r in second["records"]] == list(range(5, 10))
    assert buf.discard_head("refused") == 5
    assert buf.stats()["dropped_total"] == 5


def test_a_probe_window_is_sent_without_the_linger_and_windows_emitted_together_travel_together(tmp_path):
    import time

    from agent.telemetry import PROMPT_LINGER_S

    buf = TelemetryBuffer(tmp_path / "p", max_bytes=1 << 20, linger_s=3600.0, sync=False)
    buf.emit("test.sample", {"i": 0})
    assert buf.next_batch() is None and buf.due_in(10.0) > 1.0  # an ordinary record lingers
    buf.emit("probe.window", {"nic": "h/nic0"})
    buf.emit("probe.window", {"nic": "h/nic1"})
    assert buf.due_in(10.0) <= PROMPT_LINGER_S
    deadline = time.monotonic() + 10
    while (batch := buf.next_batch()) is None and time.monotonic() < deadline:
        buf.wait(max(0.01, buf.due_in(1.0)))
    assert batch is not None
    assert [r["kind"] for r in batch["records"]] == ["test.sample", "probe.window", "probe.window"]
    buf.ack(batch["seq"])
    buf.emit("test.sample", {"i": 1})
    assert buf.next_batch() is None  # the prompt is spent with the batch that carried it
