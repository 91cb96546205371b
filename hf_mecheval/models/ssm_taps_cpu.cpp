// The convolution kernels of H3's two SSMs (its reference form) on a CPU, forward and backward.
//
// 1. The diagonal SSM of conjugate pairs of complex modes: the taps and their backward in one
// pass over each channel's modes, instead of PyTorch's L complex products, sums and in-place adds
// of whole (C, N) tensors. The math is ops_ssm_taps.py's ConjugatePairTaps (readable reference:
// DiagonalSSM.kernel_vandermonde):
//
//     taps[c, l] = 2 Re sum_n w[c, n] a[c, n]^l                                l < L
//     P(a) = sum_l G[c, l] a^l,  P'(a) = sum_l l G[c, l] a^(l-1)               (Horner's rule)
//     gw[c, n] = 2 conj(P(a)),   ga[c, n] = 2 conj(w P'(a))                    (G = dLoss/dtaps)
//
// (PyTorch's convention: the gradient of a real loss with respect to z = x + iy is dL/dx + i dL/dy,
// and the taps are holomorphic in w and a up to the real part.)
//
// Layout (row-major, contiguous), complex numbers planar: w_re, w_im, a_re, a_im, gw_re, gw_im,
// ga_re, ga_im (C, N); taps, G (C, L). The modes are innermost, so each step runs over W lanes of
// modes at once; a channel's sums over its modes are taken on W lanes and added across them at
// the end of each tap.
//
// 2. The shift SSM: its kernel is the cross-correlation of its B and C (mixer_h3.ShiftSSM.kernel,
// which takes it by FFTs, its readable reference), T lags of it directly:
//
//     K[c, l] = sum_m B[c, m] C[c, m + l]                 l < T <= N, m + l < N
//     gB[c, m] = sum_l G[c, l] C[c, m + l],   gC[c, j] = sum_l G[c, l] B[c, j - l]
//
// Layout: B, C, gB, gC (C, N); K, G (C, T). Each lag is a dot product, or in the backward an
// update, of two contiguous stretches of a channel's N numbers: T N multiply-adds each way, where
// the FFTs of size >= N + T - 1 took longer at T = 37, N = 1 024 than these at every T up to 128.
//
// A channel is computed by one thread alone.
//
// Built with the other kernels into one library by cpu_kernels.py and called through ctypes;
// tested against the PyTorch form and the Vandermonde form in tests/models/test_h3_reference.py.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu_threads.h"
#include "cpu_vectors.h"

