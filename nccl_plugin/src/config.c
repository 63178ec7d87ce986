/* Configuration (LOCKSTEP_NCCL_* variables, read once) and device discovery. */
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plugin.h"

ls_config ls_cfg;
static ncclDebugLogger_t logger;

uint64_t ls_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t ls_now_ms(void) { return ls_now_us() / 1000u; }

void ls_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (logger) logger(level, NCCL_NET, file, line, "NET/Lockstep : %s", msg);
    if (ls_cfg.debug || (!logger && level == NCCL_LOG_WARN))
        fprintf(stderr, "NET/Lockstep %s %llu: %s\n", level == NCCL_LOG_WARN ? "WARN" : "INFO",
                (unsigned long long)ls_now_ms(), msg);
}

/* An integer variable within [lo, hi]; out of range or not a number: the default, with a warning. */
static int env_int(const char *name, int dflt, int lo, int hi) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi) {
        LS_WARN("%s=%s is not an integer in %d..%d; using %d", name, v, lo, hi, dflt);
        return dflt;
    }
    return (int)x;
}

static int read_small(const char *path, char *buf, size_t len) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = 0;
    while (n && isspace((unsigned char)buf[n - 1])) buf[--n] = 0;
    return 0;
}

/* Fills a NIC from its interface name: index, IPv4 address, PCI path, speed. -1 if it has no IPv4. */
static int nic_from_name(const char *name, ls_nic *nic, struct ifaddrs *ifs) {
    memset(nic, 0, sizeof *nic);
    if (strlen(name) >= IF_NAMESIZE) return -1;
    strcpy(nic->name, name);
    nic->ifindex = (int)if_nametoindex(name);
    if (!nic->ifindex) return -1;
    int found = 0;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && strcmp(i->ifa_name, name) == 0) {
            nic->addr = ((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr;
            found = 1;
            break;
        }
    }
    if (!found) return -1;
    char path[300], buf[64];
    snprintf(path, sizeof path, "/sys/class/net/%s/device", name);
    char real[PATH_MAX];
    if (realpath(path, real) && strlen(real) < sizeof nic->pci_path) strcpy(nic->pci_path, real);
    snprintf(path, sizeof path, "/sys/class/net/%s/speed", name);
    nic->speed_mbps = 10000; /* virtual NICs report no speed; NCCL needs one */
    if (read_small(path, buf, sizeof buf) == 0 && atoi(buf) > 0) nic->speed_mbps = atoi(buf);
    return 0;
}

/* LOCKSTEP_NCCL_NICS: "a,b;c,d" is two devices, primary a with standby b, primary c with standby d. */
static int parse_nics(const char *spec, struct ifaddrs *ifs) {
    char copy[1024];
    if (strlen(spec) >= sizeof copy) {
        LS_WARN("LOCKSTEP_NCCL_NICS is longer than %zu characters", sizeof copy - 1);
        return -1;
    }
    strcpy(copy, spec);
    char *dsave, *dev = strtok_r(copy, ";", &dsave);
    for (; dev; dev = strtok_r(NULL, ";", &dsave)) {
        if (ls_cfg.ndevs == LS_MAX_DEVS) {
            LS_WARN("LOCKSTEP_NCCL_NICS names more than %d devices", LS_MAX_DEVS);
            return -1;
        }
        ls_device *d = &ls_cfg.devs[ls_cfg.ndevs];
        d->nnics = 0;
        char *nsave, *name = strtok_r(dev, ",", &nsave);
        for (; name; name = strtok_r(NULL, ",", &nsave)) {
            while (isspace((unsigned char)*name)) name++;
            char *end = name + strlen(name);
            while (end > name && isspace((unsigned char)end[-1])) *--end = 0;
            if (!*name) continue;
            if (d->nnics == LS_MAX_NICS) {
                LS_WARN("LOCKSTEP_NCCL_NICS: device %d has more than %d NICs", ls_cfg.ndevs, LS_MAX_NICS);
                return -1;
            }
            if (nic_from_name(name, &d->nics[d->nnics], ifs) != 0) {
                LS_WARN("LOCKSTEP_NCCL_NICS: interface '%s' does not exist or has no IPv4 address", name);
                return -1;
            }
            d->nnics++;
        }
        if (d->nnics) ls_cfg.ndevs++;
    }
    return ls_cfg.ndevs ? 0 : -1;
}

static size_t common_prefix(const char *a, const char *b) {
    size_t n = 0;
    while (a[n] && a[n] == b[n]) n++;
    return n;
}

/* GPUs' PCI paths (vendor NVIDIA, display class) from sysfs. */
static int gpu_paths(char paths[][256], int max) {
    DIR *dir = opendir("/sys/bus/pci/devices");
    if (!dir) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) && n < max) {
        if (e->d_name[0] == '.') continue;
        char p[300], vendor[16], cls[16], real[PATH_MAX];
        snprintf(p, sizeof p, "/sys/bus/pci/devices/%s/vendor", e->d_name);
        if (read_small(p, vendor, sizeof vendor) || strcmp(vendor, "0x10de")) continue;
        snprintf(p, sizeof p, "/sys/bus/pci/devices/%s/class", e->d_name);
        if (read_small(p, cls, sizeof cls) || strncmp(cls, "0x03", 4)) continue;
        snprintf(p, sizeof p, "/sys/bus/pci/devices/%s", e->d_name);
        if (realpath(p, real) && strlen(real) < 256) strcpy(paths[n++], real);
    }
    closedir(dir);
    return n;
}

/* Without LOCKSTEP_NCCL_NICS: each GPU's device is its nearest NIC on PCIe (longest common sysfs
 * path), standbys the other NICs nearest first; without GPUs, every up non-loopback IPv4
 * interface is a device, the others its standbys in order. */
