/* The one implementation behind every exported ABI version (net.c), in the newest shape. */
#ifndef LOCKSTEP_NCCL_NET_IMPL_H
#define LOCKSTEP_NCCL_NET_IMPL_H

#include "plugin.h"

ncclResult_t ls_init(void **ctx, ncclDebugLogger_t logger);
ncclResult_t ls_devices(int *ndev);
ncclResult_t ls_get_properties(int dev, ncclNetProperties_v12_t *props);
ncclResult_t ls_listen_(int dev, void *handle, void **listen_comm);
ncclResult_t ls_connect(int dev, void *handle, void **send_comm);
ncclResult_t ls_accept(void *listen_comm, void **recv_comm);
ncclResult_t ls_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle);
ncclResult_t ls_dereg_mr(void *comm, void *mhandle);
ncclResult_t ls_isend(void *send_comm, void *data, size_t size, int tag, void **request);
ncclResult_t ls_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **request);
ncclResult_t ls_iflush(void *recv_comm, void **request);
ncclResult_t ls_test(void *request, int *done, int *sizes);
ncclResult_t ls_close_comm(void *comm);
ncclResult_t ls_close_listen(void *listen_comm);
ncclResult_t ls_finalize(void *ctx);
ncclResult_t ls_set_net_attr(void *ctx, ncclNetAttr_v12_t *attr);

#endif
