/* The exported plugin tables. v12 is the implementation's own shape; v8..v11 are thin shims
 * that convert sizes, properties and the context-less calls of the older interfaces. */
#include <limits.h>
#include <string.h>

#include "net_impl.h"

#define PLUGIN_NAME "Lockstep"

/* ---- v12 and v11 (same calls; v11's properties lack railId/planeId, vProps hold 4) ---- */

static ncclResult_t init_v11(void **ctx, uint64_t comm_id, ncclNetCommConfig_v11_t *config,
                             ncclDebugLogger_t logger, ncclProfilerCallback_t prof) {
    (void)comm_id; (void)config; (void)prof;
    return ls_init(ctx, logger);
}

static ncclResult_t props_v12(int dev, ncclNetProperties_v12_t *props) { return ls_get_properties(dev, props); }

static ncclResult_t listen_v11(void *ctx, int dev, void *handle, void **listen_comm) {
    (void)ctx;
    return ls_listen_(dev, handle, listen_comm);
}

static ncclResult_t connect_v11(void *ctx, int dev, void *handle, void **send_comm, ncclNetDeviceHandle_t **dev_comm) {
    (void)ctx; (void)dev_comm;
    return ls_connect(dev, handle, send_comm);
}

static ncclResult_t accept_v8(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **dev_comm) {
    (void)dev_comm;
    return ls_accept(listen_comm, recv_comm);
}

static ncclResult_t isend_v10(void *comm, void *data, size_t size, int tag, void *mhandle, void *phandle, void **req) {
    (void)mhandle; (void)phandle;
    return ls_isend(comm, data, size, tag, req);
}

static ncclResult_t irecv_v10(void *comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                              void **phandles, void **req) {
    (void)mhandles; (void)phandles;
    return ls_irecv(comm, n, data, sizes, tags, req);
}

static ncclResult_t iflush_v8(void *comm, int n, void **data, int *sizes, void **mhandles, void **req) {
    (void)n; (void)data; (void)sizes; (void)mhandles;
    return ls_iflush(comm, req);
}

static ncclResult_t set_attr_v11(void *ctx, ncclNetAttr_v11_t *attr) { return ls_set_net_attr(ctx, attr); }

const ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = PLUGIN_NAME,
    .init = init_v11,
    .devices = ls_devices,
    .getProperties = props_v12,
    .listen = listen_v11,
    .connect = connect_v11,
    .accept = accept_v8,
    .regMr = ls_reg_mr,
    .regMrDmaBuf = NULL,
    .deregMr = ls_dereg_mr,
    .isend = isend_v10,
    .irecv = irecv_v10,
    .iflush = iflush_v8,
    .test = ls_test,
    .closeSend = ls_close_comm,
    .closeRecv = ls_close_comm,
    .closeListen = ls_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
    .finalize = ls_finalize,
    .setNetAttr = set_attr_v11,
};

/* Copies the fields every version from v9 on shares, in their order. */
#define COPY_V9_FIELDS(dst, src)                                    \
    do {                                                            \
        (dst)->name = (src).name;                                   \
        (dst)->pciPath = (src).pciPath;                             \
        (dst)->guid = (src).guid;                                   \
        (dst)->ptrSupport = (src).ptrSupport;                       \
        (dst)->regIsGlobal = (src).regIsGlobal;                     \
        (dst)->forceFlush = (src).forceFlush;                       \
        (dst)->speed = (src).speed;                                 \
        (dst)->port = (src).port;                                   \
        (dst)->latency = (src).latency;                             \
        (dst)->maxComms = (src).maxComms;                           \
        (dst)->maxRecvs = (src).maxRecvs;                           \
        (dst)->netDeviceType = (src).netDeviceType;                 \
        (dst)->netDeviceVersion = (src).netDeviceVersion;           \
        (dst)->vProps.ndevs = (src).vProps.ndevs;                   \
        for (int i_ = 0; i_ < LOCKSTEP_VDEVS_V9; i_++)              \
            (dst)->vProps.devs[i_] = (src).vProps.devs[i_];         \
        (dst)->maxP2pBytes = (src).maxP2pBytes;                     \
        (dst)->maxCollBytes = (src).maxCollBytes;                   \
    } while (0)

static ncclResult_t props_v11(int dev, ncclNetProperties_v11_t *props) {
    ncclNetProperties_v12_t p;
    ncclResult_t rc = ls_get_properties(dev, &p);
    if (rc != ncclSuccess) return rc;
    memset(props, 0, sizeof *props);
    COPY_V9_FIELDS(props, p);
    props->maxMultiRequestSize = p.maxMultiRequestSize;
    return ncclSuccess;
}

const ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = PLUGIN_NAME,
    .init = init_v11,
    .devices = ls_devices,
    .getProperties = props_v11,
    .listen = listen_v11,
    .connect = connect_v11,
    .accept = accept_v8,
    .regMr = ls_reg_mr,
    .regMrDmaBuf = NULL,
    .deregMr = ls_dereg_mr,
    .isend = isend_v10,
    .irecv = irecv_v10,
    .iflush = iflush_v8,
    .test = ls_test,
    .closeSend = ls_close_comm,
    .closeRecv = ls_close_comm,
    .closeListen = ls_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
    .finalize = ls_finalize,
    .setNetAttr = set_attr_v11,
};

