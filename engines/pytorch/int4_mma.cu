// The batch-1 W4A16 product on the tensor cores (`cuda_int4`, which compiles and launches
// it), with the fused forms of `kernels`: y (N) = W (N x K) x (K), W in compressed-tensors'
// layout (element 8j + i in bits 4i..4i+3 of int32 word j of its row, stored q + 8; one
// bf16 scale per 32 inputs), x and y bf16, the multiply-adds by mma.m16n8k16 (bf16 in,
// float32 sums): about 2.3 instructions a weight against 3.5-4 for float32 multiply-adds,
// and, unlike Triton's `gemv_int4`, no value moves between lanes after the dependent
// launch's wait (records: benchmarks/records/2026-12-06-h100-split-residual-cuda-gemv.md).
// - A block is SPLIT warps over 16 rows (and the 16 matching up rows of a GELU pair);
//   warp w takes the 128-input chunks w, w + SPLIT, ...; in a chunk, lane (g, c) =
//   (lane / 4, lane % 4) loads group 4 chunk + c of rows g and g + 8 (16 bytes each), all
//   before `griddepcontrol.wait`.
// - The sum over k does not care in which order the inputs meet the mma's k slots, so
//   each lane puts its own group's values in its own slots: nibbles (i, i + 4) of a word
//   are one bf16 pair (one shift, one LOP3 to 128 + u, two fma.bf16x2 to (u - 8) * scale,
//   rounded once as the dequantized weight is), and the input pairs meet them by one PRMT.
// - The input fills all eight columns of the mma's B, so every column of the result is
//   the product; lane (g, 0) holds rows g and g + 8. The SPLIT warps' sums meet in shared
//   memory after one barrier, added in warp order, so a launch repeats to the bit.
// Prologues and epilogues (the codes and roundings of `triton_kernels`):
// - 5, the norm scaled after: the input times the norm weight (one bf16 rounding; the
//   norm weight read before the wait where a warp holds at most two chunks), and the
//   squares of the raw input summed by one more mma with the input as A too (each row of
//   A the same input), so the reciprocal RMS scales the sums at the end;
// - 3, the residual step before: every block builds the new residual row in shared
//   memory from one round trip of 16-byte loads (block 0 also writes it out);
// - epilogue 1, GELU of a gate/up pair; 2, GELU times a vector; 3, the residual step
//   after: the last block to finish (a counter) reads the whole output row back past L1.
// N, K, SPLIT, X_LOAD, PROLOGUE, EPILOGUE and SCALE are substituted before compiling
// (NVRTC, after `int4_mma_common.cuh`'s helpers); sm_80 and later (bf16 mma), the
// dependent launch's two instructions on sm_90 and later.

#define N_ __N__
#define K_ __K__
#define SPLIT __SPLIT__
#define X_LOAD __X_LOAD__
#define PROLOGUE __PROLOGUE__
#define EPILOGUE __EPILOGUE__
#define SCALE __SCALE__
#define TILES (EPILOGUE == 1 ? 2 : 1)
#define GROUPS (K_ / 32)
#define CHUNKS (K_ / 128)
#define PER_WARP (CHUNKS / SPLIT)
#define THREADS (SPLIT * 32)

__device__ __forceinline__ float gelu_tanh(float x) {
    const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (2.0f - 2.0f / (__expf(2.0f * inner) + 1.0f));
}

// x + RMSNorm(b) * rw [* scalar], rounded where the unfused ops round.
__device__ __forceinline__ float residual_of(float x, float b, float rw, float scalar, float rstd) {
    float xn = rounded(x + rounded(b * rstd * rw));
    if (SCALE) xn = rounded(xn * scalar);
    return xn;
}

// The sum of every thread's `v`, in every thread: each warp's by a fixed shuffle tree,
// then the warps' in warp order (the same bits on every run).
__device__ __forceinline__ float block_sum(float v, float* warp_sums) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
    __syncthreads();
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < SPLIT; ++w) sum += warp_sums[w];
    __syncthreads();
    return sum;
}

