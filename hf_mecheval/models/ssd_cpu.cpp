// Mamba-2's selective SSM (a scalar decay per head) on a CPU, as a scan: one pass over time per
// batch row, head and block of W head channels, whose state (N vectors of W numbers) stays in the
// first-level cache. ops_ssd.py's readable reference (ssd_recurrent) without D, which the caller
// adds:
//
//     h_t = exp(dt_t A_h) h_{t-1} + dt_t x_t B_t^T       h: (P, N) per row and head
//     y_t = h_t C_t                                      (P,)
//
// The PyTorch training path (ssd_chunked) takes the attention form inside chunks instead, whose
// (batch, heads, length, length) decay and score tensors go through a dozen whole-tensor passes
// forward and backward; here the decay is one exp per row, head and step, and a step costs three
// vector operations per state entry forward (eight backward).
//
// Layout (row-major, contiguous): x, y, gx: (B, L, H, P); dt, gdt: (B, L, H); A: (B, H), one per
// row (the caller expands a shared one; gA: (B, H), one share per row); Bm, C, gB, gC: (B, L, G, N),
// head h reading group h / (H / G). The W lanes of a vector are W channels p of one head (GCC /
// Clang vector extensions, cpu_vectors.h); a block narrower than W (head sizes that are not a
// multiple of W) runs with its missing lanes zero (x = 0: a state that stays 0), never written
// back. A row's results are written by that row's call only; rows are split between threads.
//
// Built with the other kernels into one library by cpu_kernels.py and called through ctypes;
// tested against the reference in tests/models/test_mamba2.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_threads.h"
#include "cpu_vectors.h"

