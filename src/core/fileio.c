/* ==== Files: read-only mappings, whole-file reads, path helpers (see fileio.h) ==== */
#include "core/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

st_status st_file_map(const char *path, st_mapped_file *out, st_error *err) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return st_error_set(err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return st_error_set(err, ST_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return st_error_set(err, ST_ERR_IO, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    const uint8_t *data = NULL;
    if (size > 0) {
        void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return st_error_set(err, ST_ERR_IO, "%s: cannot map: %s", path, strerror(e));
        }
        data = p;
    }
    close(fd);
    out->path = strdup(path);
    if (!out->path) {
        if (data) munmap((void *)data, size);
        return st_error_set(err, ST_ERR_NOMEM, "%s: out of memory", path);
    }
    out->data = data;
    out->size = size;
    return ST_OK;
}

void st_file_unmap(st_mapped_file *f) {
    if (!f) return;
    if (f->data) munmap((void *)f->data, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

st_status st_file_read(const char *path, size_t max_len, char **out, size_t *out_len,
                       st_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return st_error_set(err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(fp);
        return st_error_set(err, ST_ERR_IO, "%s: is a directory, not a file", path);
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(fp);
        return st_error_set(err, ST_ERR_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (len == cap) {
            if (cap >= max_len) {
                free(buf);
                fclose(fp);
                return st_error_set(err, ST_ERR_LIMIT, "%s: file larger than %zu bytes", path,
                                    max_len);
            }
            size_t ncap = cap * 2 > max_len ? max_len : cap * 2;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                fclose(fp);
                return st_error_set(err, ST_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap = ncap;
        }
        size_t n = fread(buf + len, 1, cap - len, fp);
        len += n;
        if (n == 0) break;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        return st_error_set(err, ST_ERR_IO, "%s: read error: %s", path, strerror(errno));
    }
    if (len > max_len) { /* a file under the first buffer's size, over a small limit */
        free(buf);
        return st_error_set(err, ST_ERR_LIMIT, "%s: file larger than %zu bytes", path, max_len);
    }
    buf[len] = '\0';
    *out = buf;
    if (out_len) *out_len = len;
    return ST_OK;
}

st_status st_file_write(const char *path, const void *data, size_t len, st_error *err) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return st_error_set(err, ST_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t n = len ? fwrite(data, 1, len, fp) : 0;
    int bad = (n != len) | (fclose(fp) != 0);
    if (bad) return st_error_set(err, ST_ERR_IO, "%s: write failed", path);
    return ST_OK;
}

int st_file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

st_status st_path_join(char *buf, size_t cap, const char *dir, const char *name, st_error *err) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return st_error_set(err, ST_ERR_LIMIT, "path too long: %s/%s", dir, name);
    return ST_OK;
}

st_status st_file_copy(const char *from, const char *to, st_error *err) {
    char *data;
    size_t len;
    st_status st = st_file_read(from, (size_t)1 << 30, &data, &len, err);
    if (st != ST_OK) return st;
    st = st_file_write(to, data, len, err);
    free(data);
    return st;
}
