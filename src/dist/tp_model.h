/* One GPU's shard of a model under tensor parallelism, as an ordinary
 * rp_model: its config has the rank's local shapes (query and KV heads,
 * MLP width, vocabulary rows) and its weights are the rank's slices
 * (tp_load.h), so a backend built on it allocates, uploads and computes
 * exactly the rank's part without knowing about ranks. What it cannot know
 * is where the partial sums meet (the all-reduces after o_proj, down_proj
 * and the embedding) and that its logits are one vocabulary shard: that is
 * the tensor-parallel backend's business (docs/tensor-parallel.md).
 *
 * The vocabulary shard is vocab_per_rank rows: the rank's real rows, then
 * zero rows up to the padded size (a view of the file where there is no
 * padding, else a buffer of the shard's size). */
#ifndef RP_DIST_TP_MODEL_H
#define RP_DIST_TP_MODEL_H

#include "dist/tp_plan.h"
#include "model/model.h"
#include "util/err.h"

/* The config a rank's shard runs with: plan->cfg with num_heads,
 * num_kv_heads, intermediate_size and vocab_size those of one rank. Token
 * ids (bos, eos) keep their global values: they index the whole
 * vocabulary, not the shard. */
void rp_tp_shard_config(const rp_tp_plan *plan, rp_model_config *out);

/* Rank `rank`'s shard of the checkpoint in dir, reading only its slices
 * from the mmap'd safetensors files. The directory's config.json must be
 * the one the plan was made from. An FP8 checkpoint's layer matrices keep
 * their slices' e4m3 bytes and scales (tp_load.h), so the shard is fp8 of
 * the layout the whole model would be (rp_model_fp8_settle); quantize
 * (RP_FP8_ROWS: --quantization fp8) quantizes a bf16 checkpoint's layer
 * matrices to the bytes the whole model's quantization makes
 * (rp_tp_slice_quantize). */
rp_model *rp_tp_model_load(const char *dir, const rp_tp_plan *plan, int rank, rp_fp8_layout quantize, rp_err *err);

/* Rank `rank`'s shard of a model already loaded (or dummy weights made on
 * the host): bf16 row slices are views into `full`, which must outlive the
 * shard. An fp8 model's layer matrices are sliced with their e4m3 bytes and
 * scales (the same bytes; a block grid its slices would cut leaves the
 * shard bf16, said in the log). Lazy dummy weights (no data on the host)
 * are refused. */
rp_model *rp_tp_model_slice(const rp_model *full, const rp_tp_plan *plan, int rank, rp_err *err);

/* Rank `rank`'s shard of dummy weights (seed: the whole model's) with no
 * data on the host: every weight shaped as the shard holds it, data NULL,
 * for the CUDA backend to generate on the GPU as the rank's slice of the
 * whole tensor's values (rp_k_fill_dummy_slice), what rp_tp_model_slice
 * of host dummy weights would hold. Nothing is made whole anywhere. fp8
 * (the whole model's quantize_fp8): the shard is fp8 of that layout and the
 * GPU quantizes each slice as it generates it; per row, a column slice's
 * (o_proj, down_proj) rows then get their own scales, not the whole rows'
 * (the GPU never has the whole rows): not one GPU's bytes, but as valid a
 * quantization of the same matrix, since each rank's partial sum is scaled
 * by its own row scales before the all-reduce adds them. */
rp_model *rp_tp_model_lazy_dummy(const rp_tp_plan *plan, int rank, uint64_t seed, rp_fp8_layout fp8, rp_err *err);

#endif
