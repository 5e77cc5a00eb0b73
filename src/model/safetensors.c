/* ==== safetensors: parsing, validation, sharded checkpoints, writing (see safetensors.h) ==== */
#include "model/safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* header parsing */

/* A JSON integer that is a non-negative value fitting in int64. */
static int json_nonneg_int(const json_t *v, int64_t *out) {
    if (!json_is_integer(v)) return 0;
    json_int_t x = json_integer_value(v);
    if (x < 0) return 0;
    *out = (int64_t)x;
    return 1;
}

typedef struct span {
    size_t begin, end;
    int index;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

void st_sf_header_free(st_sf_header *h) {
    if (!h) return;
    if (h->tensors) {
        for (int i = 0; i < h->n_tensors; i++) free((char *)h->tensors[i].name);
    }
    free(h->tensors);
    free(h->format);
    memset(h, 0, sizeof *h);
}

static st_status parse_entry(const char *label, const char *name, json_t *val, size_t data_size,
                             st_tensor *t, st_error *err) {
    if (!json_is_object(val))
        return st_error_set(err, ST_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object",
                            label, name);
    json_t *jdt = json_object_get(val, "dtype");
    json_t *jshape = json_object_get(val, "shape");
    json_t *joff = json_object_get(val, "data_offsets");
    if (!json_is_string(jdt))
        return st_error_set(err, ST_ERR_FORMAT, "%s: tensor '%s': missing or non-string dtype",
                            label, name);
    if (st_dtype_parse(json_string_value(jdt), &t->dtype) != 0)
        return st_error_set(err, ST_ERR_UNSUPPORTED, "%s: tensor '%s': unknown dtype '%.32s'",
                            label, name, json_string_value(jdt));
    if (!json_is_array(jshape))
        return st_error_set(err, ST_ERR_FORMAT, "%s: tensor '%s': missing or non-array shape",
                            label, name);
    size_t nd = json_array_size(jshape);
    if (nd > ST_MAX_DIMS)
        return st_error_set(err, ST_ERR_UNSUPPORTED, "%s: tensor '%s': %zu dimensions (max %d)",
                            label, name, nd, ST_MAX_DIMS);
    t->n_dims = (int)nd;
    int64_t numel = 1;
    for (size_t d = 0; d < nd; d++) {
        int64_t x;
        if (!json_nonneg_int(json_array_get(jshape, d), &x))
            return st_error_set(err, ST_ERR_FORMAT,
                                "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                                label, name, d);
        t->shape[d] = x;
        if (x != 0 && numel > INT64_MAX / x)
            return st_error_set(err, ST_ERR_FORMAT, "%s: tensor '%s': shape overflows", label,
                                name);
        numel *= x;
    }
    t->numel = numel;
    size_t esz = st_dtype_size(t->dtype);
    if ((uint64_t)numel > SIZE_MAX / esz)
        return st_error_set(err, ST_ERR_FORMAT, "%s: tensor '%s': size overflows", label, name);
    t->nbytes = (size_t)numel * esz;
    int64_t b, e;
    if (!json_is_array(joff) || json_array_size(joff) != 2 ||
        !json_nonneg_int(json_array_get(joff, 0), &b) ||
        !json_nonneg_int(json_array_get(joff, 1), &e))
        return st_error_set(err, ST_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets must be [begin, end] integers", label,
                            name);
    if (b > e)
        return st_error_set(err, ST_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64
                            "] end before begin",
                            label, name, b, e);
    if ((uint64_t)e > data_size)
        return st_error_set(err, ST_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64
                            "] out of range (data section has %zu bytes)",
                            label, name, b, e, data_size);
    if ((uint64_t)(e - b) != t->nbytes)
        return st_error_set(err, ST_ERR_FORMAT,
                            "%s: tensor '%s': %s x %" PRId64 " elements needs %zu bytes but "
                            "data_offsets span %" PRId64,
                            label, name, st_dtype_name(t->dtype), numel, t->nbytes, e - b);
    t->offset = (size_t)b;
    return ST_OK;
}

st_status st_sf_parse(const uint8_t *buf, size_t len, const char *label, st_sf_header *out,
                      st_error *err) {
    memset(out, 0, sizeof *out);
    if (len < 8)
        return st_error_set(err, ST_ERR_FORMAT,
                            "%s: truncated: %zu bytes, too short for the header length", label,
                            len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > len - 8)
        return st_error_set(err, ST_ERR_FORMAT,
                            "%s: header length %" PRIu64 " runs past the end of the file "
                            "(%zu bytes)",
                            label, hlen, len);
    if (hlen > ST_SF_MAX_HEADER)
        return st_error_set(err, ST_ERR_LIMIT, "%s: header of %" PRIu64 " bytes exceeds %u",
                            label, hlen, ST_SF_MAX_HEADER);
    if (hlen < 2)
        return st_error_set(err, ST_ERR_FORMAT, "%s: header too short (%" PRIu64 " bytes)",
                            label, hlen);
    size_t data_start = 8 + (size_t)hlen;
    size_t data_size = len - data_start;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return st_error_set(err, ST_ERR_FORMAT,
                            "%s: header is not valid JSON (line %d, column %d): %s", label,
                            jerr.line, jerr.column, st_json_error_text(jerr.text));
    st_status st = ST_OK;
    span *spans = NULL;
    if (!json_is_object(root)) {
        st = st_error_set(err, ST_ERR_FORMAT, "%s: header is not a JSON object", label);
        goto done;
    }
    size_t n = json_object_size(root);
    json_t *meta = json_object_get(root, "__metadata__");
    if (meta) {
        if (!json_is_object(meta)) {
            st = st_error_set(err, ST_ERR_FORMAT, "%s: __metadata__ is not an object", label);
            goto done;
        }
        json_t *fmt = json_object_get(meta, "format");
        if (json_is_string(fmt)) out->format = strdup(json_string_value(fmt));
        n--;
    }
    out->tensors = calloc(n ? n : 1, sizeof *out->tensors);
    spans = calloc(n ? n : 1, sizeof *spans);
    if (!out->tensors || !spans) {
        st = st_error_set(err, ST_ERR_NOMEM, "%s: out of memory", label);
        goto done;
    }
    const char *key;
    json_t *val;
    int i = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        st_tensor *t = &out->tensors[i];
        t->name = strdup(key);
        if (!t->name) {
            st = st_error_set(err, ST_ERR_NOMEM, "%s: out of memory", label);
            goto done;
        }
        out->n_tensors = ++i;
        st = parse_entry(label, key, val, data_size, t, err);
        if (st != ST_OK) goto done;
        t->data = buf + data_start + t->offset;
        spans[i - 1] = (span){t->offset, t->offset + t->nbytes, i - 1};
    }
    /* non-overlap: sort non-empty spans by begin, each must start at or after the last end */
    qsort(spans, (size_t)out->n_tensors, sizeof *spans, span_cmp);
    size_t last_end = 0;
    int last_idx = -1;
    for (int k = 0; k < out->n_tensors; k++) {
        if (spans[k].begin == spans[k].end) continue;
        if (last_idx >= 0 && spans[k].begin < last_end) {
            st = st_error_set(err, ST_ERR_FORMAT,
                              "%s: tensors '%s' and '%s' overlap (bytes %zu..%zu and %zu..%zu)",
                              label, out->tensors[last_idx].name,
                              out->tensors[spans[k].index].name,
                              out->tensors[last_idx].offset, last_end, spans[k].begin,
                              spans[k].end);
            goto done;
        }
        last_end = spans[k].end;
        last_idx = spans[k].index;
    }
    out->data_start = data_start;
    out->data_size = data_size;
done:
    free(spans);
    json_decref(root);
    if (st != ST_OK) st_sf_header_free(out);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* checkpoints */

void st_checkpoint_close(st_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; i < ck->n_files; i++) {
        if (ck->headers) st_sf_header_free(&ck->headers[i]);
        if (ck->files) st_file_unmap(&ck->files[i]);
    }
    for (int i = 0; i < ck->n_copies; i++) free(ck->aligned_copies[i]);
    free(ck->aligned_copies);
    free(ck->headers);
    free(ck->files);
    st_strmap_free(&ck->by_name);
    free(ck->dir);
    free(ck);
}

/* Shard file names come from an untrusted index: plain names only. */
static int safe_shard_name(const char *s) {
    if (!*s || strchr(s, '/') || strchr(s, '\\') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return 0;
    return 1;
}

static st_status add_file(st_checkpoint *ck, const char *path, st_error *err) {
    int k = ck->n_files;
    st_status st = st_file_map(path, &ck->files[k], err);
    if (st != ST_OK) return st;
    st = st_sf_parse(ck->files[k].data, ck->files[k].size, path, &ck->headers[k], err);
    if (st != ST_OK) {
        st_file_unmap(&ck->files[k]);
        return st;
    }
    ck->n_files++;
    st_sf_header *h = &ck->headers[k];
    for (int i = 0; i < h->n_tensors; i++) {
        st_tensor *t = &h->tensors[i];
        t->file = ck->files[k].path;
        int64_t prev;
        if (st_strmap_get(&ck->by_name, t->name, strlen(t->name), &prev)) {
            const st_tensor *o = &ck->headers[prev >> 32].tensors[prev & 0xffffffff];
            return st_error_set(err, ST_ERR_FORMAT, "tensor '%s' appears in both %s and %s",
                                t->name, o->file, path);
        }
        if (st_strmap_put(&ck->by_name, t->name, strlen(t->name), ((int64_t)k << 32) | i) < 0)
            return st_error_set(err, ST_ERR_NOMEM, "out of memory");
        ck->n_tensors++;
        size_t align = st_dtype_size(t->dtype);
        if (t->nbytes && ((uintptr_t)t->data % align) != 0) {
            /* rare: a file whose data section is not aligned; keep an aligned copy */
            void **nc = realloc(ck->aligned_copies, (size_t)(ck->n_copies + 1) * sizeof *nc);
            if (!nc) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
            ck->aligned_copies = nc;
            void *copy = malloc(t->nbytes);
            if (!copy) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
            memcpy(copy, t->data, t->nbytes);
            nc[ck->n_copies++] = copy;
            t->data = copy;
        }
    }
    return ST_OK;
}

static st_status open_index(st_checkpoint *ck, const char *index_path, st_error *err) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return st_error_set(err, ST_ERR_FORMAT, "%s: not valid JSON (line %d): %s", index_path,
                            jerr.line, st_json_error_text(jerr.text));
    st_status st = ST_OK;
    json_t *wm = json_object_get(root, "weight_map");
    const char **names = NULL;
    int n_names = 0;
    if (!json_is_object(wm)) {
        st = st_error_set(err, ST_ERR_FORMAT, "%s: missing object 'weight_map'", index_path);
        goto done;
    }
    size_t n = json_object_size(wm);
    names = calloc(n ? n : 1, sizeof *names);
    if (!names) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val) || !safe_shard_name(json_string_value(val))) {
            st = st_error_set(err, ST_ERR_FORMAT, "%s: weight_map['%s'] is not a plain file name",
                              index_path, key);
            goto done;
        }
        const char *f = json_string_value(val);
        int seen = 0;
        for (int i = 0; i < n_names; i++) seen |= strcmp(names[i], f) == 0;
        if (!seen) names[n_names++] = f;
    }
    if (n_names == 0) {
        st = st_error_set(err, ST_ERR_FORMAT, "%s: weight_map is empty", index_path);
        goto done;
    }
    ck->files = calloc((size_t)n_names, sizeof *ck->files);
    ck->headers = calloc((size_t)n_names, sizeof *ck->headers);
    if (!ck->files || !ck->headers) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_names; i++) {
        char path[4096];
        if ((st = st_path_join(path, sizeof path, ck->dir, names[i], err)) != ST_OK) goto done;
        if ((st = add_file(ck, path, err)) != ST_OK) goto done;
    }
    /* every tensor the index names must be in the shard it names */
    json_object_foreach(wm, key, val) {
        int64_t loc;
        const char *f = json_string_value(val);
        if (!st_strmap_get(&ck->by_name, key, strlen(key), &loc)) {
            st = st_error_set(err, ST_ERR_MISSING, "%s: lists tensor '%s' in %s, which lacks it",
                              index_path, key, f);
            goto done;
        }
        const char *actual = ck->files[loc >> 32].path;
        size_t al = strlen(actual), fl = strlen(f);
        if (al < fl || strcmp(actual + al - fl, f) != 0 || (al > fl && actual[al - fl - 1] != '/')) {
            st = st_error_set(err, ST_ERR_FORMAT, "%s: lists tensor '%s' in %s but it is in %s",
                              index_path, key, f, actual);
            goto done;
        }
    }
