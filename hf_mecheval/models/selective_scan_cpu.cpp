// Mamba's selective scan on a CPU, fused: one pass over time per batch row that keeps the state
// (N x E numbers) in cache, instead of PyTorch's whole-tensor passes over (B, L, N, E) buffers
// that are memory-bound. The math is ops_selective_scan.py's readable reference:
//
//     h_t = exp(dt_t A) * h_{t-1} + dt_t x_t B_t        h: (N, E) per row, A: (N, E)
//     y_t = C_t . h_t                                   (E,)
//
// Layout (row-major, contiguous): x, dt, y: (B, L, E); A: (N, E), or (B, N, E) with one A per
// row (stacked copies folded into the rows); Bm, C: (B, L, N). The channels E are innermost, so
// every inner loop runs over contiguous memory and the compiler vectorizes it (with -ffast-math
// glibc's vector exp as well). A row's results are written by that row's call only; the caller
// splits rows between threads.
//
// Built by cpu_kernels.py (g++ -O3 -march=native -ffast-math) and called through ctypes; tested
// against the reference in tests/models/test_mamba_scan.py.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace {

// exp(v) for a decay exponent v = dt A <= 0, with v clamped at -80 (float; -700 for double):
// a decay below exp(-80) ~ 2e-35 reads as exp(-80), which changes h by less than 2e-35 of
// h_{t-1}. A model whose dt grows large (a high learning rate: dt up to 3e4) has many v far
// below that, where glibc's vector exp leaves its fast path lane by lane and the products turn
// subnormal: the scan ran 10x slower. (Selecting 0 there instead kept the slow path: measured.)
template <typename T>
inline T decay(T v) {
    const T lowest = sizeof(T) == 4 ? T(-80) : T(-700);
    return std::exp(v < lowest ? lowest : v);
}

// Subnormal inputs and results read as 0 inside a kernel call (x86: the MXCSR DAZ and FTZ bits),
// restored on return: the same reason as above, for what the decays multiply.
struct FlushSubnormals {
#if defined(__SSE__)
    unsigned saved = _mm_getcsr();
    FlushSubnormals() { _mm_setcsr(saved | 0x8040); }
    ~FlushSubnormals() { _mm_setcsr(saved); }
#endif
};

template <typename T>
void forward_row(const T* x, const T* dt, const T* A, const T* Bm, const T* C, T* y,
                 int64_t L, int64_t N, int64_t E, T* h, T* dtx) {
    std::memset(h, 0, sizeof(T) * N * E);
    for (int64_t t = 0; t < L; ++t) {
        const T* dt_t = dt + t * E;
        T* y_t = y + t * E;
        for (int64_t e = 0; e < E; ++e) {
            dtx[e] = dt_t[e] * x[t * E + e];
            y_t[e] = 0;
        }
        for (int64_t n = 0; n < N; ++n) {
            const T* a = A + n * E;
            T* h_n = h + n * E;
            const T b = Bm[t * N + n], c = C[t * N + n];
            for (int64_t e = 0; e < E; ++e) {
                h_n[e] = decay(dt_t[e] * a[e]) * h_n[e] + b * dtx[e];
                y_t[e] += c * h_n[e];
            }
        }
    }
}

