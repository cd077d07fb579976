/* The host planning's interface inside the decode step's folder: plan.cu
 * makes a launch's arguments, decode_step.cu launches the kernel with them. */
#ifndef RP_DECODE_STEP_PLAN_H
#define RP_DECODE_STEP_PLAN_H

#include "layout.cuh"

/* The kernel's sequence count for nb sequences: 1, 2 or 4. */
static inline int ds_nb_kernel(int nb) { return nb <= 2 ? nb : 4; }


/* Arguments for nb sequences (a->nb = nb, the kernel's count setting
 * everything but the loops over them) and the launch's shared memory;
 * -1 where they do not fit the device's shared memory. */
int ds_make_args(const rp_decode_step *s, const rp_decode_step_tuning *t, int nb_real, int num_sms, ds_args *a,
                 size_t *smem);

#endif