static void discover(struct ifaddrs *ifs) {
    ls_nic all[LS_MAX_DEVS];
    int nall = 0;
    for (struct ifaddrs *i = ifs; i && nall < LS_MAX_DEVS; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        if ((i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP)) continue;
        int dup = 0;
        for (int k = 0; k < nall; k++) dup |= strcmp(all[k].name, i->ifa_name) == 0;
        if (!dup && nic_from_name(i->ifa_name, &all[nall], ifs) == 0) nall++;
    }
    char gpus[LS_MAX_DEVS][256];
    int ngpus = gpu_paths(gpus, LS_MAX_DEVS);
    int nprimaries = ngpus ? ngpus : nall;
    for (int g = 0; g < nprimaries && nall; g++) {
        ls_device *d = &ls_cfg.devs[ls_cfg.ndevs++];
        int order[LS_MAX_DEVS];
        for (int k = 0; k < nall; k++) order[k] = k;
        if (ngpus) { /* nearest first (stable sort by shared PCIe path) */
            for (int a = 1; a < nall; a++)
                for (int b = a; b > 0 && common_prefix(all[order[b]].pci_path, gpus[g]) >
                                          common_prefix(all[order[b - 1]].pci_path, gpus[g]); b--) {
                    int t = order[b]; order[b] = order[b - 1]; order[b - 1] = t;
                }
        } else { /* device g: NIC g first */
            order[0] = g;
            for (int k = 1; k < nall; k++) order[k] = k <= g ? k - 1 : k;
        }
        d->nnics = 0;
        for (int k = 0; k < nall && d->nnics < LS_MAX_NICS; k++) d->nics[d->nnics++] = all[order[k]];
    }
}

ncclResult_t ls_config_load(ncclDebugLogger_t log_function) {
    if (log_function) logger = log_function;
    if (ls_cfg.heartbeat_ms) return ncclSuccess; /* loaded by an earlier init */
    ls_cfg.debug = env_int("LOCKSTEP_NCCL_DEBUG", 0, 0, 1);
    ls_cfg.heartbeat_ms = env_int("LOCKSTEP_NCCL_HEARTBEAT_MS", 300, 30, 60000);
    ls_cfg.streams = env_int("LOCKSTEP_NCCL_STREAMS", 2, 1, LS_MAX_STREAMS);
    ls_cfg.chunk_bytes = (size_t)env_int("LOCKSTEP_NCCL_CHUNK_BYTES", 512 * 1024, 4096, 16 * 1024 * 1024);
    ls_cfg.retransmit_bytes = (size_t)env_int("LOCKSTEP_NCCL_RETRANSMIT_BYTES", 16 << 20, 0, 1 << 30);
    ls_cfg.eager_bytes = (size_t)env_int("LOCKSTEP_NCCL_EAGER_BYTES", 8 << 20, 0, 1 << 30);
    ls_cfg.zerocopy_bytes = (size_t)env_int("LOCKSTEP_NCCL_ZEROCOPY_BYTES", 256 << 10, 0, 1 << 30);
    ls_cfg.giveup_ms = env_int("LOCKSTEP_NCCL_GIVEUP_MS", 15000, 100, 24 * 3600 * 1000);
    ls_cfg.connect_timeout_ms = env_int("LOCKSTEP_NCCL_CONNECT_TIMEOUT_MS", 1000, 50, 60000);
    ls_cfg.failback_min_ms = env_int("LOCKSTEP_NCCL_FAILBACK_MIN_MS", 100, 10, 600000);
    ls_cfg.failback_max_ms = env_int("LOCKSTEP_NCCL_FAILBACK_MAX_MS", 5000, ls_cfg.failback_min_ms, 3600000);
    ls_cfg.failback_stable_ms = env_int("LOCKSTEP_NCCL_FAILBACK_STABLE_MS", 1000, 0, 600000);
    const char *sock = getenv("LOCKSTEP_AGENT_SOCKET");
    if (!sock || !*sock) sock = "/run/lockstep/agent.sock";
    if (strlen(sock) >= sizeof ls_cfg.agent_socket) {
        LS_WARN("LOCKSTEP_AGENT_SOCKET is longer than %zu characters; events are off", sizeof ls_cfg.agent_socket - 1);
        sock = "none";
    }
    strcpy(ls_cfg.agent_socket, sock);

    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0) {
        LS_WARN("getifaddrs: %s", strerror(errno));
        return ncclSystemError;
    }
    const char *spec = getenv("LOCKSTEP_NCCL_NICS");
    ncclResult_t rc = ncclSuccess;
    if (spec && *spec) {
        if (parse_nics(spec, ifs) != 0) {
            LS_WARN("LOCKSTEP_NCCL_NICS='%s' names no usable device", spec);
            ls_cfg.ndevs = 0;
            rc = ncclInvalidArgument;
        }
    } else {
        discover(ifs);
    }
    freeifaddrs(ifs);
    for (int d = 0; d < ls_cfg.ndevs; d++) {
        char line[256] = "";
        for (int k = 0; k < ls_cfg.devs[d].nnics; k++) {
            size_t len = strlen(line);
            snprintf(line + len, sizeof line - len, "%s%s/%s", k ? " standby " : "",
                     ls_cfg.devs[d].nics[k].name, inet_ntoa(ls_cfg.devs[d].nics[k].addr));
        }
        LS_INFO("device %d: %s", d, line);
    }
    if (rc != ncclSuccess) ls_cfg.heartbeat_ms = 0; /* a later init tries again */
    return rc;
}
