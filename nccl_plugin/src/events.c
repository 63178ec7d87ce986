/* Events to the local agent ($LOCKSTEP_AGENT_SOCKET, docs/agent-protocol.md "Local socket"):
 * one JSON line per event, written with MSG_DONTWAIT. The plugin never waits for the agent: no
 * agent, a full socket or a broken connection drops the event (counted) and the next event
 * tries to connect again, at most once a second. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "plugin.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int fd = -1;
static uint64_t last_attempt_ms;
static char pending[65536]; /* the unsent tail of lines already started (never cut a line) */
static size_t pending_len;
static unsigned long long dropped;

const char *ls_role(const ls_comm *c) { return c->is_send ? "send" : "recv"; }

static void disconnect(void) {
    if (fd >= 0) close(fd);
    fd = -1;
    pending_len = 0; /* a half-written line dies with its connection */
}

static int ensure_connected(void) {
    if (fd >= 0) return 0;
    if (strcmp(ls_cfg.agent_socket, "none") == 0) return -1;
    uint64_t now = ls_now_ms();
    if (last_attempt_ms && now - last_attempt_ms < 1000) return -1;
    last_attempt_ms = now;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, ls_cfg.agent_socket, strlen(ls_cfg.agent_socket) + 1); /* length checked at load */
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) { /* a Unix socket connects at once or not */
        disconnect();
        return -1;
    }
    return 0;
}

static void flush_pending(void) {
    while (pending_len) {
        ssize_t n = send(fd, pending, pending_len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) disconnect();
            return;
        }
        memmove(pending, pending + n, pending_len - (size_t)n);
        pending_len -= (size_t)n;
    }
}

void ls_event(const char *kind, const char *data_json) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char line[2048];
    int len = snprintf(line, sizeof line, "{\"v\":1,\"op\":\"event\",\"kind\":\"%s\",\"ts_ns\":%lld,\"data\":%s}\n",
                       kind, (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, data_json);
    if (len < 0 || (size_t)len >= sizeof line) return;
    pthread_mutex_lock(&lock);
    if (ensure_connected() == 0) {
        flush_pending();
        if (fd >= 0 && pending_len + (size_t)len <= sizeof pending) {
            memcpy(pending + pending_len, line, (size_t)len);
            pending_len += (size_t)len;
            flush_pending();
        } else {
            dropped++;
        }
    } else {
        dropped++;
    }
    pthread_mutex_unlock(&lock);
}

void ls_event_path_state(const ls_comm *c, int path, const char *state, const char *reason) {
    char data[512];
    const char *nic = path < 0 ? "all" : c->device.nics[c->paths[path].local_nic].name;
    snprintf(data, sizeof data,
             "{\"comm\":\"%p\",\"role\":\"%s\",\"device\":%d,\"nic\":\"%s\",\"state\":\"%s\",\"reason\":\"%s\","
             "\"primary\":%s,\"active\":%s}",
             (void *)c, ls_role(c), c->dev, nic, state, reason, path == 0 ? "true" : "false",
             c->is_send && path >= 0 && path == c->active ? "true" : "false");
    ls_event("nccl.path_state", data);
}
