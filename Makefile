# tk — one plain Makefile. Dependencies come from pkg-config; objects and binaries go to build/.
#
#   make              libtk (static + shared), the tk CLI, the default registry, tests and examples
#   make test         the whole test suite (no GPU, no network needed)
#   make test-gpu     the tests that need a GPU (skip cleanly without one)
#   make check-kernels   NVRTC over every package in kernels-src/ for sm_80 and sm_90
#   make asan         build + test with AddressSanitizer and UBSan into build-asan/
#   make fuzz         libFuzzer over every tests/fuzz/fuzz_*.c target (FUZZ_SECONDS each, 2 at a time)
#   make bench        benchmarks (see bench/RESULTS.md)
#   make gpu-bundle   build-gpu/ + .gpu/*.tgz: a relocatable bundle for a GPU machine (README: Running on a GPU)
#   make format       clang-format the C sources (make format-check: fail where it would change a line)

B       ?= build
PKGS    := libcurl libarchive libcrypto sqlite3 jansson
# OpenBLAS: the CPU reference of the linear op (cblas_sgemm)
PKGS    += openblas
# tokenizers (models/tokenizer.c): Unicode regexes and normalisation
PKGS    += libpcre2-8 libutf8proc
CC      ?= cc
OPT     ?= -O2 -g
WERROR  := $(if $(CI),-Werror,)
CFLAGS  += $(OPT) -std=gnu11 -Wall -Wextra -Wno-unused-parameter $(WERROR) -fPIC \
           -fvisibility=hidden -DTK_BUILDING_LIBRARY -Iinclude -I. -I$(B)/gen \
           $(shell pkg-config --cflags $(PKGS)) -MMD -MP
LDLIBS  := $(shell pkg-config --libs $(PKGS)) -ldl -lpthread -lm
SOMAJOR := 0
# libmicrohttpd: only the server (hub/serve.c, linked into the tk command and libtkhub-serve)
SERVE_PKGS := libmicrohttpd
# libcmark: the server's package pages render each README's Markdown (hub/serve.c, CMARK_OPT_SAFE)
SERVE_PKGS += libcmark
CFLAGS  += $(shell pkg-config --cflags $(SERVE_PKGS))
SERVE_LDLIBS := $(shell pkg-config --libs $(SERVE_PKGS))

# MPI (comm/mpi.c), optional: Open MPI (pkg-config ompi-c) or MPICH (mpich), linked when found.
# MPI=0 builds without it (the GPU bundle does); MPI=ompi-c or MPI=mpich picks one. Without MPI, tk
# runs one process alone as before, and NCCL bootstraps through a file (docs/parallel.md).
ifeq ($(origin MPI),undefined)
MPI     := $(firstword $(foreach p,ompi-c mpich,$(if $(shell pkg-config --exists $(p) && echo y),$(p))))
endif
ifneq ($(filter-out 0,$(MPI)),)
CFLAGS  += -DTK_HAVE_MPI $(shell pkg-config --cflags $(MPI))
LDLIBS  += $(shell pkg-config --libs $(MPI))
endif

