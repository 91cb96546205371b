// The depthwise causal short convolution on a CPU, fused: each output position's K taps in one
// pass over the channels, forward and backward, instead of PyTorch's 2K - 1 whole-tensor passes
// (a multiply and an add per tap, and in the backward a product and a sum per tap for the
// weights), with the bias and the SiLU that follows it in the mixers (Mamba, Mamba-2) taken in
// as options (as causal-conv1d's activation="silu" on a GPU). The math is ops_short_conv.py's
// readable reference:
//
//     p[b, t, c] = bias[c] + sum_j w[j, c] * x[b, t - (K-1) + j, c]    (x = 0 before the start)
//     y = silu(p) = p * sigmoid(p)   (silu on)   or   y = p
//     gp = g * silu'(p)   (silu on; p recomputed)   or   gp = g
//     gx[b, s, c] = sum_j w[j, c] * gp[b, s + (K-1) - j, c]          (taps past the end: 0)
//     gw[b, j, c] = sum_t gp[b, t, c] * x[b, t - (K-1) + j, c]        (one share per batch row)
//     gbias[b, c] = sum_t gp[b, t, c]                                 (one share per batch row)
//
// Layout (row-major, contiguous): x, y, g, gx: (B, L, C); w: (K, C), or (B, K, C) with one
// weight per row (stacked copies folded into the rows), and then bias (B, C), else (C,); bias
// may be null (none); gw: (B, K, C), gbias: (B, C), summed over the rows by the caller. The
// channels are innermost, so every inner loop runs over contiguous memory and the compiler
// vectorizes it; the SiLU runs on vectors of W lanes (cpu_vectors.h). A row's results are
// written by that row's thread only.
//
// Built with selective_scan_cpu.cpp into one library by cpu_kernels.py and called through
// ctypes; tested against the reference in tests/models/test_short_conv_op.py.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_threads.h"
#include "cpu_vectors.h"