/* ---- v10: no context; connect takes the per-comm config ---- */

static ncclResult_t init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t prof) {
    (void)prof;
    return ls_init(NULL, logger);
}

static ncclResult_t props_v9(int dev, ncclNetProperties_v9_t *props) {
    ncclNetProperties_v12_t p;
    ncclResult_t rc = ls_get_properties(dev, &p);
    if (rc != ncclSuccess) return rc;
    memset(props, 0, sizeof *props);
    COPY_V9_FIELDS(props, p);
    return ncclSuccess;
}

static ncclResult_t connect_v10(int dev, ncclNetCommConfig_v10_t *config, void *handle, void **send_comm,
                                ncclNetDeviceHandle_t **dev_comm) {
    (void)config; (void)dev_comm;
    return ls_connect(dev, handle, send_comm);
}

const ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = PLUGIN_NAME,
    .init = init_v10,
    .devices = ls_devices,
    .getProperties = props_v9,
    .listen = ls_listen_,
    .connect = connect_v10,
    .accept = accept_v8,
    .regMr = ls_reg_mr,
    .regMrDmaBuf = NULL,
    .deregMr = ls_dereg_mr,
    .isend = isend_v10,
    .irecv = irecv_v10,
    .iflush = iflush_v8,
    .test = ls_test,
    .closeSend = ls_close_comm,
    .closeRecv = ls_close_comm,
    .closeListen = ls_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
};

/* ---- v9: no profiler; isend/irecv without profiler handles ---- */

static ncclResult_t init_v8(ncclDebugLogger_t logger) { return ls_init(NULL, logger); }

static ncclResult_t connect_v8(int dev, void *handle, void **send_comm, ncclNetDeviceHandle_t **dev_comm) {
    (void)dev_comm;
    return ls_connect(dev, handle, send_comm);
}

static ncclResult_t isend_v9(void *comm, void *data, size_t size, int tag, void *mhandle, void **req) {
    (void)mhandle;
    return ls_isend(comm, data, size, tag, req);
}

static ncclResult_t irecv_v9(void *comm, int n, void **data, size_t *sizes, int *tags, void **mhandles, void **req) {
    (void)mhandles;
    return ls_irecv(comm, n, data, sizes, tags, req);
}

const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = PLUGIN_NAME,
    .init = init_v8,
    .devices = ls_devices,
    .getProperties = props_v9,
    .listen = ls_listen_,
    .connect = connect_v8,
    .accept = accept_v8,
    .regMr = ls_reg_mr,
    .regMrDmaBuf = NULL,
    .deregMr = ls_dereg_mr,
    .isend = isend_v9,
    .irecv = irecv_v9,
    .iflush = iflush_v8,
    .test = ls_test,
    .closeSend = ls_close_comm,
    .closeRecv = ls_close_comm,
    .closeListen = ls_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
};

/* ---- v8: int sizes; properties without forceFlush, vProps and the size limits ---- */

static ncclResult_t props_v8(int dev, ncclNetProperties_v8_t *props) {
    ncclNetProperties_v12_t p;
    ncclResult_t rc = ls_get_properties(dev, &p);
    if (rc != ncclSuccess) return rc;
    memset(props, 0, sizeof *props);
    props->name = p.name;
    props->pciPath = p.pciPath;
    props->guid = p.guid;
    props->ptrSupport = p.ptrSupport;
    props->regIsGlobal = p.regIsGlobal;
    props->speed = p.speed;
    props->port = p.port;
    props->latency = p.latency;
    props->maxComms = p.maxComms;
    props->maxRecvs = p.maxRecvs;
    props->netDeviceType = p.netDeviceType;
    props->netDeviceVersion = p.netDeviceVersion;
    return ncclSuccess;
}

static ncclResult_t isend_v8(void *comm, void *data, int size, int tag, void *mhandle, void **req) {
    (void)mhandle;
    if (size < 0) return ncclInvalidArgument;
    return ls_isend(comm, data, (size_t)size, tag, req);
}

static ncclResult_t irecv_v8(void *comm, int n, void **data, int *sizes, int *tags, void **mhandles, void **req) {
    (void)mhandles;
    if (n < 1 || n > LS_MAX_RECVS) return ncclInvalidArgument;
    size_t wide[LS_MAX_RECVS];
    for (int i = 0; i < n; i++) {
        if (sizes[i] < 0) return ncclInvalidArgument;
        wide[i] = (size_t)sizes[i];
    }
    return ls_irecv(comm, n, data, wide, tags, req);
}

const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = PLUGIN_NAME,
    .init = init_v8,
    .devices = ls_devices,
    .getProperties = props_v8,
    .listen = ls_listen_,
    .connect = connect_v8,
    .accept = accept_v8,
    .regMr = ls_reg_mr,
    .regMrDmaBuf = NULL,
    .deregMr = ls_dereg_mr,
    .isend = isend_v8,
    .irecv = irecv_v8,
    .iflush = iflush_v8,
    .test = ls_test,
    .closeSend = ls_close_comm,
    .closeRecv = ls_close_comm,
    .closeListen = ls_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
};
