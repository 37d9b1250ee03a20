// hang.cu — a silu kernel that never returns: test data for the self-test's time limit per launch
// (docs/selftest.md, scripts/gpu-check.sh phase "selftest"). Thread 0 spins on clock64(), which the
// compiler cannot fold away; the other threads do the work and wait for nobody.

extern "C" __global__ void silu_hang_f32(float *out, const float *input, long long n)  // (n) f32
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) {
        long long t0 = clock64();
        while (clock64() - t0 >= 0) // always true: the clock only goes forward
            ;
    }
    if (i < n)
        out[i] = input[i] / (1.0f + expf(-input[i]));
}