namespace {

using namespace cpu_vectors;

// p at position t of a row (C,): bias and taps.
template <typename T>
inline void taps(const T* __restrict x_r, const T* __restrict w_r, const T* __restrict bias_r, T* __restrict p,
                 int64_t t, int64_t C, int64_t K) {
    const T* __restrict w_now = w_r + (K - 1) * C;              // tap K-1: the current step
    const T* __restrict x_t = x_r + t * C;
    if (bias_r) {
        for (int64_t c = 0; c < C; ++c) p[c] = bias_r[c] + w_now[c] * x_t[c];
    } else {
        for (int64_t c = 0; c < C; ++c) p[c] = w_now[c] * x_t[c];
    }
    for (int64_t j = std::max<int64_t>(0, K - 1 - t); j < K - 1; ++j) {
        const T* __restrict w_j = w_r + j * C;
        const T* __restrict x_s = x_r + (t - (K - 1) + j) * C;
        for (int64_t c = 0; c < C; ++c) p[c] += w_j[c] * x_s[c];
    }
}

// y = silu(p) in place, C numbers: whole vectors, then the last partial one with its missing
// lanes zero (never written back).
template <typename T>
inline void silu_in_place(T* p, int64_t C) {
    int64_t c = 0;
    for (; c + W <= C; c += W) {
        const Vec<T> v = load<T, true>(p + c, W);
        store<T, true>(p + c, v * sigmoid(v), W);
    }
    if (c < C) {
        const Vec<T> v = load<T, false>(p + c, C - c);
        store<T, false>(p + c, v * sigmoid(v), C - c);
    }
}

// g * silu'(p) into gp (C numbers), silu'(p) = s (1 + p (1 - s)), s = sigmoid(p).
template <typename T>
inline void silu_backward(const T* p, const T* g, T* gp, int64_t C) {
    int64_t c = 0;
    for (; c < C; c += W) {
        const int64_t w = std::min(W, C - c);
        const Vec<T> v = w == W ? load<T, true>(p + c, w) : load<T, false>(p + c, w);
        const Vec<T> gv = w == W ? load<T, true>(g + c, w) : load<T, false>(g + c, w);
        const Vec<T> s = sigmoid(v), out = gv * (s * (T(1) + v * (T(1) - s)));
        if (w == W) store<T, true>(gp + c, out, w); else store<T, false>(gp + c, out, w);
    }
}

template <typename T>
void forward_rows(const T* x, const T* w, const T* bias, T* y, int64_t r0, int64_t r1, int64_t L, int64_t C,
                  int64_t K, int64_t w_per_row, int64_t silu) {
    for (int64_t r = r0; r < r1; ++r) {
        const T* x_r = x + r * L * C;
        const T* w_r = w + (w_per_row ? r * K * C : 0);
        const T* bias_r = bias ? bias + (w_per_row ? r * C : 0) : nullptr;
        for (int64_t t = 0; t < L; ++t) {
            T* y_t = y + (r * L + t) * C;
            taps(x_r, w_r, bias_r, y_t, t, C, K);
            if (silu) silu_in_place(y_t, C);
        }
    }
}

template <typename T>
void backward_rows(const T* x, const T* w, const T* bias, const T* g, T* gx, T* gw, T* gbias, int64_t r0,
                   int64_t r1, int64_t L, int64_t C, int64_t K, int64_t w_per_row, int64_t silu) {
    std::vector<T> gp_row(silu ? L * C : 0), p(silu ? C : 0);   // gp of a row, (L, C); p at one position
    for (int64_t r = r0; r < r1; ++r) {
        const T* __restrict x_r = x + r * L * C;
        const T* __restrict w_r = w + (w_per_row ? r * K * C : 0);
        const T* bias_r = bias ? bias + (w_per_row ? r * C : 0) : nullptr;
        const T* __restrict g_r = g + r * L * C;
        if (silu) {                                              // gp = g silu'(p), p recomputed
            for (int64_t t = 0; t < L; ++t) {
                taps(x_r, w_r, bias_r, p.data(), t, C, K);
                silu_backward(p.data(), g_r + t * C, gp_row.data() + t * C, C);
            }
            g_r = gp_row.data();
        }
        T* __restrict gw_r = gw + r * K * C;
        std::fill(gw_r, gw_r + K * C, T(0));
        for (int64_t s = 0; s < L; ++s) {
            T* __restrict gx_s = gx + (r * L + s) * C;
            const T* __restrict w_now = w_r + (K - 1) * C;
            const T* __restrict g_s = g_r + s * C;
            for (int64_t c = 0; c < C; ++c) gx_s[c] = w_now[c] * g_s[c];
            for (int64_t j = std::max<int64_t>(0, s + K - L); j < K - 1; ++j) {   // t = s + (K-1) - j < L
                const T* __restrict w_j = w_r + j * C;
                const T* __restrict g_t = g_r + (s + (K - 1) - j) * C;
                for (int64_t c = 0; c < C; ++c) gx_s[c] += w_j[c] * g_t[c];
            }
        }
        for (int64_t j = 0; j < K; ++j) {
            T* __restrict gw_j = gw_r + j * C;
            for (int64_t t = std::max<int64_t>(0, K - 1 - j); t < L; ++t) {        // s = t - (K-1) + j >= 0
                const T* __restrict g_t = g_r + t * C;
                const T* __restrict x_s = x_r + (t - (K - 1) + j) * C;
                for (int64_t c = 0; c < C; ++c) gw_j[c] += g_t[c] * x_s[c];
            }
        }
        if (gbias) {
            T* __restrict gb_r = gbias + r * C;
            std::fill(gb_r, gb_r + C, T(0));
            for (int64_t t = 0; t < L; ++t) {
                const T* __restrict g_t = g_r + t * C;
                for (int64_t c = 0; c < C; ++c) gb_r[c] += g_t[c];
            }
        }
    }
}

}  // namespace

// The calling convention (cpu_kernels.py): pointers (bias and gbias null where there is no
// bias), then rows, L, C, K, weight per row (0 / 1), silu (0 / 1), threads.
#define CONV_ENTRY_POINTS(T, suffix)                                                                      \
    void short_conv_forward_##suffix(const T* x, const T* w, const T* bias, T* y, int64_t rows, int64_t L, \
                                     int64_t C, int64_t K, int64_t w_per_row, int64_t silu, int64_t threads) { \
        cpu_threads::split_rows(rows, threads, [=](int64_t r0, int64_t r1) {                              \
            forward_rows(x, w, bias, y, r0, r1, L, C, K, w_per_row, silu);                               \
        });                                                                                               \
    }                                                                                                     \
    void short_conv_backward_##suffix(const T* x, const T* w, const T* bias, const T* g, T* gx, T* gw,    \
                                      T* gbias, int64_t rows, int64_t L, int64_t C, int64_t K,           \
                                      int64_t w_per_row, int64_t silu, int64_t threads) {                \
        cpu_threads::split_rows(rows, threads, [=](int64_t r0, int64_t r1) {                              \
            backward_rows(x, w, bias, g, gx, gw, gbias, r0, r1, L, C, K, w_per_row, silu);               \
        });                                                                                               \
    }

extern "C" {
CONV_ENTRY_POINTS(float, f32)
CONV_ENTRY_POINTS(double, f64)
}
