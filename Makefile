# hylo build. Plain GNU make: every .c under src/ goes into libhylo.a, cli/ links
# against it, every tests/<layer>/test_*.c becomes its own cmocka executable.
#
#   make                 build/hylo (with the CUDA backend when nvcc is found)
#   make test            fetch the default model if needed, build and run the CPU tests
#                        (with CUDA: also build the CUDA tests and the benchmarks)
#   make MODE=asan test  the same under AddressSanitizer + UBSan (build-asan/)
#   make CUDA=0          build without the CUDA backend
#   make test-cuda       CUDA-vs-CPU tests (needs a GPU)
#   make bench           the benchmarks (bench/), bench_attn, bench_gdn and bench_decode also in the bench-variants build (below)
#   make fuzz            libFuzzer targets of every file parser (token shards included) (clang; docs/FUZZING.md)
#   make fuzz-smoke      each of them briefly on its corpus (CI)
#   make format / make format-check
#
# One kernel per job: build/hylo and libhylo.a have no kernel variants and read
# no environment knobs that pick one. Variants kept for comparison (attention
# backward, MLA decode, the GDN state passes on mma.sync, the few-row product's
# columns per warp, the block-format product's bulk copies) are compiled only with
# -DHYLO_BENCH_VARIANTS, in the bench-variants build: the CUDA files that hold
# them compiled again into $(BUILD)/bench-variants/, a library of those and the
# rest of libhylo.a's objects, and, against it, bench_attn (--compare, --sweep),
# bench_gdn (--compare), bench_decode, bench_cuda_core, bench_long and the CUDA
# tests of the variants, test_cuda_attn, test_cuda_gdn, test_cuda_core and
# test_cuda_quant
# (docs/PERFORMANCE.md). `make bench` builds its benchmarks,
# `make test` (with CUDA) all of them, `make test-cuda` runs its tests too.

MODE ?= release
CC ?= gcc
NVCC ?= nvcc
CUDA_HOME ?= /usr/local/cuda

# CUDA backend: on when nvcc exists unless CUDA=0 (asan builds never link CUDA).
ifeq ($(MODE),asan)
CUDA ?= 0
endif
CUDA ?= $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1 || echo 0)

# Each configuration builds into its own folder, so objects never mix.
ifeq ($(MODE),asan)
BUILD ?= build-asan
OPT = -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDSAN = -fsanitize=address,undefined
else ifeq ($(MODE),debug)
BUILD ?= build-debug
OPT = -O0 -g
else ifeq ($(CUDA),0)
BUILD ?= build-cpu
OPT = -O2 -g -march=x86-64-v3
else
BUILD ?= build
OPT = -O2 -g -march=x86-64-v3
endif

WARN = -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
CFLAGS = -std=c17 $(OPT) $(WARN) -fopenmp -D_GNU_SOURCE -Isrc -I. -Itests
LDLIBS = -lopenblas -llapacke -lpcre2-8 -lcjson -lyaml -lzstd -lmicrohttpd -lm -lpthread

# MPI (OpenMPI: libopenmpi-dev + openmpi-bin, scripts/setup.sh): hylo train runs as one
# rank of an `mpirun -np N` job, or alone (a singleton MPI_Init). The compiler
# wrapper's flags, or pkg-config's when the wrapper is missing.
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null || pkg-config --cflags ompi-c 2>/dev/null)
MPI_LIBS := $(shell mpicc --showme:link 2>/dev/null || pkg-config --libs ompi-c 2>/dev/null)
CFLAGS += $(MPI_CFLAGS)
LDLIBS += $(MPI_LIBS)

CSRC := $(shell find src -name '*.c' | sort)
CUSRC :=
ifeq ($(CUDA),1)
CFLAGS += -DHYLO_CUDA=1 -I$(CUDA_HOME)/include
CUSRC := $(shell find src -name '*.cu' | sort)
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lnccl -lstdc++
endif
NVFLAGS = -std=c++17 -O3 -g -lineinfo -Isrc -DHYLO_CUDA=1 \
  -gencode=arch=compute_90a,code=sm_90a -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter,-fPIC \
  --expt-relaxed-constexpr -Werror all-warnings

