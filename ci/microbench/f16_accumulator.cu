// How wgmma's f16 accumulator rounds (PERF.md, "fourth part"): one warpgroup, SS m64n256k16 f16 +=
// f16 x f16 chained over K. Probes (C plus products worth fractions of an ulp) print what came out;
// a P.V-like sum over K = 512 and 2048 is compared with float64 and with per-k16-step emulations that
// round to nearest and toward zero. A standalone program (static cudart): build
//   nvcc -std=c++17 -O2 -arch=sm_90a --expt-relaxed-constexpr -I <cutlass>/include -cudart static
//     -o f16_accumulator ci/microbench/f16_accumulator.cu
#include <cstdio>
#include <cmath>
#include <vector>
#include <random>
#include <cuda_fp16.h>
#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
using namespace cute;
using Mma = SM90_64x256x16_F16F16F16_SS<GMMA::Major::K, GMMA::Major::K>;
using SA = decltype(tile_to_shape(GMMA::Layout_K_SW32_Atom<half_t>{}, Shape<_64, _16>{}));
using SB = decltype(tile_to_shape(GMMA::Layout_K_SW32_Atom<half_t>{}, Shape<_256, _16>{}));

__global__ void __launch_bounds__(128) k16acc(const half_t* A, const half_t* B, const half_t* C0, half_t* C, int K) {
    __shared__ __align__(1024) half_t sa[64 * 16];
    __shared__ __align__(1024) half_t sb[256 * 16];
    Tensor sA = make_tensor(make_smem_ptr(sa), SA{});
    Tensor sB = make_tensor(make_smem_ptr(sb), SB{});
    auto mma = make_tiled_mma(Mma{});
    auto thr = mma.get_thread_slice(threadIdx.x);
    Tensor gC0 = make_tensor(make_gmem_ptr(C0), make_layout(make_shape(Int<64>{}, Int<256>{}), make_stride(Int<256>{}, Int<1>{})));
    Tensor gC = make_tensor(make_gmem_ptr(C), make_layout(make_shape(Int<64>{}, Int<256>{}), make_stride(Int<256>{}, Int<1>{})));
    Tensor acc = thr.partition_fragment_C(gC);
    copy(thr.partition_C(gC0), acc);
    Tensor tA = thr.partition_fragment_A(sA);
    Tensor tB = thr.partition_fragment_B(sB);
    mma.accumulate_ = GMMA::ScaleOut::One;
    for (int k0 = 0; k0 < K; k0 += 16) {
        for (int u = threadIdx.x; u < 64 * 16; u += 128) sA(u / 16, u % 16) = A[(u / 16) * K + k0 + u % 16];
        for (int u = threadIdx.x; u < 256 * 16; u += 128) sB(u / 16, u % 16) = B[(u / 16) * K + k0 + u % 16];
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        warpgroup_fence_operand(acc);
        warpgroup_arrive();
        gemm(mma, tA, tB, acc);
        warpgroup_commit_batch();
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc);
        __syncthreads();
    }
    copy(acc, thr.partition_C(gC));
}

static double h2d(__half h) { return (double)__half2float(h); }
static __half rn(double x) { return __double2half(x); }
static __half rz(double x) {
    __half h = __double2half(x);
    double y = h2d(h);
    if (std::fabs(y) > std::fabs(x)) {  // step one ulp toward zero
        unsigned short b = *reinterpret_cast<unsigned short*>(&h);
        b -= 1;
        h = *reinterpret_cast<__half*>(&b);
    }
    return h;
}

static std::vector<__half> run(const std::vector<__half>& A, const std::vector<__half>& B, const std::vector<__half>& C0, int K) {
    half_t *dA, *dB, *dC0, *dC;
    cudaMalloc(&dA, A.size() * 2); cudaMalloc(&dB, B.size() * 2); cudaMalloc(&dC0, C0.size() * 2); cudaMalloc(&dC, C0.size() * 2);
    cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dC0, C0.data(), C0.size() * 2, cudaMemcpyHostToDevice);
    k16acc<<<1, 128>>>(dA, dB, dC0, dC, K);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) { printf("CUDA error %s\n", cudaGetErrorString(e)); exit(1); }
    std::vector<__half> C(C0.size());
    cudaMemcpy(C.data(), dC, C.size() * 2, cudaMemcpyDeviceToHost);
    cudaFree(dA); cudaFree(dB); cudaFree(dC0); cudaFree(dC);
    return C;
}

