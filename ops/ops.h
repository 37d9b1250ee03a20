/*
 * ops.h — the op registry: every standard op's typed signature, its validation and its CPU reference.
 *
 * An op is a table entry (tk_op_desc): its parameters (tensors with allowed dtypes and ranks, scalars
 * with defaults), a shape check that names the argument and the shape it got, and a CPU reference
 * that computes in fp32 (or better) on host tensors. Each family of ops is one table in its own file
 * (ops/activation.c); ops/registry.c lists the tables, so norms, RoPE, softmax, cross-entropy and
 * attention are added as new tables without touching the dispatch.
 *
 * Use:  tk_op_call c;  tk_ops__prepare(&c, "silu_and_mul", args, nargs);  then  tk_ops__run_cpu(&c)
 * for host tensors, or hand c's bound arguments to a package kernel (api/op.c does the dispatch).
 *
 * Internal names are tk_ops__<verb>. Nothing here prints or exits; errors go through tk__err.
 */
#ifndef TK_OPS_H
#define TK_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* ---- dtypes ----------------------------------------------------------------------------------- */

/* One bit per dtype an op parameter may accept. */
enum {
    TK_OPS_F32 = 1u << 0,
    TK_OPS_F16 = 1u << 1,
    TK_OPS_BF16 = 1u << 2,
    TK_OPS_F64 = 1u << 3,
    TK_OPS_I32 = 1u << 4,
    TK_OPS_I64 = 1u << 5,
    TK_OPS_I8 = 1u << 6,
    TK_OPS_U8 = 1u << 7,
    TK_OPS_FP8_E4M3 = 1u << 8,
    TK_OPS_FP8_E5M2 = 1u << 9,
};
#define TK_OPS_FLOATS (TK_OPS_F32 | TK_OPS_F16 | TK_OPS_BF16)

/* The bit of a dtype, or 0 for one no op knows (lanes != 1, odd widths). */
unsigned tk_ops__dtype_bit(tk_dtype dt);
/* The manifest name of a dtype ("bf16"), "?" for an unknown one. */
const char *tk_ops__dtype_str(tk_dtype dt);
/* The manifest name of a single dtype bit, NULL if the bit is not a dtype. */
const char *tk_ops__dtype_bit_str(unsigned bit);
/* Parses a manifest dtype name. TK_ERR_INVALID with the accepted names. */
int tk_ops__dtype_parse(tk_dtype *out, const char *name);
/* The same, and the other spellings people type (tk_dtype_parse): float16, fp16, half, bfloat16,
 * float32, torch's int8 and float8_e4m3fn, any case. */
int tk_ops__dtype_parse_any(tk_dtype *out, const char *name);
/* Bytes per element, 0 for an unknown dtype. */
size_t tk_ops__dtype_size(tk_dtype dt);

/* IEEE half and bfloat16 <-> fp32, round to nearest even; NaN stays NaN (quiet), overflow gives inf,
 * subnormals are kept. */
float tk_ops__f16_to_f32(uint16_t h);
uint16_t tk_ops__f32_to_f16(float f);
float tk_ops__bf16_to_f32(uint16_t h);
uint16_t tk_ops__f32_to_bf16(float f);

/* OCP fp8 <-> fp32: e4m3fn (max 448, no inf) and e5m2 (max 57344). Round to nearest even, saturating
 * to the largest finite value (as __nv_cvt_float_to_fp8 with __NV_SATFINITE); NaN stays NaN. */
float tk_ops__fp8_e4m3_to_f32(uint8_t c);
uint8_t tk_ops__f32_to_fp8_e4m3(float f);
float tk_ops__fp8_e5m2_to_f32(uint8_t c);
uint8_t tk_ops__f32_to_fp8_e5m2(float f);
/* Round to nearest even, saturating to [-127, 127] (symmetric quantisation); NaN gives 0. */
int8_t tk_ops__f32_to_i8(float f);

/* ---- descriptors ------------------------------------------------------------------------------ */

#define TK_OPS_MAX_PARAMS 24
/* A package may declare ops of at most this many parameters (kernel.schema.json's maxItems). */
#define TK_OPS_MAX_DECL_PARAMS 16
#define TK_OPS_MAX_RANK 16

