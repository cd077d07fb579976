/* What a caller may ask of the CUDA backend in particular, beyond the
 * generic interface of backend.h: the one-kernel decode step's counters and
 * its timing alone (`replay bench kernels`, tests). Plain C; a build
 * without CUDA gets the stubs of src/backend/cuda_stub.c. */
#ifndef RP_BACKEND_CUDA_CUDA_BACKEND_H
#define RP_BACKEND_CUDA_CUDA_BACKEND_H

#include <stdint.h>

#include "backend/backend.h"
#include "dist/comm.h"

typedef struct rp_cuda_stats {
    uint64_t decode_step_forwards; /* decode steps of 1-4 sequences run as one persistent kernel */
    uint64_t decode_step_picks;    /* of those, sampled by the kernel's own greedy pick */
} rp_cuda_stats;

/* The counters of a CUDA backend; RP_ERR (err says why) on another one. */
int rp_cuda_stats_get(rp_backend *b, rp_cuda_stats *out, rp_err *err);

/* The one-kernel decode step alone, launched back to back (inner launches
 * per timing, the median of reps timings) on the metadata of the last
 * forward, which must have been such a step and read: microseconds per
 * launch in *us. Re-running a step rewrites the same KV entries with the
 * same values. RP_ERR (err says why) on another backend or a model the
 * kernel does not take. */
int rp_cuda_time_decode_step(rp_backend *b, int reps, int inner, double *us, rp_err *err);

/* Rank `rank` of a group of tensor-parallel ranks that share device
 * `device` (made current on the calling thread): each collective goes
 * through host memory and the local communicator of group g (comm.h), so
 * the CUDA backend's split runs on one GPU, eagerly (no graphs). A test
 * harness for machines with one GPU (comm_one_gpu.c). */
rp_comm *rp_comm_one_gpu_new(rp_comm_local_group *g, int rank, int device, rp_err *err);

/* The one-shot all-reduce through peer memory over `inner` (comm_p2p.c):
 * sums of at most slot_bytes (in 16-byte vectors) go through one kernel
 * that reads the other ranks' slots over NVLink; everything else goes to
 * inner. `host` is this process's communicator of the same ranks (they
 * swap their device addresses through it; every rank calls this at once).
 * step_floats > 0 also makes the one-kernel decode step's buffers for
 * hidden sizes up to it (rp_decode_step_tp: cuda_state.h).
 * Returns a communicator that owns inner, or inner itself where some pair
 * of the GPUs cannot reach each other's memory (logged), or NULL on an
 * error (inner still the caller's). */
#define RP_P2P_SLOT_BYTES (1 << 20)
rp_comm *rp_comm_p2p_new(rp_comm *inner, rp_comm *host, int device, size_t slot_bytes, size_t step_floats,
                         rp_err *err);

#endif
