/* ==== safetensors: header validation, sharded checkpoints, the writer ====
 * Every malformed input gets a clear error naming the file (and tensor), never a crash. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "model/safetensors.h"
#include "tap.h"

/* Build a safetensors image from a header string and n data bytes. */
static uint8_t *image(const char *hdr, size_t data_bytes, size_t *len) {
    size_t hl = strlen(hdr);
    *len = 8 + hl + data_bytes;
    uint8_t *b = calloc(1, *len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    return b;
}

static void expect_parse(const char *what, const char *hdr, size_t data_bytes, st_status want,
                         const char *msg_part) {
    size_t len;
    uint8_t *b = image(hdr, data_bytes, &len);
    st_sf_header h;
    st_error err = {0};
    st_status st = st_sf_parse(b, len, "x.safetensors", &h, &err);
    if (st == ST_OK) st_sf_header_free(&h);
    CHECK(st == want && (!msg_part || strstr(err.msg, msg_part)) &&
              (st == ST_OK || strstr(err.msg, "x.safetensors")),
          "%s -> %s (%s)", what, st_status_name(st), err.msg);
    free(b);
}

static char tmpdir[256];

static void write_bytes(const char *name, const void *data, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    st_file_write(path, data, len, NULL);
}

static st_status fill_seq(void *ctx, int index, int64_t row0, int64_t nrows, void *buf,
                          st_error *err) {
    (void)ctx;
    (void)err;
    float *f = buf;
    for (int64_t r = 0; r < nrows; r++)
        for (int j = 0; j < 3; j++) f[r * 3 + j] = (float)(index * 100 + (row0 + r) * 3 + j);
    return ST_OK;
}

int main(void) {
    /* valid */
    expect_parse("valid two tensors",
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]},"
                 "\"__metadata__\":{\"format\":\"pt\"}}",
                 16, ST_OK, NULL);
    expect_parse("valid scalar and empty tensor",
                 "{\"s\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]},"
                 "\"e\":{\"dtype\":\"U8\",\"shape\":[0,5],\"data_offsets\":[4,4]}}",
                 4, ST_OK, NULL);
    /* truncation and lengths */
    {
        st_sf_header h;
        st_error err = {0};
        uint8_t b[5] = {1, 2, 3, 4, 5};
        st_status st = st_sf_parse(b, sizeof b, "x.safetensors", &h, &err);
        CHECK(st == ST_ERR_FORMAT && strstr(err.msg, "truncated"), "5-byte file is truncated (%s)",
              err.msg);
        uint8_t big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
        st = st_sf_parse(big, sizeof big, "x.safetensors", &h, &err);
        CHECK(st == ST_ERR_FORMAT && strstr(err.msg, "past the end"),
              "header length past the end of the file (%s)", err.msg);
    }
    expect_parse("data section shorter than offsets",
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
                 ST_ERR_FORMAT, "out of range");
    expect_parse("end before begin", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}",
                 8, ST_ERR_FORMAT, "end before begin");
    expect_parse("overlapping tensors",
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                 12, ST_ERR_FORMAT, "overlap");
    expect_parse("dtype x shape != bytes",
                 "{\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                 ST_ERR_FORMAT, "needs 6 bytes");
    expect_parse("unknown dtype", "{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                 1, ST_ERR_UNSUPPORTED, "unknown dtype 'Q7'");
    expect_parse("negative shape", "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}",
                 1, ST_ERR_FORMAT, "shape[0]");
    expect_parse("shape overflow",
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                 "\"data_offsets\":[0,1]}}",
                 1, ST_ERR_FORMAT, "overflow");
    expect_parse("too many dims",
                 "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
                 ST_ERR_UNSUPPORTED, "dimensions");
    expect_parse("missing data_offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, ST_ERR_FORMAT,
                 "data_offsets");
    expect_parse("offsets not integers",
                 "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,\"1\"]}}", 1,
                 ST_ERR_FORMAT, "data_offsets");
    expect_parse("header not JSON", "{\"a\":", 0, ST_ERR_FORMAT, "not valid JSON");
    expect_parse("header not an object", "[1,2,3]", 0, ST_ERR_FORMAT, "not a JSON object");
    expect_parse("duplicate tensor names",
                 "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                 "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                 2, ST_ERR_FORMAT, "not valid JSON");
    expect_parse("entry not an object", "{\"a\":5}", 0, ST_ERR_FORMAT, "'a'");
    expect_parse("metadata not an object", "{\"__metadata__\":[]}", 0, ST_ERR_FORMAT, "__metadata__");

    /* writer round trip + sharded checkpoints */
    snprintf(tmpdir, sizeof tmpdir, "/tmp/strand-sft-XXXXXX");
    if (!CHECK(mkdtemp(tmpdir) != NULL, "temp dir")) return tap_done();
    st_error err = {0};
    st_sf_entry e1[2] = {{"w.a", ST_DTYPE_F32, 2, {4, 3}}, {"w.b", ST_DTYPE_F32, 1, {3}}};
    st_sf_entry e2[1] = {{"w.c", ST_DTYPE_F32, 2, {2, 3}}};
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", tmpdir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", tmpdir);
    CHECK(st_sf_write(p1, e1, 2, "pt", fill_seq, NULL, &err) == ST_OK &&
              st_sf_write(p2, e2, 1, "pt", fill_seq, NULL, &err) == ST_OK,
          "writer writes two shards (%s)", err.msg);
    const char *index =
        "{\"metadata\":{},\"weight_map\":{\"w.a\":\"model-00001-of-00002.safetensors\","
        "\"w.b\":\"model-00001-of-00002.safetensors\",\"w.c\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes("model.safetensors.index.json", index, strlen(index));
    st_checkpoint *ck = NULL;
    st_status st = st_checkpoint_open(tmpdir, &ck, &err);
    if (CHECK(st == ST_OK, "sharded checkpoint opens (%s)", err.msg)) {
        const st_tensor *a = st_checkpoint_find(ck, "w.a"), *c = st_checkpoint_find(ck, "w.c");
        CHECK(ck->n_files == 2 && ck->n_tensors == 3 && a && c, "3 tensors in 2 shards");
        CHECK(a && ((const float *)a->data)[11] == 11.0f && c && ((const float *)c->data)[5] == 5.0f,
              "tensor data round-trips through the writer");
        CHECK(a && ((uintptr_t)a->data % 4) == 0, "data is aligned in place (no copy)");
        CHECK(strcmp(st_checkpoint_format(ck), "pt") == 0, "metadata format read");
        st_checkpoint_close(ck);
    }
    /* index naming a tensor its shard lacks */
    const char *bad_index =
        "{\"weight_map\":{\"w.a\":\"model-00001-of-00002.safetensors\","
        "\"w.zz\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes("model.safetensors.index.json", bad_index, strlen(bad_index));
    st = st_checkpoint_open(tmpdir, &ck, &err);
    CHECK(st == ST_ERR_MISSING && strstr(err.msg, "w.zz"), "index lists a missing tensor (%s)",
          err.msg);
    const char *wrong_shard = "{\"weight_map\":{\"w.a\":\"model-00001-of-00002.safetensors\","
                              "\"w.c\":\"model-00001-of-00002.safetensors\","
                              "\"x\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes("model.safetensors.index.json", wrong_shard, strlen(wrong_shard));
    st = st_checkpoint_open(tmpdir, &ck, &err);
    CHECK(st != ST_OK && strstr(err.msg, "w.c"), "index puts a tensor in the wrong shard (%s)", err.msg);
    const char *escape = "{\"weight_map\":{\"w.a\":\"../etc/passwd\"}}";
    write_bytes("model.safetensors.index.json", escape, strlen(escape));
    st = st_checkpoint_open(tmpdir, &ck, &err);
    CHECK(st == ST_ERR_FORMAT && strstr(err.msg, "plain file name"), "index path traversal refused (%s)",
          err.msg);
    const char *missing_shard = "{\"weight_map\":{\"w.a\":\"model-00009-of-00009.safetensors\"}}";
    write_bytes("model.safetensors.index.json", missing_shard, strlen(missing_shard));
    st = st_checkpoint_open(tmpdir, &ck, &err);
    CHECK(st == ST_ERR_IO && strstr(err.msg, "model-00009-of-00009"), "missing shard file (%s)", err.msg);
    write_bytes("model.safetensors.index.json", "{", 1);
    st = st_checkpoint_open(tmpdir, &ck, &err);
    CHECK(st == ST_ERR_FORMAT && strstr(err.msg, "index.json"), "index not JSON (%s)", err.msg);
    /* duplicate tensor across shards */
    st_sf_entry dup[1] = {{"w.a", ST_DTYPE_F32, 1, {3}}};
    st_sf_write(p2, dup, 1, NULL, fill_seq, NULL, &err);
    const char *dup_index = "{\"weight_map\":{\"w.a\":\"model-00001-of-00002.safetensors\","
                            "\"w.b\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes("model.safetensors.index.json", dup_index, strlen(dup_index));
    st = st_checkpoint_open(tmpdir, &ck, &err);
    CHECK(st == ST_ERR_FORMAT && strstr(err.msg, "appears in both"), "tensor in two shards (%s)", err.msg);
    /* no checkpoint at all */
    char empty[512];
    snprintf(empty, sizeof empty, "%s/empty", tmpdir);
    mkdir(empty, 0755);
    st = st_checkpoint_open(empty, &ck, &err);
    CHECK(st == ST_ERR_IO && strstr(err.msg, "no model.safetensors"), "empty directory (%s)", err.msg);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) printf("# could not remove %s\n", tmpdir);
    return tap_done();
}