done:
    free(names);
    json_decref(root);
    return st;
}

st_status st_checkpoint_open(const char *dir, st_checkpoint **out, st_error *err) {
    *out = NULL;
    st_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || st_strmap_init(&ck->by_name, 1024) != 0) {
        free(ck);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    st_status st;
    size_t dl = strlen(dir);
    if (dl > 12 && strcmp(dir + dl - 12, ".safetensors") == 0 && st_file_exists(dir)) {
        const char *slash = strrchr(dir, '/');
        ck->dir = slash ? strndup(dir, (size_t)(slash - dir)) : strdup(".");
        ck->files = calloc(1, sizeof *ck->files);
        ck->headers = calloc(1, sizeof *ck->headers);
        if (!ck->dir || !ck->files || !ck->headers) {
            st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if ((st = add_file(ck, dir, err)) != ST_OK) goto fail;
        *out = ck;
        return ST_OK;
    }
    ck->dir = strdup(dir);
    if (!ck->dir) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto fail;
    }
    char path[4096];
    if ((st = st_path_join(path, sizeof path, dir, "model.safetensors.index.json", err)) != ST_OK)
        goto fail;
    if (st_file_exists(path)) {
        if ((st = open_index(ck, path, err)) != ST_OK) goto fail;
    } else {
        if ((st = st_path_join(path, sizeof path, dir, "model.safetensors", err)) != ST_OK)
            goto fail;
        if (!st_file_exists(path)) {
            st = st_error_set(err, ST_ERR_IO,
                              "%s: no model.safetensors or model.safetensors.index.json", dir);
            goto fail;
        }
        ck->files = calloc(1, sizeof *ck->files);
        ck->headers = calloc(1, sizeof *ck->headers);
        if (!ck->files || !ck->headers) {
            st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if ((st = add_file(ck, path, err)) != ST_OK) goto fail;
    }
    *out = ck;
    return ST_OK;
fail:
    st_checkpoint_close(ck);
    return st;
}

const st_tensor *st_checkpoint_find(const st_checkpoint *ck, const char *name) {
    int64_t loc;
    if (!st_strmap_get(&ck->by_name, name, strlen(name), &loc)) return NULL;
    return &ck->headers[loc >> 32].tensors[loc & 0xffffffff];
}

const st_tensor *st_checkpoint_tensor(const st_checkpoint *ck, int i) {
    for (int f = 0; f < ck->n_files; f++) {
        if (i < ck->headers[f].n_tensors) return &ck->headers[f].tensors[i];
        i -= ck->headers[f].n_tensors;
    }
    return NULL;
}

const char *st_checkpoint_format(const st_checkpoint *ck) {
    return ck->n_files ? ck->headers[0].format : NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* writing */

size_t st_sf_entry_bytes(const st_sf_entry *e) {
    size_t n = st_dtype_size(e->dtype);
    for (int d = 0; d < e->n_dims; d++) n *= (size_t)e->shape[d];
    return n;
}

st_status st_sf_write(const char *path, const st_sf_entry *entries, int n, const char *format,
                      st_sf_fill_fn fill, void *ctx, st_error *err) {
    json_t *root = json_object();
    if (!root) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    if (format) {
        json_t *meta = json_object();
        json_object_set_new(meta, "format", json_string(format));
        json_object_set_new(root, "__metadata__", meta);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const st_sf_entry *e = &entries[i];
        json_t *t = json_object();
        json_t *shape = json_array();
        for (int d = 0; d < e->n_dims; d++) json_array_append_new(shape, json_integer(e->shape[d]));
        size_t nb = st_sf_entry_bytes(e);
        json_object_set_new(t, "dtype", json_string(st_dtype_name(e->dtype)));
        json_object_set_new(t, "shape", shape);
        json_object_set_new(t, "data_offsets",
                            json_pack("[II]", (json_int_t)off, (json_int_t)(off + nb)));
        json_object_set_new(root, e->name, t);
        off += nb;
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    size_t hl = strlen(hdr);
    size_t padded = (hl + 7) & ~(size_t)7; /* keep the data section 8-byte aligned */
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        free(hdr);
        return st_error_set(err, ST_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int bad = fwrite(lenbuf, 1, 8, fp) != 8 || fwrite(hdr, 1, hl, fp) != hl;
    for (size_t i = hl; i < padded && !bad; i++) bad = fputc(' ', fp) == EOF;
    free(hdr);
    st_status st = ST_OK;
    const size_t chunk_target = 16u << 20;
    void *buf = NULL;
    size_t buf_cap = 0;
    for (int i = 0; i < n && !bad && st == ST_OK; i++) {
        const st_sf_entry *e = &entries[i];
        size_t nb = st_sf_entry_bytes(e);
        if (nb == 0) continue;
        int64_t rows = 1, row_bytes = (int64_t)nb;
        if (e->n_dims >= 2) {
            row_bytes = e->shape[e->n_dims - 1] * (int64_t)st_dtype_size(e->dtype);
            rows = (int64_t)nb / row_bytes;
        }
        int64_t per = (int64_t)chunk_target / row_bytes;
        if (per < 1) per = 1;
        if (per > rows) per = rows;
        size_t need = (size_t)(per * row_bytes);
        if (need > buf_cap) {
            free(buf);
            buf = malloc(need);
            buf_cap = buf ? need : 0;
            if (!buf) {
                st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
                break;
            }
        }
        for (int64_t r = 0; r < rows && st == ST_OK && !bad; r += per) {
            int64_t nr = rows - r < per ? rows - r : per;
            st = fill(ctx, i, r, nr, buf, err);
            if (st == ST_OK) bad = fwrite(buf, 1, (size_t)(nr * row_bytes), fp) != (size_t)(nr * row_bytes);
        }
    }
    free(buf);
    if (fclose(fp) != 0) bad = 1;
    if (st == ST_OK && bad) st = st_error_set(err, ST_ERR_IO, "%s: write failed", path);
    return st;
}
