// broken.cu — silu kernels that are wrong on purpose: test data for tk selftest (docs/selftest.md,
// scripts/gpu-check.sh phase "selftest"). Each is the right silu but for one defect:
//   silu_wrong_element_f32   element n/2 is off by 1 (a wrong element a loose check would miss)
//   silu_skip_last_row_f32   the last row of the last dimension is never written (NaN stays)
//   silu_trap_f32            every launch traps (a device fault: the context dies)
// Launch: one thread per element, 256 a block. f32 in and out, (n) elements, rows of d.

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

extern "C" __global__ void silu_wrong_element_f32(float *out, const float *input, long long n)  // (n) f32
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = silu(input[i]) + (i == n / 2 ? 1.0f : 0.0f);
}

extern "C" __global__ void silu_skip_last_row_f32(float *out, const float *input, long long n, long long d)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n - d) // the last row is left as it was
        out[i] = silu(input[i]);
}

extern "C" __global__ void silu_trap_f32(float *out, const float *input, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0)
        __trap();
    if (i < n)
        out[i] = silu(input[i]);
}
