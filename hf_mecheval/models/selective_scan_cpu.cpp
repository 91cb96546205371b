// Mamba's selective scan on a CPU, fused: one pass over time per batch row and block of W
// channels, whose state (N vectors of W numbers) stays in the first-level cache, instead of
// PyTorch's whole-tensor passes over (B, L, N, E) buffers that are memory-bound. The math is
// ops_selective_scan.py's readable reference:
//
//     h_t = exp(dt_t A) * h_{t-1} + dt_t x_t B_t        h: (N, E) per row, A: (N, E)
//     y_t = C_t . h_t                                   (E,)
//
// Layout (row-major, contiguous): x, dt, y: (B, L, E); A: (N, E), or (B, N, E) with one A per
// row (stacked copies folded into the rows); Bm, C: (B, L, N). Every channel e is its own
// recurrence, so a row is computed in blocks of W = 16 channels, each block one vector (GCC /
// Clang vector extensions: every operation below acts on the W lanes at once), with the decays'
// exp computed inline on the vector. A block narrower than W (the last one, where E is not a
// multiple of W) runs with its missing lanes set to zero (dt = x = A = 0: a state that stays 0),
// never written back. A row's results are written by that row's call only; rows are split
// between threads here.
//
// Built by cpu_kernels.py (g++ -O3 -march=native -ffp-contract=fast, without -ffast-math) and
// called through ctypes; tested against the reference in tests/models/test_mamba_scan.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_threads.h"
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace {

// A block of W = 16 channels as one vector (GCC / Clang vector extensions): one AVX-512 register
// of floats, two AVX2 ones, four NEON ones; the compiler maps it to what the CPU has.
constexpr int64_t W = 16;
template <typename T> struct Lanes;
template <> struct Lanes<float> { typedef float type __attribute__((vector_size(W * sizeof(float)))); };
template <> struct Lanes<double> { typedef double type __attribute__((vector_size(W * sizeof(double)))); };
template <typename T> using Vec = typename Lanes<T>::type;
typedef int32_t IntLanes __attribute__((vector_size(W * sizeof(int32_t))));

template <typename T>
inline Vec<T> splat(T v) {
    return Vec<T>{} + v;
}

// exp(v) for a decay exponent v = dt A <= 0, with v clamped at -80 (float; -700 for double):
// a decay below exp(-80) ~ 2e-35 reads as exp(-80), which changes h by less than 2e-35 of
// h_{t-1}. A model whose dt grows large (a high learning rate: dt up to 3e4) has many v far
// below that, where a library's exp leaves its fast path lane by lane and the products turn
// subnormal: the scan ran 10x slower. (Selecting 0 there instead kept the slow path: measured.)
//
// In float, exp is computed here on the vector, inline: the decays are most of the scan's
// arithmetic (one per state element), and a call to a library's vector exp from the loop spills
// every register the loop keeps. exp(v) = 2^k exp(r) with k = round(v / ln 2) and
// r = v - k ln 2 in [-ln 2 / 2, ln 2 / 2] (ln 2 split in two parts, the first with few enough
// bits that k times it is exact, so r is exact to a float's precision), exp(r) by its Taylor
// series to r^7 / 7! (the next term is below 6e-9 of exp(r): under a tenth of float's rounding
// step), 2^k built in the exponent bits. The file is compiled without -ffast-math, so nothing
// reassociates these steps. Double (the tests' precision) takes std::exp lane by lane.
inline Vec<float> decay(Vec<float> v) {
    const Vec<float> lowest = splat(-80.0f), highest = splat(80.0f);
    v = v < lowest ? lowest : v;
    v = v > highest ? highest : v;
    // k = floor(v / ln 2 + 1/2): the conversion truncates, which floors a positive number
    const IntLanes k = __builtin_convertvector(v * 1.44269504088896341f + 128.5f, IntLanes) - 128;
    const Vec<float> kf = __builtin_convertvector(k, Vec<float>);
    Vec<float> r = v - kf * 0.693145751953125f;              // ln 2's leading bits (exact product)
    r = r - kf * 1.42860682030941723e-6f;                    // ln 2's remaining bits
    Vec<float> p = splat(1.0f / 5040);
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p * (Vec<float>)((k + 127) << 23);                // 2^k, k in [-116, 116]: a normal float
}

inline Vec<double> decay(Vec<double> v) {
    for (int64_t j = 0; j < W; ++j) v[j] = std::exp(v[j] < -700.0 ? -700.0 : v[j]);
    return v;
}

// The sum of a vector's n lanes, halves added to halves (vector adds: a loop over the lanes
// compiled to n dependent scalar additions through memory).
template <typename T, int64_t n>
struct Part { typedef T type __attribute__((vector_size(n * sizeof(T)))); };

template <typename T, int64_t n>
inline T sum_lanes(typename Part<T, n>::type v) {
    if constexpr (n == 2) {
        return v[0] + v[1];
    } else {
        typename Part<T, n / 2>::type low, high;
        std::memcpy(&low, &v, sizeof low);
        std::memcpy(&high, reinterpret_cast<const char*>(&v) + sizeof low, sizeof high);
        return sum_lanes<T, n / 2>(low + high);
    }
}

template <typename T>
inline T lane_sum(Vec<T> v) {
    return sum_lanes<T, W>(v);
}

// Subnormal inputs and results read as 0 inside a kernel call (x86: the MXCSR DAZ and FTZ bits),
// restored on return: the same reason as above, for what the decays multiply. Per thread: each
// thread of a call sets and restores its own.
struct FlushSubnormals {
#if defined(__SSE__)
    unsigned saved = _mm_getcsr();
    FlushSubnormals() { _mm_setcsr(saved | 0x8040); }
    ~FlushSubnormals() { _mm_setcsr(saved); }
#endif
};

// A block's lanes of a row of a (L, E) or (N, E) tensor: W numbers from src, zeros past the w
// that exist. Full = (w == W), known when compiled, so that the copy is one vector load.
template <typename T, bool Full>
inline Vec<T> load(const T* src, int64_t w) {
    Vec<T> v;
    if (Full) {
        std::memcpy(&v, src, sizeof v);
    } else {
        T lanes[W] = {};
        std::memcpy(lanes, src, w * sizeof(T));
        std::memcpy(&v, lanes, sizeof v);
    }
    return v;
}

template <typename T, bool Full>
inline void store(T* dst, Vec<T> v, int64_t w) {
    std::memcpy(dst, &v, (Full ? W : w) * sizeof(T));
}

// y for channels e0 .. e0 + w of one row. a: (N,) this block's A; h: (N,) scratch.
template <typename T, bool Full>
void forward_block(const T* x, const T* dt, const T* Bm, const T* C, T* y, int64_t L, int64_t N, int64_t E,
                   int64_t e0, int64_t w, const Vec<T>* a, Vec<T>* h) {
    for (int64_t n = 0; n < N; ++n) h[n] = Vec<T>{};
    for (int64_t t = 0; t < L; ++t) {
        const Vec<T> dt_t = load<T, Full>(dt + t * E + e0, w), dtx = dt_t * load<T, Full>(x + t * E + e0, w);
        Vec<T> y_t{};
        for (int64_t n = 0; n < N; ++n) {
            h[n] = decay(dt_t * a[n]) * h[n] + Bm[t * N + n] * dtx;
            y_t += C[t * N + n] * h[n];
        }
        store<T, Full>(y + t * E + e0, y_t, w);
    }
}

// Gradients of sum(gy * y) for channels e0 .. e0 + w of one row. The block's forward is
// recomputed, keeping its states H_t and decays dA_t = exp(dt_t A) ((L, N) vectors each: 38 KB
// at length 37 and state 16), then one pass backwards in time carries G_t = dLoss/dh_t
// = C_t gy_t + dA_{t+1} G_{t+1} (g: (N,)). gx, gdt: this block's lanes; gA (N, E): this row's
// share, its lanes; sum_gB, sum_gC (L, N) vectors: this block's terms of gB, gC are added (the
// caller zeroes them, and sums their lanes once the row's blocks are done).
template <typename T, bool Full>
void backward_block(const T* x, const T* dt, const T* Bm, const T* C, const T* gy, T* gx, T* gdt, T* gA,
                    int64_t L, int64_t N, int64_t E, int64_t e0, int64_t w, const Vec<T>* a, Vec<T>* H,
                    Vec<T>* dA, Vec<T>* g, Vec<T>* gA_block, Vec<T>* sum_gB, Vec<T>* sum_gC) {
    for (int64_t t = 0; t < L; ++t) {               // the forward again: H_t, dA_t; and gC_t = H_t . gy_t
        const Vec<T> dt_t = load<T, Full>(dt + t * E + e0, w), dtx = dt_t * load<T, Full>(x + t * E + e0, w);
        const Vec<T> gy_t = load<T, Full>(gy + t * E + e0, w);
        Vec<T>* H_t = H + t * N;
        Vec<T>* dA_t = dA + t * N;
        for (int64_t n = 0; n < N; ++n) {
            dA_t[n] = decay(dt_t * a[n]);
            H_t[n] = Bm[t * N + n] * dtx;
            if (t > 0) H_t[n] += dA_t[n] * H_t[n - N];
            sum_gC[t * N + n] += H_t[n] * gy_t;
        }
    }
    for (int64_t n = 0; n < N; ++n) g[n] = gA_block[n] = Vec<T>{};
    for (int64_t t = L - 1; t >= 0; --t) {
        const Vec<T> dt_t = load<T, Full>(dt + t * E + e0, w), x_t = load<T, Full>(x + t * E + e0, w);
        const Vec<T> gy_t = load<T, Full>(gy + t * E + e0, w), dtx = dt_t * x_t;
        Vec<T> gd{}, gdt_t{};                       // dLoss/d(dt_t x_t) and the dt_t A terms of dLoss/d dt_t
        for (int64_t n = 0; n < N; ++n) {
            const Vec<T> carried = t + 1 < L ? dA[(t + 1) * N + n] * g[n] : Vec<T>{};
            g[n] = carried + C[t * N + n] * gy_t;   // G_t = dA_{t+1} G_{t+1} + C_t gy_t
            sum_gB[t * N + n] += g[n] * dtx;
            gd += Bm[t * N + n] * g[n];
            if (t > 0) {                            // dLoss/d(dt_t A) = G_t * H_{t-1} * dA_t
                const Vec<T> q = g[n] * H[(t - 1) * N + n] * dA[t * N + n];
                gdt_t += q * a[n];
                gA_block[n] += q * dt_t;
            }
        }
        store<T, Full>(gx + t * E + e0, gd * dt_t, w);
        store<T, Full>(gdt + t * E + e0, gdt_t + gd * x_t, w);
    }
    for (int64_t n = 0; n < N; ++n) store<T, Full>(gA + n * E + e0, gA_block[n], w);
}

// Rows [r0, r1) of the forward, in one thread.
template <typename T>
void forward_rows(const T* x, const T* dt, const T* A, const T* Bm, const T* C, T* y, int64_t r0, int64_t r1,
                  int64_t L, int64_t N, int64_t E, int64_t a_per_row) {
    FlushSubnormals flush;
    std::vector<Vec<T>> a(N), h(N);
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t s = r * L * E, p = r * L * N;
        const T* A_r = A + (a_per_row ? r * N * E : 0);
        for (int64_t e0 = 0; e0 < E; e0 += W) {
            const int64_t w = std::min(W, E - e0);
            if (w == W) {
                for (int64_t n = 0; n < N; ++n) a[n] = load<T, true>(A_r + n * E + e0, w);
                forward_block<T, true>(x + s, dt + s, Bm + p, C + p, y + s, L, N, E, e0, w, a.data(), h.data());
            } else {
                for (int64_t n = 0; n < N; ++n) a[n] = load<T, false>(A_r + n * E + e0, w);
                forward_block<T, false>(x + s, dt + s, Bm + p, C + p, y + s, L, N, E, e0, w, a.data(), h.data());
            }
        }
    }
}