enum { TK_OPS_IN = 0, TK_OPS_OUT = 1 }; /* a tensor parameter's role: read, or written */

typedef struct {
    const char *name;   /* "input" */
    int kind;           /* TK_ARG_TENSOR, TK_ARG_I64 or TK_ARG_F64 */
    int role;           /* tensors: TK_OPS_IN or TK_OPS_OUT */
    unsigned dtypes;    /* tensors: allowed TK_OPS_* bits */
    int dtype_like;     /* tensors: index of the param whose dtype this one must have, or -1 */
    int or_f32;         /* tensors with dtype_like: f32 is accepted too (Gemma's (1 + w) norm weights) */
    int min_rank;       /* tensors: at least this many dimensions */
    int max_rank;       /* tensors: at most this many (-1: any up to TK_OPS_MAX_RANK) */
    const char *shape;  /* tensors: the shape in the signature, "[..., 2*d]" */
    int optional;       /* 1: may be left out (a scalar then takes def, a tensor is NULL) */
    double def;         /* scalars: the default */
    const char *doc;    /* one line for `tk ops` */
} tk_op_param;

/* Entries of a built-in op's parameter table. A tensor: name, role (TK_OPS_IN / TK_OPS_OUT), allowed
 * dtypes, dtype_like (-1: its own dtypes), ranks min..max (max -1: any), shape text, doc line;
 * TK_OPS_TENSOR_OPT: the same, optional (the call may leave it out: NULL). */
#define TK_OPS_TENSOR_(nm, rl, dts, like, rmin, rmax, shp, opt, dc)                                                    \
    {.name = (nm),                                                                                                     \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = (rl),                                                                                                     \
     .dtypes = (dts),                                                                                                  \
     .dtype_like = (like),                                                                                             \
     .min_rank = (rmin),                                                                                               \
     .max_rank = (rmax),                                                                                               \
     .shape = (shp),                                                                                                   \
     .optional = (opt),                                                                                                \
     .doc = (dc)}
#define TK_OPS_TENSOR(nm, rl, dts, like, rmin, rmax, shp, dc) TK_OPS_TENSOR_(nm, rl, dts, like, rmin, rmax, shp, 0, dc)
#define TK_OPS_TENSOR_OPT(nm, rl, dts, like, rmin, rmax, shp, dc)                                                      \
    TK_OPS_TENSOR_(nm, rl, dts, like, rmin, rmax, shp, 1, dc)
/* An optional scalar: name, kind (TK_ARG_I64 / TK_ARG_F64), its default, doc line. */
#define TK_OPS_SCALAR(nm, knd, dflt, dc)                                                                               \
    {.name = (nm), .kind = (knd), .optional = 1, .def = (dflt), .dtype_like = -1, .doc = (dc)}

typedef struct tk_op_desc tk_op_desc;

/* The arguments of one call, bound to the op's parameters (index = parameter index). */
typedef struct {
    const tk_op_desc *op;
    const tk_tensor *t[TK_OPS_MAX_PARAMS]; /* tensors (NULL: an optional one left out) */
    int64_t i[TK_OPS_MAX_PARAMS];          /* TK_ARG_I64 scalars */
    double f[TK_OPS_MAX_PARAMS];           /* TK_ARG_F64 scalars */
    int given[TK_OPS_MAX_PARAMS];          /* 1: the caller passed it */
    int device_type;                       /* of the tensors: TK_DEV_CPU or TK_DEV_CUDA */
    int device_id;
    tk_dtype dtype;                        /* of the first tensor: what implementations filter on */
} tk_op_call;

struct tk_op_desc {
    const char *name;     /* "silu_and_mul" */
    const char *family;   /* "activation" */
    const char *summary;  /* one line: "out = silu(x[..., :d]) * x[..., d:]" */
    const tk_op_param *params;
    size_t nparams;
    /* Checks the shapes (the generic checks of dtype, rank and device have passed). TK_ERR_INVALID
     * with a message "op: 'arg' has shape [..], want [..] (why)". */
    int (*check)(const tk_op_call *c);
    /* The CPU reference on host tensors (validated). */
    int (*cpu)(const tk_op_call *c);
    const void *data;     /* for check and cpu: e.g. the activation function of a family entry */
    const char *package;  /* a package tk ships that implements it, for hints ("kernels-community/activation") */
};

