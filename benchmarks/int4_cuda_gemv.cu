// A batch-1 W4A16 product written in CUDA C, for `benchmarks/int4_cuda_gemv_h200.py`:
// y (N) = W (N x K) x (K), W in compressed-tensors' layout (element 8j + i in bits
// 4i..4i+3 of int32 word j of its row, stored q + 8; one bf16 scale per 32 inputs),
// x and y bf16. It asks whether the engine's Triton GEMV (`gemv_int4`) loses its time
// to the barriers and shared memory its layout conversions bring after the dependent
// launch's wait: this one has neither.
// - A row is LANES lanes of one warp; each lane holds groups sub, sub + LANES, ... of
//   ROWS rows (a group: 4 words, one 16-byte load, one scale), all loaded before
//   `griddepcontrol.wait`, so the weights are in registers when the input arrives.
// - After the wait: the lane's 32 inputs a group (four 16-byte loads; X_LOAD `__ldcg`
//   reads past L1, `__ldg` through it, where the row's other lanes and rows find them), the products in float32, a butterfly of shuffles
//   across the row's lanes, one bf16 store.
// Nibble u as the float 1 + u/16 (one shift, one LOP3), q = u - 8 = 16 f - 24, so a
// group's sum is scale * (16 sum f x - 24 sum x); sum x is shared by the lane's rows.
// K, LANES, ROWS, WARPS and X_LOAD are substituted before compiling (NVRTC, no headers).

#define K_ __K__
#define LANES __LANES__
#define ROWS __ROWS__
#define WARPS __WARPS__
#define GROUPS (K_ / 32)
#define PER_LANE (GROUPS / LANES)
#define X_LOAD __X_LOAD__

__device__ __forceinline__ float bf16_float(unsigned short h) {
    return __uint_as_float(((unsigned)h) << 16);
}

__device__ __forceinline__ unsigned short float_bf16(float f) {
    unsigned u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

__device__ __forceinline__ float nibble_float(unsigned word, int shift_left, int shift_right) {
    unsigned bits = shift_left >= 0 ? word << shift_left : word >> shift_right;
    unsigned out;
    asm("lop3.b32 %0, %1, 0x780000, 0x3F800000, 0xEA;" : "=r"(out) : "r"(bits));
    return __uint_as_float(out);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
w4a16_gemv(const uint4* __restrict__ wq, const unsigned short* __restrict__ ws,
           const uint4* __restrict__ x, unsigned short* __restrict__ y, int n) {
    const int lane = threadIdx.x & 31;
    const int sub = lane % LANES;
    const int first = ((blockIdx.x * WARPS + (threadIdx.x >> 5)) * (32 / LANES) + lane / LANES) * ROWS;
    uint4 w[ROWS][PER_LANE];
    float s[ROWS][PER_LANE];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int row = first + r;
        const bool ok = row < n;
        const uint4* wrow = wq + (size_t)row * GROUPS;
        const unsigned short* srow = ws + (size_t)row * GROUPS;
#pragma unroll
        for (int g = 0; g < PER_LANE; ++g) {
            w[r][g] = ok ? __ldcs(wrow + g * LANES + sub) : make_uint4(0, 0, 0, 0);
            s[r][g] = ok ? bf16_float(srow[g * LANES + sub]) : 0.0f;
        }
    }
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
#pragma unroll
    for (int g = 0; g < PER_LANE; ++g) {
        const uint4* xg = x + (g * LANES + sub) * 4;
        uint4 xv[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) xv[t] = X_LOAD(xg + t);
        float sum_x = 0.0f;
        float fx[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) fx[r] = 0.0f;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const unsigned xs[4] = {xv[t].x, xv[t].y, xv[t].z, xv[t].w};
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                const float x0 = __uint_as_float(xs[p] << 16);
                const float x1 = __uint_as_float(xs[p] & 0xffff0000u);
                sum_x += x0 + x1;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    const unsigned word = t == 0 ? w[r][g].x : t == 1 ? w[r][g].y : t == 2 ? w[r][g].z : w[r][g].w;
                    const int i0 = 2 * p, i1 = 2 * p + 1;
                    fx[r] = fmaf(nibble_float(word, 19 - 4 * i0, 4 * i0 - 19), x0, fx[r]);
                    fx[r] = fmaf(nibble_float(word, 19 - 4 * i1, 4 * i1 - 19), x1, fx[r]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[r] = fmaf(s[r][g], 16.0f * fx[r] - 24.0f * sum_x, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int o = LANES / 2; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
        if (sub == 0 && first + r < n) y[first + r] = float_bf16(acc[r]);
    }
}