int main() {
    // probes: C0 = c, one product a (or 16 products a each), B = 1
    struct Probe { double c, a; int n; const char* what; };
    Probe probes[] = {
        {1.0, 3 * std::ldexp(1.0, -12), 1, "1 + 0.75 ulp: RN 1+2^-10, RZ 1"},
        {-1.0, -3 * std::ldexp(1.0, -12), 1, "-1 - 0.75 ulp: RN -(1+2^-10), RZ -1"},
        {1.0, -5 * std::ldexp(1.0, -13), 1, "1 - 1.25 ulp(below 1): RN 1-2^-11, RZ 1-2^-10"},
        {1.0, 3 * std::ldexp(1.0, -16), 16, "1 + 16 x 0.047 ulp: one rounding of the sum: RN 1+2^-10; per product: 1"},
        {0.0, std::ldexp(1.0, -24) * 3, 1, "0 + 3 x 2^-24 (subnormal): kept or flushed"},
        {2048.0, 1.0, 1, "2048 + 1 (half ulp, tie): RN-even 2048"},
        {2048.0, 1.5, 1, "2048 + 1.5: RN 2050, RZ 2048"},
    };
    for (const Probe& p : probes) {
        const int K = 16;
        std::vector<__half> A(64 * K, rn(0)), B(256 * K, rn(0)), C0(64 * 256, rn(p.c));
        for (int m = 0; m < 64; ++m) for (int j = 0; j < p.n; ++j) A[m * K + j] = rn(p.a);
        for (int n = 0; n < 256; ++n) for (int j = 0; j < 16; ++j) B[n * K + j] = rn(1.0);
        auto C = run(A, B, C0, K);
        printf("probe %-75s -> %.10g (C[63][255] %.10g)\n", p.what, h2d(C[0]), h2d(C[64 * 256 - 1]));
    }
    // a P.V-like sum: P in [0, 2^-4] fp16, V e4m3 values (randn x 1.5), K = 2048, C0 = 0
    std::mt19937 g(1);
    std::normal_distribution<double> nd(0, 1.5);
    std::uniform_real_distribution<double> ud(0, 1);
    for (int K : {512, 2048}) {
        std::vector<__half> A(64 * K), B(256 * K), C0(64 * 256, rn(0));
        for (auto& x : A) x = rn(std::exp2(-8 * ud(g)) / 16);
        for (auto& x : B) x = rn(nd(g));
        auto C = run(A, B, C0, K);
        double num = 0, den = 0, num_rn = 0, num_rz = 0; long same_rn = 0, same_rz = 0;
        for (int m = 0; m < 64; ++m) for (int n = 0; n < 256; ++n) {
            double ref = 0; __half orn = rn(0), orz = rn(0);
            for (int k0 = 0; k0 < K; k0 += 16) {
                double s = 0;
                for (int j = 0; j < 16; ++j) s += h2d(A[m * K + k0 + j]) * h2d(B[n * K + k0 + j]);
                ref += s;
                orn = rn(h2d(orn) + s);
                orz = rz(h2d(orz) + s);
            }
            double got = h2d(C[m * 256 + n]);
            num += (got - ref) * (got - ref); den += ref * ref;
            num_rn += (h2d(orn) - ref) * (h2d(orn) - ref); num_rz += (h2d(orz) - ref) * (h2d(orz) - ref);
            same_rn += got == h2d(orn); same_rz += got == h2d(orz);
        }
        printf("K %d: rel err GPU %.3e, per-step RN emulation %.3e, RZ emulation %.3e; GPU equal to RN %ld / %d, to RZ %ld\n",
               K, std::sqrt(num / den), std::sqrt(num_rn / den), std::sqrt(num_rz / den), same_rn, 64 * 256, same_rz);
    }
    return 0;
}
