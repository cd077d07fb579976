/* Split attention's partial results (flash-decoding), shared by decode
 * (attn_decode.cu: the keys of a sequence cut into ranges) and prefill
 * (attn_prefill.cu: the keys of a query tile cut into ranges where the grid
 * is too small to fill the GPU). A row is one query (a decode sequence or a
 * prefill token) of one head; for each row and split the workspace holds
 * the split's unnormalised output (fp32, head_dim values) and its (max,
 * sum), both in the exp2 domain (scores times log2(e) / sqrt(head_dim)).
 * A split that saw no key of a row leaves (-inf, 0) and zeros. The layout,
 * row r = query * nh + head: o[(r * splits + split) * hd + d], then
 * ml[r * splits + split]. rp_attn_merge_splits turns it into the bf16
 * output [rows][hd]. */
#ifndef RP_KERNELS_ATTN_SPLIT_CUH
#define RP_KERNELS_ATTN_SPLIT_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

/* Bytes of the layout for rows x splits (rp_attn_decode_workspace_bytes). */
static inline size_t rp_attn_split_bytes(size_t rows, int splits, int hd) {
    const size_t parts = rows * (size_t)splits;
    return parts * (size_t)hd * sizeof(float) + parts * sizeof(float2) + 256;
}

/* Where the outputs and the (max, sum) pairs of rows x splits lie in a
 * workspace of rp_attn_split_bytes (the pairs 16-byte aligned). */
static inline void rp_attn_split_at(void *workspace, size_t rows, int splits, int hd, float **o, float2 **ml) {
    *o = (float *)workspace;
    *ml = (float2 *)(((uintptr_t)(*o + rows * (size_t)splits * hd) + 15) & ~(uintptr_t)15);
}

/* out[r][:] = sum_i o_i 2^(m_i - M) / sum_i l_i 2^(m_i - M) over the splits
 * i of row r (attn_decode.cu). */
int rp_attn_merge_splits(const float *ws_o, const float2 *ws_ml, uint16_t *out, int rows, int hd, int splits,
                         cudaStream_t stream);

/* The same over rows [range[0], range[1]) with the split count at splits,
 * both read on the device (a step's header), by a grid of blocks striding
 * over the rows (rp_attn_merge_blocks(most rows)). */
int rp_attn_merge_range(const float *ws_o, const float2 *ws_ml, uint16_t *out, const int32_t *range,
                        const int32_t *splits, int blocks, int hd, cudaStream_t stream);
static inline int rp_attn_merge_blocks(int max_rows) { return max_rows < 1024 ? (max_rows > 0 ? max_rows : 1) : 1024; }

#endif
