# strand build: `make` builds the CLI (build/strand), the library and the tests.
# `make test` installs missing Debian packages, builds and runs every test.
# Objects go to build/; no -march=native anywhere: SIMD kernels get per-file flags and
# are chosen at run time.

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
WARN    := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes \
           -Werror=implicit-function-declaration -Werror=incompatible-pointer-types
CPPFLAGS_ALL := -std=c11 -D_GNU_SOURCE -Isrc -MMD -MP
LDLIBS  := -lmicrohttpd -ljansson -lpcre2-8 -lutf8proc -lpng16 -ljpeg -lwebp -lgif -lpthread -lm -ldl

# library sources: everything under src/ except the CLI, the CUDA backend and the MPI
# communicator (their own shared objects, below)
LIB_SRC  := $(shell find src -name '*.c' ! -path 'src/apps/*' ! -path 'src/backend/cuda/*' ! -path 'src/dist/mpi/*' | sort)
APP_SRC  := $(sort $(wildcard src/apps/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
APP_OBJ  := $(APP_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
LIB      := $(BUILD)/libstrand.a

.PHONY: all test deps clean fuzz demo bench test-gpu mmv-bench
all: $(BUILD)/strand $(TEST_BIN)

# The CUDA backend: build/libstrand-cuda.so, when nvcc is there (strand opens it at run time,
# so the binary itself never needs CUDA). Hopper (sm_90) machine code, and PTX for newer.
NVCC ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
# the wgmma product and attention (Hopper's warpgroup MMA, setmaxnreg) exist for sm_90a alone: their files are
# built for that target only, and the backend takes them on a compute capability 9.0 device
CUDA_ARCH_90A := -gencode arch=compute_90a,code=sm_90a
CUDA_LIB := $(BUILD)/libstrand-cuda.so
# build switches for the kernel files (bench/cuda/variants.sh sets them; each file keeps its target)
CUDA_DEFS ?=
# the kernels, one object a family (compiled in parallel under -j): the slowest first (the
# CUDA-core products' 30 instantiations, about half the compile time), so that -j2 ends sooner
CUDA_CU  := src/backend/cuda/matmul.cu $(filter-out src/backend/cuda/matmul.cu,$(sort $(wildcard src/backend/cuda/*.cu)))
# the headers the kernel files include
CUDA_H   := $(wildcard src/backend/cuda/*.h) $(wildcard src/backend/cuda/*.cuh)
CUDA_C   := $(sort $(wildcard src/backend/cuda/*.c))
CUDA_OBJ := $(CUDA_CU:%.cu=$(BUILD)/obj/%.cu.o) $(CUDA_C:%.c=$(BUILD)/obj/%.pic.o)
# the backend's host code is built on its own flags: nvcc links the shared object without a
# sanitizer runtime, so a sanitizer build of strand must not instrument it
CUDA_CFLAGS ?= -O2 -g
ifneq ($(NVCC),)
all: $(CUDA_LIB)
endif
# the matrix-product bench (bench/cuda/mmv_bench.cu): the backend's kernels side by side
# (`make mmv-bench`; not part of `all`: it compiles the kernels a second time)
mmv-bench: $(BUILD)/mmv_bench
MMV_BENCH_CU := $(addprefix src/backend/cuda/,elementwise.cu matmul.cu matmul_bf16.cu matmul_q.cu matmul_wgmma.cu gdn.cu gdn_chunk.cu sample.cu attention.cu attention_wgmma.cu)
$(BUILD)/mmv_bench: bench/cuda/mmv_bench.cu $(MMV_BENCH_CU) $(CUDA_H) $(BUILD)/obj/src/backend/cuda/blas.pic.o
	@mkdir -p $(dir $@)
	@echo "  NVCC    $<"
	@$(NVCC) -std=c++17 -O3 -Isrc $(CUDA_ARCH_90A) $< $(BUILD)/obj/src/backend/cuda/blas.pic.o -o $@ -ldl -lpthread
$(BUILD)/obj/src/backend/cuda/matmul_wgmma.cu.o: CUDA_ARCH := $(CUDA_ARCH_90A)
$(BUILD)/obj/src/backend/cuda/attention_wgmma.cu.o: CUDA_ARCH := $(CUDA_ARCH_90A)
$(BUILD)/obj/%.cu.o: %.cu $(CUDA_H)
	@mkdir -p $(dir $@)
	@echo "  NVCC    $<"
	@$(NVCC) -std=c++17 -O3 -Isrc $(CUDA_ARCH) $(CUDA_DEFS) -Xcompiler -fPIC -c $< -o $@
$(BUILD)/obj/src/backend/cuda/%.pic.o: src/backend/cuda/%.c
	@mkdir -p $(dir $@)
	@echo "  CC      $< (PIC)"
	@$(CC) $(CPPFLAGS_ALL) -I$(CUDA_HOME)/include $(WARN) $(CUDA_CFLAGS) -fPIC -fvisibility=hidden -c $< -o $@
$(CUDA_LIB): $(CUDA_OBJ)
	@echo "  LINK    $@"
	@$(NVCC) -shared $(CUDA_ARCH) -cudart static -o $@ $(CUDA_OBJ) -Xlinker -z,defs -lrt -ldl -lpthread

# The MPI communicator: build/libstrand-mpi.so, when mpicc is there (strand opens it at run
# time under mpirun, so the binary itself never needs MPI)
MPICC ?= $(shell command -v mpicc 2>/dev/null)
MPI_LIB := $(BUILD)/libstrand-mpi.so
ifneq ($(MPICC),)
all: $(MPI_LIB)
endif
$(MPI_LIB): src/dist/mpi/comm_mpi.c src/dist/comm.h
	@mkdir -p $(dir $@)
	@echo "  MPICC   $<"
	@$(MPICC) -std=c11 -D_GNU_SOURCE -Isrc $(WARN) $(CFLAGS) -fPIC -shared -fvisibility=hidden -o $@ $< -Wl,-z,defs

# the GPU tests (on a machine with an NVIDIA GPU): the fixtures, the op conformance test and
# the device-allocation count on the CUDA backend
test-gpu: all
	@tests/gpu_test.sh

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CPPFLAGS_ALL) $(WARN) $(CFLAGS) $(KFLAGS) -c $< -o $@

# The VNNI 8-bit kernel keeps 24 integer accumulators in registers; gcc 12 spills them
# (measured 1.3-1.7x slower), clang does not: it is built with clang when there is one.
KCC ?= $(shell command -v clang >/dev/null 2>&1 && echo clang || echo $(CC))
$(BUILD)/obj/src/kernels/cpu/q8vnni.o: src/kernels/cpu/q8vnni.c
	@mkdir -p $(dir $@)
	@echo "  KCC     $<"
	@$(KCC) $(CPPFLAGS_ALL) $(WARN) $(CFLAGS) -ffp-contract=off -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	@ar rcs $@ $^

$(BUILD)/strand: $(APP_OBJ) $(LIB)
	@echo "  LINK    $@"
	@$(CC) $(CFLAGS) -o $@ $(APP_OBJ) $(LIB) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(LIB) tests/tap.h
	@mkdir -p $(dir $@)
	@echo "  TEST    $@"
	@$(CC) $(CPPFLAGS_ALL) -Itests $(WARN) $(CFLAGS) $< -o $@ $(LIB) $(LDLIBS)

deps:
	@scripts/deps.sh

test: deps
	@$(MAKE) --no-print-directory -j$(shell nproc 2>/dev/null || echo 2) all
	@tests/run.sh

# libFuzzer targets (clang): build/fuzz/<name>. The library is compiled once with the
# sanitizers (build/fuzz-obj) and each target links against it.
FUZZ_SRC := $(sort $(wildcard fuzz/fuzz_*.c))
FUZZ_BIN := $(FUZZ_SRC:fuzz/%.c=$(BUILD)/fuzz/%)
# the parsers' modules only: no kernels, backends or model arithmetic (a static library links
# what the targets reach; compiling the rest with the fuzzer's instrumentation took a minute)
FUZZ_LIB_SRC := $(filter-out src/kernels/% src/backend/% src/dist/% src/model/forward.c src/model/quantize.c \
                src/model/synth.c src/engine/batch.c src/engine/generate.c src/engine/perplexity.c \
                src/engine/scheduler.c src/vision/tower.c,$(LIB_SRC))
FUZZ_OBJ := $(FUZZ_LIB_SRC:%.c=$(BUILD)/fuzz-obj/%.o)
FUZZ_LIB := $(BUILD)/libstrand-fuzz.a
FUZZ_CFLAGS := -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
fuzz: $(FUZZ_BIN)
$(BUILD)/fuzz-obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC/FUZZ $<"
	@clang $(CPPFLAGS_ALL) $(FUZZ_CFLAGS) -c $< -o $@
$(FUZZ_LIB): $(FUZZ_OBJ)
	@rm -f $@
	@ar rcs $@ $^
$(BUILD)/fuzz/%: fuzz/%.c $(FUZZ_LIB)
	@mkdir -p $(dir $@)
	@echo "  FUZZ    $@"
	@clang $(CPPFLAGS_ALL) -O1 -g -fsanitize=fuzzer,address,undefined $< $(FUZZ_LIB) -o $@ $(LDLIBS)

# micro-benchmarks: build/bench/<name> (run by hand or by bench/*.sh)
BENCH_SRC := $(sort $(wildcard bench/bench_*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
bench: $(BENCH_BIN) $(BUILD)/strand
$(BUILD)/bench/%: bench/%.c $(LIB)
	@mkdir -p $(dir $@)
	@echo "  BENCH   $@"
	@$(CC) $(CPPFLAGS_ALL) -Itests $(WARN) $(CFLAGS) $< -o $@ $(LIB) $(LDLIBS)

demo: deps
	@$(MAKE) --no-print-directory $(BUILD)/strand
	@scripts/demo.sh

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
