/* ==== Run-time choice of the CPU kernel set ====
 * CPUID + XGETBV say what the CPU has and what the OS saves on context switches; AMX also
 * needs the Linux permission request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA), made
 * once per process. The features are detected once (pthread_once) and never change. */
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "kernels/cpu/cpu_tables.h"
#include "kernels/kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

unsigned st_kernels_packs(const st_kernels *k) {
    unsigned p = k->packs;
    if (!st_cpu_get_features()->avx512vnni) p &= ~ST_WPACK_BIT(ST_WPACK_Q8_V16);
    return p;
}

int64_t st_kernels_matmul_scratch(int64_t cols) {
    /* simd: activation block (max(2^18 floats, 24 tokens)) + converted row block (<= 16
     * rows) + saved accumulators; amx: three bf16 parts of 32 tokens (48 floats per column) + 32 padded bf16 rows
     * (16 per column) + a C block; 64-column padding */
    const int64_t kp = (cols + 63) / 64 * 64;
    const int64_t xblk = 262144 > 24 * kp ? 262144 : 24 * kp;
    const int64_t amx = 64 * kp;
    /* + the simd tiles' saved accumulators: 43 tiles x 8 x 8 vectors of 16; + the 8-bit
     * path's group sums (252 tokens x kp/32) and a row block's scales and biases (8 rows) */
    return (xblk > amx ? xblk : amx) + 16 * kp + 8192 + 43 * 8 * 8 * 16 + 252 * (kp / 32 + 16) +
           16 * (kp / 32) + 8 * (kp / 32 + 16);
}

static st_cpu_features g_feat; /* written once under g_once, read-only afterwards */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__)
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

int st_amx_request_permission(void) {
#ifndef ARCH_REQ_XCOMP_PERM
#define ARCH_REQ_XCOMP_PERM 0x1023
#endif
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, 18 /* XFEATURE_XTILEDATA */) == 0;
}

static void detect(void) {
    st_cpu_features *f = &g_feat;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    const int fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return;
    const uint64_t xcr0 = xgetbv0();
    const int ymm_ok = (xcr0 & 0x6) == 0x6;
    const int zmm_ok = ymm_ok && (xcr0 & 0xe0) == 0xe0;
    const int tile_ok = (xcr0 & 0x60000) == 0x60000;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    f->avx2 = ymm_ok && ((b >> 5) & 1);
    f->fma = ymm_ok && fma;
    f->f16c = ymm_ok && f16c;
    f->avx512f = zmm_ok && ((b >> 16) & 1);
    f->avx512dq = zmm_ok && ((b >> 17) & 1);
    f->avx512bw = zmm_ok && ((b >> 30) & 1);
    f->avx512vl = zmm_ok && ((b >> 31) & 1);
    f->avx512vnni = f->avx512f && ((c >> 11) & 1);
    f->amx_bf16 = (d >> 22) & 1;
    f->amx_tile = (d >> 24) & 1;
    unsigned a1, b1, c1, d1;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    f->avx512bf16 = f->avx512f && ((a1 >> 5) & 1);
    (void)b1;
    (void)c1;
    (void)d1;
    f->amx_usable = f->amx_tile && f->amx_bf16 && f->avx512f && f->avx512bw && tile_ok &&
                    st_amx_request_permission();
}
#else
int st_amx_request_permission(void) { return 0; }
static void detect(void) {}
#endif

const st_cpu_features *st_cpu_get_features(void) {
    pthread_once(&g_once, detect);
    return &g_feat;
}

static const char *const g_names[] = {"ref", "avx2", "avx512", "amx", NULL};

const char *const *st_kernels_names(void) { return g_names; }

const st_kernels *st_kernels_by_name(const char *name) {
    const st_cpu_features *f = st_cpu_get_features();
    const int has_avx2 = f->avx2 && f->fma && f->f16c;
    const int has_avx512 = has_avx2 && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq;
    if (!name) return NULL;
    if (strcmp(name, "ref") == 0) return st_kernels_ref();
#if defined(__x86_64__)
    if (strcmp(name, "avx2") == 0) return has_avx2 ? st_kernels_avx2_table() : NULL;
    if (strcmp(name, "avx512") == 0) return has_avx512 ? st_kernels_avx512_table() : NULL;
    if (strcmp(name, "amx") == 0) return has_avx512 && f->amx_usable ? st_kernels_amx_table() : NULL;
    /* a testing aid, not listed: the amx set with its tile instructions emulated */
    if (strcmp(name, "amx-emulated") == 0) return has_avx512 ? st_kernels_amx_emulated() : NULL;
#endif
    return NULL;
}

const st_kernels *st_kernels_best(void) {
    static const char *const order[] = {"amx", "avx512", "avx2"};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        const st_kernels *k = st_kernels_by_name(order[i]);
        if (k) return k;
    }
    return st_kernels_ref();
}

const st_kernels *st_kernels_select(const char *e) {
    if (!e || !*e || strcmp(e, "auto") == 0) return st_kernels_best();
    const st_kernels *k = st_kernels_by_name(e);
    if (k) return k;
    const st_kernels *b = st_kernels_best();
    int known = strcmp(e, "amx-emulated") == 0;
    for (const char *const *n = st_kernels_names(); *n; n++) known |= strcmp(*n, e) == 0;
    if (known) {
        ST_WARN("kernel set %s is not available on this CPU; using %s", e, b->name);
    } else {
        char list[128] = "";
        for (const char *const *n = st_kernels_names(); *n; n++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", *list ? ", " : "", *n);
        ST_WARN("%s is not a kernel set (known: auto, %s); using %s", e, list, b->name);
    }
    return b;
}
