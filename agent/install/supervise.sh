#!/bin/sh
# Lockstep agent supervisor: keeps `python -m agent run` running on hosts without systemd.
# Installed by install.sh as <root>/opt/lockstep/supervise.sh and started detached:
#
#   supervise.sh PYTHON CONFIG RUNDIR
#
# Like the systemd unit (Restart=always, RestartSec=5, RestartPreventExitStatus=2 4 5): it
# restarts the agent whatever its exit status, 5 s later (doubling up to 60 s while the agent
# keeps dying within a minute), except after 2 (configuration), 4 (token refused) and 5
# (conflict), which a restart cannot fix. SIGTERM, SIGINT or SIGHUP stop the agent (SIGTERM,
# its clean shutdown) and then the supervisor. Writes RUNDIR/supervisor.pid and
# RUNDIR/agent.pid and removes them when it ends. Output goes where it was started with
# (install.sh: <root>/var/log/lockstep/agent.log, rotated at 10 MiB to agent.log.1).
set -u

PYTHON=$1
CONFIG=$2
RUNDIR=$3
LOG_MAX_BYTES=10485760

child=""
sleeper=""
stopping=0

say() {
    printf 'ts=%s level=info event=supervisor.%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$1" "$2"
}

cleanup() {
    rm -f "$RUNDIR/agent.pid"
    # only our own pid file: a newer supervisor may have replaced it
    if [ "$(cat "$RUNDIR/supervisor.pid" 2>/dev/null)" = "$$" ]; then
        rm -f "$RUNDIR/supervisor.pid"
    fi
}

stop() {
    stopping=1
    if [ -n "$sleeper" ]; then
        kill "$sleeper" 2>/dev/null || true
    fi
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
        say stopping "agent_pid=$child"
        kill -TERM "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
    fi
    cleanup
    say stopped "pid=$$"
    exit 0
}

rotate_log() {
    # stdout is the log file when install.sh started us; rotate it by copy and truncate
    log=$(readlink "/proc/$$/fd/1" 2>/dev/null || true)
    case $log in
        /*) ;;
        *) return 0 ;;
    esac
    [ -f "$log" ] || return 0
    size=$(wc -c <"$log" 2>/dev/null || echo 0)
    if [ "$size" -gt "$LOG_MAX_BYTES" ]; then
        cp "$log" "$log.1" && : >"$log"
    fi
}

trap stop TERM INT HUP
echo "$$" >"$RUNDIR/supervisor.pid"
say started "pid=$$ python=$PYTHON config=$CONFIG"

delay=5
while [ "$stopping" = 0 ]; do
    rotate_log
    started=$(date +%s)
    "$PYTHON" -m agent run --config "$CONFIG" </dev/null &
    child=$!
    echo "$child" >"$RUNDIR/agent.pid"
    status=0
    wait "$child" || status=$?
    child=""
    rm -f "$RUNDIR/agent.pid"
    [ "$stopping" = 0 ] || break
    case $status in
        2 | 4 | 5)
            say gave_up "status=$status msg=\"the agent cannot start (2: configuration, 4: token refused, 5: host name conflict); fix the cause (see the lines above) and run install.sh again\""
            cleanup
            exit "$status"
            ;;
    esac
    if [ $(($(date +%s) - started)) -ge 60 ]; then
        delay=5
    fi
    say restarting "status=$status in_s=$delay"
    sleep "$delay" &
    sleeper=$!
    wait "$sleeper" || true
    sleeper=""
    if [ "$delay" -lt 60 ]; then
        delay=$((delay * 2))
    fi
done
cleanup
