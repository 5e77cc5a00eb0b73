/* ==== The CPU kernel tables, one per instruction set (private to src/kernels) ====
 * Each getter only returns a pointer; calling a table's functions on a CPU without its
 * instruction set faults, so use st_kernels_by_name / st_kernels_select, which check. */
#ifndef ST_KERNELS_CPU_TABLES_H
#define ST_KERNELS_CPU_TABLES_H

#include "kernels/kernels.h"

const st_kernels *st_kernels_avx2_table(void);
const st_kernels *st_kernels_avx512_table(void);
const st_kernels *st_kernels_amx_table(void);

/* The amx set with the tile instructions emulated in C: runs on any CPU that has the avx512
 * set (for the tests on machines without AMX); never chosen by the dispatcher. */
const st_kernels *st_kernels_amx_emulated(void);

/* Request this process's permission to use AMX tile data (Linux arch_prctl); 1 on success. */
int st_amx_request_permission(void);

#endif /* ST_KERNELS_CPU_TABLES_H */
