/*
 * softmax.c — the softmax ops (the ops of kernels-community/softmax): signatures, shape checks and CPU
 * references.
 *
 *   softmax      out[..., i] = exp(x_i - m) / sum_j exp(x_j - m)          m = max_j x_j, over the last dim
 *   log_softmax  out[..., i] = (x_i - m) - log(sum_j exp(x_j - m))
 *
 * Special values follow PyTorch (torch.softmax / torch.log_softmax on the same row): a row that holds
 * a NaN, a +inf, or nothing but -inf gives NaN in every element (PyTorch gets there through
 * inf - inf and max = -inf); -inf entries of an otherwise finite row give 0 (softmax) and -inf
 * (log_softmax). Any row length d >= 1 is accepted.
 *
 * Numerics: elements are loaded as fp32; the max is taken in fp32, sum exp(x - m) is accumulated in
 * double, and each output is computed in double and rounded once to the output dtype, so the
 * reference is within half an ulp of the exact result of the rounded inputs. Rows are streamed in
 * blocks of columns (three passes: max, sum, write), so a row of millions needs no row-sized buffer.
 * Strided tensors are read and written through their strides; out may be input itself (each element
 * is read before the same element is written).
 */
#include <math.h>

#include "ops/ops.h"

/* ---- CPU reference ---------------------------------------------------------------------------- */

#define BLK 1024 /* columns per step: the scratch rows live on the stack */

typedef struct {
    int log;
    const tk_tensor *out, *in;
    int64_t d;
} sm_job;

static void sm_range(void *arg, int64_t lo, int64_t hi)
{
    const sm_job *j = arg;
    float x[BLK];
    void *ob = tk_ops__base(j->out);
    const void *ib = tk_ops__base(j->in);
    int64_t ocs = tk_ops__col_stride(j->out), ics = tk_ops__col_stride(j->in);
    for (int64_t r = lo; r < hi; r++) {
        int64_t io = tk_ops__row_offset(j->in, r), oo = tk_ops__row_offset(j->out, r);
        /* pass 1: the max (NaN seen separately: fmaxf would skip it) */
        float m = -INFINITY;
        int nan = 0;
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            tk_ops__load_f32(x, ib, io + c0 * ics, ics, n, j->in->dtype);
            for (int64_t i = 0; i < n; i++) {
                nan |= isnan(x[i]);
                m = x[i] > m ? x[i] : m;
            }
        }
        /* NaN anywhere, a +inf, or only -inf: every output is NaN (as PyTorch) */
        int bad = nan || isinf(m);
        /* pass 2: the sum of exp(x - m) in double; exp(-inf) = 0 */
        double s = 0;
        for (int64_t c0 = 0; !bad && c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            tk_ops__load_f32(x, ib, io + c0 * ics, ics, n, j->in->dtype);
            for (int64_t i = 0; i < n; i++)
                s += exp((double)x[i] - (double)m);
        }
        double inv = 1.0 / s, ls = log(s);
        /* pass 3: the outputs, each rounded once */
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            if (bad) {
                for (int64_t i = 0; i < n; i++)
                    x[i] = NAN;
            } else {
                tk_ops__load_f32(x, ib, io + c0 * ics, ics, n, j->in->dtype);
                if (j->log)
                    for (int64_t i = 0; i < n; i++)
                        x[i] = (float)(((double)x[i] - (double)m) - ls);
                else
                    for (int64_t i = 0; i < n; i++)
                        x[i] = (float)(exp((double)x[i] - (double)m) * inv);
            }
            tk_ops__store_f32(ob, oo + c0 * ocs, ocs, x, n, j->out->dtype);
        }
    }
}

static int cpu_softmax(const tk_op_call *c)
{
    const int *log = c->op->data;
    sm_job j = {*log, c->t[0], c->t[1], 0};
    j.d = j.in->shape[j.in->ndim - 1];
    int64_t numel = tk_ops__numel(j.in);
    if (numel == 0)
        return TK_OK;
    tk_ops__parallel(numel / j.d, j.d * 40, sm_range, &j);
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------------------------- */

static const tk_op_param softmax_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, 1, 1, -1, "[..., d]", "the result (may be 'input' itself)"),
    TK_OPS_TENSOR("input", TK_OPS_IN, TK_OPS_FLOATS, -1, 1, -1, "[..., d]", "x, normalised over its last dimension"),
};

static const int plain = 0, logarithmic = 1;

#define PKG "kernels-community/softmax"
#define NPARAMS (sizeof softmax_params / sizeof softmax_params[0])

const tk_op_desc tk_ops__softmax[] = {
    {"softmax", "softmax", "out = exp(x - max(x)) / sum(exp(x - max(x))) over the last dimension", softmax_params,
     NPARAMS, tk_ops__check_out_like_input, cpu_softmax, &plain, PKG},
    {"log_softmax", "softmax", "out = x - max(x) - log(sum(exp(x - max(x)))) over the last dimension", softmax_params,
     NPARAMS, tk_ops__check_out_like_input, cpu_softmax, &logarithmic, PKG},
};
const size_t tk_ops__softmax_count = sizeof tk_ops__softmax / sizeof tk_ops__softmax[0];
