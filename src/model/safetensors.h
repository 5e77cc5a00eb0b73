/* ==== safetensors: header parsing and validation, sharded checkpoints, writing ====
 *
 * A safetensors file is an 8-byte little-endian header length H, H bytes of JSON
 * ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}), then the data
 * section. Every header is validated once at open (offsets in bounds and non-overlapping,
 * dtype x shape = bytes, known dtype, sane sizes); afterwards tensors are trusted and read
 * in place from a read-only mapping. A checkpoint is one file or several shards listed in
 * model.safetensors.index.json.
 */
#ifndef ST_MODEL_SAFETENSORS_H
#define ST_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/fileio.h"
#include "core/status.h"
#include "core/strmap.h"
#include "tensor/dtype.h"

#define ST_MAX_DIMS 8
#define ST_SF_MAX_HEADER (256u << 20) /* 256 MiB of JSON is far beyond any real checkpoint */

/* One tensor of a file. */
typedef struct st_tensor {
    const char *name;    /* NUL-terminated; owned by the st_sf_header */
    st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;       /* product of shape (1 for a scalar) */
    size_t nbytes;       /* numel * dtype size */
    size_t offset;       /* byte offset within the data section */
    const void *data;    /* [nbytes] bytes; borrowed from the mapping (or aligned copy) */
    const char *file;    /* path of the file holding it; borrowed from the checkpoint */
} st_tensor;

/* A parsed, validated header. */
typedef struct st_sf_header {
    st_tensor *tensors;  /* [n_tensors], owned */
    int n_tensors;
    char *format;        /* __metadata__.format ("pt", "mlx", ...) or NULL; owned */
    size_t data_start;   /* 8 + header length: where the data section starts in the file */
    size_t data_size;    /* bytes of the data section */
} st_sf_header;

/* Parse and validate the header of a safetensors image buf[0..len) (the whole file).
 * `label` names the file in error messages. Tensor data pointers point into buf. */
st_status st_sf_parse(const uint8_t *buf, size_t len, const char *label, st_sf_header *out,
                      st_error *err);
void st_sf_header_free(st_sf_header *h);

/* A checkpoint directory: one model.safetensors or the shards of an index. */
typedef struct st_checkpoint {
    char *dir;                /* owned */
    int n_files;
    st_mapped_file *files;    /* [n_files], owned mappings */
    st_sf_header *headers;    /* [n_files], owned */
    void **aligned_copies;    /* [n_copies] owned copies of misaligned tensors */
    int n_copies;
    st_strmap by_name;        /* tensor name -> (file << 32 | index) */
    int n_tensors;            /* over all files */
} st_checkpoint;

/* Open dir/model.safetensors.index.json (and its shards) or dir/model.safetensors, or
 * dir itself when it names a .safetensors file. */
st_status st_checkpoint_open(const char *dir, st_checkpoint **out, st_error *err);
void st_checkpoint_close(st_checkpoint *ck);
/* Tensor by exact name, or NULL. */
const st_tensor *st_checkpoint_find(const st_checkpoint *ck, const char *name);
/* Iterate: i in [0, n_tensors). */
const st_tensor *st_checkpoint_tensor(const st_checkpoint *ck, int i);
/* The __metadata__.format of the first file (or NULL). */
const char *st_checkpoint_format(const st_checkpoint *ck);

/* ---- writing ---- */

typedef struct st_sf_entry {
    const char *name; /* borrowed */
    st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
} st_sf_entry;

/* Produces the bytes of rows [row0, row0+nrows) of entry `index` into buf. A "row" is the
 * last dimension (the whole tensor for 0-d/1-d tensors). Returns ST_OK or an error. */
typedef st_status (*st_sf_fill_fn)(void *ctx, int index, int64_t row0, int64_t nrows, void *buf,
                                   st_error *err);

/* Write a safetensors file with the given tensors (stored in the order given) and
 * __metadata__ {"format": format} when format is non-NULL. Data is produced in chunks
 * by fill, so files larger than memory can be written. */
st_status st_sf_write(const char *path, const st_sf_entry *entries, int n, const char *format,
                      st_sf_fill_fn fill, void *ctx, st_error *err);

/* Bytes an entry occupies. */
size_t st_sf_entry_bytes(const st_sf_entry *e);

#endif /* ST_MODEL_SAFETENSORS_H */