namespace {

using namespace cpu_vectors;

template <typename T>
struct Ssd {
    const T *x, *dt, *A, *Bm, *C;
    T* y;
    const T* gy;
    T *gx, *gdt, *gA, *gB, *gC;
    int64_t L, H, P, G, N;
};

// y for channels p0 .. p0 + w of head h in row r. state: (N,) scratch.
template <typename T, bool Full>
void forward_block(const Ssd<T>& s, int64_t r, int64_t h, int64_t p0, int64_t w, Vec<T>* state) {
    const int64_t L = s.L, H = s.H, P = s.P, G = s.G, N = s.N, g = h / (H / G);
    const T A_h = s.A[r * H + h];
    for (int64_t n = 0; n < N; ++n) state[n] = Vec<T>{};
    for (int64_t t = 0; t < L; ++t) {
        const int64_t q = ((r * L + t) * H + h) * P + p0, bc = ((r * L + t) * G + g) * N;
        const T dt_t = s.dt[(r * L + t) * H + h], decay = std::exp(dt_t * A_h);
        const Vec<T> dtx = dt_t * load<T, Full>(s.x + q, w);
        Vec<T> y_t{};
        for (int64_t n = 0; n < N; ++n) {
            state[n] = decay * state[n] + s.Bm[bc + n] * dtx;
            y_t += s.C[bc + n] * state[n];
        }
        store<T, Full>(s.y + q, y_t, w);
    }
}

// Per-thread scratch of the backward, for Q heads at once: their states H_t ((Q, L, N) vectors)
// and decays ((Q, L)), the carried gradients g ((Q, N)); per row the sums of gB's and gC's terms
// ((L, G, N) vectors, summed over their lanes once the row's heads are done).
constexpr int64_t Q = 4;   // heads per pass of the backward: one update of those sums per Q heads

template <typename T>
struct Work {
    std::vector<Vec<T>> H, g, sum_gB, sum_gC;
    std::vector<T> decays;
    Work(int64_t L, int64_t G, int64_t N)
        : H(Q * L * N), g(Q * N), sum_gB(L * G * N), sum_gC(L * G * N), decays(Q * L) {}
};

// Gradients of sum(gy * y) for channels p0 .. p0 + w of heads h0 .. h0 + Qn - 1 (one group) in
// row r: the blocks' states are recomputed, then one pass backwards in time carries
// G_t = dLoss/dh_t = C_t gy_t + a_{t+1} G_{t+1} (a_t = exp(dt_t A_h)). gx: these blocks' lanes;
// gdt (this row and head, per step) and gA (this row's share for the head): these blocks' terms
// are added (the caller zeroes them); sum_gB, sum_gC: the Qn heads' terms are added, once (the
// sums are read and written once per Qn heads: with one head at a time they were most of the
// backward's memory traffic).
template <typename T, bool Full, int64_t Qn>
void backward_heads(const Ssd<T>& s, int64_t r, int64_t h0, int64_t p0, int64_t w, Work<T>& k) {
    const int64_t L = s.L, H = s.H, P = s.P, G = s.G, N = s.N, g = h0 / (H / G);
    T A_h[Qn], gA_h[Qn];
    for (int64_t j = 0; j < Qn; ++j) A_h[j] = s.A[r * H + h0 + j], gA_h[j] = 0;
    for (int64_t t = 0; t < L; ++t) {               // the forward again: H_t, a_t; and gC_t = H_t . gy_t
        const int64_t bc = ((r * L + t) * G + g) * N;
        Vec<T> dtx[Qn], gy_t[Qn];
        T decay[Qn];
        for (int64_t j = 0; j < Qn; ++j) {
            const int64_t q = ((r * L + t) * H + h0 + j) * P + p0;
            const T dt_t = s.dt[(r * L + t) * H + h0 + j];
            decay[j] = k.decays[j * L + t] = std::exp(dt_t * A_h[j]);
            dtx[j] = dt_t * load<T, Full>(s.x + q, w);
            gy_t[j] = load<T, Full>(s.gy + q, w);
        }
        Vec<T>* sum_gC = k.sum_gC.data() + (t * G + g) * N;
        for (int64_t n = 0; n < N; ++n) {
            Vec<T> acc{};
            for (int64_t j = 0; j < Qn; ++j) {
                Vec<T>& H_t = k.H[(j * L + t) * N + n];
                H_t = s.Bm[bc + n] * dtx[j];
                if (t > 0) H_t += decay[j] * k.H[(j * L + t - 1) * N + n];
                acc += H_t * gy_t[j];
            }
            sum_gC[n] += acc;
        }
    }
    for (int64_t i = 0; i < Qn * N; ++i) k.g[i] = Vec<T>{};
    for (int64_t t = L - 1; t >= 0; --t) {
        const int64_t bc = ((r * L + t) * G + g) * N;
        Vec<T> x_t[Qn], gy_t[Qn], dtx[Qn], gd[Qn], gq[Qn];  // gd: dLoss/d(dt_t x_t); gq: G_t . H_{t-1} per lane
        T carry[Qn], dt_t[Qn];
        for (int64_t j = 0; j < Qn; ++j) {
            const int64_t q = ((r * L + t) * H + h0 + j) * P + p0;
            dt_t[j] = s.dt[(r * L + t) * H + h0 + j];
            carry[j] = t + 1 < L ? k.decays[j * L + t + 1] : T(0);
            x_t[j] = load<T, Full>(s.x + q, w);
            gy_t[j] = load<T, Full>(s.gy + q, w);
            dtx[j] = dt_t[j] * x_t[j];
            gd[j] = gq[j] = Vec<T>{};
        }
        Vec<T>* sum_gB = k.sum_gB.data() + (t * G + g) * N;
        for (int64_t n = 0; n < N; ++n) {
            Vec<T> acc{};
            for (int64_t j = 0; j < Qn; ++j) {
                Vec<T>& g_n = k.g[j * N + n];
                g_n = carry[j] * g_n + s.C[bc + n] * gy_t[j];      // G_t = a_{t+1} G_{t+1} + C_t gy_t
                acc += g_n * dtx[j];
                gd[j] += s.Bm[bc + n] * g_n;
                if (t > 0) gq[j] += g_n * k.H[(j * L + t - 1) * N + n];
            }
            sum_gB[n] += acc;
        }
        for (int64_t j = 0; j < Qn; ++j) {
            const int64_t q = ((r * L + t) * H + h0 + j) * P + p0;
            store<T, Full>(s.gx + q, gd[j] * dt_t[j], w);
            // dLoss/d dt_t: through dt_t x_t (gd . x_t) and through a_t = exp(dt_t A_h) (a_t A_h G_t . H_{t-1})
            const T through_decay = t > 0 ? lane_sum<T>(gq[j]) * k.decays[j * L + t] : T(0);
            s.gdt[(r * L + t) * H + h0 + j] += lane_sum<T>(gd[j] * x_t[j]) + through_decay * A_h[j];
            gA_h[j] += through_decay * dt_t[j];
        }
    }
    for (int64_t j = 0; j < Qn; ++j) s.gA[r * H + h0 + j] += gA_h[j];
}

// The heads of one group from h0 on, Q at a time (then one at a time), for one block of channels.
template <typename T, bool Full>
void backward_group(const Ssd<T>& s, int64_t r, int64_t h0, int64_t heads, int64_t p0, int64_t w, Work<T>& k) {
    int64_t h = h0;
    for (; h + Q <= h0 + heads; h += Q) backward_heads<T, Full, Q>(s, r, h, p0, w, k);
    for (; h < h0 + heads; ++h) backward_heads<T, Full, 1>(s, r, h, p0, w, k);
}

template <typename T>
void forward_rows(const Ssd<T>& s, int64_t r0, int64_t r1) {
    FlushSubnormals flush;
    std::vector<Vec<T>> state(s.N);
    for (int64_t r = r0; r < r1; ++r)
        for (int64_t h = 0; h < s.H; ++h)
            for (int64_t p0 = 0; p0 < s.P; p0 += W) {
                const int64_t w = std::min(W, s.P - p0);
                if (w == W) forward_block<T, true>(s, r, h, p0, w, state.data());
                else forward_block<T, false>(s, r, h, p0, w, state.data());
            }
}

template <typename T>
void backward_rows(const Ssd<T>& s, int64_t r0, int64_t r1) {
    FlushSubnormals flush;
    Work<T> k(s.L, s.G, s.N);
    const int64_t L = s.L, H = s.H, G = s.G, N = s.N;
    for (int64_t r = r0; r < r1; ++r) {
        std::fill(k.sum_gB.begin(), k.sum_gB.end(), Vec<T>{});
        std::fill(k.sum_gC.begin(), k.sum_gC.end(), Vec<T>{});
        std::fill(s.gdt + r * L * H, s.gdt + (r + 1) * L * H, T(0));
        std::fill(s.gA + r * H, s.gA + (r + 1) * H, T(0));
        for (int64_t h0 = 0; h0 < H; h0 += H / G)      // a group's heads read the same B and C
            for (int64_t p0 = 0; p0 < s.P; p0 += W) {
                const int64_t w = std::min(W, s.P - p0);
                if (w == W) backward_group<T, true>(s, r, h0, H / G, p0, w, k);
                else backward_group<T, false>(s, r, h0, H / G, p0, w, k);
            }
        const int64_t p = r * L * G * N;
        for (int64_t i = 0; i < L * G * N; ++i) {
            s.gB[p + i] = lane_sum<T>(k.sum_gB[i]);
            s.gC[p + i] = lane_sum<T>(k.sum_gC[i]);
        }
    }
}

}  // namespace

