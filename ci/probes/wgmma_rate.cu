// What an FP8 wgmma's N costs the tensor cores (PERF.md, dual_fast at h_q 64): one warpgroup a CTA, 1
// or 2 CTAs a SM (the wide and dual kernels' shapes), issues a chain of SS m64nNk32 e4m3 wgmmas into
// one fp32 accumulator over a 64 x 256 A tile and an N x 256 B tile in the kernels' 64-byte swizzle
// atoms (QK^T's operands: N 32 is the 64-head kernels' half tile), 8 K steps a commit group with one
// group in flight, as a GEMM's main loop does; the same m64n32k32 with A from registers (RS: only B
// read from shared memory); and the RS m64n256k32 into f16 that is dual_fast's P.V. Prints each
// shape's FLOPs a cycle a SM, against the dense FP8 rate (kDenseFlopsPerCycle): an SM's CTAs' FLOPs
// over the span from its first CTA's start to its last one's end (%clock64 is the SM's), with the
// CTAs a SM held to 1 or 2 by their shared memory.
// Built and run by `ci/gpu.sh wgmma` on the GPU machine (a program of its own: no package, no torch).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <vector>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

namespace wgmma_rate {

using namespace cute;
constexpr int kD = 256, kKSteps = kD / 32, kGroups = 4096;
constexpr double kDenseFlopsPerCycle = 8192;  // an SM's 4 tensor cores at the dense FP8 rate
// shared memory a CTA that lets only one, or two, onto an SM (228 KB, 1 KB of it reserved a CTA)
constexpr int kSmemOneCta = 120 * 1024, kSmemTwoCtas = 80 * 1024;
// kN > 0: SS m64nNk32 into fp32; kN == 0: RS m64n256k32 into f16 (P.V); kN == -32: RS m64n32k32 into
// fp32 (QK^T's half tile with Q from registers). b_rows: the B operand's rows.
constexpr int b_rows(int kN) { return kN > 0 ? kN : kN == 0 ? 256 : -kN; }

template <int kRows>
using Tile = decltype(tile_to_shape(GMMA::Layout_K_SW64_Atom<float_e4m3_t>{}, Shape<Int<kRows>, Int<kD>>{}));
using VtTile = decltype(tile_to_shape(GMMA::Layout_K_SW32_Atom<float_e4m3_t>{}, Shape<_256, _32>{}));

template <class Op, class Acc, size_t... I>
__device__ __forceinline__ void ss(uint64_t a, uint64_t b, Acc& d, std::index_sequence<I...>) {
    Op::fma(a, b, d[I]..., GMMA::ScaleOut::One);
}
template <class Op, class Acc, size_t... I>
__device__ __forceinline__ void rs(const uint32_t (&a)[4], uint64_t b, Acc& d, std::index_sequence<I...>) {
    Op::fma(a[0], a[1], a[2], a[3], b, d[I]..., GMMA::ScaleOut::One);
}

// One warpgroup's chain of kN's wgmma. span[3 block ..]: its SM, the chain's start and end (%clock64).
template <int kN>
__global__ void __launch_bounds__(128) chain(long long* span, float* sink) {
    extern __shared__ __align__(1024) uint8_t smem[];
    constexpr int kBRows = b_rows(kN);
    const int tid = threadIdx.x;
    for (int i = tid; i < (64 + kBRows) * kD / 4; i += 128) reinterpret_cast<uint32_t*>(smem)[i] = 0x38383838u * (i % 3);
    __syncthreads();
    auto sa = make_tensor(make_smem_ptr(reinterpret_cast<float_e4m3_t*>(smem)), Tile<64>{});
    auto sb = make_tensor(make_smem_ptr(reinterpret_cast<float_e4m3_t*>(smem + 64 * kD)), Tile<kBRows>{});
    uint64_t da[kKSteps], db[kKSteps];
    float acc32[kN != 0 ? kBRows / 2 : 1] = {};
    uint32_t acc16[64] = {}, pa[4] = {0x3c3c3c3cu, 0x3c3c3c3cu, 0x3c3c3c3cu, 0x3c3c3c3cu};
    using OpSS = decltype(SM90::GMMA::ss_op_selector<float_e4m3_t, float_e4m3_t, float, Shape<_64, Int<kBRows>, _32>>());
    using OpRS = SM90::GMMA::MMA_64x256x32_F16E4M3E4M3_RS_TN<>;
    using OpQkRS = SM90::GMMA::MMA_64x32x32_F32E4M3E4M3_RS_TN<>;
    if constexpr (kN != 0) {
        auto thr = make_tiled_mma(OpSS{}).get_thread_slice(tid);
        auto fa = thr.partition_fragment_A(sa);
        auto fb = thr.partition_fragment_B(sb);
        for (int k = 0; k < kKSteps; ++k) da[k] = fa(0, 0, k), db[k] = fb(0, 0, k);
    } else {
        auto svt = make_tensor(make_smem_ptr(reinterpret_cast<float_e4m3_t*>(smem + 64 * kD)), VtTile{});
        auto fb = make_tiled_mma(OpRS{}).get_thread_slice(tid).partition_fragment_B(svt);
        for (int k = 0; k < kKSteps; ++k) db[k] = fb(0, 0, 0);
    }
    __syncthreads();
    const long long t0 = clock64();
    for (int g = 0; g < kGroups; ++g) {
        warpgroup_arrive();
#pragma unroll
        for (int k = 0; k < kKSteps; ++k) {
            if constexpr (kN > 0) ss<OpSS>(da[k], db[k], acc32, std::make_index_sequence<kBRows / 2>{});
            else if constexpr (kN < 0) rs<OpQkRS>(pa, db[k], acc32, std::make_index_sequence<kBRows / 2>{});
            else rs<OpRS>(pa, db[k], acc16, std::make_index_sequence<64>{});
        }
        warpgroup_commit_batch();
        warpgroup_wait<1>();
    }
    warpgroup_wait<0>();
    const long long t1 = clock64();
    float s = 0.f;
    for (float x : acc32) s += x;
    for (uint32_t x : acc16) s += __uint_as_float(x & 0x3f7fffffu);
    sink[blockIdx.x * 128 + tid] = s;
    if (tid == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        span[3 * blockIdx.x] = sm, span[3 * blockIdx.x + 1] = t0, span[3 * blockIdx.x + 2] = t1;
    }
}

template <int kN>
void run(const char* name, int sms, int per_sm, long long* span, float* sink) {
    const int smem = std::max((64 + b_rows(kN)) * kD, per_sm == 1 ? kSmemOneCta : kSmemTwoCtas);
    cudaFuncSetAttribute(chain<kN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    const int blocks = sms * per_sm;
    chain<kN><<<blocks, 128, smem>>>(span, sink);  // warm-up
    chain<kN><<<blocks, 128, smem>>>(span, sink);
    if (cudaDeviceSynchronize() != cudaSuccess) {
        std::printf("%s: %s\n", name, cudaGetErrorString(cudaGetLastError()));
        return;
    }
    std::vector<long long> host(3 * blocks);
    cudaMemcpy(host.data(), span, host.size() * sizeof(long long), cudaMemcpyDeviceToHost);
    std::map<long long, std::array<long long, 3>> by_sm;  // CTAs, first start, last end
    double chain_cycles = 0;
    for (int b = 0; b < blocks; ++b) {
        const long long sm = host[3 * b], t0 = host[3 * b + 1], t1 = host[3 * b + 2];
        chain_cycles += t1 - t0;
        auto& e = by_sm.try_emplace(sm, std::array<long long, 3>{0, t0, t1}).first->second;
        ++e[0], e[1] = std::min(e[1], t0), e[2] = std::max(e[2], t1);
    }
    const double flops = 2.0 * 64 * b_rows(kN) * 32 * kKSteps * kGroups;  // one CTA's
    double rate = 0;
    int odd = 0;
    for (const auto& [sm, e] : by_sm) {
        rate += e[0] * flops / (e[2] - e[1]);
        odd += e[0] != per_sm;
    }
    rate /= by_sm.size();
    std::printf("%-26s %d CTA/SM: %7.1f cycles a wgmma (one CTA), %6.0f FLOP/cycle/SM (%.2f of the dense rate)%s\n",
                name, per_sm, chain_cycles / blocks / (kKSteps * kGroups), rate, rate / kDenseFlopsPerCycle,
                odd ? " (SMs with other CTA counts)" : "");
}

}  // namespace wgmma_rate

int main() {
    using wgmma_rate::run;
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    long long* span;
    float* sink;
    const int most_blocks = 2 * sms;  // two CTAs a SM
    cudaMalloc(&span, 3 * most_blocks * sizeof(long long));
    cudaMalloc(&sink, most_blocks * 128 * sizeof(float));
    for (int per_sm = 1; per_sm <= 2; ++per_sm) {
        run<32>("SS m64n32k32 (QK^T half)", sms, per_sm, span, sink);
        run<-32>("RS m64n32k32 (Q in regs)", sms, per_sm, span, sink);
        run<64>("SS m64n64k32", sms, per_sm, span, sink);
        run<128>("SS m64n128k32", sms, per_sm, span, sink);
        run<256>("SS m64n256k32", sms, per_sm, span, sink);
        run<0>("RS m64n256k32 f16 (P.V)", sms, per_sm, span, sink);
    }
    return 0;
}