// Gradients of sum(gy * y) for one row. The forward is recomputed, keeping the states H of every
// step ((L, N, E): a few hundred KB at Mamba's sizes, in cache), then one pass backwards in time
// carries G_t = dLoss/dh_t = C_t gy_t + dA_{t+1} G_{t+1}. The decays dA_t = exp(dt_t A) are
// recomputed on the way back too, which measured as fast as keeping them in a second (L, N, E)
// buffer: step t needs dA_t and dA_{t+1}, the previous step's.
// Outputs: gx, gdt (L, E); gA (N, E), this row's share; gB, gC (L, N).
template <typename T>
void backward_row(const T* x, const T* dt, const T* A, const T* Bm, const T* C, const T* gy,
                  T* gx, T* gdt, T* gA, T* gB, T* gC, int64_t L, int64_t N, int64_t E,
                  std::vector<T>& H, std::vector<T>& G, std::vector<T>& dA_now, std::vector<T>& dA_next,
                  std::vector<T>& gdtx) {
    const int64_t S = N * E;
    for (int64_t t = 0; t < L; ++t) {           // the forward again: H_t
        const T* dt_t = dt + t * E;
        const T* x_t = x + t * E;
        for (int64_t n = 0; n < N; ++n) {
            const T* a = A + n * E;
            T* H_tn = H.data() + t * S + n * E;
            const T b = Bm[t * N + n];
            if (t == 0) {
                for (int64_t e = 0; e < E; ++e) H_tn[e] = b * dt_t[e] * x_t[e];
            } else {
                const T* H_prev = H_tn - S;
                for (int64_t e = 0; e < E; ++e) H_tn[e] = decay(dt_t[e] * a[e]) * H_prev[e] + b * dt_t[e] * x_t[e];
            }
        }
    }
    std::memset(gA, 0, sizeof(T) * S);
    T* g = G.data();
    for (int64_t t = L - 1; t >= 0; --t) {
        const T* dt_t = dt + t * E;
        const T* x_t = x + t * E;
        const T* gy_t = gy + t * E;
        T* gd = gdtx.data();                    // dLoss/d(dt_t x_t), (E,)
        T* gdt_t = gdt + t * E;
        std::memset(gd, 0, sizeof(T) * E);
        std::memset(gdt_t, 0, sizeof(T) * E);
        for (int64_t n = 0; n < N; ++n) {
            T* g_n = g + n * E;
            const T* H_tn = H.data() + t * S + n * E;
            const T* dA_up = dA_next.data() + n * E;                    // dA_{t+1}
            const T c = C[t * N + n], b = Bm[t * N + n];
            T sum_c = 0, sum_b = 0;
            if (t + 1 < L) {
                for (int64_t e = 0; e < E; ++e) g_n[e] = dA_up[e] * g_n[e] + c * gy_t[e];   // G_t
            } else {
                for (int64_t e = 0; e < E; ++e) g_n[e] = c * gy_t[e];
            }
            for (int64_t e = 0; e < E; ++e) {
                sum_c += H_tn[e] * gy_t[e];
                sum_b += g_n[e] * dt_t[e] * x_t[e];
                gd[e] += b * g_n[e];
            }
            gC[t * N + n] = sum_c;
            gB[t * N + n] = sum_b;
            if (t > 0) {                        // dLoss/d(dt_t A) = G_t * H_{t-1} * dA_t
                const T* a = A + n * E;
                const T* H_prev = H_tn - S;
                T* dA_n = dA_now.data() + n * E;
                T* gA_n = gA + n * E;
                for (int64_t e = 0; e < E; ++e) {
                    dA_n[e] = decay(dt_t[e] * a[e]);
                    const T q = g_n[e] * H_prev[e] * dA_n[e];
                    gdt_t[e] += q * a[e];
                    gA_n[e] += q * dt_t[e];
                }
            }
        }
        dA_now.swap(dA_next);                   // dA_t is the next step's dA_{t+1}
        for (int64_t e = 0; e < E; ++e) {
            gx[t * E + e] = gd[e] * dt_t[e];
            gdt_t[e] += gd[e] * x_t[e];
        }
    }
}

template <typename T>
void forward(const T* x, const T* dt, const T* A, const T* Bm, const T* C, T* y,
             int64_t rows, int64_t L, int64_t N, int64_t E, int64_t a_per_row) {
    FlushSubnormals flush;
    std::vector<T> h(N * E), dtx(E);
    for (int64_t r = 0; r < rows; ++r)
        forward_row(x + r * L * E, dt + r * L * E, A + (a_per_row ? r * N * E : 0), Bm + r * L * N,
                    C + r * L * N, y + r * L * E, L, N, E, h.data(), dtx.data());
}

template <typename T>
void backward(const T* x, const T* dt, const T* A, const T* Bm, const T* C, const T* gy,
              T* gx, T* gdt, T* gA, T* gB, T* gC, int64_t rows, int64_t L, int64_t N, int64_t E,
              int64_t a_per_row) {
    // gA: (rows, N, E), one share per row; the caller sums them where A is shared
    FlushSubnormals flush;
    std::vector<T> H(L * N * E), G(N * E), dA_now(N * E), dA_next(N * E), gdtx(E);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t s = r * L * E, p = r * L * N;
        backward_row(x + s, dt + s, A + (a_per_row ? r * N * E : 0), Bm + p, C + p, gy + s,
                     gx + s, gdt + s, gA + r * N * E, gB + p, gC + p, L, N, E, H, G, dA_now, dA_next, gdtx);
    }
}

}  // namespace

extern "C" {
void scan_forward_f32(const float* x, const float* dt, const float* A, const float* Bm, const float* C,
                      float* y, int64_t rows, int64_t L, int64_t N, int64_t E, int64_t a_per_row) {
    forward(x, dt, A, Bm, C, y, rows, L, N, E, a_per_row);
}
void scan_forward_f64(const double* x, const double* dt, const double* A, const double* Bm, const double* C,
                      double* y, int64_t rows, int64_t L, int64_t N, int64_t E, int64_t a_per_row) {
    forward(x, dt, A, Bm, C, y, rows, L, N, E, a_per_row);
}
void scan_backward_f32(const float* x, const float* dt, const float* A, const float* Bm, const float* C,
                       const float* gy, float* gx, float* gdt, float* gA, float* gB, float* gC,
                       int64_t rows, int64_t L, int64_t N, int64_t E, int64_t a_per_row) {
    backward(x, dt, A, Bm, C, gy, gx, gdt, gA, gB, gC, rows, L, N, E, a_per_row);
}
void scan_backward_f64(const double* x, const double* dt, const double* A, const double* Bm, const double* C,
                       const double* gy, double* gx, double* gdt, double* gA, double* gB, double* gC,
                       int64_t rows, int64_t L, int64_t N, int64_t E, int64_t a_per_row) {
    backward(x, dt, A, Bm, C, gy, gx, gdt, gA, gB, gC, rows, L, N, E, a_per_row);
}
}