// The calling convention (cpu_kernels.py): pointers, then rows, L, H, P, G, N, threads.
#define SSD_ENTRY_POINTS(T, suffix)                                                                        \
    void ssd_forward_##suffix(const T* x, const T* dt, const T* A, const T* Bm, const T* C, T* y,         \
                              int64_t rows, int64_t L, int64_t H, int64_t P, int64_t G, int64_t N,        \
                              int64_t threads) {                                                           \
        const Ssd<T> s{x, dt, A, Bm, C, y, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, L, H, P, G, N}; \
        cpu_threads::split_rows(rows, threads, [&s](int64_t r0, int64_t r1) { forward_rows(s, r0, r1); }); \
    }                                                                                                      \
    void ssd_backward_##suffix(const T* x, const T* dt, const T* A, const T* Bm, const T* C, const T* gy, \
                               T* gx, T* gdt, T* gA, T* gB, T* gC, int64_t rows, int64_t L, int64_t H,    \
                               int64_t P, int64_t G, int64_t N, int64_t threads) {                        \
        const Ssd<T> s{x, dt, A, Bm, C, nullptr, gy, gx, gdt, gA, gB, gC, L, H, P, G, N};                 \
        cpu_threads::split_rows(rows, threads, [&s](int64_t r0, int64_t r1) { backward_rows(s, r0, r1); }); \
    }

extern "C" {
SSD_ENTRY_POINTS(float, f32)
SSD_ENTRY_POINTS(double, f64)
}
