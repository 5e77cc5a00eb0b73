/* ==== strand bench --grammar (bench_grammar.c) ==== */
#ifndef ST_APPS_BENCH_GRAMMAR_H
#define ST_APPS_BENCH_GRAMMAR_H

#include <stdint.h>

#include "core/status.h"

/* The cost of JSON output: the grammar's tables built for the tokenizer (tokenizer, else
 * dir's tokenizer.json) at a vocabulary of `vocab` ids (0: 248,320, Qwen3.5's), then random
 * replies drawn from the masks in JSON-object mode and under a nested schema, each step's
 * mask and apply times (p50, p99, max, mean); with a model (dir), batch-1 greedy decode
 * tok/s free and as a JSON object. -1 with err on a failure. */
int bench_grammar(const char *dir, const char *tokenizer, int64_t vocab, int json, st_error *err);

#endif /* ST_APPS_BENCH_GRAMMAR_H */
