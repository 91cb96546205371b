// The convolution kernels of H3's two SSMs (its reference form) on a CPU, forward and backward.
//
// 1. The diagonal SSM (mixer_h3.DiagonalSSM), its taps from its parameters in one pass per head:
// the bilinear discretisation (DiagonalSSM.discretize), then the taps of the conjugate pairs of
// complex modes (ops_ssm_taps.py's ConjugatePairTaps; readable reference:
// DiagonalSSM.kernel_vandermonde), instead of a dozen whole-tensor passes over (H, N) for the
// first and L complex products, sums and in-place adds of whole (H, N) tensors for the second,
// each as many again in the backward. Per head h and mode n, dt = exp(log_dt[h]):
//
//     x = -dt exp(inv_A_real) / 2,   y = dt A_imag / 2                (dt A / 2 = x + i y)
//     u = 1 - x,   scale = 1 / (u^2 + y^2),   gain = dt scale
//     a = ((1 - x^2 - y^2) scale, 2 y scale)                          (dA)
//     dB = gain (B_re u - B_im y, B_re y + B_im u),   w = C dB        (complex product)
//     taps[h, l] = 2 Re sum_n w[n] a[n]^l                             l < L
//
// The backward: P(a) = sum_l G[h, l] a^l and P'(a) = sum_l l G[h, l] a^(l-1) by Horner's rule
// (G = dLoss/dtaps) give gw = 2 conj(P(a)) and ga = 2 conj(w P'(a)) (PyTorch's convention: the
// gradient of a real loss with respect to z = x + iy is dL/dx + i dL/dy, and the taps are
// holomorphic in w and a up to the real part), which the chain rule carries back through the
// lines above to log_dt, inv_A_real, A_imag, B and C (written out in bilinear_backward_heads;
// tested by gradcheck and against autograd through DiagonalSSM.discretize). In float,
// exp(inv_A_real) is decay()'s, inv_A_real clamped to [-80, 80] (|Re A| between 2e-35 and 6e34;
// it starts at log 1/2).
//
// Layout as the module keeps its parameters: log_dt, g_log_dt (H,); inv_A_real, A_imag and their
// gradients (H, N); B, C, gB, gC (H, N, 2), real and imaginary parts interleaved; taps, G (H, L).
// The modes are innermost, so each step runs over W lanes of modes at once; a head's sums over
// its modes are taken on W lanes and added across them at the end of each tap.
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
// A head, or a channel, is computed by one thread alone.
//
// Built with the other kernels into one library by cpu_kernels.py and called through ctypes;
// tested against the PyTorch form and the Vandermonde form in tests/models/test_h3_reference.py.
#include <algorithm>
#include <cmath>
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

// --- 1. the diagonal SSM

// One head's taps from its modes' w and a (N each, planar): p_re, p_im hold w on entry, and are
// overwritten with w a^l, tap by tap.
template <typename T>
void taps_of_head(T* p_re, T* p_im, const T* a_re, const T* a_im, T* taps_h, int64_t N, int64_t L) {
    for (int64_t l = 0; l < L; ++l) {
        Vec<T> sum = splat(T(0));
        const bool last = l + 1 == L;
        for (int64_t n = 0; n < N; n += W) {
            const int64_t w = std::min(W, N - n);
            const Vec<T> pr = read(p_re + n, w), pi = read(p_im + n, w);
            sum += pr;
            if (!last) {                                         // p <- p a
                const Vec<T> ar = read(a_re + n, w), ai = read(a_im + n, w);
                write(p_re + n, pr * ar - pi * ai, w);
                write(p_im + n, pr * ai + pi * ar, w);
            }
        }
        taps_h[l] = 2 * lane_sum<T>(sum);
    }
}

// Horner from the highest power, on a block of modes a: P = sum_l G_l a^l and P' = dP/da
// (P <- P a + G_l, P' <- P' a + P before P's update).
template <typename T>
inline void horner(Vec<T> ar, Vec<T> ai, const T* G_h, int64_t L, Vec<T>& pr, Vec<T>& pi, Vec<T>& dr, Vec<T>& di) {
    pr = splat(G_h[L - 1]), pi = splat(T(0)), dr = splat(T(0)), di = splat(T(0));
    for (int64_t l = L - 2; l >= 0; --l) {
        const Vec<T> dr_next = dr * ar - di * ai + pr, di_next = dr * ai + di * ar + pi;
        const Vec<T> pr_next = pr * ar - pi * ai + G_h[l], pi_next = pr * ai + pi * ar;
        dr = dr_next, di = di_next, pr = pr_next, pi = pi_next;
    }
}

