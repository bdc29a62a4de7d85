// cuda-proof: what the proof script runs, the same binary on the host and in a sandbox,
// to compare them: a device query, device-to-device copy bandwidth and the throughput
// of a plain shared-memory SGEMM kernel (no cuBLAS: the binary needs nothing from the
// CUDA toolkit at run time, nvcc links the runtime statically and it dlopens libcuda).
//
// Output, one `key=value` per line:
//   devices=<count>
//   dev<N>=<name>|<compute capability>|<memory MiB>|<PCI bus id>|<GPU-UUID>
//   d2d_GBps=<best of the trials: 2 * bytes / time, as CUDA's bandwidthTest counts>
//   sgemm_GFLOPs=<best of the trials: 2 n^3 / time>
//   sgemm_check=ok|bad (a few entries against the CPU)
// Usage: cuda-proof [--query]   (--query: the device lines only)
#include <cuda_runtime.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                        \
    do {                                                                                \
        cudaError_t e_ = (x);                                                           \
        if (e_ != cudaSuccess) {                                                        \
            printf("error=%s: %s (%d)\n", #x, cudaGetErrorString(e_), (int)e_);         \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

constexpr int TILE = 32;

__global__ void sgemm(int n, const float *a, const float *b, float *c) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int k0 = 0; k0 < n; k0 += TILE) {
        as[threadIdx.y][threadIdx.x] = a[row * n + k0 + threadIdx.x];
        bs[threadIdx.y][threadIdx.x] = b[(k0 + threadIdx.y) * n + col];
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; k++) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
        __syncthreads();
    }
    c[row * n + col] = acc;
}

static float best_ms(cudaEvent_t start, cudaEvent_t stop, int trials, void (*work)(void *), void *arg) {
    float best = 1e30f;
    for (int t = 0; t < trials; t++) {
        CHECK(cudaEventRecord(start));
        work(arg);
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (ms < best) best = ms;
    }
    return best;
}

struct Copy {
    void *dst, *src;
    size_t bytes;
    int reps;
};
static void do_copy(void *p) {
    Copy *c = (Copy *)p;
    for (int i = 0; i < c->reps; i++) CHECK(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice));
}

struct Gemm {
    int n;
    float *a, *b, *c;
};
static void do_gemm(void *p) {
    Gemm *g = (Gemm *)p;
    dim3 block(TILE, TILE), grid(g->n / TILE, g->n / TILE);
    sgemm<<<grid, block>>>(g->n, g->a, g->b, g->c);
    CHECK(cudaGetLastError());
}

int main(int argc, char **argv) {
    bool query_only = argc > 1 && strcmp(argv[1], "--query") == 0;
    int n_dev = 0;
    CHECK(cudaGetDeviceCount(&n_dev));
    printf("devices=%d\n", n_dev);
    for (int i = 0; i < n_dev; i++) {
        cudaDeviceProp p;
        CHECK(cudaGetDeviceProperties(&p, i));
        char uuid[64];
        const unsigned char *u = (const unsigned char *)p.uuid.bytes;
        snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                 u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
        printf("dev%d=%s|%d.%d|%zu|%04x:%02x:%02x.0|%s\n", i, p.name, p.major, p.minor, p.totalGlobalMem >> 20,
               p.pciDomainID, p.pciBusID, p.pciDeviceID, uuid);
    }
    if (query_only || n_dev == 0) return n_dev == 0;
    CHECK(cudaSetDevice(0));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));

    // Device-to-device copy: 256 MiB, 10 copies per trial, best of 5 trials.
    Copy cp{nullptr, nullptr, (size_t)256 << 20, 10};
    CHECK(cudaMalloc(&cp.src, cp.bytes));
    CHECK(cudaMalloc(&cp.dst, cp.bytes));
    CHECK(cudaMemset(cp.src, 1, cp.bytes));
    do_copy(&cp);
    CHECK(cudaDeviceSynchronize());
    float ms = best_ms(start, stop, 5, do_copy, &cp);
    printf("d2d_GBps=%.1f\n", 2.0 * cp.bytes * cp.reps / (ms / 1e3) / 1e9);
    CHECK(cudaFree(cp.src));
    CHECK(cudaFree(cp.dst));

    // SGEMM, n = 4096: best of 5 launches after a warm-up.
    Gemm g{4096, nullptr, nullptr, nullptr};
    size_t elems = (size_t)g.n * g.n;
    std::vector<float> ha(elems), hb(elems), hc(elems);
    srand(1);
    for (size_t i = 0; i < elems; i++) {
        ha[i] = (float)(rand() % 7 - 3) / 4.f;
        hb[i] = (float)(rand() % 5 - 2) / 2.f;
    }
    CHECK(cudaMalloc(&g.a, elems * sizeof(float)));
    CHECK(cudaMalloc(&g.b, elems * sizeof(float)));
    CHECK(cudaMalloc(&g.c, elems * sizeof(float)));
    CHECK(cudaMemcpy(g.a, ha.data(), elems * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(g.b, hb.data(), elems * sizeof(float), cudaMemcpyHostToDevice));
    do_gemm(&g);
    CHECK(cudaDeviceSynchronize());
    ms = best_ms(start, stop, 5, do_gemm, &g);
    printf("sgemm_GFLOPs=%.1f\n", 2.0 * g.n * (double)g.n * g.n / (ms / 1e3) / 1e9);
    CHECK(cudaMemcpy(hc.data(), g.c, elems * sizeof(float), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int s = 0; s < 16; s++) {
        int r = (s * 977) % g.n, c = (s * 613) % g.n;
        double want = 0;
        for (int k = 0; k < g.n; k++) want += (double)ha[(size_t)r * g.n + k] * hb[(size_t)k * g.n + c];
        if (std::fabs(want - hc[(size_t)r * g.n + c]) > 1e-2 * (1 + std::fabs(want))) ok = false;
    }
    printf("sgemm_check=%s\n", ok ? "ok" : "bad");
    return ok ? 0 : 1;
}