// The residual step x + RMSNorm(b) * rw [* scalar] over a whole row of LEN values (a
// multiple of 8, 16-byte aligned rows), by the block: every 16-byte load of the three
// rows issued before the first use (one memory round trip), the mean square of b
// summed by `block_sum`; into `out` and, where it is not null, into `also`. b is read
// past L1 where other blocks of this launch wrote it (B_PAST_L1).
template <int LEN, bool B_PAST_L1>
__device__ __forceinline__ void residual_row(const unsigned short* x, const unsigned short* b,
                                             const unsigned short* rw, float scalar, float eps,
                                             float* warp_sums, unsigned short* out,
                                             unsigned short* also) {
    constexpr int VECS = LEN / 8, PER = (VECS + THREADS - 1) / THREADS;
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    const uint4* b4 = reinterpret_cast<const uint4*>(b);
    const uint4* w4 = reinterpret_cast<const uint4*>(rw);
    uint4 xv[PER], bv[PER], wv[PER];
#pragma unroll
    for (int p = 0; p < PER; ++p) {
        const int i = threadIdx.x + p * THREADS;
        if (i < VECS) {
            bv[p] = B_PAST_L1 ? __ldcg(b4 + i) : b4[i];
            xv[p] = x4[i];
            wv[p] = w4[i];
        }
    }
    float squares = 0.0f;
#pragma unroll
    for (int p = 0; p < PER; ++p) {
        if (threadIdx.x + p * THREADS < VECS) {
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const unsigned v = word_of(bv[p], t);
                const float lo = __uint_as_float(v << 16), hi = __uint_as_float(v & 0xffff0000u);
                squares += lo * lo + hi * hi;
            }
        }
    }
    const float rstd = 1.0f / sqrtf(block_sum(squares, warp_sums) / LEN + eps);
#pragma unroll
    for (int p = 0; p < PER; ++p) {
        const int i = threadIdx.x + p * THREADS;
        if (i < VECS) {
            unsigned words[4];
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const unsigned xw = word_of(xv[p], t), bw = word_of(bv[p], t), ww = word_of(wv[p], t);
                words[t] = pair_bf16(
                    residual_of(__uint_as_float(xw << 16), __uint_as_float(bw << 16),
                                __uint_as_float(ww << 16), scalar, rstd),
                    residual_of(__uint_as_float(xw & 0xffff0000u), __uint_as_float(bw & 0xffff0000u),
                                __uint_as_float(ww & 0xffff0000u), scalar, rstd));
            }
            const uint4 v = make_uint4(words[0], words[1], words[2], words[3]);
            reinterpret_cast<uint4*>(out)[i] = v;
            if (also != nullptr) reinterpret_cast<uint4*>(also)[i] = v;
        }
    }
}

// other: the branch (prologue 3) or the residual row (epilogue 3); nw: the norm weight
// (prologue 5); rw: the branch's norm weight (prologue 3, epilogue 3); s: the scalar
// (SCALE); xo: the new residual row (prologue 3, epilogue 3); m: the multiplier
// (epilogue 2); count: the launch's counter (epilogue 3), left at zero.
extern "C" __global__ void __launch_bounds__(THREADS)
w4a16_gemv(const uint4* __restrict__ wq, const unsigned short* __restrict__ ws,
           const unsigned short* __restrict__ x, unsigned short* __restrict__ y,
           const unsigned short* __restrict__ other, const uint4* __restrict__ nw,
           const unsigned short* __restrict__ rw, const unsigned short* __restrict__ s,
           unsigned short* __restrict__ xo, const unsigned short* __restrict__ m,
           unsigned* __restrict__ count, float eps) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.x * 16;
    const bool ok0 = row0 + g < N_, ok1 = row0 + g + 8 < N_;
    uint4 w[TILES][2][PER_WARP];
    unsigned sc[TILES][2][PER_WARP];
#pragma unroll
    for (int tile = 0; tile < TILES; ++tile) {
#pragma unroll
        for (int j = 0; j < PER_WARP; ++j) {
            const int group = (warp + j * SPLIT) * 4 + c;
            const size_t at0 = (size_t)(tile * N_ + row0 + g) * GROUPS + group;
            const size_t at1 = at0 + 8 * (size_t)GROUPS;
            const uint4 zero = make_uint4(0x88888888u, 0x88888888u, 0x88888888u, 0x88888888u);
            w[tile][0][j] = ok0 ? __ldcs(wq + at0) : zero;
            w[tile][1][j] = ok1 ? __ldcs(wq + at1) : zero;
            const unsigned a = ok0 ? ws[at0] : 0u, b = ok1 ? ws[at1] : 0u;
            sc[tile][0][j] = a | (a << 16);
            sc[tile][1][j] = b | (b << 16);
        }
    }
#if PROLOGUE == 5
    // The norm weight is a parameter: where it fits in registers, it is read with the
    // weights, before the wait, off the path after it.
    constexpr bool nw_early = PER_WARP <= 2;
    uint4 nw_held[nw_early ? PER_WARP : 1][4];
    if (nw_early) {
#pragma unroll
        for (int j = 0; j < (nw_early ? PER_WARP : 1); ++j)
#pragma unroll
            for (int t = 0; t < 4; ++t) nw_held[j][t] = __ldg(nw + ((warp + j * SPLIT) * 4 + c) * 4 + t);
    }
#endif
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    __shared__ float warp_sums[SPLIT];
    const float scalar = SCALE ? bf16_float(*s) : 1.0f;
    // The multiplier of epilogue 2 is loaded now, off the end of the product's path.
    const float multiplier =
        EPILOGUE == 2 && threadIdx.x < 16 && row0 + (int)threadIdx.x < N_ ? bf16_float(m[row0 + threadIdx.x]) : 0.0f;