// Rows [r0, r1) of the backward, in one thread. gA: (rows, N, E), one share per row (the caller
// sums them where A is shared).
template <typename T>
void backward_rows(const T* x, const T* dt, const T* A, const T* Bm, const T* C, const T* gy, T* gx, T* gdt,
                   T* gA, T* gB, T* gC, int64_t r0, int64_t r1, int64_t L, int64_t N, int64_t E,
                   int64_t a_per_row) {
    FlushSubnormals flush;
    std::vector<Vec<T>> a(N), H(L * N), dA(L * N), g(N), gA_block(N), sum_gB(L * N), sum_gC(L * N);
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t s = r * L * E, p = r * L * N;
        const T* A_r = A + (a_per_row ? r * N * E : 0);
        std::fill(sum_gB.begin(), sum_gB.end(), Vec<T>{});
        std::fill(sum_gC.begin(), sum_gC.end(), Vec<T>{});
        for (int64_t e0 = 0; e0 < E; e0 += W) {
            const int64_t w = std::min(W, E - e0);
            if (w == W) {
                for (int64_t n = 0; n < N; ++n) a[n] = load<T, true>(A_r + n * E + e0, w);
                backward_block<T, true>(x + s, dt + s, Bm + p, C + p, gy + s, gx + s, gdt + s, gA + r * N * E,
                                        L, N, E, e0, w, a.data(), H.data(), dA.data(), g.data(), gA_block.data(),
                                        sum_gB.data(), sum_gC.data());
            } else {
                for (int64_t n = 0; n < N; ++n) a[n] = load<T, false>(A_r + n * E + e0, w);
                backward_block<T, false>(x + s, dt + s, Bm + p, C + p, gy + s, gx + s, gdt + s, gA + r * N * E,
                                         L, N, E, e0, w, a.data(), H.data(), dA.data(), g.data(), gA_block.data(),
                                         sum_gB.data(), sum_gC.data());
            }
        }
        for (int64_t i = 0; i < L * N; ++i) {
            gB[p + i] = lane_sum<T>(sum_gB[i]);
            gC[p + i] = lane_sum<T>(sum_gC[i]);
        }
    }
}

