/* Host planning of the one-kernel decode step: whether a model's shapes fit
 * the kernel (rp_decode_step_check), its workspace, and for nb sequences the
 * launch's arguments and shared memory (ds_make_args) from the shapes, the
 * device and the resolved tuning values (rp_decode_step_tuning, whose
 * defaults by model shape and GPU live in src/backend/cuda/tuning.c). */
#include "plan.h"

extern "C" size_t rp_decode_step_workspace_bytes(int nh, int nkv) {
    (void)nkv;
    ds_ws w = ds_ws_at(nullptr, nh);
    return (size_t)((uint8_t *)(w.pick + DS_PICK_MAX_GRID * 4) - (uint8_t *)nullptr);
}

static int kmax_of(const rp_decode_step *s) {
    int k = s->H;
    if (s->nh * s->hd > k) k = s->nh * s->hd;
    if (s->F > k) k = s->F;
    return k;
}

/* The pieces of the longest unit at piece width kc: with those the other
 * warps can take meanwhile (< 8 + stages) they must fit the 32 partial-sum
 * slots, so at most 16. */
/* The narrowest ring piece ds_make_args narrows to where x does not fit. */
#define DS_KC_MIN 1024

static bool ds_pieces_fit(const rp_decode_step *s, int kc) {
    const int gu = 2 * ((s->H + kc - 1) / kc), dn = (kmax_of(s) + kc - 1) / kc;
    return gu <= 16 && dn <= 16;
}

extern "C" const char *rp_decode_step_check(const rp_decode_step *s) {
    if (s->hd != 64 && s->hd != DS_HD) return "head_dim is not 64 or 128";
    if (s->nkv <= 0 || s->nh % s->nkv) return "heads do not divide into kv groups";
    const int G = s->nh / s->nkv;
    if (G != 1 && G != 2 && G != 4 && G != 8 && !(s->hd == DS_HD && (G == 5 || G == 6)))
        return "GQA group is not 1, 2, 4 or 8 (or 5 or 6 with head_dim 128)";
    if (s->H % DS_SEG || s->F % DS_SEG || (s->nh * s->hd) % DS_SEG) return "a matrix width is not a multiple of 256";
    if (s->H > DS_MAX_H) return "hidden size above 8192";
    if (4 * s->num_layers + 1 > DS_MAX_PHASES) return "more than 128 layers";
    /* a unit's pieces must fit the partial-sum slots (gemv_phase) */
    if (!ds_pieces_fit(s, DS_KC)) return "a matrix width above 24576";
    /* shared memory: the ring and x (227 KiB on Hopper) */
    /* (a tensor-parallel shard's stages may narrow to DS_KC_MIN: ds_make_args) */
    if (ds_plan(DS_STAGES, kmax_of(s), G, 4 * s->num_layers + 1, 0, 1,
                s->tp.n ? DS_ROWS * ds_row_stride(DS_KC_MIN) : DS_STAGE)
            .total > 227 * 1024)
        return "x does not fit beside the ring";
    if (s->V % DS_ROWS) return "vocabulary not a multiple of 8";
    return NULL;
}

/* Arguments for nb sequences, the kernel's count (ds_nb_kernel) setting
 * everything but the loops over them, and its shared memory. */
int ds_make_args(const rp_decode_step *s, const rp_decode_step_tuning *t, int nb_real, int num_sms, ds_args *a,
                 size_t *smem) {
    const int nb = ds_nb_kernel(nb_real);
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return -1;
    a->s = *s;
    a->nb = nb_real;
    a->grid = num_sms;
    a->kmax = kmax_of(s);
    /* attention items (sequence, kv head, split): at most one per block,
     * and the partials' workspace holds DS_MAX_SPLITS per query head */
    a->splits = num_sms / (s->nkv * nb);
    if (a->splits < 1) a->splits = 1;
    if (a->splits > DS_MAX_SPLITS / nb) a->splits = DS_MAX_SPLITS / nb;
    a->stages = DS_STAGES;
    a->kc = t->kc;
    if (!ds_pieces_fit(s, a->kc)) a->kc = DS_KC; /* narrower pieces would overflow the slots */
    const int plan_phases = 4 * s->num_layers + 1, G = s->nh / s->nkv;
    a->xstride = ds_xstride(a->kmax, nb);
    a->row_stride = DS_ROW_STRIDE;
    a->stage_bytes = DS_STAGE;
    if (nb > 1 ||
        (s->tp.n && ds_plan(a->stages, a->kmax, G, plan_phases, 0, nb, a->stage_bytes).total > (size_t)optin)) {
        /* x for every sequence beside the ring: stages as wide as the
         * piece, and narrower pieces where that does not fit, down to
         * DS_KC_MIN (below it the chain of kernels is faster: qwen3-8b's 4
         * sequences at 768 take 7.71 ms against 7.07; bench/RESULTS.md).
         * One sequence's x does not fit at DS_STAGE only in a wide shard
         * under tensor parallelism (llama3-70b's down product at TP = 2: k
         * 14336), whose kernels take the stage's size as an argument; the
         * one-GPU kernels keep it a constant. */
        bool fits = false;
        for (int kc = a->kc; kc >= DS_KC_MIN && !fits; kc -= 256) {
            a->kc = kc;
            a->row_stride = ds_row_stride(kc);
            a->stage_bytes = DS_ROWS * a->row_stride;
            fits = ds_pieces_fit(s, kc) &&
                   ds_plan(a->stages, a->kmax, G, plan_phases, 0, nb, a->stage_bytes).total <= (size_t)optin;
        }
        if (!fits) return -1;
    }
    /* the plan values by shape and GPU (tuning.c and docs/tuning.md say why
     * each default is what it is) */
    a->prefetch = t->prefetch;
    a->prefetch_now = t->prefetch_now;
    if (a->prefetch < a->prefetch_now) a->prefetch = a->prefetch_now;
    a->dyn_eighths = t->dyn_eighths;
    /* Past its static pieces a consumer of the one-sequence kernel polls
     * for a dynamic phase's end every 64 ns (gemv_phase); the kernels for
     * several sequences keep their code and sleep in try_wait. */
    a->poll_ns = nb == 1 && a->dyn_eighths > 0 ? 64 : 0;
    a->apace_ns = nb == 1 ? t->pace_ns : 0;
    a->norm_pf = 1;
    a->apace_all = 1;
    a->tail_hold = t->tail_hold;
    /* The residual row stays in shared memory where it fits beside the
     * ring (hidden size up to 2048: qwen3-0.6b and 1.7b, llama3.2-1b): the
     * o and down epilogues then skip an L2 round trip. */
    const bool res_fits =
        ds_plan(a->stages, a->kmax, G, plan_phases, s->H, nb, a->stage_bytes).total <= (size_t)optin;
    /* (under tensor parallelism the epilogues write partial rows and the
     * stagings read the sums: no residual row to keep) */
    a->keep_res = res_fits && !s->tp.n;
    *smem = ds_plan(a->stages, a->kmax, G, plan_phases, a->keep_res ? s->H : 0, nb, a->stage_bytes).total;
    return *smem > (size_t)optin ? -1 : 0;
}