/* ---- the registry (ops/registry.c) ------------------------------------------------------------ */

size_t tk_ops__count(void);
const tk_op_desc *tk_ops__at(size_t i);
/* NULL when there is no op of that name. */
const tk_op_desc *tk_ops__find(const char *name);
/* Index of a parameter by name, -1 if none. */
int tk_ops__param_index(const tk_op_desc *op, const char *name);

/* Finds the op and binds and validates the arguments: by name when tk_arg.name is set, else by
 * position; kinds, dtypes, ranks, devices and the op's shape rules. On success *c holds the call.
 * Errors: TK_ERR_NOT_FOUND (unknown op, with a hint naming a close one), TK_ERR_INVALID (the message
 * names the argument, what it got and what is wanted). */
int tk_ops__prepare(tk_op_call *c, const char *op, const tk_arg *args, size_t nargs);
/* The same for an op descriptor found elsewhere (a declared op, api/op.c). */
int tk_ops__prepare_op(tk_op_call *c, const tk_op_desc *op, const tk_arg *args, size_t nargs);

/* Runs the CPU reference of a prepared call. TK_ERR_UNSUPPORTED if a tensor is not on the host. */
int tk_ops__run_cpu(const tk_op_call *c);

/* The signature as text, outputs after "->" and shared dtypes as type variables:
 * "silu_and_mul(out: T[..., d], input: T[..., 2*d]) -> out; T in {f32, f16, bf16}". */
int tk_ops__signature(tk_buf *b, const tk_op_desc *op);

/* ---- helpers for op tables -------------------------------------------------------------------- */

/* 1 when a and b have the same shape. */
int tk_ops__same_shape(const tk_tensor *a, const tk_tensor *b);
/* The check of an op whose params 0 and 1 are 'out' and 'input' of one shape: TK_ERR_INVALID
 * "op: 'out' has shape [..], want [..] (the shape of 'input')". */
int tk_ops__check_out_like_input(const tk_op_call *c);

/* numel of a tensor (1 for rank 0). */
int64_t tk_ops__numel(const tk_tensor *t);
/* 1 when t is contiguous row-major (NULL strides, or strides that equal the row-major ones). */
int tk_ops__contiguous(const tk_tensor *t);
/* Appends "[4, 16]" to b. */
int tk_ops__shape_str(tk_buf *b, int32_t ndim, const int64_t *shape);
/* A shape as text in a per-thread ring of small buffers, for error messages ("[4, 16]"). */
const char *tk_ops__shape_fmt(int32_t ndim, const int64_t *shape);

/* Element offsets (in elements, from the tensor's first element) of the start of row r when the
 * tensor is seen as rows of its last dimension. The row stride of the last dim is in *col_stride. */
int64_t tk_ops__row_offset(const tk_tensor *t, int64_t r);
int64_t tk_ops__col_stride(const tk_tensor *t);
/* The element offset of flat (row-major) index i of t, through its strides. */
int64_t tk_ops__flat_offset(const tk_tensor *t, int64_t i);
/* The tensor's first element: data + byte_offset. */
static inline void *tk_ops__base(const tk_tensor *t) { return (char *)t->data + t->byte_offset; }

/* Loads n elements (stride `stride` elements apart, starting at element offset `off` of base) as
 * float, and stores n floats rounding to the dtype (round to nearest even). dt is f32, f16, bf16, or
 * one of the 8-bit types: fp8_e4m3 / fp8_e5m2 (saturating), i8 (saturating to [-127, 127]), u8. */
void tk_ops__load_f32(float *dst, const void *base, int64_t off, int64_t stride, int64_t n, tk_dtype dt);
void tk_ops__store_f32(void *base, int64_t off, int64_t stride, const float *src, int64_t n, tk_dtype dt);

