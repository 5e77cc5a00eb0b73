/* ==== Opening one of strand's shared objects at run time ====
 * The GPU backend and the MPI communicator live in their own shared objects
 * (libstrand-cuda.so, libstrand-mpi.so) so that the strand binary starts on machines
 * without their libraries; this opens one by its file name. */
#ifndef ST_CORE_PLUGIN_H
#define ST_CORE_PLUGIN_H

#include <stddef.h>

/* dlopen(file) from `path` when it is given, else next to the executable, then one folder up
 * from it (tests), then the loader's search path; the handle, or NULL with the first
 * attempt's error in why. */
void *st_plugin_open(const char *file, const char *path, char *why, size_t cap);

#endif /* ST_CORE_PLUGIN_H */
