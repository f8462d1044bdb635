// What compute-sanitizer racecheck reports on the kernels' handoff of a shared-memory word through
// named barriers (PERF.md, v17), reduced to one word per buffer: a producer warpgroup writes word b
// (a byte per warp) and arrives on "full" b; consumer warpgroups wait on it, read the word and
// arrive on "empty" b, which the producer waits on before it writes the word again, kBuffers tiles
// later. Per the PTX memory model an arrive synchronizes with the wait of the same barrier phase, so
// every read sees its tile's write (the sum printed checks it). Modes: 0 a full barrier per consumer
// warpgroup (count 256, the producer arriving on both: the wide and split kernels); 1 one full barrier
// for both (count 384: the 64-head kernel); 2 one consumer warpgroup. With more tiles than buffers
// racecheck reports hazards in every mode. A standalone program: build and run
//   nvcc -O3 -arch=sm_90a -o racecheck_named_barrier ci/microbench/racecheck_named_barrier.cu
//   compute-sanitizer --tool racecheck --racecheck-report all ./racecheck_named_barrier MODE TILES
#include <cstdint>
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }

constexpr int kBuffers = 3;
constexpr int kFullBar0 = 1;                         // + 2 buffer + consumer warpgroup
constexpr int kEmptyBar0 = kFullBar0 + 2 * kBuffers;  // + buffer

__global__ void handoff(int mode, int n_tiles, int* sums) {
    __shared__ uint32_t word[kBuffers];
    const int tid = threadIdx.x, wg = tid / 128;
    const int consumers = mode == 2 ? 128 : 256;
    if (wg == 2) {  // the producer
        for (int t = 0; t < n_tiles; ++t) {
            const int b = t % kBuffers;
            if (t >= kBuffers) bar_sync(kEmptyBar0 + b, 128 + consumers);
            if (tid % 32 == 0) reinterpret_cast<volatile uint8_t*>(&word[b])[(tid - 256) / 32] = static_cast<uint8_t>(t);
            if (mode == 1) {
                bar_arrive(kFullBar0 + 2 * b, 384);
            } else {
                bar_arrive(kFullBar0 + 2 * b, 256);
                if (mode == 0) bar_arrive(kFullBar0 + 2 * b + 1, 256);
            }
        }
        return;
    }
    if (mode == 2 && wg == 1) return;
    int sum = 0;
    for (int t = 0; t < n_tiles; ++t) {
        const int b = t % kBuffers;
        bar_sync(mode == 1 ? kFullBar0 + 2 * b : kFullBar0 + 2 * b + wg, mode == 1 ? 384 : 256);
        sum += reinterpret_cast<volatile uint32_t*>(word)[b];
        if (t + kBuffers < n_tiles) bar_arrive(kEmptyBar0 + b, 128 + consumers);
    }
    sums[blockIdx.x * 256 + tid] = sum;
}

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODE(0-2) TILES\n", argv[0]);
        return 2;
    }
    const int mode = atoi(argv[1]), n_tiles = atoi(argv[2]);
    constexpr int kBlocks = 4;
    int* sums;
    cudaMalloc(&sums, kBlocks * 256 * sizeof(int));
    handoff<<<kBlocks, 384>>>(mode, n_tiles, sums);
    const cudaError_t e = cudaDeviceSynchronize();
    int first;
    cudaMemcpy(&first, sums, sizeof first, cudaMemcpyDeviceToHost);
    // tile t writes t into each byte of its word (modulo 256)
    uint32_t expected = 0;
    for (int t = 0; t < n_tiles; ++t) expected += 0x01010101u * static_cast<uint8_t>(t);
    printf("mode %d, %d tiles: %s, sum %s\n", mode, n_tiles, cudaGetErrorString(e),
           static_cast<uint32_t>(first) == expected ? "right" : "WRONG");
    return e != cudaSuccess || static_cast<uint32_t>(first) != expected;
}
