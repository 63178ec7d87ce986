/* Sockets bound to a NIC, kernel timestamps, extended errors. */
#include "probed.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <linux/net_tstamp.h>
#include <linux/sockios.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_TIMESTAMPING_NEW
#define SO_TIMESTAMPING_NEW 65
#endif

int64_t pm_now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t pm_now_real(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t pm_window_clock(void)
{
    return pm_now_real() + (pm.synced ? pm.clock_offset : 0);
}

void pm_put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

void pm_put64(uint8_t *p, uint64_t v)
{
    pm_put32(p, (uint32_t)(v >> 32));
    pm_put32(p + 4, (uint32_t)v);
}

uint32_t pm_get32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

uint64_t pm_get64(const uint8_t *p)
{
    return ((uint64_t)pm_get32(p) << 32) | pm_get32(p + 4);
}

/* Whether the NIC time-stamps in hardware (SIOCGHWTSTAMP); with enable, switch it on. Changing
 * it is global to the NIC (ptp4l may own it), so it is only done when the plan asks. */
int pm_hw_available(const char *ifname, int enable)
{
    if (!ifname[0])
        return 0;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0)
        return 0;
    struct hwtstamp_config cfg;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    memset(&cfg, 0, sizeof cfg);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", ifname);
    ifr.ifr_data = (void *)&cfg;
    int on = 0;
    if (ioctl(fd, SIOCGHWTSTAMP, &ifr) == 0)
        on = cfg.tx_type == HWTSTAMP_TX_ON && cfg.rx_filter == HWTSTAMP_FILTER_ALL;
    if (!on && enable) {
        memset(&cfg, 0, sizeof cfg);
        cfg.tx_type = HWTSTAMP_TX_ON;
        cfg.rx_filter = HWTSTAMP_FILTER_ALL;
        ifr.ifr_data = (void *)&cfg;
        on = ioctl(fd, SIOCSHWTSTAMP, &ifr) == 0 && cfg.rx_filter == HWTSTAMP_FILTER_ALL;
    }
    close(fd);
    return on;
}

static void append_err(char *err, size_t errlen, const char *what)
{
    size_t used = strlen(err);
    if (used + 3 < errlen)
        snprintf(err + used, errlen - used, "%s%s", used ? "; " : "", what);
}

/* A UDP socket on the NIC's address and port, on its interface, with kernel RX and TX stamps
 * and extended errors. Returns the fd or -1 (err says why). */
int pm_open_socket(struct pm_nic *nic, uint16_t port, char *err, size_t errlen)
{
    char msg[160];
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(msg, sizeof msg, "socket: %s", strerror(errno));
        append_err(err, errlen, msg);
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (nic->ifname[0] && setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, nic->ifname, (socklen_t)strlen(nic->ifname)) < 0) {
        /* without CAP_NET_RAW the source address still selects the NIC's routes */
        if (!strstr(err, "SO_BINDTODEVICE")) {
            snprintf(msg, sizeof msg, "SO_BINDTODEVICE %s: %s; bound by address only", nic->ifname, strerror(errno));
            append_err(err, errlen, msg);
        }
    }
    int buf = 4 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    buf = 1 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, IPPROTO_IP, IP_RECVERR, &one, sizeof one);
    if (pm.opts.dscp) {
        int tos = pm.opts.dscp << 2;
        setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof tos);
    }
    /* the looped TX stamp carries the packet, so it is matched by its own header (no OPT_ID) */
    int flags = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE;
    if (pm.opts.txts)
        flags |= SOF_TIMESTAMPING_TX_SOFTWARE;
    if (nic->hw)
        flags |= SOF_TIMESTAMPING_RX_HARDWARE | SOF_TIMESTAMPING_RAW_HARDWARE
                 | (pm.opts.txts ? SOF_TIMESTAMPING_TX_HARDWARE : 0);
    if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &flags, sizeof flags) < 0) {
        if (!strstr(err, "SO_TIMESTAMPING")) {
            snprintf(msg, sizeof msg, "SO_TIMESTAMPING: %s; user-space stamps", strerror(errno));
            append_err(err, errlen, msg);
        }
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = nic->addr;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        char addr[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &nic->addr, addr, sizeof addr);
        snprintf(msg, sizeof msg, "bind %s:%u: %s", addr, port, strerror(errno));
        append_err(err, errlen, msg);
        close(fd);
        return -1;
    }
    return fd;
}

void pm_parse_cmsgs(void *msghdr, struct pm_stamps *out)
{
    struct msghdr *msg = msghdr;
    memset(out, 0, sizeof *out);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && (c->cmsg_type == SO_TIMESTAMPING || c->cmsg_type == SO_TIMESTAMPING_NEW)) {
            if (c->cmsg_type == SO_TIMESTAMPING && c->cmsg_len >= CMSG_LEN(sizeof(struct scm_timestamping))) {
                struct scm_timestamping ts;
                memcpy(&ts, CMSG_DATA(c), sizeof ts);
                out->sw = (int64_t)ts.ts[0].tv_sec * 1000000000LL + ts.ts[0].tv_nsec;
                out->hw = (int64_t)ts.ts[2].tv_sec * 1000000000LL + ts.ts[2].tv_nsec;
            }
        } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_RECVERR
                   && c->cmsg_len >= CMSG_LEN(sizeof(struct sock_extended_err))) {
            struct sock_extended_err ee;
            memcpy(&ee, CMSG_DATA(c), sizeof ee);
            out->have_err = 1;
            out->ee_errno = ee.ee_errno;
            out->ee_origin = ee.ee_origin;
            out->ee_type = ee.ee_type;
            out->ee_code = ee.ee_code;
            if (ee.ee_origin == SO_EE_ORIGIN_ICMP
                && c->cmsg_len >= CMSG_LEN(sizeof(struct sock_extended_err) + sizeof(struct sockaddr_in))) {
                struct sockaddr_in off;
                memcpy(&off, (const uint8_t *)CMSG_DATA(c) + sizeof ee, sizeof off);
                if (off.sin_family == AF_INET)
                    out->offender = off.sin_addr.s_addr;
            }
        }
    }
}

/* The start of a Lockstep probe-mesh message in a buffer that may begin with link and IP
 * headers (a looped TX stamp) or with the UDP payload (an ICMP error). */
const uint8_t *pm_find_magic(const uint8_t *buf, size_t len, size_t *rest)
{
    for (size_t i = 0; i + PM_PROBE_HDR <= len && i <= 128; i++) {
        if (buf[i] == 'L' && pm_get32(buf + i) == PM_MAGIC && buf[i + PM_P_VERSION] == PM_WIRE_VERSION) {
            *rest = len - i;
            return buf + i;
        }
    }
    return NULL;
}
