// The narrow kernels' MMA (mma.sync m16n8k16, fp16 in, fp32 out) and its fragments read from a landing
// tile by ldmatrix, the e4m3 bytes converted exactly to fp16 in registers.
#pragma once

#include <stdint.h>

#include "sm90/config.h"
#include "sm90/device_helpers.cuh"

namespace sparse_mla::sm90::narrow {

// d += a b: A 16x16 (4 registers of fp16 pairs), B 16x8 (2), D 16x8 fp32
__device__ inline void mma_f16(float (&d)[4], uint4 a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// The fragment layouts (gid = lane / 4, tig = lane % 4). An ldmatrix x4 at rows R.. of a landing tile
// and chunks c, c + 1 (c even) reads four 8x16-byte matrices: (rows R..R+7, c), (R+8..R+15, c),
// (R..R+7, c+1), (R+8..R+15, c+1); lane L gives the address of row L % 8 of matrix L / 8. Its
// offset from (R, c) in sw64_chunk's layout, for c % 4 == 0 (c % 4 == 2: ^ 32, the chunk's bit 1):
__device__ inline uint32_t ldmatrix_lane_offset(int lane) {
    const int i = lane / 8, r = 8 * (i % 2) + lane % 8;
    return r * 64 + (((i / 2) ^ ((r / 2) % 4)) * 16);
}
__device__ inline uint32_t ldmatrix_at(uint32_t tile, int row0, int c, uint32_t lane_offset) {
    return tile + (c / 4) * kE4m3AtomColumnBytes + row0 * 64 + ((c % 4) ? (lane_offset ^ 32) : lane_offset);
}
// Q K^T's k order: a non-transposed matrix gives lane (gid, tig) bytes 4 tig .. 4 tig + 3 of its
// row (slot gid); converted, the first pair is B's k rows 2 tig, 2 tig + 1 and the second k rows
// 2 tig + 8, + 9. So an MMA's k index is a permutation of the chunk's 16 columns, and Q's A fragment
// follows it (the consumers' q16): a dot product's terms in another order.
// P.V's n order: a transposed matrix gives lane (gid, tig) the bytes V[2 tig][2 gid], V[2 tig][2 gid
// + 1], V[2 tig + 1][2 gid], V[2 tig + 1][2 gid + 1] (rows = slots); byte-permuted to (V[2 tig][2 gid],
// V[2 tig + 1][2 gid]), (V[2 tig][2 gid + 1], V[2 tig + 1][2 gid + 1]) they are the B fragments of two
// n8 tiles, the chunk's even and its odd columns. O's accumulators then hold, per row, the 4
// consecutive columns 4 tig .. 4 tig + 3 of each chunk.
constexpr uint32_t kEvenOddBytes = 0x3120;

// V's fragments on the 16 slots 16 kc .. of a landing tile, for the d_v chunks c0 + 2 dp + cc (dp < 4,
// cc < 2): f(dp, cc, lo, hi) takes each chunk's converted pairs, lo of slots 2 tig, 2 tig + 1 and hi
// of slots 2 tig + 8, + 9, each .x in the chunk's column 2 gid and .y in column 2 gid + 1.
template <class F>
__device__ inline void for_v_fragments(uint32_t tile, int kc, int c0, uint32_t lane_offset, F f) {
#pragma unroll
    for (int dp = 0; dp < 4; ++dp) {
        uint32_t r[4];
        ldmatrix_x4_trans(r, ldmatrix_at(tile, 16 * kc, c0 + 2 * dp, lane_offset));
#pragma unroll
        for (int cc = 0; cc < 2; ++cc)
            f(dp, cc, e4m3x4_to_half2x2(__byte_perm(r[2 * cc], 0, kEvenOddBytes)),
              e4m3x4_to_half2x2(__byte_perm(r[2 * cc + 1], 0, kEvenOddBytes)));
    }
}

}  // namespace sparse_mla::sm90::narrow
