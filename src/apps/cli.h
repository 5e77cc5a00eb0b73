/* ==== CLI: shared helpers and the command entry points ====
 * Each command lives in its own file (cmd_*.c) and returns the process exit status. */
#ifndef ST_APPS_CLI_H
#define ST_APPS_CLI_H

#include <stdint.h>

#include "backend/select.h"
#include "core/status.h"
#include "engine/cache.h"

typedef int (*st_cmd_fn)(int argc, char **argv);

/* Commands (argv[0] is the command name). Declared weak so that a command whose file is
 * not built yet reports itself as unavailable instead of breaking the link. */
#define ST_CMD(name) int name(int argc, char **argv) __attribute__((weak))
ST_CMD(cmd_logits);
ST_CMD(cmd_generate);
ST_CMD(cmd_inspect);
ST_CMD(cmd_synth);
ST_CMD(cmd_tokenize);
ST_CMD(cmd_detokenize);
ST_CMD(cmd_template);
ST_CMD(cmd_run);
ST_CMD(cmd_serve);
ST_CMD(cmd_bench);
ST_CMD(cmd_perplexity);
ST_CMD(cmd_quantize);
#undef ST_CMD

/* Report an error the way every command does ("strand: <msg>") and return exit status 1. */
int cli_fail(const st_error *err);
int cli_failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Parse "1,2,3" (commas and/or spaces) into a malloc'ed array. */
st_status cli_parse_ids(const char *s, int32_t **ids, int *n, st_error *err);

/* Parse a non-negative integer option value; returns 0 on success. */
int cli_parse_int(const char *opt, const char *s, long long min, long long max, long long *out);
int cli_parse_float(const char *opt, const char *s, double *out);

/* Returns argv[i+1] and advances *i, or fails with a message naming the option. */
const char *cli_value(int argc, char **argv, int *i);

struct st_req_params;
/* Sampling and stopping options shared by generate and run:
 *   --temp T --top-k K --top-p P --min-p P --repeat-penalty R --presence-penalty P
 *   --frequency-penalty F --seed N --logit-bias ID=BIAS --stop STR --ignore-eos --logprobs N
 * Returns 1 when argv[*i] was one of them (consumed, *i advanced), 0 when it is not, -1 on a
 * bad value (message printed). */
int cli_parse_sampling(int argc, char **argv, int *i, struct st_req_params *rp);
/* --kv-dtype f32|bf16; returns 0, or -1 after a message. */
int cli_parse_kv_dtype(const char *value, st_kv_dtype *out);

/* The CPU backend's parameters from the environment (the only place strand reads these):
 *   STRAND_KERNELS  a kernel set (ref, avx2, avx512, amx) or auto; unknown names warn
 *   STRAND_THREADS  threads per context (default: the online CPUs)
 *   STRAND_PACK=0   keep the checkpoint's matrix layout (no packed copies) */
st_cpu_params cli_cpu_params(void);

/* Under an MPI launcher (mpirun -np N, N > 1): join the job (MPI may take its own arguments
 * out of argv) so that cli_cpu_params() shards the model over the ranks; only rank 0 writes
 * standard output. Rank 0 runs the command; every other rank runs it as far as its backend
 * (cli_backend, cli_follow) and then replays rank 0's steps (dist/relay.h). Commands that
 * cannot run so are refused. $STRAND_COMM_TIMEOUT: the collectives' watchdog in seconds
 * (default 3). 0, or the exit code. */
int cli_dist_start(const char *cmd, int *argc, char ***argv);
void cli_dist_end(void);
/* this process's rank in the job (0 outside one), and the job's size (1 outside one) */
int cli_rank(void);
int cli_world(void);
/* A rank other than 0: follow rank 0's steps on b (this rank's shard), then end the job's
 * part here: frees b, leaves MPI, exits the process (0, or 1 on an error). Never returns. */
_Noreturn void cli_follow(st_backend *b);
/* A rank other than 0 of `serve`: load the model in dir, make its backend and follow. */
int cli_follow_model(const char *dir);
/* The device the command runs its model on: --device cpu|cuda|auto (main.c takes the option
 * from any command's arguments), else $STRAND_DEVICE, else auto; with cli_cpu_params(). */
st_device_params cli_device_params(void);
/* main.c: the --device value (-1 when it is not a device). */
int cli_set_device(const char *value);
/* main.c: the --precision value (exact or bf16; -1 otherwise). */
int cli_set_precision(const char *value);
/* A backend for m on cli_device_params()'s device (on a rank other than 0: cli_follow). */
st_status cli_backend(const st_model *m, st_backend **out, st_error *err);

/* The image parts of a prompt from image files (images in order): *vt (the model
 * directory's tower) and *vp to free after. ids either hold each image's run of image tokens
 * (expand_max 0), or one placeholder per image that becomes its run (a rendered chat prompt:
 * *ids is then replaced, within expand_max tokens). */
struct st_vision_tower;
struct st_vision_prompt;
st_status cli_vision_prompt(const char *dir, const st_model *m, int32_t **ids, int64_t *n, int64_t expand_max,
                            const char *const *paths, int n_paths, struct st_vision_tower **vt,
                            struct st_vision_prompt *vp, st_error *err);

/* The help text of those options. */
const char *cli_sampling_help(void);

#endif /* ST_APPS_CLI_H */
