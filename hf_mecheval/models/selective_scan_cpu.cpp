// Mamba's selective scan on a CPU, fused: one pass over time per batch row and block of W
// channels, whose state (N vectors of W numbers) stays in the first-level cache, instead of
// PyTorch's whole-tensor passes over (B, L, N, E) buffers that are memory-bound. The math is
// ops_selective_scan.py's readable reference, with the elementwise steps around it that
// mixer_mamba.py writes out in PyTorch taken in as options (as mamba-ssm's selective_scan_fn
// does on a GPU):
//
//     dt_t = softplus(dt_raw_t + bias)   (softplus on; bias optional)   or   dt_raw_t + bias
//     h_t  = exp(dt_t A) * h_{t-1} + dt_t x_t B_t       h: (N, E) per row, A: (N, E)
//     y_t  = C_t . h_t + D x_t                          (E,)   (D optional)
//     out_t = y_t * silu(z_t)                           (z optional)
//
// Layout (row-major, contiguous): x, dt (dt_raw), z, out: (B, L, E); A: (N, E), or (B, N, E)
// with one A per row (stacked copies folded into the rows); Bm, C: (B, L, N); D, bias: (B, E),
// one per row (the caller expands a shared one). Every channel e is its own recurrence, so a row
// is computed in blocks of W = 16 channels, each block one vector (GCC / Clang vector
// extensions: every operation below acts on the W lanes at once), with the decays' exp computed
// inline on the vector. A block narrower than W (the last one, where E is not a multiple of W)
// runs with its missing lanes set to zero (x = A = 0: a state that stays 0), never written back.
// A row's results are written by that row's call only; rows are split between threads here.
//
// Built by cpu_kernels.py (g++ -O3 -march=native -ffp-contract=fast, without -ffast-math) and
// called through ctypes; tested against the reference in tests/models/test_mamba_scan.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_threads.h"
#include "cpu_vectors.h"

