// The depthwise causal short convolution on a CPU, fused: each output position's K taps in one
// pass over the channels, forward and backward, instead of PyTorch's 2K - 1 whole-tensor passes
// (a multiply and an add per tap, and in the backward a product and a sum per tap for the
// weights). The math is ops_short_conv.py's readable reference:
//
//     y[b, t, c] = sum_j w[j, c] * x[b, t - (K-1) + j, c]            (x = 0 before the start)
//     gx[b, s, c] = sum_j w[j, c] * g[b, s + (K-1) - j, c]           (taps past the end: 0)
//     gw[b, j, c] = sum_t g[b, t, c] * x[b, t - (K-1) + j, c]         (one share per batch row)
//
// Layout (row-major, contiguous): x, y, g, gx: (B, L, C); w: (K, C), or (B, K, C) with one
// weight per row (stacked copies folded into the rows); gw: (B, K, C), summed over the rows by
// the caller. The channels are innermost, so every inner loop runs over contiguous memory and
// the compiler vectorizes it. A row's results are written by that row's thread only.
//
// Built with selective_scan_cpu.cpp into one library by cpu_kernels.py and called through
// ctypes; tested against the reference in tests/models/test_short_conv_op.py.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_threads.h"

namespace {

template <typename T>
void forward_rows(const T* x, const T* w, T* y, int64_t r0, int64_t r1, int64_t L, int64_t C, int64_t K,
                  int64_t w_per_row) {
    for (int64_t r = r0; r < r1; ++r) {
        const T* __restrict x_r = x + r * L * C;
        const T* __restrict w_r = w + (w_per_row ? r * K * C : 0);
        for (int64_t t = 0; t < L; ++t) {
            T* __restrict y_t = y + (r * L + t) * C;
            const T* __restrict w_now = w_r + (K - 1) * C;       // tap K-1: the current step
            const T* __restrict x_t = x_r + t * C;
            for (int64_t c = 0; c < C; ++c) y_t[c] = w_now[c] * x_t[c];
            for (int64_t j = std::max<int64_t>(0, K - 1 - t); j < K - 1; ++j) {
                const T* __restrict w_j = w_r + j * C;
                const T* __restrict x_s = x_r + (t - (K - 1) + j) * C;
                for (int64_t c = 0; c < C; ++c) y_t[c] += w_j[c] * x_s[c];
            }
        }
    }
}

template <typename T>
void backward_rows(const T* x, const T* w, const T* g, T* gx, T* gw, int64_t r0, int64_t r1, int64_t L,
                   int64_t C, int64_t K, int64_t w_per_row) {
    for (int64_t r = r0; r < r1; ++r) {
        const T* __restrict x_r = x + r * L * C;
        const T* __restrict g_r = g + r * L * C;
        const T* __restrict w_r = w + (w_per_row ? r * K * C : 0);
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
    }
}

}  // namespace

extern "C" {
void short_conv_forward_f32(const float* x, const float* w, float* y, int64_t rows, int64_t L, int64_t C,
                            int64_t K, int64_t w_per_row, int64_t threads) {
    cpu_threads::split_rows(rows, threads, [=](int64_t r0, int64_t r1) {
        forward_rows(x, w, y, r0, r1, L, C, K, w_per_row);
    });
}
void short_conv_forward_f64(const double* x, const double* w, double* y, int64_t rows, int64_t L, int64_t C,
                            int64_t K, int64_t w_per_row, int64_t threads) {
    cpu_threads::split_rows(rows, threads, [=](int64_t r0, int64_t r1) {
        forward_rows(x, w, y, r0, r1, L, C, K, w_per_row);
    });
}
void short_conv_backward_f32(const float* x, const float* w, const float* g, float* gx, float* gw, int64_t rows,
                             int64_t L, int64_t C, int64_t K, int64_t w_per_row, int64_t threads) {
    cpu_threads::split_rows(rows, threads, [=](int64_t r0, int64_t r1) {
        backward_rows(x, w, g, gx, gw, r0, r1, L, C, K, w_per_row);
    });
}
void short_conv_backward_f64(const double* x, const double* w, const double* g, double* gx, double* gw,
                             int64_t rows, int64_t L, int64_t C, int64_t K, int64_t w_per_row, int64_t threads) {
    cpu_threads::split_rows(rows, threads, [=](int64_t r0, int64_t r1) {
        backward_rows(x, w, g, gx, gw, r0, r1, L, C, K, w_per_row);
    });
}
}