# The HTTP servers (hub/serve.c, the registry's, and serve/*.c, the model server's) are not in libtk: only
# the tk command and libtkhub-serve link them and libmicrohttpd.
SERVE_SRC := $(wildcard hub/serve*.c serve/*.c)
LIB_SRC := $(filter-out $(SERVE_SRC),$(wildcard common/*.c cache/*.c manifest/*.c hub/*.c jit/*.c ops/*.c comm/*.c models/*.c api/*.c))
CLI_SRC := $(wildcard cli/*.c)
TEST_SRC := $(wildcard tests/test_*.c)
EX_SRC  := $(wildcard examples/*.c)
BENCH_SRC := $(wildcard bench/*.c)

LIB_OBJ := $(LIB_SRC:%.c=$(B)/obj/%.o)
SERVE_OBJ := $(SERVE_SRC:%.c=$(B)/obj/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(B)/obj/%.o)
TESTS   := $(TEST_SRC:tests/%.c=$(B)/tests/%)
EXAMPLES := $(EX_SRC:examples/%.c=$(B)/examples/%)
BENCHES := $(BENCH_SRC:bench/%.c=$(B)/bench/%)

# Fuzz targets (tests/fuzz/README.md): every tests/fuzz/fuzz_<name>.c. Each links the library and the
# cli units in FUZZ_LINK; `all` builds it with a standalone driver ($(B)/fuzz/replay_<name>) so
# `make test` replays its corpus with any compiler; `make fuzz` builds it with clang's libFuzzer, ASan
# and UBSan into $(FB)/.
FUZZ_SRC   := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_NAMES := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=%)
FUZZ_LINK  := $(B)/obj/cli/shape.o $(SERVE_OBJ)
FUZZ_REPLAY := $(FUZZ_NAMES:%=$(B)/fuzz/replay_%)
FB         := build-fuzz
FUZZ_CC    ?= clang
FUZZ_SAN   := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_SECONDS ?= 180
FUZZ_JOBS  ?= 2
.SECONDARY: $(FUZZ_NAMES:%=$(B)/obj/tests/fuzz/fuzz_%.o) $(B)/obj/tests/fuzz/driver.o

# The embedded default registry: every package in kernels-src/, published by this build with a key
# this build makes (kept across builds in $(B)/default-key.pem) and trusts.
KEY     := $(B)/default-key.pem
REGISTRY := $(abspath $(B))/registry
# The built-in default endpoint. Empty: the registry/ beside the binary or libtk.so (api/ctx.c), which
# is also the fallback when this directory does not exist (a relocated build).
DEFAULT_ENDPOINT ?= file://$(REGISTRY)
DEFAULT_ORG := kernels-community
PKG_FILES := $(shell find kernels-src -type f 2>/dev/null)

.PHONY: all lib test test-gpu check-kernels asan bench format format-check clean registry gpu-bundle
all: lib $(B)/tk registry $(TESTS) $(EXAMPLES) $(BENCHES) $(B)/tests/test_ops_cpu_portable
lib: $(B)/libtk.a $(B)/libtk.so.$(SOMAJOR)

$(KEY):
	@mkdir -p $(dir $@)
	openssl genpkey -algorithm ed25519 -out $@ 2>/dev/null
	chmod 600 $@

# Generated header: the default endpoint and the public key of the build's registry key.
$(B)/gen/tk_default.h: $(KEY) Makefile
	@mkdir -p $(dir $@)
	@pub=$$(openssl pkey -in $(KEY) -pubout -outform DER | tail -c 32 | od -An -tx1 | tr -d ' \n'); \
	{ echo "/* generated by make: do not edit */"; \
	  echo "#ifndef TK_DEFAULT_ENDPOINT /* make install compiles api/ctx.c with its own */"; \
	  echo "#define TK_DEFAULT_ENDPOINT \"$(DEFAULT_ENDPOINT)\""; \
	  echo "#endif"; \
	  echo "#define TK_DEFAULT_ORG \"$(DEFAULT_ORG)\""; \
	  echo "#define TK_DEFAULT_PUBKEY \"ed25519:$$pub\""; } > $@.tmp && mv $@.tmp $@

