/*
 * cpu.h — fast CPU implementations of ops, beside the references (ops/cpu_*.c), and the thread pool
 * every CPU op shares (ops/parallel.c).
 *
 * The references (each op's tk_op_desc.cpu) stay simple and exact: they are the oracles. A fast
 * implementation is an entry in the table of ops/cpu_dispatch.c: the op it implements, the CPU
 * features it needs (detected at run time with cpuid and xgetbv, so one binary runs on any x86-64),
 * and a fits() that says whether it takes a call (dtypes, shapes, strides, scalars). tk_op_run runs
 * the first entry, in table order (fastest first), that the CPU can run and that fits the call, else
 * the reference. TK_CPU_IMPL=reference forces the references; TK_CPU_IMPL=portable allows only the
 * entries that need no ISA extension (the C fallbacks every architecture builds).
 *
 * The SIMD code is compiled per function for its ISA (GCC's and clang's target attributes), never for
 * the whole file, so the library keeps the baseline x86-64 ABI; on other architectures only the
 * portable entries exist.
 *
 * Internal names are tk_ops__<verb>. Nothing here prints or exits.
 */
#ifndef TK_OPS_CPU_H
#define TK_OPS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "ops/ops.h"

/* 1 where the x86 SIMD kernels are compiled (x86-64, unless TK_CPU_NO_SIMD is defined: a build of the
 * portable implementations alone, as other architectures get; the tests run it that way too). */
#if defined(__x86_64__) && !defined(TK_CPU_NO_SIMD)
#define TK_CPU_X86 1
#else
#define TK_CPU_X86 0
#endif

/* ---- CPU features ------------------------------------------------------------------------------ */

enum {
    TK_CPU_AVX2 = 1u << 0,
    TK_CPU_FMA = 1u << 1,
    TK_CPU_F16C = 1u << 2,
    TK_CPU_AVX512F = 1u << 3,   /* with BW, DQ and VL: tk asks for the four together */
    TK_CPU_AVX512BF16 = 1u << 4,
    TK_CPU_AVX512VNNI = 1u << 5,
    TK_CPU_AVXVNNI = 1u << 6,
    TK_CPU_AMX = 1u << 7,       /* AMX-TILE, AMX-BF16 and AMX-INT8, and the OS manages the tile state */
    TK_CPU_NEON = 1u << 8,      /* aarch64 */
};
/* The AVX2 level the x86 kernels of cpu_*.c need: AVX2, FMA and F16C (Haswell, Zen and later). */
#define TK_CPU_X86_AVX2 (TK_CPU_AVX2 | TK_CPU_FMA | TK_CPU_F16C)

/* The features of the CPU this process runs on (detected once; the OS must have enabled the register
 * state, as xgetbv says). */
unsigned tk_ops__cpu_features(void);
/* The name of one feature bit ("avx2"), NULL if the bit is not a feature. */
const char *tk_ops__cpu_feature_str(unsigned bit);

/* ---- implementations --------------------------------------------------------------------------- */

typedef struct {
    const char *op;     /* the op it implements: "linear" */
    const char *impl;   /* what tk_op_run reports: "cpu-avx2" */
    unsigned needs;     /* TK_CPU_* bits the CPU must have */
    /* 1 when it takes this call (validated by the op's checks): dtypes, contiguity, scalars. */
    int (*fits)(const tk_op_call *c);
    int (*run)(const tk_op_call *c);
    const char *doc;    /* one line for `tk ops`: what it covers */
} tk_cpu_impl;

/* TK_CPU_IMPL: which implementations may run. */
enum { TK_CPU_MODE_AUTO = 0, TK_CPU_MODE_PORTABLE = 1, TK_CPU_MODE_REFERENCE = 2 };
/* The mode from TK_CPU_IMPL (read once: auto, portable or reference; anything else is auto). */
int tk_ops__cpu_mode(void);

/* 1 when TK_CPU_Q8=1 (read once): implementations that round activations beyond an op's contract
 * (casted_linear's cpu-avx2-q8 quantises x as llama.cpp's Q8_0 does) may take calls; else they refuse. */
int tk_ops__cpu_act_quant(void);
/* Overrides TK_CPU_Q8 (tests). */
void tk_ops__cpu_set_act_quant(int on);

size_t tk_ops__cpu_impl_count(void);
const tk_cpu_impl *tk_ops__cpu_impl_at(size_t i);
/* 1 when this CPU can run it and the mode allows it. */
int tk_ops__cpu_impl_usable(const tk_cpu_impl *im);
/* The implementation tk_op_run would run for a prepared host call, NULL for the reference. */
const tk_cpu_impl *tk_ops__cpu_pick(const tk_op_call *c);
/* Runs a prepared host call on the fastest implementation that fits, else the reference; *impl (when
 * not NULL) gets the name of what ran ("cpu-avx2", or "cpu-reference"). */
int tk_ops__run_cpu_best(const tk_op_call *c, const char **impl);

#define TK_CPU_IMPL_REFERENCE "cpu-reference"

/* The tables of the cpu_*.c files (cpu_dispatch.c joins them in this order of preference). */
extern const tk_cpu_impl tk_ops__cpu_linear_impls[]; /* ops/cpu_linear.c */
extern const size_t tk_ops__cpu_linear_count;
extern const tk_cpu_impl tk_ops__cpu_attn_impls[]; /* ops/cpu_attention.c */
extern const size_t tk_ops__cpu_attn_count;
extern const tk_cpu_impl tk_ops__cpu_fused_impls[]; /* ops/cpu_fused.c */
extern const size_t tk_ops__cpu_fused_count;

/* ---- the thread pool (ops/parallel.c) ------------------------------------------------------------ */

/* The threads a call on this thread may use: n > 0 sets it (the calling thread included), 0 the
 * default (TK_NUM_THREADS, else the CPUs this process may run on). Returns the previous value (0 for
 * the default). Thread-local: tk_op_run sets it from the context for the duration of a call. */
int tk_ops__set_threads(int n);
/* The threads a call on this thread would use now (>= 1). */
int tk_ops__threads(void);
/* The default: TK_NUM_THREADS when set to 1..256, else the CPUs in this process's affinity mask. */
int tk_ops__default_threads(void);

/* Runs fn(arg, lo, hi) over [0, n) in ranges of `grain` items (the last may be shorter), on up to
 * `max_threads` threads of the pool (<= 0: tk_ops__threads()), the calling thread among them. Ranges
 * are handed out dynamically, so a thread the OS delays costs only its current range. A call made while
 * the pool is busy (a nested call, or another thread's) runs on the calling thread alone. */
void tk_ops__parallel_for(int64_t n, int64_t grain, int max_threads, void (*fn)(void *arg, int64_t lo, int64_t hi),
                          void *arg);

/* ---- helpers the implementations share (ops/cpu_dispatch.c) ------------------------------------- */

/* 1 when t is f32 / f16 / bf16, with unit stride in its last dimension and rows evenly spaced (the row
 * stride in *row_stride, in elements): the layout the kernels index directly. */
int tk_ops__cpu_rows(const tk_tensor *t, int64_t *row_stride);
/* The product of all but the last dimension (1 for rank 0 and 1). */
int64_t tk_ops__cpu_nrows(const tk_tensor *t);

/* A per-thread scratch buffer of at least `bytes` (64-byte aligned), grown as needed and kept for the
 * thread's life; slot 0..3 are distinct buffers. NULL when out of memory. Never free it. */
void *tk_ops__cpu_scratch(int slot, size_t bytes);

#endif /* TK_OPS_CPU_H */
