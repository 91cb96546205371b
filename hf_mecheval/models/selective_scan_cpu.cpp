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

// The elementwise steps taken into the kernel: softplus of the step size, its derivative (the
// sigmoid) and the gate's SiLU, on a whole vector. As torch computes them: softplus(v) = v above
// 20, else log1p(exp(v)); its derivative 1 there, else sigmoid(v).
//
// In float: exp by decay() above (exact to float rounding where |v| <= 80; outside that range it
// clamps, which moves sigmoid and softplus by less than 2e-35), and log1p(e) = log(u) e / (u - 1)
// with u = 1 + e rounded (exact to rounding for every e >= 0: the factor e / (u - 1) corrects
// u's rounding; where u rounds to 1, log1p(e) = e to rounding). log(u), u >= 1: u = m 2^k with
// m in [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s) = 2 (s + s^3/3 + ... + s^9/9), s = (m - 1) / (m + 1),
// |s| <= 0.172: the next term is below 3e-9 of the sum, a twentieth of float's rounding step.
// Double takes std::log1p and std::exp lane by lane.
inline Vec<float> log_at_least_1(Vec<float> u) {
    IntLanes bits;
    std::memcpy(&bits, &u, sizeof bits);
    IntLanes k = ((bits >> 23) & 0xff) - 127;
    const IntLanes mantissa = (bits & 0x7fffff) | 0x3f800000;    // m in [1, 2)
    Vec<float> m;
    std::memcpy(&m, &mantissa, sizeof m);
    const IntLanes big = m > 1.41421356f;                         // -1 where m > sqrt(2): m / 2, k + 1
    m = big ? m * 0.5f : m;
    k = k - big;
    const Vec<float> s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
    Vec<float> p = splat(1.0f / 9);
    p = p * s2 + 1.0f / 7;
    p = p * s2 + 1.0f / 5;
    p = p * s2 + 1.0f / 3;
    p = p * s2 + 1.0f;
    const Vec<float> kf = __builtin_convertvector(k, Vec<float>);
    return kf * 0.693145751953125f + (kf * 1.42860682030941723e-6f + 2.0f * s * p);
}

inline Vec<float> softplus(Vec<float> v) {
    const Vec<float> e = decay(v), u = 1.0f + e;
    const Vec<float> log1p_e = u == 1.0f ? e : log_at_least_1(u) * (e / (u - 1.0f));
    return v > 20.0f ? v : log1p_e;
}

inline Vec<float> sigmoid(Vec<float> v) {
    return 1.0f / (1.0f + decay(-v));
}

inline Vec<double> softplus(Vec<double> v) {
    for (int64_t j = 0; j < W; ++j) v[j] = v[j] > 20.0 ? v[j] : std::log1p(std::exp(v[j]));
    return v;
}

inline Vec<double> sigmoid(Vec<double> v) {
    for (int64_t j = 0; j < W; ++j) v[j] = 1.0 / (1.0 + std::exp(-v[j]));
    return v;
}

// d softplus(v) / dv, as torch's softplus backward takes it: 1 above the threshold 20
template <typename T>
inline Vec<T> softplus_slope(Vec<T> v) {
    const Vec<T> s = sigmoid(v);
    return v > T(20) ? splat(T(1)) : s;
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
