/* TCP sockets bound to one NIC (its address and, with SO_BINDTODEVICE, its interface). */
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "plugin.h"

_Static_assert(sizeof(ls_handle) <= NCCL_NET_HANDLE_MAXSIZE, "the handle must fit NCCL's 128 bytes");
_Static_assert(sizeof(ls_hdr) == 56, "the frame header is 56 bytes on the wire");

uint64_t ls_random64(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) x = ls_now_us() * 0x9e3779b97f4a7c15ull;
    return x;
}

static int bound_socket(const ls_nic *nic) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* Needs CAP_NET_RAW; without it the source address alone picks the NIC on a routed host. */
    if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, nic->name, (socklen_t)strlen(nic->name)) != 0 &&
        errno != EPERM)
        LS_WARN("SO_BINDTODEVICE %s: %s", nic->name, strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = nic->addr, .sin_port = 0};
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        LS_WARN("bind to %s: %s", nic->name, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

int ls_sock_listen(const ls_nic *nic, uint16_t *port_out) {
    int fd = bound_socket(nic);
    if (fd < 0) return -1;
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    if (listen(fd, 64) != 0 || getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        LS_WARN("listen on %s: %s", nic->name, strerror(errno));
        close(fd);
        return -1;
    }
    *port_out = sa.sin_port;
    return fd;
}

int ls_sock_connect(const ls_nic *local, uint32_t addr, uint16_t port) {
    int fd = bound_socket(local);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = port};
    sa.sin_addr.s_addr = addr;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

int ls_sock_connected(int fd) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err) return -1;
    struct sockaddr_in peer;
    socklen_t plen = sizeof peer;
    if (getpeername(fd, (struct sockaddr *)&peer, &plen) == 0) return 1;
    return errno == ENOTCONN ? 0 : -1;
}

void ls_sock_abort(int fd) {
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}