// A block of modes of one head, discretised.
template <typename T>
struct Discretised {
    Vec<T> x, y, u, scale, gain, b_re, b_im, c_re, c_im, a_re, a_im, db_re, db_im, w_re, w_im;
};

// Lanes of the real and of the imaginary parts of w complex numbers stored interleaved.
template <typename T>
inline void read_complex(const T* src, int64_t w, Vec<T>& re, Vec<T>& im) {
    T r[W] = {}, i[W] = {};
    for (int64_t j = 0; j < w; ++j) r[j] = src[2 * j], i[j] = src[2 * j + 1];
    re = load<T, true>(r, W), im = load<T, true>(i, W);
}

template <typename T>
inline void write_complex(T* dst, Vec<T> re, Vec<T> im, int64_t w) {
    for (int64_t j = 0; j < w; ++j) dst[2 * j] = re[j], dst[2 * j + 1] = im[j];
}

template <typename T>
inline Discretised<T> discretise(T dt, const T* inv_A_real, const T* A_imag, const T* B, const T* C, int64_t w) {
    Discretised<T> m;
    m.x = T(-0.5) * dt * decay(read(inv_A_real, w));
    m.y = T(0.5) * dt * read(A_imag, w);
    m.u = 1 - m.x;
    m.scale = 1 / (m.u * m.u + m.y * m.y);
    m.gain = dt * m.scale;
    m.a_re = (1 - m.x * m.x - m.y * m.y) * m.scale;
    m.a_im = 2 * m.y * m.scale;
    read_complex(B, w, m.b_re, m.b_im);
    read_complex(C, w, m.c_re, m.c_im);
    m.db_re = m.gain * (m.b_re * m.u - m.b_im * m.y);
    m.db_im = m.gain * (m.b_re * m.y + m.b_im * m.u);
    m.w_re = m.c_re * m.db_re - m.c_im * m.db_im;
    m.w_im = m.c_re * m.db_im + m.c_im * m.db_re;
    return m;
}

template <typename T>
void bilinear_forward_heads(const T* log_dt, const T* inv_A_real, const T* A_imag, const T* B, const T* C, T* taps,
                            int64_t h0, int64_t h1, int64_t N, int64_t L) {
    FlushSubnormals flush;
    std::vector<T> a_re(N), a_im(N), p_re(N), p_im(N);              // dA; w, then w dA^l
    for (int64_t h = h0; h < h1; ++h) {
        const T dt = std::exp(log_dt[h]);
        for (int64_t n = 0; n < N; n += W) {
            const int64_t w = std::min(W, N - n), at = h * N + n;
            const Discretised<T> m = discretise(dt, inv_A_real + at, A_imag + at, B + 2 * at, C + 2 * at, w);
            write(a_re.data() + n, m.a_re, w), write(a_im.data() + n, m.a_im, w);
            write(p_re.data() + n, m.w_re, w), write(p_im.data() + n, m.w_im, w);
        }
        taps_of_head(p_re.data(), p_im.data(), a_re.data(), a_im.data(), taps + h * L, N, L);
    }
}