/* Runs fn(arg, lo, hi) over [0, n) split into contiguous ranges on up to the machine's cores
 * (sysconf), using more than one thread only when n * cost_per_item is large enough to pay for it.
 * Falls back to fewer threads (down to the calling thread alone) when threads cannot be created. */
void tk_ops__parallel(int64_t n, int64_t cost_per_item, void (*fn)(void *arg, int64_t lo, int64_t hi), void *arg);

/* ---- ops that packages declare (ops/declared.c) ------------------------------------------------- */

/* A package may declare an op tk does not know (kernel.json "ops"). api/ builds its tk_op_desc: family
 * TK_OPS_FAMILY_DECLARED, package the declaring "org/name", check tk_ops__check_patterns, no cpu. */
#define TK_OPS_FAMILY_DECLARED "declared"
int tk_ops__is_declared(const tk_op_desc *op);
/* Checks a declared shape: "[...]", "[..., n]", "[b, 2*d]", "[4]", "[]": dims are "..." (at most one),
 * an integer, a symbol or INT*symbol. *min_rank / *max_rank (-1: any) get its rank bounds. 0, or -1
 * with *why a static text saying what is wrong. */
int tk_ops__pattern_check(const char *shape, int *min_rank, int *max_rank, const char **why);
/* The shape check of a declared op: binds each given tensor's pattern in parameter order; a symbol has
 * one value across tensors, and every "..." the same dims. TK_ERR_INVALID "op: 'y' has shape [4, 6],
 * want [..., n] with n = 8 (from 'x' [4, 8])". */
int tk_ops__check_patterns(const tk_op_call *c);

/* ---- op tables -------------------------------------------------------------------------------- */

extern const tk_op_desc tk_ops__activation[];
extern const size_t tk_ops__activation_count;
extern const tk_op_desc tk_ops__norm[]; /* ops/norm.c */
extern const size_t tk_ops__norm_count;
extern const tk_op_desc tk_ops__rotary[]; /* ops/rotary.c */
extern const size_t tk_ops__rotary_count;
extern const tk_op_desc tk_ops__softmax[]; /* ops/softmax.c */
extern const size_t tk_ops__softmax_count;
extern const tk_op_desc tk_ops__loss[]; /* ops/loss.c */
extern const size_t tk_ops__loss_count;
extern const tk_op_desc tk_ops__casted[]; /* ops/casted.c */
extern const size_t tk_ops__casted_count;
extern const tk_op_desc tk_ops__sampling[]; /* ops/sampling.c */
extern const size_t tk_ops__sampling_count;
extern const tk_op_desc tk_ops__attention[]; /* ops/attention.c */
extern const size_t tk_ops__attention_count;
extern const tk_op_desc tk_ops__layers[]; /* ops/layers.c */
extern const size_t tk_ops__layers_count;
extern const tk_op_desc tk_ops__backward_layers[]; /* ops/backward_layers.c */
extern const size_t tk_ops__backward_layers_count;
extern const tk_op_desc tk_ops__backward_act[]; /* ops/backward_act.c */
extern const size_t tk_ops__backward_act_count;
extern const tk_op_desc tk_ops__optim[]; /* ops/optim.c */
extern const size_t tk_ops__optim_count;
extern const tk_op_desc tk_ops__diffusion[]; /* ops/diffusion.c */
extern const size_t tk_ops__diffusion_count;
extern const tk_op_desc tk_ops__moe[]; /* ops/moe.c */
extern const size_t tk_ops__moe_count;

/* ---- shared pieces ------------------------------------------------------------------------------ */

/* Philox-4x32-10 (Salmon et al., SC'11; Random123's philox4x32_10): the generator of the sample and
 * randn ops (ops/sampling.c), the same function as the device toolkit's tk::philox4x32_10. */
void tk_ops__philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2]);

/* tk_noise_schedule (tk.h), for the tests: the betas and alphas_cumprod of opts (NULL: the defaults). */
int tk_ops__noise_schedule(double *betas, double *alphas_cumprod, const tk_noise_schedule_opts *opts);

#endif /* TK_OPS_H */