namespace {

using namespace cpu_vectors;

// The lanes of a block of modes: whole vectors, or the last partial one with its missing lanes 0
// (zeros stay zeros through every product below, and add nothing to a sum).
template <typename T>
inline Vec<T> read(const T* src, int64_t w) {
    return w == W ? load<T, true>(src, w) : load<T, false>(src, w);
}

template <typename T>
inline void write(T* dst, Vec<T> v, int64_t w) {
    if (w == W) store<T, true>(dst, v, w); else store<T, false>(dst, v, w);
}

template <typename T>
void forward_channels(const T* w_re, const T* w_im, const T* a_re, const T* a_im, T* taps, int64_t c0,
                      int64_t c1, int64_t N, int64_t L) {
    FlushSubnormals flush;                                       // powers of |a| < 1 decay towards 0
    std::vector<T> p_re(N), p_im(N);                              // w a^l, one channel's modes
    for (int64_t c = c0; c < c1; ++c) {
        const int64_t row = c * N;
        std::copy(w_re + row, w_re + row + N, p_re.begin());
        std::copy(w_im + row, w_im + row + N, p_im.begin());
        for (int64_t l = 0; l < L; ++l) {
            Vec<T> sum = splat(T(0));
            const bool last = l + 1 == L;
            for (int64_t n = 0; n < N; n += W) {
                const int64_t w = std::min(W, N - n);
                const Vec<T> pr = read(p_re.data() + n, w), pi = read(p_im.data() + n, w);
                sum += pr;
                if (!last) {                                     // p <- p a
                    const Vec<T> ar = read(a_re + row + n, w), ai = read(a_im + row + n, w);
                    write(p_re.data() + n, pr * ar - pi * ai, w);
                    write(p_im.data() + n, pr * ai + pi * ar, w);
                }
            }
            taps[c * L + l] = 2 * lane_sum<T>(sum);
        }
    }
}

template <typename T>
void backward_channels(const T* w_re, const T* w_im, const T* a_re, const T* a_im, const T* G, T* gw_re,
                       T* gw_im, T* ga_re, T* ga_im, int64_t c0, int64_t c1, int64_t N, int64_t L) {
    FlushSubnormals flush;
    for (int64_t c = c0; c < c1; ++c) {
        const T* G_c = G + c * L;
        for (int64_t n = 0; n < N; n += W) {
            const int64_t w = std::min(W, N - n), at = c * N + n;
            const Vec<T> ar = read(a_re + at, w), ai = read(a_im + at, w);
            // Horner from the highest power: P <- P a + G_l, P' <- P' a + P (before P's update)
            Vec<T> pr = splat(G_c[L - 1]), pi = splat(T(0)), dr = splat(T(0)), di = splat(T(0));
            for (int64_t l = L - 2; l >= 0; --l) {
                const Vec<T> dr_next = dr * ar - di * ai + pr, di_next = dr * ai + di * ar + pi;
                const Vec<T> pr_next = pr * ar - pi * ai + G_c[l], pi_next = pr * ai + pi * ar;
                dr = dr_next, di = di_next, pr = pr_next, pi = pi_next;
            }
            const Vec<T> wr = read(w_re + at, w), wi = read(w_im + at, w);
            write(gw_re + at, 2 * pr, w);                        // 2 conj(P)
            write(gw_im + at, -2 * pi, w);
            write(ga_re + at, 2 * (wr * dr - wi * di), w);       // 2 conj(w P')
            write(ga_im + at, -2 * (wr * di + wi * dr), w);
        }
    }
}

// sum_m x[m] y[m] over n numbers, on W lanes added across at the end.
template <typename T>
inline T dot(const T* x, const T* y, int64_t n) {
    Vec<T> sum = splat(T(0));
    for (int64_t m = 0; m < n; m += W) {
        const int64_t w = std::min(W, n - m);
        sum += read(x + m, w) * read(y + m, w);
    }
    return lane_sum<T>(sum);
}

// y[m] += g x[m] for n numbers.
template <typename T>
inline void axpy(T g, const T* x, T* y, int64_t n) {
    for (int64_t m = 0; m < n; m += W) {
        const int64_t w = std::min(W, n - m);
        write(y + m, read(y + m, w) + g * read(x + m, w), w);
    }
}

// Four lags l .. l+3 at once: each block of B is loaded once for four products, and the four
// sums are independent (one sum alone waits on its previous add: ~1.7 -> ~0.8 ms at 256 channels,
// N 1 024, T 37, one thread). Lag l + j has N - l - j terms: the first N - l - 3 on the lanes, the
// last 3 - j after them.
template <typename T>
void shift_forward_channels(const T* B, const T* Cm, T* K, int64_t c0, int64_t c1, int64_t N, int64_t T_lags) {
    for (int64_t c = c0; c < c1; ++c) {
        const T *B_c = B + c * N, *C_c = Cm + c * N;
        T* K_c = K + c * T_lags;
        int64_t l = 0;
        for (; l + 3 < T_lags; l += 4) {
            const int64_t common = N - l - 3;
            Vec<T> s0 = splat(T(0)), s1 = s0, s2 = s0, s3 = s0;
            for (int64_t m = 0; m < common; m += W) {
                const int64_t w = std::min(W, common - m);
                const Vec<T> b = read(B_c + m, w);
                const T* C_m = C_c + l + m;
                s0 += b * read(C_m, w);
                s1 += b * read(C_m + 1, w);
                s2 += b * read(C_m + 2, w);
                s3 += b * read(C_m + 3, w);
            }
            const Vec<T>* sums[4] = {&s0, &s1, &s2, &s3};
            for (int64_t j = 0; j < 4; ++j) {
                T k = lane_sum<T>(*sums[j]);
                for (int64_t m = common; m < N - l - j; ++m) k += B_c[m] * C_c[m + l + j];
                K_c[l + j] = k;
            }
        }
        for (; l < T_lags; ++l) K_c[l] = dot(B_c, C_c + l, N - l);
    }
}

template <typename T>
void shift_backward_channels(const T* B, const T* Cm, const T* G, T* gB, T* gC, int64_t c0, int64_t c1, int64_t N,
                             int64_t T_lags) {
    for (int64_t c = c0; c < c1; ++c) {
        const T *B_c = B + c * N, *C_c = Cm + c * N;
        T *gB_c = gB + c * N, *gC_c = gC + c * N;
        std::fill(gB_c, gB_c + N, T(0));
        std::fill(gC_c, gC_c + N, T(0));
        for (int64_t l = 0; l < T_lags; ++l) {
            const T g = G[c * T_lags + l];
            axpy(g, C_c + l, gB_c, N - l);                       // gB[m] += G_l C[m + l]
            axpy(g, B_c, gC_c + l, N - l);                       // gC[m + l] += G_l B[m]
        }
    }
}

}  // namespace

