// The W4A16 product of a few rows on the tensor cores (`cuda_int4_rows`), Y (M x N) =
// X (M x K) W^T for M up to 8 TILES, in the layout and mma scheme of the batch-1 product
// (`int4_mma.cu`; the helpers of `int4_mma_common.cuh` come before this text):
// - A block is WARPS warps, each over its own RW fragments of 16 weight rows, lane (g, c)
//   loading group c of a chunk's four for rows g and g + 8 of each (16 bytes each)
//   straight to registers, STAGES chunks in flight, the first before
//   `griddepcontrol.wait`. Each X fragment read from shared memory meets all RW weight
//   fragments (RW 2 halves the shared-memory reads an mma). With BATCH_SPLIT warps to a
//   set of weight fragments, each takes its own TILES / BATCH_SPLIT tiles of the rows
//   (fewer accumulators a warp, so more fragments fit; each of those warps dequantizes
//   the same weights).
// - Each 128-input chunk of X is staged once a block in shared memory, already in the
//   mma's fragment order: batch rows meet the mma's eight columns, TILES tiles of 8 rows,
//   lane (g, c) of a tile reading the 16 bytes of batch row 8 tile + g, group c, word t,
//   its pairs (8t + i, 8t + i + 4) as the weight pairs are (one LDS.128 a tile and word,
//   eight lanes a phase on distinct banks). Each dequantized weight pair meets all the
//   warp's tiles. X of the next chunk is read while the current one multiplies (two
//   buffers, one barrier a chunk).
// - SPLIT_K programs (grid y) split K where the row blocks alone leave SMs idle; each
//   writes float32 partial sums and the last of a row block's to finish (a counter) adds
//   them in split order, every load issued before the first store, and resets the
//   counter, as `triton_int4.matmul_int4` does.
// N, K, TILES, WARPS, RW, SPLIT_K, STAGES and BATCH_SPLIT are substituted before compiling;
// sm_80 and later.

#define N_ __N__
#define K_ __K__
#define TILES __TILES__
#define WARPS __WARPS__
#define SPLIT_K __SPLIT_K__
#define STAGES __STAGES__
#define RW __RW__
#define BATCH_SPLIT __BATCH_SPLIT__
#define M_MAX (TILES * 8)
#define GROUPS (K_ / 32)
#define CHUNKS (K_ / 128 / SPLIT_K)
#define THREADS (WARPS * 32)
#define ROWS_A_WARP (16 * RW)
#define ROWS_A_BLOCK (ROWS_A_WARP * WARPS / BATCH_SPLIT)
#define TILES_A_WARP (TILES / BATCH_SPLIT)
#define X_VECS (M_MAX * 16)
#define X_PER_THREAD ((X_VECS + THREADS - 1) / THREADS)
#define SUMS_A_THREAD (ROWS_A_BLOCK * M_MAX / THREADS)  // outputs a thread adds up after a split

// Inputs 8t .. 8t + 7 of a group in the mma's pair order: (8t, 8t + 4), (8t + 1, 8t + 5),
// (8t + 2, 8t + 6), (8t + 3, 8t + 7).
__device__ __forceinline__ uint4 pair_order(uint4 v) {
    return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632),
                      __byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632));
}

