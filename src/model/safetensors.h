/* Reading .safetensors files: an 8-byte little-endian header length, a JSON
 * header naming each tensor's dtype, shape and byte range, then the data.
 * Files are mmap'd read-only, so tensors are views into the page cache and
 * loading a model costs no copy until a backend uploads or converts it.
 *
 * The header is untrusted input: every offset, shape and size is checked
 * against the file before a view is handed out (tests/test_safetensors.c
 * mutates headers to prove it). */
#ifndef RP_MODEL_SAFETENSORS_H
#define RP_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "util/dtype.h"
#include "util/err.h"

#define RP_MAX_DIMS 4

typedef struct rp_st_tensor {
    char *name;
    rp_dtype dtype;
    int ndim;
    int64_t shape[RP_MAX_DIMS];
    const void *data;
    size_t nbytes;
    /* where the file puts the tensor at an offset its element size does
     * not divide (a writer that did not pad its header, as safetensors'
     * own does to 8 bytes): an aligned copy, which data points to; NULL
     * for a tensor read in place */
    void *copy;
} rp_st_tensor;

typedef struct rp_safetensors {
    char *path;
    void *map;
    size_t map_bytes;
    rp_st_tensor *tensors;
    int num_tensors;
} rp_safetensors;

/* Opens and validates one file. Tensors of dtypes replay cannot use are an
 * error only when looked up, so unrelated extra tensors do not block loading. */
rp_safetensors *rp_safetensors_open(const char *path, rp_err *err);
/* Parses a file already in memory (used by open() and by the fuzz tests). */
rp_safetensors *rp_safetensors_parse(const void *buf, size_t len, rp_err *err);
void rp_safetensors_close(rp_safetensors *st);
const rp_st_tensor *rp_safetensors_find(const rp_safetensors *st, const char *name);

#endif