OBJ := $(CSRC:%.c=$(BUILD)/obj/%.o) $(CUSRC:%.cu=$(BUILD)/obj/%.cu.o)
LIB := $(BUILD)/libhylo.a
BIN := $(BUILD)/hylo
CLISRC := $(shell find cli -name '*.c' | sort)
CLIOBJ := $(CLISRC:%.c=$(BUILD)/obj/%.o)

TESTSRC := $(shell find tests -path tests/cuda -prune -o -name 'test_*.c' -print | sort)
TESTBIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TESTSRC))
CUDATESTSRC := $(shell find tests/cuda -name 'test_*.c' 2>/dev/null | sort)
CUDATESTBIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(CUDATESTSRC))
TESTUTIL := $(BUILD)/obj/tests/testutil.o
BENCHSRC := $(shell find bench -name '*.c' | sort)
BENCHBIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCHSRC))

# The bench-variants build (header): its objects, library and binaries.
VARDIR := $(BUILD)/bench-variants
VARCU := src/backend/cuda/cuda_attn.cu src/backend/cuda/cuda_mla.cu src/backend/cuda/cuda_gdn.cu src/backend/cuda/cuda_core.cu \
	src/backend/cuda/cuda_quant.cu
VAROBJ := $(filter-out $(VARCU:%.cu=$(BUILD)/obj/%.cu.o),$(OBJ)) $(VARCU:%.cu=$(VARDIR)/obj/%.cu.o)
VARLIB := $(VARDIR)/libhylo.a
VARBENCHBIN :=
VARTESTBIN :=
ifeq ($(CUDA),1)
VARBENCHBIN := $(VARDIR)/bench/bench_attn $(VARDIR)/bench/bench_gdn $(VARDIR)/bench/bench_decode \
	$(VARDIR)/bench/bench_cuda_core $(VARDIR)/bench/bench_long
VARTESTBIN := $(VARDIR)/tests/cuda/test_cuda_attn $(VARDIR)/tests/cuda/test_cuda_gdn \
	$(VARDIR)/tests/cuda/test_cuda_core $(VARDIR)/tests/cuda/test_cuda_quant
endif

.PHONY: all test test-cuda bench fuzz fuzz-smoke format format-check clean model demo
.SECONDARY: $(TESTUTIL)
all: $(BIN)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# Kernels chosen at run time (src/backend/cpu/cpu_quant.c probes the CPU):
# compiled for their instruction set whatever -march the build uses.
$(BUILD)/obj/src/backend/cpu/cpu_quant_avx2.o: CFLAGS += -mavx2 -mfma -mf16c
# The attention's row loop, decode and tiles all multiply-add with FMA (the same
# contraction in every path keeps them bit for bit alike; cpu_attn.c). Its
# 8-float vectors pass between static functions only (-Wno-psabi: without AVX,
# as under MODE=asan, GCC warns of an ABI no caller outside the file sees).
$(BUILD)/obj/src/backend/cpu/cpu_attn.o: CFLAGS += -ffp-contract=fast -Wno-psabi

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(OBJ)
	@rm -f $@
	ar rcs $@ $^

$(VARDIR)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -DHYLO_BENCH_VARIANTS -MMD -MP -c $< -o $@

$(VARLIB): $(VAROBJ)
	@rm -f $@
	ar rcs $@ $^

# The commit that hylo eval / bench record in their results: cmd_eval.o is
# rebuilt when it changes (version.txt is rewritten only then).
HYLO_VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
$(shell mkdir -p $(BUILD) && (echo '$(HYLO_VERSION)' | cmp -s - $(BUILD)/version.txt || echo '$(HYLO_VERSION)' > $(BUILD)/version.txt))
$(BUILD)/obj/cli/cmd_eval.o: $(BUILD)/version.txt
$(BUILD)/obj/cli/cmd_eval.o: CFLAGS += -DHYLO_VERSION='"$(HYLO_VERSION)"'

$(BIN): $(CLIOBJ) $(LIB)
	$(CC) $(CFLAGS) $(LDSAN) $(CLIOBJ) $(LIB) $(LDLIBS) -o $@

$(BUILD)/tests/%: tests/%.c $(LIB) $(TESTUTIL)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDSAN) $< $(TESTUTIL) $(LIB) $(LDLIBS) -lcmocka -o $@