#if PROLOGUE == 3
    // Every block builds the new residual row; block 0 also writes it out.
    __shared__ __align__(16) unsigned short staged[K_];
    residual_row<K_, false>(x, other, rw, scalar, eps, warp_sums, staged,
                            blockIdx.x == 0 ? xo : nullptr);
    __syncthreads();
    const uint4* xs = reinterpret_cast<const uint4*>(staged);
#else
    const uint4* xs = reinterpret_cast<const uint4*>(x);
#endif
    float d[TILES][4];
#pragma unroll
    for (int tile = 0; tile < TILES; ++tile) d[tile][0] = d[tile][1] = d[tile][2] = d[tile][3] = 0.0f;
    float squares[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < PER_WARP; ++j) {
        const int group = (warp + j * SPLIT) * 4 + c;
        uint4 xv[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
#if PROLOGUE == 3
            xv[t] = xs[group * 4 + t];
#else
            xv[t] = X_LOAD(xs + group * 4 + t);
#endif
        }
#if PROLOGUE == 5
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            // Squares: A holds the raw input in every row, B the same input.
            mma(squares, xv[t].x, 0u, xv[t].y, 0u, xv[t].x, xv[t].y);
            mma(squares, xv[t].z, 0u, xv[t].w, 0u, xv[t].z, xv[t].w);
            const uint4 nv = nw_early ? nw_held[nw_early ? j : 0][t] : __ldg(nw + group * 4 + t);
            xv[t] = make_uint4(times(xv[t].x, nv.x), times(xv[t].y, nv.y), times(xv[t].z, nv.z),
                               times(xv[t].w, nv.w));
        }
#endif
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            // Input pairs (8t + i, 8t + i + 4), i = 0..3, to meet the weight pairs.
            const unsigned lo = xv[t].x, lo2 = xv[t].y, hi = xv[t].z, hi2 = xv[t].w;
            const unsigned x0 = __byte_perm(lo, hi, 0x5410), x1 = __byte_perm(lo, hi, 0x7632);
            const unsigned x2 = __byte_perm(lo2, hi2, 0x5410), x3 = __byte_perm(lo2, hi2, 0x7632);
#pragma unroll
            for (int tile = 0; tile < TILES; ++tile) {
                const unsigned a = word_of(w[tile][0][j], t), b = word_of(w[tile][1][j], t);
                const unsigned sa = sc[tile][0][j], sb = sc[tile][1][j];
                mma(d[tile], dequantized_pair(a, 0, sa), dequantized_pair(b, 0, sb),
                    dequantized_pair(a, 1, sa), dequantized_pair(b, 1, sb), x0, x1);
                mma(d[tile], dequantized_pair(a, 2, sa), dequantized_pair(b, 2, sb),
                    dequantized_pair(a, 3, sa), dequantized_pair(b, 3, sb), x2, x3);
            }
        }
    }
    __shared__ float part[TILES][SPLIT][16];
    if (c == 0) {
#pragma unroll
        for (int tile = 0; tile < TILES; ++tile) {
            part[tile][warp][g] = d[tile][0];
            part[tile][warp][g + 8] = d[tile][2];
        }
    }
#if PROLOGUE == 5
    const float rstd = 1.0f / sqrtf(block_sum(lane == 0 ? squares[0] : 0.0f, warp_sums) / K_ + eps);
#else
    __syncthreads();
#endif
    if (threadIdx.x < 16 && row0 + (int)threadIdx.x < N_) {
        const int row = row0 + threadIdx.x;
        float sum[TILES];
#pragma unroll
        for (int tile = 0; tile < TILES; ++tile) {
            sum[tile] = 0.0f;
#pragma unroll
            for (int w = 0; w < SPLIT; ++w) sum[tile] += part[tile][w][threadIdx.x];
#if PROLOGUE == 5
            sum[tile] *= rstd;
#endif
        }
        float out = sum[0];
#if EPILOGUE == 1
        out = rounded(rounded(gelu_tanh(rounded(sum[0]))) * rounded(sum[TILES - 1]));
#elif EPILOGUE == 2
        out = rounded(rounded(gelu_tanh(rounded(sum[0]))) * multiplier);
#endif
        y[row] = float_bf16(out);
#if EPILOGUE == 3
        __threadfence();
#endif
    }
#if EPILOGUE == 3
    // The residual step needs the whole row: the block that counts last (after every
    // block's stores) reads it back past L1 and leaves the counter at zero for the next
    // launch.
    __shared__ unsigned last;
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(count, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    residual_row<N_, true>(other, y, rw, scalar, eps, warp_sums, xo, nullptr);
    if (threadIdx.x == 0) atomicExch(count, 0u);
#endif
}