// The calling convention (cpu_kernels.py): pointers, then channels C, modes N, taps L, threads;
// for the shift SSM, channels C, state N, lags T, threads.
#define TAPS_ENTRY_POINTS(T, suffix)                                                                      \
    void ssm_taps_forward_##suffix(const T* w_re, const T* w_im, const T* a_re, const T* a_im, T* taps,  \
                                   int64_t C, int64_t N, int64_t L, int64_t threads) {                   \
        cpu_threads::split_rows(C, threads, [=](int64_t c0, int64_t c1) {                                 \
            forward_channels(w_re, w_im, a_re, a_im, taps, c0, c1, N, L);                                \
        });                                                                                               \
    }                                                                                                     \
    void ssm_taps_backward_##suffix(const T* w_re, const T* w_im, const T* a_re, const T* a_im,          \
                                    const T* G, T* gw_re, T* gw_im, T* ga_re, T* ga_im, int64_t C,        \
                                    int64_t N, int64_t L, int64_t threads) {                              \
        cpu_threads::split_rows(C, threads, [=](int64_t c0, int64_t c1) {                                 \
            backward_channels(w_re, w_im, a_re, a_im, G, gw_re, gw_im, ga_re, ga_im, c0, c1, N, L);     \
        });                                                                                               \
    }                                                                                                     \
    void shift_taps_forward_##suffix(const T* B, const T* Cm, T* K, int64_t C, int64_t N, int64_t T_lags,  \
                                     int64_t threads) {                                                   \
        cpu_threads::split_rows(C, threads, [=](int64_t c0, int64_t c1) {                                 \
            shift_forward_channels(B, Cm, K, c0, c1, N, T_lags);                                         \
        });                                                                                               \
    }                                                                                                     \
    void shift_taps_backward_##suffix(const T* B, const T* Cm, const T* G, T* gB, T* gC, int64_t C,       \
                                      int64_t N, int64_t T_lags, int64_t threads) {                       \
        cpu_threads::split_rows(C, threads, [=](int64_t c0, int64_t c1) {                                 \
            shift_backward_channels(B, Cm, G, gB, gC, c0, c1, N, T_lags);                               \
        });                                                                                               \
    }

extern "C" {
TAPS_ENTRY_POINTS(float, f32)
TAPS_ENTRY_POINTS(double, f64)
}
