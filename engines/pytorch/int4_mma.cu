// The batch-1 W4A16 product on the tensor cores (`cuda_int4`, which compiles and launches
// it): y (N) = W (N x K) x (K), W in compressed-tensors' layout (element 8j + i in bits
// 4i..4i+3 of int32 word j of its row, stored q + 8; one bf16 scale per 32 inputs), x and
// y bf16, the multiply-adds by mma.m16n8k16 (bf16 in, float32 sums): about 2.3
// instructions a weight against 3.5-4 for float32 multiply-adds, and, unlike Triton's
// `gemv_int4`, no value moves between lanes after the dependent launch's wait
// (records: benchmarks/records/2026-12-06-h100-split-residual-cuda-gemv.md).
// - A block is SPLIT warps over 16 rows; warp w takes the 128-input chunks w, w + SPLIT,
//   ...; in a chunk, lane (g, c) = (lane / 4, lane % 4) loads group 4 chunk + c of rows g
//   and g + 8 (16 bytes each), all before `griddepcontrol.wait`.
// - The sum over k does not care in which order the inputs meet the mma's k slots, so
//   each lane puts its own group's values in its own slots: nibbles (i, i + 4) of a word
//   are one bf16 pair (one shift, one LOP3 to 128 + u, two fma.bf16x2 to (u - 8) * scale,
//   rounded once as the dequantized weight is), and the input pairs meet them by one PRMT.
// - The input fills all eight columns of the mma's B, so every column of the result is
//   the product; lane (g, 0) holds rows g and g + 8. The SPLIT warps' sums meet in shared
//   memory after one barrier, added in warp order.
// K, SPLIT and X_LOAD are substituted before compiling (NVRTC, no headers); sm_80 and
// later (bf16 mma), the dependent launch's two instructions on sm_90 and later.

#define K_ __K__
#define SPLIT __SPLIT__
#define X_LOAD __X_LOAD__
#define GROUPS (K_ / 32)
#define CHUNKS (K_ / 128)
#define PER_WARP (CHUNKS / SPLIT)

__device__ __forceinline__ unsigned short float_bf16(float f) {
    unsigned u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// Nibbles i and i + 4 of `word` as the bf16 pair ((u - 8) * s, (u' - 8) * s).
__device__ __forceinline__ unsigned dequantized_pair(unsigned word, int i, unsigned s2) {
    unsigned t = word >> (4 * i), out;
    asm("{ .reg .b32 one, off, zero;\n"
        "  mov.b32 one, 0x3F803F80; mov.b32 off, 0xC308C308; mov.b32 zero, 0x80008000;\n"
        "  lop3.b32 %0, %1, 0x000F000F, 0x43004300, 0xEA;\n"
        "  fma.rn.bf16x2 %0, %0, one, off;\n"
        "  fma.rn.bf16x2 %0, %0, %2, zero; }"
        : "=r"(out) : "r"(t), "r"(s2));
    return out;
}

__device__ __forceinline__ void mma(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                    unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned word_of(const uint4& v, int t) {
    return t == 0 ? v.x : t == 1 ? v.y : t == 2 ? v.z : v.w;
}

extern "C" __global__ void __launch_bounds__(SPLIT * 32)
w4a16_gemv(const uint4* __restrict__ wq, const unsigned short* __restrict__ ws,
           const uint4* __restrict__ x, unsigned short* __restrict__ y, int n) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.x * 16;
    const bool ok0 = row0 + g < n, ok1 = row0 + g + 8 < n;
    uint4 w0[PER_WARP], w1[PER_WARP];
    unsigned s0[PER_WARP], s1[PER_WARP];
#pragma unroll
    for (int j = 0; j < PER_WARP; ++j) {
        const int group = (warp + j * SPLIT) * 4 + c;
        const size_t at0 = (size_t)(row0 + g) * GROUPS + group;
        const size_t at1 = at0 + 8 * (size_t)GROUPS;
        w0[j] = ok0 ? __ldcs(wq + at0) : make_uint4(0x88888888u, 0x88888888u, 0x88888888u, 0x88888888u);
        w1[j] = ok1 ? __ldcs(wq + at1) : make_uint4(0x88888888u, 0x88888888u, 0x88888888u, 0x88888888u);
        const unsigned a = ok0 ? ws[at0] : 0u, b = ok1 ? ws[at1] : 0u;
        s0[j] = a | (a << 16);
        s1[j] = b | (b << 16);
    }
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < PER_WARP; ++j) {
        const int group = (warp + j * SPLIT) * 4 + c;
        uint4 xv[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) xv[t] = X_LOAD(x + group * 4 + t);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            // Input pairs (8t + i, 8t + i + 4), i = 0..3, to meet the weight pairs.
            const unsigned lo = xv[t].x, lo2 = xv[t].y, hi = xv[t].z, hi2 = xv[t].w;
            const unsigned x0 = __byte_perm(lo, hi, 0x5410), x1 = __byte_perm(lo, hi, 0x7632);
            const unsigned x2 = __byte_perm(lo2, hi2, 0x5410), x3 = __byte_perm(lo2, hi2, 0x7632);
            const unsigned a = word_of(w0[j], t), b = word_of(w1[j], t);
            mma(d, dequantized_pair(a, 0, s0[j]), dequantized_pair(b, 0, s1[j]),
                dequantized_pair(a, 1, s0[j]), dequantized_pair(b, 1, s1[j]), x0, x1);
            mma(d, dequantized_pair(a, 2, s0[j]), dequantized_pair(b, 2, s1[j]),
                dequantized_pair(a, 3, s0[j]), dequantized_pair(b, 3, s1[j]), x2, x3);
        }
    }
    if (SPLIT == 1) {
        if (c == 0) {
            if (ok0) y[row0 + g] = float_bf16(d[0]);
            if (ok1) y[row0 + g + 8] = float_bf16(d[2]);
        }
        return;
    }
    __shared__ float part[SPLIT][16];
    if (c == 0) {
        part[warp][g] = d[0];
        part[warp][g + 8] = d[2];
    }
    __syncthreads();
    if (threadIdx.x < 16 && row0 + (int)threadIdx.x < n) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < SPLIT; ++w) sum += part[w][threadIdx.x];
        y[row0 + threadIdx.x] = float_bf16(sum);
    }
}