namespace {

using namespace cpu_vectors;

// One call's tensors and sizes (the layouts above). D, z, bias (forward), and gD, gz, gbias
// (backward) may be null: that option is off. gD, gbias: (B, E), one share per row.
template <typename T>
struct Scan {
    const T *x, *dt, *A, *Bm, *C, *D, *z, *bias;
    T* out;
    const T* gout;
    T *gx, *gdt, *gA, *gB, *gC, *gD, *gz, *gbias;
    int64_t L, N, E, a_per_row, softplus;
};

// The step size dt_t of a block's lanes at position t, and (slope) d dt_t / d dt_raw_t.
template <typename T, bool Full>
inline Vec<T> step_size(const Scan<T>& s, const T* dt_raw, Vec<T> bias, int64_t w, Vec<T>* slope) {
    const Vec<T> v = load<T, Full>(dt_raw, w) + bias;
    if (!s.softplus) {
        if (slope) *slope = splat(T(1));
        return v;
    }
    if (slope) *slope = softplus_slope<T>(v);
    return softplus(v);
}

// out for channels e0 .. e0 + w of row r. a: (N,) this block's A; h: (N,) scratch.
template <typename T, bool Full>
void forward_block(const Scan<T>& s, int64_t r, int64_t e0, int64_t w, const Vec<T>* a, Vec<T>* h) {
    const int64_t L = s.L, N = s.N, E = s.E, q = r * L * E + e0, p = r * L * N;
    const Vec<T> bias = s.bias ? load<T, Full>(s.bias + r * E + e0, w) : Vec<T>{};
    const Vec<T> d = s.D ? load<T, Full>(s.D + r * E + e0, w) : Vec<T>{};
    const T *Bm = s.Bm + p, *C = s.C + p;
    for (int64_t n = 0; n < N; ++n) h[n] = Vec<T>{};
    for (int64_t t = 0; t < L; ++t) {
        const Vec<T> dt_t = step_size<T, Full>(s, s.dt + q + t * E, bias, w, nullptr);
        const Vec<T> x_t = load<T, Full>(s.x + q + t * E, w), dtx = dt_t * x_t;
        Vec<T> y_t{};
        for (int64_t n = 0; n < N; ++n) {
            h[n] = decay(dt_t * a[n]) * h[n] + Bm[t * N + n] * dtx;
            y_t += C[t * N + n] * h[n];
        }
        if (s.D) y_t += d * x_t;
        if (s.z) {
            const Vec<T> z_t = load<T, Full>(s.z + q + t * E, w);
            y_t *= z_t * sigmoid(z_t);
        }
        store<T, Full>(s.out + q + t * E, y_t, w);
    }
}

// Per-thread scratch of the backward: per block of channels, the recomputed states H_t and decays
// dA_t = exp(dt_t A) ((L, N) vectors each: 38 KB at length 37 and state 16), the step sizes dt_t,
// their slopes and the gradients gy_t reaching y ((L,) vectors each); per row the sums of gB and
// gC's terms ((L, N) vectors, summed over their lanes once the row's blocks are done).
template <typename T>
struct Work {
    std::vector<Vec<T>> a, H, dA, g, gA_block, dts, slopes, gys, sum_gB, sum_gC;
    Work(int64_t L, int64_t N) : a(N), H(L * N), dA(L * N), g(N), gA_block(N), dts(L), slopes(L), gys(L),
                                 sum_gB(L * N), sum_gC(L * N) {}
};

// Gradients of sum(gout * out) for channels e0 .. e0 + w of row r. The block's forward is
// recomputed, keeping H_t and dA_t (and, with a gate, y_t: gz_t and gy_t = gout_t silu(z_t)),
// then one pass backwards in time carries G_t = dLoss/dh_t = C_t gy_t + dA_{t+1} G_{t+1}
// (g: (N,)). gx, gdt (of dt_raw), gz: this block's lanes; gA (N, E), gD, gbias (E,): this row's
// share, its lanes; sum_gB, sum_gC: this block's terms of gB, gC are added.
template <typename T, bool Full>
void backward_block(const Scan<T>& s, int64_t r, int64_t e0, int64_t w, Work<T>& k) {
    const int64_t L = s.L, N = s.N, E = s.E, q = r * L * E + e0, p = r * L * N;
    const Vec<T> bias = s.bias ? load<T, Full>(s.bias + r * E + e0, w) : Vec<T>{};
    const Vec<T> d = s.D ? load<T, Full>(s.D + r * E + e0, w) : Vec<T>{};
    const T *Bm = s.Bm + p, *C = s.C + p;
    const Vec<T>* a = k.a.data();
    Vec<T> gD_block{};
    for (int64_t t = 0; t < L; ++t) {               // the forward again: H_t, dA_t, dt_t, gy_t; gC_t = H_t . gy_t
        const Vec<T> dt_t = step_size<T, Full>(s, s.dt + q + t * E, bias, w, &k.slopes[t]);
        const Vec<T> x_t = load<T, Full>(s.x + q + t * E, w), dtx = dt_t * x_t;
        Vec<T>* H_t = k.H.data() + t * N;
        Vec<T>* dA_t = k.dA.data() + t * N;
        Vec<T> y_t{};
        for (int64_t n = 0; n < N; ++n) {
            dA_t[n] = decay(dt_t * a[n]);
            H_t[n] = Bm[t * N + n] * dtx;
            if (t > 0) H_t[n] += dA_t[n] * H_t[n - N];
            if (s.z) y_t += C[t * N + n] * H_t[n];
        }
        Vec<T> gy_t = load<T, Full>(s.gout + q + t * E, w);
        if (s.z) {                                  // out = y silu(z): gz = gout y silu'(z), gy = gout silu(z)
            if (s.D) y_t += d * x_t;
            const Vec<T> z_t = load<T, Full>(s.z + q + t * E, w), sz = sigmoid(z_t);
            store<T, Full>(s.gz + q + t * E, gy_t * y_t * (sz * (T(1) + z_t * (T(1) - sz))), w);
            gy_t *= z_t * sz;
        }
        for (int64_t n = 0; n < N; ++n) k.sum_gC[t * N + n] += H_t[n] * gy_t;
        if (s.D) gD_block += gy_t * x_t;
        k.dts[t] = dt_t;
        k.gys[t] = gy_t;
    }
    for (int64_t n = 0; n < N; ++n) k.g[n] = k.gA_block[n] = Vec<T>{};
    Vec<T> gbias_block{};
    for (int64_t t = L - 1; t >= 0; --t) {
        const Vec<T> dt_t = k.dts[t], gy_t = k.gys[t], x_t = load<T, Full>(s.x + q + t * E, w), dtx = dt_t * x_t;
        Vec<T> gd{}, gdt_t{};                       // dLoss/d(dt_t x_t) and the dt_t A terms of dLoss/d dt_t
        for (int64_t n = 0; n < N; ++n) {
            const Vec<T> carried = t + 1 < L ? k.dA[(t + 1) * N + n] * k.g[n] : Vec<T>{};
            k.g[n] = carried + C[t * N + n] * gy_t;  // G_t = dA_{t+1} G_{t+1} + C_t gy_t
            k.sum_gB[t * N + n] += k.g[n] * dtx;
            gd += Bm[t * N + n] * k.g[n];
            if (t > 0) {                            // dLoss/d(dt_t A) = G_t * H_{t-1} * dA_t
                const Vec<T> q_n = k.g[n] * k.H[(t - 1) * N + n] * k.dA[t * N + n];
                gdt_t += q_n * a[n];
                k.gA_block[n] += q_n * dt_t;
            }
        }
        Vec<T> gx_t = gd * dt_t;
        if (s.D) gx_t += d * gy_t;
        const Vec<T> graw_t = (gdt_t + gd * x_t) * k.slopes[t];    // of dt_raw (and of the bias)
        gbias_block += graw_t;
        store<T, Full>(s.gx + q + t * E, gx_t, w);
        store<T, Full>(s.gdt + q + t * E, graw_t, w);
    }
    for (int64_t n = 0; n < N; ++n) store<T, Full>(s.gA + (r * N + n) * E + e0, k.gA_block[n], w);
    if (s.gD) store<T, Full>(s.gD + r * E + e0, gD_block, w);
    if (s.gbias) store<T, Full>(s.gbias + r * E + e0, gbias_block, w);
}

// This block's A, (N,) vectors.
template <typename T, bool Full>
void load_decays(const Scan<T>& s, int64_t r, int64_t e0, int64_t w, Vec<T>* a) {
    const T* A_r = s.A + (s.a_per_row ? r * s.N * s.E : 0);
    for (int64_t n = 0; n < s.N; ++n) a[n] = load<T, Full>(A_r + n * s.E + e0, w);
}

// Rows [r0, r1) of the forward, in one thread.
template <typename T>
void forward_rows(const Scan<T>& s, int64_t r0, int64_t r1) {
    FlushSubnormals flush;
    std::vector<Vec<T>> a(s.N), h(s.N);
    for (int64_t r = r0; r < r1; ++r) {
        for (int64_t e0 = 0; e0 < s.E; e0 += W) {
            const int64_t w = std::min(W, s.E - e0);
            if (w == W) {
                load_decays<T, true>(s, r, e0, w, a.data());
                forward_block<T, true>(s, r, e0, w, a.data(), h.data());
            } else {
                load_decays<T, false>(s, r, e0, w, a.data());
                forward_block<T, false>(s, r, e0, w, a.data(), h.data());
            }
        }
    }
}

// Rows [r0, r1) of the backward, in one thread. gA: (rows, N, E), gD, gbias: (rows, E), one share
// per row (the caller sums them where the parameter is shared).
template <typename T>
void backward_rows(const Scan<T>& s, int64_t r0, int64_t r1) {
    FlushSubnormals flush;
    Work<T> k(s.L, s.N);
    for (int64_t r = r0; r < r1; ++r) {
        std::fill(k.sum_gB.begin(), k.sum_gB.end(), Vec<T>{});
        std::fill(k.sum_gC.begin(), k.sum_gC.end(), Vec<T>{});
        for (int64_t e0 = 0; e0 < s.E; e0 += W) {
            const int64_t w = std::min(W, s.E - e0);
            if (w == W) {
                load_decays<T, true>(s, r, e0, w, k.a.data());
                backward_block<T, true>(s, r, e0, w, k);
            } else {
                load_decays<T, false>(s, r, e0, w, k.a.data());
                backward_block<T, false>(s, r, e0, w, k);
            }
        }
        const int64_t p = r * s.L * s.N;
        for (int64_t i = 0; i < s.L * s.N; ++i) {
            s.gB[p + i] = lane_sum<T>(k.sum_gB[i]);
            s.gC[p + i] = lane_sum<T>(k.sum_gC[i]);
        }
    }
}

template <typename T>
void forward(const Scan<T>& s, int64_t rows, int64_t threads) {
    cpu_threads::split_rows(rows, threads, [&s](int64_t r0, int64_t r1) { forward_rows(s, r0, r1); });
}

template <typename T>
void backward(const Scan<T>& s, int64_t rows, int64_t threads) {
    cpu_threads::split_rows(rows, threads, [&s](int64_t r0, int64_t r1) { backward_rows(s, r0, r1); });
}

}  // namespace

