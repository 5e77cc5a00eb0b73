/* ==== Opening strand's shared objects (see plugin.h) ==== */
#include "core/plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void *st_plugin_open(const char *file, const char *path, char *why, size_t cap) {
    char tried[3][PATH_MAX + 64];
    int n = 0;
    if (path) {
        snprintf(tried[n++], sizeof tried[0], "%s", path);
    } else {
        char exe[PATH_MAX];
        ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
        char *slash = len > 0 ? (exe[len] = 0, strrchr(exe, '/')) : NULL;
        if (slash) {
            *slash = 0;
            snprintf(tried[n++], sizeof tried[0], "%s/%s", exe, file);
            snprintf(tried[n++], sizeof tried[0], "%s/../%s", exe, file);
        }
        snprintf(tried[n++], sizeof tried[0], "%s", file);
    }
    if (why && cap) why[0] = 0;
    for (int i = 0; i < n; i++) {
        void *h = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
        if (why && cap && !why[0]) snprintf(why, cap, "%s", dlerror());
    }
    return NULL;
}
