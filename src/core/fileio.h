/* ==== Files: read-only mappings, whole-file reads, path helpers ==== */
#ifndef ST_CORE_FILEIO_H
#define ST_CORE_FILEIO_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* A read-only, private memory mapping of a whole file. */
typedef struct st_mapped_file {
    char *path;          /* owned copy of the path */
    const uint8_t *data; /* [size] bytes, mmap'ed read-only; NULL when size == 0 */
    size_t size;
} st_mapped_file;

/* Map path read-only. On failure fills err (naming the file) and leaves *out zeroed. */
st_status st_file_map(const char *path, st_mapped_file *out, st_error *err);
/* Unmap and free; tolerates a zeroed struct. */
void st_file_unmap(st_mapped_file *f);

/* Read a whole file into a malloc'ed, NUL-terminated buffer (*out_len excludes the NUL).
 * max_len bounds the size accepted (ST_ERR_LIMIT beyond it). Caller frees *out. */
st_status st_file_read(const char *path, size_t max_len, char **out, size_t *out_len,
                       st_error *err);

/* Write len bytes to path (created/truncated). */
st_status st_file_write(const char *path, const void *data, size_t len, st_error *err);

/* 1 if path names an existing regular file, 0 otherwise. */
int st_file_exists(const char *path);

/* Copy a file (read whole, up to 1 GiB) to a new path. */
st_status st_file_copy(const char *from, const char *to, st_error *err);

/* dir + "/" + name into buf (cap bytes); ST_ERR_LIMIT when it does not fit. */
st_status st_path_join(char *buf, size_t cap, const char *dir, const char *name, st_error *err);

#endif /* ST_CORE_FILEIO_H */