template <typename T>
void bilinear_backward_heads(const T* log_dt, const T* inv_A_real, const T* A_imag, const T* B, const T* C,
                             const T* G, T* g_log_dt, T* g_inv_A_real, T* g_A_imag, T* gB, T* gC, int64_t h0,
                             int64_t h1, int64_t N, int64_t L) {
    FlushSubnormals flush;
    for (int64_t h = h0; h < h1; ++h) {
        const T dt = std::exp(log_dt[h]);
        Vec<T> log_dt_sum = splat(T(0));
        for (int64_t n = 0; n < N; n += W) {
            const int64_t w = std::min(W, N - n), at = h * N + n;
            const Discretised<T> m = discretise(dt, inv_A_real + at, A_imag + at, B + 2 * at, C + 2 * at, w);
            Vec<T> pr, pi, dr, di;
            horner(m.a_re, m.a_im, G + h * L, L, pr, pi, dr, di);
            // the taps' gradients (real partials) with respect to w = 2 conj(P) and a = 2 conj(w P')
            const Vec<T> gw_re = 2 * pr, gw_im = -2 * pi;
            const Vec<T> ga_re = 2 * (m.w_re * dr - m.w_im * di), ga_im = -2 * (m.w_re * di + m.w_im * dr);
            // w = C dB
            const Vec<T> gc_re = gw_re * m.db_re + gw_im * m.db_im, gc_im = gw_im * m.db_re - gw_re * m.db_im;
            const Vec<T> gdb_re = gw_re * m.c_re + gw_im * m.c_im, gdb_im = gw_im * m.c_re - gw_re * m.c_im;
            // dB = gain (B_re u - B_im y, B_re y + B_im u)
            const Vec<T> gb_re = m.gain * (gdb_re * m.u + gdb_im * m.y), gb_im = m.gain * (gdb_im * m.u - gdb_re * m.y);
            const Vec<T> g_gain = gdb_re * (m.b_re * m.u - m.b_im * m.y) + gdb_im * (m.b_re * m.y + m.b_im * m.u);
            Vec<T> g_x = -m.gain * (gdb_re * m.b_re + gdb_im * m.b_im);                    // through u = 1 - x
            Vec<T> g_y = m.gain * (gdb_im * m.b_re - gdb_re * m.b_im);
            // a = ((1 - x^2 - y^2) scale, 2 y scale), gain = dt scale
            const Vec<T> g_scale = ga_re * (1 - m.x * m.x - m.y * m.y) + ga_im * 2 * m.y + g_gain * dt;
            g_x += -2 * m.x * m.scale * ga_re;
            g_y += (2 * ga_im - 2 * m.y * ga_re) * m.scale;
            // scale = 1 / (u^2 + y^2): d/dx = 2 u scale^2, d/dy = -2 y scale^2
            const Vec<T> scale2 = m.scale * m.scale;
            g_x += 2 * m.u * scale2 * g_scale;
            g_y += -2 * m.y * scale2 * g_scale;
            // x = -dt exp(inv_A_real) / 2, y = dt A_imag / 2, dt = exp(log_dt): d/d log_dt of x, y, gain are x, y, gain
            write(g_inv_A_real + at, g_x * m.x, w);
            write(g_A_imag + at, g_y * (T(0.5) * dt), w);
            write_complex(gB + 2 * at, gb_re, gb_im, w);
            write_complex(gC + 2 * at, gc_re, gc_im, w);
            log_dt_sum += g_x * m.x + g_y * m.y + g_gain * m.gain;
        }
        g_log_dt[h] = lane_sum<T>(log_dt_sum);
    }
}

// --- 2. the shift SSM

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

// The calling convention (cpu_kernels.py): pointers, then heads H, modes N, taps L, threads; for
// the shift SSM, channels C, state N, lags T, threads.
#define TAPS_ENTRY_POINTS(T, suffix)                                                                      \
    void bilinear_taps_forward_##suffix(const T* log_dt, const T* inv_A_real, const T* A_imag, const T* B,   \
                                        const T* Cm, T* taps, int64_t H, int64_t N, int64_t L,            \
                                        int64_t threads) {                                                \
        cpu_threads::split_rows(H, threads, [=](int64_t h0, int64_t h1) {                                 \
            bilinear_forward_heads(log_dt, inv_A_real, A_imag, B, Cm, taps, h0, h1, N, L);               \
        });                                                                                               \
    }                                                                                                     \
    void bilinear_taps_backward_##suffix(const T* log_dt, const T* inv_A_real, const T* A_imag, const T* B,  \
                                         const T* Cm, const T* G, T* g_log_dt, T* g_inv_A_real,           \
                                         T* g_A_imag, T* gB, T* gC, int64_t H, int64_t N, int64_t L,      \
                                         int64_t threads) {                                               \
        cpu_threads::split_rows(H, threads, [=](int64_t h0, int64_t h1) {                                 \
            bilinear_backward_heads(log_dt, inv_A_real, A_imag, B, Cm, G, g_log_dt, g_inv_A_real, g_A_imag, \
                                    gB, gC, h0, h1, N, L);                                                \
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
