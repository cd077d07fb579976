/* safetensors parsing and mmap. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Unknown dtypes are kept with this marker and rejected when looked up. */
#define DTYPE_UNSUPPORTED ((rp_dtype)-1)

static rp_dtype parse_dtype(const char *s) {
    if (!strcmp(s, "BF16")) return RP_DTYPE_BF16;
    if (!strcmp(s, "F16")) return RP_DTYPE_F16;
    if (!strcmp(s, "F32")) return RP_DTYPE_F32;
    if (!strcmp(s, "F8_E4M3")) return RP_DTYPE_F8_E4M3;
    return DTYPE_UNSUPPORTED;
}

static size_t dtype_bytes_any(const char *s) {
    static const struct { const char *n; size_t b; } t[] = {
        {"BF16", 2}, {"F16", 2}, {"F32", 4}, {"F64", 8}, {"I8", 1}, {"U8", 1}, {"I16", 2}, {"U16", 2},
        {"I32", 4}, {"U32", 4}, {"I64", 8}, {"U64", 8}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(t[i].n, s)) return t[i].b;
    return 0;
}

static int parse_header(rp_safetensors *st, const uint8_t *buf, size_t len, rp_err *err) {
    if (len < 8) return rp_errf(err, "file too short for a safetensors header");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen == 0 || hlen > len - 8 || hlen > (100u << 20))
        return rp_errf(err, "invalid header length %llu (file is %zu bytes)", (unsigned long long)hlen, len);
    const uint8_t *data = buf + 8 + hlen;
    size_t data_len = len - 8 - (size_t)hlen;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return rp_errf(err, "header JSON: %s", jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return rp_errf(err, "header is not a JSON object");
    }
    size_t n = json_object_size(root);
    st->tensors = calloc(n ? n : 1, sizeof *st->tensors);
    if (!st->tensors) {
        json_decref(root);
        return rp_errf(err, "out of memory");
    }
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) continue;
        json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
               *offs = json_object_get(v, "data_offsets");
        if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) ||
            json_array_size(offs) != 2) {
            rc = rp_errf(err, "tensor \"%s\": malformed entry", key);
            break;
        }
        size_t esize = dtype_bytes_any(json_string_value(dt));
        if (!esize) {
            rc = rp_errf(err, "tensor \"%s\": unknown dtype \"%s\"", key, json_string_value(dt));
            break;
        }
        rp_st_tensor *t = &st->tensors[st->num_tensors];
        t->dtype = parse_dtype(json_string_value(dt));
        t->ndim = (int)json_array_size(shape);
        if (t->ndim > RP_MAX_DIMS) {
            rc = rp_errf(err, "tensor \"%s\": %d dimensions (at most %d)", key, t->ndim, RP_MAX_DIMS);
            break;
        }
        uint64_t count = 1;
        for (int d = 0; d < t->ndim; d++) {
            json_t *e = json_array_get(shape, (size_t)d);
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > (1ll << 40)) {
                rc = rp_errf(err, "tensor \"%s\": invalid shape", key);
                break;
            }
            t->shape[d] = json_integer_value(e);
            if (t->shape[d] && count > (UINT64_MAX >> 1) / (uint64_t)t->shape[d]) {
                rc = rp_errf(err, "tensor \"%s\": shape overflows", key);
                break;
            }
            count *= (uint64_t)t->shape[d];
        }
        if (rc) break;
        json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
        if (!json_is_integer(b) || !json_is_integer(e)) {
            rc = rp_errf(err, "tensor \"%s\": data_offsets must be integers", key);
            break;
        }
        json_int_t begin = json_integer_value(b), end = json_integer_value(e);
        if (begin < 0 || end < begin || (uint64_t)end > data_len) {
            rc = rp_errf(err, "tensor \"%s\": data_offsets [%lld, %lld] outside the %zu data bytes", key,
                         (long long)begin, (long long)end, data_len);
            break;
        }
        if (count > UINT64_MAX / esize || (uint64_t)(end - begin) != count * esize) {
            rc = rp_errf(err, "tensor \"%s\": %lld bytes do not match its shape and dtype", key,
                         (long long)(end - begin));
            break;
        }
        t->name = strdup(key);
        if (!t->name) {
            rc = rp_errf(err, "out of memory");
            break;
        }
        t->data = data + begin;
        t->nbytes = (size_t)(end - begin);
        st->num_tensors++;
        if ((uintptr_t)t->data % esize) { /* bf16/f32 loads must not be misaligned (C, UBSan) */
            if (!(t->copy = malloc(t->nbytes ? t->nbytes : 1))) {
                rc = rp_errf(err, "out of memory");
                break;
            }
            memcpy(t->copy, t->data, t->nbytes);
            t->data = t->copy;
        }
    }
    json_decref(root);
    return rc;
}

rp_safetensors *rp_safetensors_parse(const void *buf, size_t len, rp_err *err) {
    rp_safetensors *st = calloc(1, sizeof *st);
    if (!st) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    if (parse_header(st, buf, len, err)) {
        rp_safetensors_close(st);
        return NULL;
    }
    return st;
}

rp_safetensors *rp_safetensors_open(const char *path, rp_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rp_errf(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < 8) {
        close(fd);
        rp_errf(err, "%s: not a safetensors file (too short)", path);
        return NULL;
    }
    size_t len = (size_t)sb.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        rp_errf(err, "%s: mmap: %s", path, strerror(errno));
        return NULL;
    }
    rp_safetensors *st = rp_safetensors_parse(map, len, err);
    if (!st) {
        munmap(map, len);
        rp_err_wrap(err, "%s", path);
        return NULL;
    }
    st->map = map;
    st->map_bytes = len;
    st->path = strdup(path);
    return st;
}

void rp_safetensors_close(rp_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->num_tensors; i++) free(st->tensors[i].name), free(st->tensors[i].copy);
    free(st->tensors);
    if (st->map) munmap(st->map, st->map_bytes);
    free(st->path);
    free(st);
}

const rp_st_tensor *rp_safetensors_find(const rp_safetensors *st, const char *name) {
    for (int i = 0; i < st->num_tensors; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}
