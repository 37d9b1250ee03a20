// out = alpha * x + y, elementwise. (n) f32 each.
extern "C" __global__ void scale_add_f32(float *out, const float *x, const float *y, float alpha, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = alpha * x[i] + y[i];
}
