/* Without CUDA support compiled in, the CUDA entry points say so. */
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

#ifndef REPLAY_HAVE_CUDA
rp_backend *rp_backend_cuda_new(const rp_model *model, const rp_backend_config *cfg, rp_err *err) {
    (void)model;
    (void)cfg;
    rp_errf(err, "this replay was built without CUDA (nvcc was not found at configure time)");
    return NULL;
}

int rp_cuda_device_count(void) { return 0; }

int rp_cuda_time_decode_step(rp_backend *b, int reps, int inner, double *us, rp_err *err) {
    (void)b, (void)reps, (void)inner, (void)us;
    return rp_errf(err, "this replay was built without CUDA");
}

int rp_cuda_stats_get(rp_backend *b, rp_cuda_stats *out, rp_err *err) {
    (void)b, (void)out;
    return rp_errf(err, "this replay was built without CUDA");
}

rp_comm *rp_comm_one_gpu_new(rp_comm_local_group *g, int rank, int device, rp_err *err) {
    (void)g, (void)rank, (void)device;
    rp_errf(err, "this replay was built without CUDA");
    return NULL;
}

rp_comm *rp_comm_p2p_new(rp_comm *inner, rp_comm *host, int device, size_t slot_bytes, size_t step_floats,
                         rp_err *err) {
    (void)inner, (void)host, (void)device, (void)slot_bytes, (void)step_floats;
    rp_errf(err, "this replay was built without CUDA");
    return NULL;
}

int rp_cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
    (void)device;
    *free_bytes = *total_bytes = 0;
    return -1;
}
#endif
