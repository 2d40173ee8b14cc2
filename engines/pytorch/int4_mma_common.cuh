// Device helpers of the int4 (W4A16) products on the tensor cores, written once:
// `cuda_int4.cuda_source` puts this text before a kernel's own (NVRTC compiles one
// text, no headers). bf16 conversions and rounding; the dequantization of nibbles
// (i, i + 4) of a compressed-tensors word into one bf16 pair (one shift, one LOP3 to
// 128 + u, two fma.bf16x2 to (u - 8) * scale, rounded once as the dequantized weight is);
// the bf16 mma.m16n8k16 with float32 sums (sm_80 and later).

__device__ __forceinline__ unsigned short float_bf16(float f) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_float(unsigned short h) {
    return __uint_as_float((unsigned)h << 16);
}

__device__ __forceinline__ float rounded(float v) { return bf16_float(float_bf16(v)); }

__device__ __forceinline__ unsigned word_of(const uint4& v, int t) {
    return t == 0 ? v.x : t == 1 ? v.y : t == 2 ? v.z : v.w;
}

__device__ __forceinline__ unsigned pair_bf16(float lo, float hi) {
    return (unsigned)float_bf16(lo) | ((unsigned)float_bf16(hi) << 16);
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

// The bf16 pairs a * b, each rounded once.
__device__ __forceinline__ unsigned times(unsigned a, unsigned b) {
    unsigned out;
    asm("{ .reg .b32 zero;\n"
        "  mov.b32 zero, 0x80008000;\n"
        "  fma.rn.bf16x2 %0, %1, %2, zero; }"
        : "=r"(out) : "r"(a), "r"(b));
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
