/* Without NCCL compiled in (a CPU build, or CUDA without NCCL found), the
 * NCCL communicator's entry points say so; the local one (comm_local.c)
 * still runs tensor parallelism on the CPU backend. */
#include "dist/comm.h"

#ifndef REPLAY_HAVE_NCCL
int rp_comm_nccl_available(void) {
    return 0;
}

int rp_comm_nccl_unique_id(uint8_t id[RP_COMM_UNIQUE_ID_BYTES], rp_err *err) {
    (void)id;
    return rp_errf(err, "this replay was built without NCCL: tensor parallelism over GPUs needs it");
}

rp_comm *rp_comm_nccl_new(const uint8_t id[RP_COMM_UNIQUE_ID_BYTES], int size, int rank, int device, int timeout_ms,
                          const atomic_int *cancel, rp_err *err) {
    (void)id, (void)size, (void)rank, (void)device, (void)timeout_ms, (void)cancel;
    rp_errf(err, "this replay was built without NCCL: tensor parallelism over GPUs needs it");
    return NULL;
}
#endif