# The build id: a digest of the library's sources and headers. Ranks of one job compare it when they
# join (comm/mpi.c): tensor parallelism sends generation options as struct bytes and steps every rank
# alike, so every rank must run the same tk. `tk --version` prints it.
$(B)/gen/tk_build_id.h: $(LIB_SRC) $(SERVE_SRC) $(wildcard */*.h) include/tk.h
	@mkdir -p $(dir $@)
	@id=$$(cat $(sort $^) | sha256sum | cut -c1-16); \
	{ echo "/* generated by make: do not edit */"; echo "#define TK_BUILD_ID \"$$id\""; } > $@.tmp && \
	if cmp -s $@.tmp $@; then rm $@.tmp; else mv $@.tmp $@; fi
$(B)/obj/common/err.o: $(B)/gen/tk_build_id.h

# <tk/device.cuh>, the device toolkit NVRTC gets in memory (jit/toolkit.c): the bytes of
# jit/device/tk_device.cuh as a NUL-terminated C array.
$(B)/gen/tk_device_cuh.h: jit/device/tk_device.cuh
	@mkdir -p $(dir $@)
	@{ echo "/* generated by make from $<: do not edit */"; echo "static const unsigned char tk_device_cuh[] = {"; \
	  od -An -v -tx1 $< | sed 's/\([0-9a-f][0-9a-f]\)/0x\1,/g'; echo "0x00};"; } > $@.tmp && mv $@.tmp $@
$(B)/obj/jit/toolkit.o: $(B)/gen/tk_device_cuh.h

$(B)/obj/%.o: %.c | $(B)/gen/tk_default.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(B)/libtk.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(B)/libtk.so.$(SOMAJOR): $(LIB_OBJ)
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libtk.so.$(SOMAJOR) -o $@ $^ $(LDLIBS)
	ln -sf libtk.so.$(SOMAJOR) $(B)/libtk.so

$(B)/tk: $(CLI_OBJ) $(SERVE_OBJ) $(B)/libtk.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(SERVE_OBJ) $(B)/libtk.a $(LDLIBS) $(SERVE_LDLIBS)

# tk linked against an MPICH unpacked in MPICH_DIR (include/mpi.h, lib/libmpi.so.12: PyPI's mpich
# wheel has them), from a build without MPI (MPI=0): the GPU bundle's tk-mpi (scripts/gpu-bundle.sh),
# so a GPU machine without an MPI can run a split model under the bundle's mpiexec. comm/mpi.c is the
# only object MPI changes; every other one is this build's.
$(B)/tk-mpi: $(CLI_OBJ) $(SERVE_OBJ) $(B)/libtk.a comm/mpi.c comm/comm.h
	@test -f "$(MPICH_DIR)/include/mpi.h" && test -f "$(MPICH_DIR)/lib/libmpi.so.12" || { \
	  echo "make $@: MPICH_DIR='$(MPICH_DIR)' lacks include/mpi.h or lib/libmpi.so.12" >&2; exit 1; }
	@test -z "$(filter-out 0,$(MPI))" || { echo "make $@: wants a build without MPI (MPI=0), not MPI=$(MPI)" >&2; exit 1; }
	@mkdir -p $(B)/mpich-obj
	$(CC) -I$(MPICH_DIR)/include $(CFLAGS) -DTK_HAVE_MPI -c comm/mpi.c -o $(B)/mpich-obj/mpi.o
	cp $(B)/libtk.a $(B)/mpich-obj/libtk.a && ar r $(B)/mpich-obj/libtk.a $(B)/mpich-obj/mpi.o
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(SERVE_OBJ) $(B)/mpich-obj/libtk.a $(LDLIBS) $(SERVE_LDLIBS) \
	  $(MPICH_DIR)/lib/libmpi.so.12
# test_comm against the same MPICH: its MPI workers (GPU tensors staged through host memory among them)
# under the bundle's mpiexec on the GPU machine
$(B)/tests/test_comm-mpi: tests/test_comm.c $(B)/tk-mpi $(wildcard tests/*.h)
	$(CC) -I$(MPICH_DIR)/include $(CFLAGS) -DTK_HAVE_MPI $(LDFLAGS) -Itests $< -o $@ $(B)/mpich-obj/libtk.a \
	  $(LDLIBS) $(MPICH_DIR)/lib/libmpi.so.12

$(B)/tests/%: tests/%.c $(B)/libtk.a $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -Itests $< -o $@ $(B)/libtk.a $(LDLIBS)

# test_ops_cpu again with the fast CPU ops compiled as where there is no x86 SIMD (-DTK_CPU_NO_SIMD:
# the plain-C implementations only, what aarch64 builds), in a copy of libtk.a: tests/run.sh runs both.
CPU_PORTABLE_SRC := ops/cpu_dispatch.c ops/cpu_linear.c ops/cpu_attention.c ops/cpu_fused.c ops/parallel.c
$(B)/tests/test_ops_cpu_portable: tests/test_ops_cpu.c $(CPU_PORTABLE_SRC) ops/cpu.h ops/cpu_simd.h $(B)/libtk.a $(wildcard tests/*.h)
	@mkdir -p $(B)/portable $(dir $@)
	for f in $(CPU_PORTABLE_SRC); do $(CC) $(CFLAGS) -DTK_CPU_NO_SIMD -c $$f -o $(B)/portable/$$(basename $$f .c).o || exit 1; done
	cp $(B)/libtk.a $(B)/portable/libtk.a
	cd $(B)/portable && ar r libtk.a $(notdir $(CPU_PORTABLE_SRC:.c=.o))
	$(CC) $(CFLAGS) $(LDFLAGS) -Itests $< -o $@ $(B)/portable/libtk.a $(LDLIBS)

$(B)/examples/%: examples/%.c $(B)/libtk.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< -o $@ $(B)/libtk.a $(LDLIBS)

$(B)/bench/%: bench/%.c $(B)/libtk.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< -o $@ $(B)/libtk.a $(LDLIBS)

$(B)/fuzz/replay_%: $(B)/obj/tests/fuzz/fuzz_%.o $(B)/obj/tests/fuzz/driver.o $(FUZZ_LINK) $(B)/libtk.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(SERVE_LDLIBS)

$(B)/fuzz/fuzz_%: $(B)/obj/tests/fuzz/fuzz_%.o $(FUZZ_LINK) $(B)/libtk.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS) $(SERVE_LDLIBS)

# One line per package: its directory and the commit it got. --no-compile: 'make check-kernels'
# compiles every package for sm_80 and sm_90.
registry: $(B)/registry/.stamp
$(B)/registry/.stamp: $(B)/tk $(KEY) $(PKG_FILES)
	@rm -rf $(B)/registry.tmp
	@for d in kernels-src/*/; do \
	  [ -f $$d/kernel.json ] || continue; \
	  c=$$(TK_HOME=$(B)/.publish-home $(B)/tk publish $$d --to $(B)/registry.tmp --key $(KEY) --quiet --no-compile) || exit 1; \
	  printf "registry: published kernels-src/%-24s commit %s\n" "$$(basename $$d)" "$$c"; \
	done
	@rm -rf $(B)/registry && mv $(B)/registry.tmp $(B)/registry && touch $@
	@echo "registry: $(REGISTRY)"

test: all gpu-bundle
	@bash scripts/setup.sh --test
	@bash tests/run.sh

test-gpu: all
	@TK_TEST_GPU=1 bash tests/run.sh gpu

check-kernels: $(B)/tk registry
	@bash tests/check_kernels.sh

asan:
	$(MAKE) B=build-asan OPT="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=address,undefined" all
	TK_BUILD=build-asan bash tests/run.sh

.PHONY: fuzz fuzz-build fuzz-targets fuzz-replay-build
all: $(FUZZ_REPLAY)
# make test replays the fuzz corpora (tests/fuzz/replay.sh, run by tests/run.sh) with the libFuzzer +
# ASan + UBSan build where clang has libFuzzer: $(B)/fuzz/libfuzzer-bin names it; else the drivers.
test: fuzz-replay-build
fuzz-replay-build: $(FUZZ_REPLAY)
	@if bash tests/fuzz/have-libfuzzer.sh $(FUZZ_CC); then $(MAKE) --no-print-directory fuzz-build && \
	  echo $(FB)/fuzz > $(B)/fuzz/libfuzzer-bin; else rm -f $(B)/fuzz/libfuzzer-bin; fi

# The fuzz build: the library and every target with clang, libFuzzer, ASan and UBSan, in $(FB)/.
# A plain `make test` (no -j) builds it every time the library changed: one job per core then.
fuzz-build:
	@bash tests/fuzz/have-libfuzzer.sh $(FUZZ_CC) || { echo "make fuzz needs clang with libFuzzer (scripts/setup.sh installs it)"; exit 1; }
	@$(MAKE) --no-print-directory $(if $(filter -j%,$(MAKEFLAGS)),,-j$(shell nproc)) B=$(FB) CC=$(FUZZ_CC) \
	  OPT="-O1 -g $(FUZZ_SAN) -fsanitize=fuzzer-no-link" LDFLAGS="$(FUZZ_SAN)" fuzz-targets
fuzz-targets: $(FUZZ_NAMES:%=$(B)/fuzz/fuzz_%)

# Runs every target for FUZZ_SECONDS, FUZZ_JOBS at a time; a crash is minimised into its regress/.
fuzz: fuzz-build
	@FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) bash tests/fuzz/run.sh $(FB)/fuzz

bench: all
	@bash bench/run.sh

# The GPU bundle: its own build dir (no fixed registry path, $$ORIGIN RPATH), packed into .gpu/.
gpu-bundle:
	@bash scripts/gpu-bundle.sh

# make install [PREFIX=/usr/local] [DESTDIR=]: the tk command, libtkhub (.so/.a, no libmicrohttpd),
# libtkhub-serve (libtkhub plus the server), <tkhub/tk.h>, pkg-config tkhub/tkhub-serve, the CMake
# package tkhub, the default registry (share/tkhub/registry) and the docs. See scripts/install.mk.
include scripts/install.mk

# The layout of .clang-format needs clang-format 18 or newer (Debian: clang-format-19). format-check
# fails on any file `make format` would change (tests/cli/layers.sh runs it; docs/hacking.md).
CLANG_FORMAT ?= $(firstword $(shell command -v clang-format-19 clang-format-18 clang-format 2>/dev/null) clang-format)
FORMAT_SRC := $(sort $(LIB_SRC) $(SERVE_SRC) $(CLI_SRC) $(TEST_SRC) $(EX_SRC) $(BENCH_SRC) $(FUZZ_SRC) include/tk.h \
              $(wildcard */*.h tests/fuzz/*.[ch] tests/install/*.c bench/shim/*.c))

format:
	$(CLANG_FORMAT) -i $(FORMAT_SRC)

format-check:
	$(CLANG_FORMAT) --dry-run -Werror $(FORMAT_SRC)

clean:
	rm -rf $(B)/obj $(B)/tests $(B)/examples $(B)/tk $(B)/libtk.* $(B)/registry $(B)/gen $(B)/fuzz $(B)/install

-include $(shell find $(B)/obj -name '*.d' 2>/dev/null)
# Test, example and bench binaries are compiled and linked in one step; -MMD writes their header
# dependencies beside them ($(B)/tests/test_x.d), so a changed header rebuilds them too.
-include $(wildcard $(B)/tests/*.d $(B)/examples/*.d $(B)/bench/*.d)
