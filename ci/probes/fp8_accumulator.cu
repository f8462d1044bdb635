// How Hopper's FP8 wgmma sums (for precision "fast": how many K steps its sums may run, and whether
// an f16 O can take an e4m3 P.V): one warpgroup runs D = C + sum over kSteps K steps of A B^T, each
// step one wgmma m64n8k32 e4m3 x e4m3 into the accumulator (f32 or f16), C loaded into it first.
// A is 64 x K and B 8 x K e4m3 bytes (K = 32 kSteps, K-major), C and D 64 x 8 floats (rounded to f16
// on the way in for an f16 accumulator). ci/probes/fp8_accumulator.py builds the cases and reads them.
#include <cuda_fp16.h>
#include <stdint.h>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

namespace {

constexpr int kM = 64, kN = 8, kKStep = 32, kThreads = 128;

template <bool kF16, int kSteps>
__device__ void chain(const uint8_t* a, const uint8_t* b, const float* c, float* d) {
    using namespace cute;
    using Op = std::conditional_t<kF16, SM90_64x8x32_F16E4M3E4M3_SS_TN<>, SM90_64x8x32_F32E4M3E4M3_SS_TN<>>;
    constexpr int kK = kKStep * kSteps;
    using Atom = GMMA::Layout_K_INTER_Atom<float_e4m3_t>;
    auto layout_a = tile_to_shape(Atom{}, Shape<Int<kM>, Int<kK>>{});
    auto layout_b = tile_to_shape(Atom{}, Shape<Int<kN>, Int<kK>>{});
    __shared__ alignas(128) uint8_t smem_a[kM * kK];
    __shared__ alignas(128) uint8_t smem_b[kN * kK];
    Tensor sa = make_tensor(make_smem_ptr(reinterpret_cast<float_e4m3_t*>(smem_a)), layout_a);
    Tensor sb = make_tensor(make_smem_ptr(reinterpret_cast<float_e4m3_t*>(smem_b)), layout_b);
    const int tid = threadIdx.x;
    for (int i = tid; i < kM * kK; i += kThreads) smem_a[layout_a(i / kK, i % kK)] = a[i];
    for (int i = tid; i < kN * kK; i += kThreads) smem_b[layout_b(i / kK, i % kK)] = b[i];
    __syncthreads();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");

    auto thr = make_tiled_mma(Op{}).get_thread_slice(tid);
    Tensor da = thr.partition_fragment_A(sa);  // descriptors, one per K step
    Tensor db = thr.partition_fragment_B(sb);
    // the accumulator of m64n8: element i of a thread is row 16 warp + gid + 8 (i / 2), column
    // 2 tig + i % 2 (f16: pairs of columns in one register)
    const int warp = tid / 32, gid = tid % 32 / 4, tig = tid % 4;
    auto at = [&](int i) { return (16 * warp + gid + 8 * (i / 2)) * kN + 2 * tig + i % 2; };
    float acc[4];
    uint32_t acc16[2];
    for (int i = 0; i < 4; ++i) acc[i] = c[at(i)];
    for (int r = 0; r < 2; ++r) {
        const __half2 h = __floats2half2_rn(acc[2 * r], acc[2 * r + 1]);
        acc16[r] = *reinterpret_cast<const uint32_t*>(&h);
    }
    warpgroup_arrive();
    for (int ks = 0; ks < kSteps; ++ks) {
        const uint64_t desc_a = static_cast<uint64_t>(da(0, 0, ks)), desc_b = static_cast<uint64_t>(db(0, 0, ks));
        if constexpr (kF16) Op::fma(desc_a, desc_b, acc16[0], acc16[1], GMMA::ScaleOut::One);
        else Op::fma(desc_a, desc_b, acc[0], acc[1], acc[2], acc[3], GMMA::ScaleOut::One);
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    if constexpr (kF16) {
        for (int r = 0; r < 2; ++r) {
            const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&acc16[r]));
            acc[2 * r] = x.x, acc[2 * r + 1] = x.y;
        }
    }
    for (int i = 0; i < 4; ++i) d[at(i)] = acc[i];
}

}  // namespace

#define FP8_ACCUMULATOR_ENTRY(acc, f16, steps)                                                              \
    extern "C" __global__ void __launch_bounds__(kThreads)                                                   \
        chain_##acc##_##steps(const uint8_t* a, const uint8_t* b, const float* c, float* d) {                \
        chain<f16, steps>(a, b, c, d);                                                                       \
    }
FP8_ACCUMULATOR_ENTRY(f32, false, 1)
FP8_ACCUMULATOR_ENTRY(f32, false, 2)
FP8_ACCUMULATOR_ENTRY(f32, false, 4)
FP8_ACCUMULATOR_ENTRY(f32, false, 16)
FP8_ACCUMULATOR_ENTRY(f16, true, 1)
FP8_ACCUMULATOR_ENTRY(f16, true, 64)
