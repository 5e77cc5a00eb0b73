/* ==== A library's entry points, resolved at run time (private to src/backend/cuda) ====
 * The CUDA backend opens NCCL and cuBLASLt with dlopen, so that it loads where they are not
 * installed; each names the functions it calls in a table of these. */
#ifndef ST_BACKEND_CUDA_CU_DL_H
#define ST_BACKEND_CUDA_CU_DL_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

typedef struct cu_dl_sym {
    void **p;         /* where the address goes */
    const char *name; /* the symbol */
} cu_dl_sym;

/* every symbol of syms[n] from lib (a dlopen handle): 0, or -1 with "WHAT has no NAME" in
 * why[cap] at the first one missing */
static inline int cu_dl_resolve(void *lib, const cu_dl_sym *syms, size_t n, const char *what, char *why, size_t cap) {
    for (size_t i = 0; i < n; i++)
        if (!(*syms[i].p = dlsym(lib, syms[i].name))) {
            snprintf(why, cap, "%s has no %s", what, syms[i].name);
            return -1;
        }
    return 0;
}

#endif /* ST_BACKEND_CUDA_CU_DL_H */
