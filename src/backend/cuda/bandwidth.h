/* The device's measured memory bandwidth (see bandwidth.cu). */
#ifndef RP_BACKEND_CUDA_BANDWIDTH_H
#define RP_BACKEND_CUDA_BANDWIDTH_H

#ifdef __cplusplus
extern "C" {
#endif

/* Best of five: a read-only streaming kernel (GB/s read) and a device copy
 * (GB/s of bytes read plus written). 0 on success. */
int rp_cuda_read_bandwidth(int device, double *read_gbs, double *copy_gbs);

/* Best of five 8192^3 bf16 GEMMs through cuBLASLt, in TFLOP/s (ceilings.c). */
int rp_cuda_matmul_tflops(int device, double *tflops);

#ifdef __cplusplus
}
#endif

#endif