template <typename T>
void forward(const T* x, const T* dt, const T* A, const T* Bm, const T* C, T* y, int64_t rows, int64_t L,
             int64_t N, int64_t E, int64_t a_per_row, int64_t threads) {
    cpu_threads::split_rows(rows, threads, [=](int64_t r0, int64_t r1) {
        forward_rows(x, dt, A, Bm, C, y, r0, r1, L, N, E, a_per_row);
    });
}

template <typename T>
void backward(const T* x, const T* dt, const T* A, const T* Bm, const T* C, const T* gy, T* gx, T* gdt, T* gA,
              T* gB, T* gC, int64_t rows, int64_t L, int64_t N, int64_t E, int64_t a_per_row, int64_t threads) {
    cpu_threads::split_rows(rows, threads, [=](int64_t r0, int64_t r1) {
        backward_rows(x, dt, A, Bm, C, gy, gx, gdt, gA, gB, gC, r0, r1, L, N, E, a_per_row);
    });
}

}  // namespace

extern "C" {
void scan_forward_f32(const float* x, const float* dt, const float* A, const float* Bm, const float* C,
                      float* y, int64_t rows, int64_t L, int64_t N, int64_t E, int64_t a_per_row,
                      int64_t threads) {
    forward(x, dt, A, Bm, C, y, rows, L, N, E, a_per_row, threads);
}
void scan_forward_f64(const double* x, const double* dt, const double* A, const double* Bm, const double* C,
                      double* y, int64_t rows, int64_t L, int64_t N, int64_t E, int64_t a_per_row,
                      int64_t threads) {
    forward(x, dt, A, Bm, C, y, rows, L, N, E, a_per_row, threads);
}
void scan_backward_f32(const float* x, const float* dt, const float* A, const float* Bm, const float* C,
                       const float* gy, float* gx, float* gdt, float* gA, float* gB, float* gC,
                       int64_t rows, int64_t L, int64_t N, int64_t E, int64_t a_per_row, int64_t threads) {
    backward(x, dt, A, Bm, C, gy, gx, gdt, gA, gB, gC, rows, L, N, E, a_per_row, threads);
}
void scan_backward_f64(const double* x, const double* dt, const double* A, const double* Bm, const double* C,
                       const double* gy, double* gx, double* gdt, double* gA, double* gB, double* gC,
                       int64_t rows, int64_t L, int64_t N, int64_t E, int64_t a_per_row, int64_t threads) {
    backward(x, dt, A, Bm, C, gy, gx, gdt, gA, gB, gC, rows, L, N, E, a_per_row, threads);
}
}