extern "C" __global__ void __launch_bounds__(THREADS)
w4a16_gemm(const uint4* __restrict__ wq, const unsigned short* __restrict__ ws,
           const uint4* __restrict__ x, unsigned short* __restrict__ y,
           float* __restrict__ partial, unsigned* __restrict__ counters, int m) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int kz = blockIdx.y;
    const int row_0 = blockIdx.x * ROWS_A_BLOCK + warp / BATCH_SPLIT * ROWS_A_WARP + g;
    const int tile_0 = warp % BATCH_SPLIT * TILES_A_WARP;
    __shared__ uint4 xs[2][TILES][4][32];
    uint4 wa[RW][STAGES], wb[RW][STAGES];
    unsigned sa[RW][STAGES], sb[RW][STAGES];

    auto load_weights = [&](int slot, int j) {
        const int group = (kz * CHUNKS + j) * 4 + c;
        const uint4 zero = make_uint4(0x88888888u, 0x88888888u, 0x88888888u, 0x88888888u);
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            const int row_a = row_0 + 16 * r, row_b = row_a + 8;
            const bool ok_a = row_a < N_, ok_b = row_b < N_;
            wa[r][slot] = ok_a ? __ldcs(wq + (size_t)row_a * GROUPS + group) : zero;
            wb[r][slot] = ok_b ? __ldcs(wq + (size_t)row_b * GROUPS + group) : zero;
            const unsigned a = ok_a ? ws[(size_t)row_a * GROUPS + group] : 0u;
            const unsigned b = ok_b ? ws[(size_t)row_b * GROUPS + group] : 0u;
            sa[r][slot] = a | (a << 16);
            sb[r][slot] = b | (b << 16);
        }
    };
    // X of chunk j, this thread's vectors (zeros past the batch's rows).
    auto load_x = [&](uint4* xr, int j) {
#pragma unroll
        for (int p = 0; p < X_PER_THREAD; ++p) {
            const int v = threadIdx.x + p * THREADS, r = v >> 4, u = v & 15;
            xr[p] = v < X_VECS && r < m ? x[(size_t)r * (K_ / 8) + (kz * CHUNKS + j) * 16 + u]
                                        : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    auto stage_x = [&](const uint4* xr, int buffer) {
#pragma unroll
        for (int p = 0; p < X_PER_THREAD; ++p) {
            const int v = threadIdx.x + p * THREADS, r = v >> 4, u = v & 15;
            if (v < X_VECS) xs[buffer][r >> 3][u & 3][(r & 7) * 4 + (u >> 2)] = pair_order(xr[p]);
        }
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
        if (s < CHUNKS) load_weights(s, s);
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    {
        uint4 xr[X_PER_THREAD];
        load_x(xr, 0);
        stage_x(xr, 0);
    }
    __syncthreads();
    float d[RW][TILES_A_WARP][4];
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int tile = 0; tile < TILES_A_WARP; ++tile)
            d[r][tile][0] = d[r][tile][1] = d[r][tile][2] = d[r][tile][3] = 0.0f;
    for (int base = 0; base < CHUNKS; base += STAGES) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            const int j = base + s;
            if (j + STAGES - 1 < CHUNKS) load_weights((s + STAGES - 1) % STAGES, j + STAGES - 1);
            const bool more = j + 1 < CHUNKS;
            uint4 xr[X_PER_THREAD];
            if (more) load_x(xr, j + 1);
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                unsigned p[RW][8];
#pragma unroll
                for (int r = 0; r < RW; ++r) {
                    const unsigned a = word_of(wa[r][s], t), b = word_of(wb[r][s], t);
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        p[r][2 * i] = dequantized_pair(a, i, sa[r][s]);
                        p[r][2 * i + 1] = dequantized_pair(b, i, sb[r][s]);
                    }
                }
#pragma unroll
                for (int tile = 0; tile < TILES_A_WARP; ++tile) {
                    const uint4 xv = xs[j & 1][tile_0 + tile][t][lane];
#pragma unroll
                    for (int r = 0; r < RW; ++r) {
                        mma(d[r][tile], p[r][0], p[r][1], p[r][2], p[r][3], xv.x, xv.y);
                        mma(d[r][tile], p[r][4], p[r][5], p[r][6], p[r][7], xv.z, xv.w);
                    }
                }
            }
            if (more) stage_x(xr, (j + 1) & 1);
            __syncthreads();
        }
    }
    // Lane (g, c) holds rows g, g + 8 of batch rows 8 tile + 2c and 8 tile + 2c + 1.
    if (SPLIT_K == 1) {
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            const int row_a = row_0 + 16 * r, row_b = row_a + 8;
#pragma unroll
            for (int tile = 0; tile < TILES_A_WARP; ++tile) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int batch = (tile_0 + tile) * 8 + 2 * c + h;
                    if (batch < m && row_a < N_) y[(size_t)batch * N_ + row_a] = float_bf16(d[r][tile][h]);
                    if (batch < m && row_b < N_) y[(size_t)batch * N_ + row_b] = float_bf16(d[r][tile][2 + h]);
                }
            }
        }
        return;
    }
    float* mine = partial + (size_t)kz * M_MAX * N_;
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        const int row_a = row_0 + 16 * r, row_b = row_a + 8;
#pragma unroll
        for (int tile = 0; tile < TILES_A_WARP; ++tile) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int batch = (tile_0 + tile) * 8 + 2 * c + h;
                if (row_a < N_) mine[(size_t)batch * N_ + row_a] = d[r][tile][h];
                if (row_b < N_) mine[(size_t)batch * N_ + row_b] = d[r][tile][2 + h];
            }
        }
    }
    __threadfence();
    __syncthreads();
    __shared__ unsigned last;
    if (threadIdx.x == 0) last = atomicAdd(counters + blockIdx.x, 1u) == SPLIT_K - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Every partial load of the thread is issued before the first sum is stored (loads
    // unconditional, rows past N read as the last row's): one round trip, not one an output.
    float sums[SUMS_A_THREAD];
#pragma unroll
    for (int i = 0; i < SUMS_A_THREAD; ++i) sums[i] = 0.0f;
#pragma unroll
    for (int z = 0; z < SPLIT_K; ++z) {
#pragma unroll
        for (int i = 0; i < SUMS_A_THREAD; ++i) {
            const int e = threadIdx.x + i * THREADS, batch = e / ROWS_A_BLOCK;
            const int row = min(blockIdx.x * ROWS_A_BLOCK + e % ROWS_A_BLOCK, N_ - 1);
            sums[i] += __ldcg(partial + ((size_t)z * M_MAX + batch) * N_ + row);
        }
    }
#pragma unroll
    for (int i = 0; i < SUMS_A_THREAD; ++i) {
        const int e = threadIdx.x + i * THREADS, batch = e / ROWS_A_BLOCK;
        const int row = blockIdx.x * ROWS_A_BLOCK + e % ROWS_A_BLOCK;
        if (batch < m && row < N_) y[(size_t)batch * N_ + row] = float_bf16(sums[i]);
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0u;
}