$(BUILD)/bench/%: bench/%.c $(wildcard bench/*.h) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDSAN) $< $(LIB) $(LDLIBS) -o $@

$(VARDIR)/tests/%: tests/%.c $(VARLIB) $(TESTUTIL)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DHYLO_BENCH_VARIANTS $(LDSAN) $< $(TESTUTIL) $(VARLIB) $(LDLIBS) -lcmocka -o $@

$(VARDIR)/bench/%: bench/%.c $(wildcard bench/*.h) $(VARLIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DHYLO_BENCH_VARIANTS $(LDSAN) $< $(VARLIB) $(LDLIBS) -o $@

# The tests run from the repository root; HYLO_MODEL points at the default GGUF.
# With the CUDA backend, the CUDA tests and the benchmarks are built too (not
# run: they need a GPU), so that CI compiles them.
TESTDEPS := $(BIN) $(TESTBIN)
ifeq ($(CUDA),1)
TESTDEPS += $(CUDATESTBIN) $(BENCHBIN) $(VARTESTBIN) $(VARBENCHBIN)
endif
test: $(TESTDEPS)
	@scripts/fetch_model.sh >/dev/null
	@HYLO_MODEL=$$(scripts/fetch_model.sh --path) HYLO_BIN=$(BIN) scripts/run_tests.sh $(TESTBIN)

# HYLO_REQUIRE_GPU=1: a missing GPU fails the tests instead of skipping them.
test-cuda: $(BIN) $(CUDATESTBIN) $(VARTESTBIN)
	@scripts/fetch_model.sh >/dev/null
	@HYLO_REQUIRE_GPU=1 HYLO_MODEL=$$(scripts/fetch_model.sh --path) HYLO_BIN=$(BIN) scripts/run_tests.sh \
	  $(CUDATESTBIN) $(VARTESTBIN)

bench: $(BIN) $(BENCHBIN) $(VARBENCHBIN)

model:
	@scripts/fetch_model.sh

demo: $(BIN)
	@BIN=$(BIN) scripts/demo.sh

# The fuzz targets share one library of the sources they reach, compiled once
# with the fuzzer's coverage instrumentation and the sanitizers.
FUZZ_TARGETS := $(patsubst fuzz/%.c,build-fuzz/%,$(wildcard fuzz/fuzz_*.c))
FUZZSRC := $(filter src/base/%.c src/io/%.c src/tok/%.c src/model/arch.c src/model/params.c src/train/shard.c src/serve/openai.c,$(CSRC))
FUZZOBJ := $(FUZZSRC:%.c=build-fuzz/obj/%.o)
FUZZFLAGS = -std=c17 -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -D_GNU_SOURCE -Isrc
fuzz: $(FUZZ_TARGETS)
build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
build-fuzz/libfuzz.a: $(FUZZOBJ)
	@rm -f $@
	ar rcs $@ $^
build-fuzz/%: fuzz/%.c fuzz/fuzz_util.h build-fuzz/libfuzz.a
	clang $(FUZZFLAGS) -Wall -Wextra -Werror -Wno-unused-parameter -fsanitize=fuzzer $< build-fuzz/libfuzz.a \
	  -lpcre2-8 -lcjson -lyaml -lm -o $@

# A short run of every target on its committed corpus (new inputs go to a
# scratch folder): what CI runs.
FUZZ_SMOKE_S ?= 5
fuzz-smoke: $(FUZZ_TARGETS)
	@for t in $(FUZZ_TARGETS); do n=$${t#build-fuzz/fuzz_}; mkdir -p build-fuzz/smoke_$$n; \
	  echo "fuzz: $$t, $(FUZZ_SMOKE_S) s on fuzz/corpus_$$n"; \
	  $$t -max_total_time=$(FUZZ_SMOKE_S) -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	    build-fuzz/smoke_$$n fuzz/corpus_$$n > build-fuzz/smoke_$$n.log 2>&1 || { tail -40 build-fuzz/smoke_$$n.log; exit 1; }; \
	  grep -E '^stat::number_of_executed_units|^Done' build-fuzz/smoke_$$n.log; \
	done

FMTSRC = $(shell find src cli tests bench fuzz -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | grep -v fixtures)
format:
	clang-format -i $(FMTSRC)
format-check:
	@clang-format --dry-run --Werror $(FMTSRC)

clean:
	rm -rf build build-cpu build-asan build-debug build-fuzz

-include $(shell find $(BUILD)/obj $(VARDIR)/obj -name '*.d' 2>/dev/null)
-include $(shell find build-fuzz/obj -name '*.d' 2>/dev/null)