// The calling convention (cpu_kernels.py): pointers to the tensors (null for an option that is
// off), then rows, L, N, E, A per row (0 / 1), softplus (0 / 1), threads.
#define SCAN_ENTRY_POINTS(T, suffix)                                                                        \
    void scan_forward_##suffix(const T* x, const T* dt, const T* A, const T* Bm, const T* C, const T* D,    \
                               const T* z, const T* bias, T* out, int64_t rows, int64_t L, int64_t N,       \
                               int64_t E, int64_t a_per_row, int64_t softplus, int64_t threads) {           \
        Scan<T> s{x, dt, A, Bm, C, D, z, bias, out, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,  \
                  nullptr, nullptr, nullptr, L, N, E, a_per_row, softplus};                                 \
        forward(s, rows, threads);                                                                          \
    }                                                                                                       \
    void scan_backward_##suffix(const T* x, const T* dt, const T* A, const T* Bm, const T* C, const T* D,   \
                                const T* z, const T* bias, const T* gout, T* gx, T* gdt, T* gA, T* gB,      \
                                T* gC, T* gD, T* gz, T* gbias, int64_t rows, int64_t L, int64_t N,          \
                                int64_t E, int64_t a_per_row, int64_t softplus, int64_t threads) {          \
        Scan<T> s{x, dt, A, Bm, C, D, z, bias, nullptr, gout, gx, gdt, gA, gB, gC, gD, gz, gbias,          \
                  L, N, E, a_per_row, softplus};                                                            \
        backward(s, rows, threads);                                                                         \
    }

extern "C" {
SCAN_ENTRY_POINTS(float, f32)
SCAN_ENTRY_POINTS(double, f64)
}
