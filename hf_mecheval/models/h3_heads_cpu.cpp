// H3's heads (its reference form) at the kept positions, forward and backward, in one pass: the
// outer products k v^T, the diagonal SSM's long convolution and the q contraction, evaluated at
// the positions whose output is kept (the answers on the answer-only training path; every
// position of a short row, mixer_h3.COMPILED_WHOLE_ROWS_MAX, otherwise). The math is
// mixer_h3.H3Reference's (its readable reference: H3.forward's kept-positions path, _outer and
// _contract), per row b, kept position p = keep[b, s], head h, key index i and value index j:
//
//     s[i, j, h] = sum_{l <= p} taps[l, h] k[p - l, i, h] v[p - l, j, h]     (the skip D_h folded
//                                                                             into taps[0, h])
//     o[s, j, h] = sum_i q[p, i, h] s[i, j, h]
//
// and, with go = dLoss/do and gs[i, j, h] = q[p, i, h] go[s, j, h]:
//
//     gq[p, i, h]      += sum_j go[s, j, h] s[i, j, h]
//     gk[p - l, i, h]  += taps[l, h] sum_j gs[i, j, h] v[p - l, j, h]
//     gv[p - l, j, h]  += taps[l, h] sum_i gs[i, j, h] k[p - l, i, h]
//     gtaps[l, h]      += sum_i k[p - l, i, h] sum_j gs[i, j, h] v[p - l, j, h]
//
// PyTorch's form builds the (B, L, P P H) outer products at every position, gathers a (B, k, L,
// P P H) window of them behind each kept position and multiplies, sums and scatters it back in
// the backward (or, for whole rows, convolves the outer products): a dozen whole-tensor passes per
// layer, where these loops touch each number of k and v once per kept position.
//
// Layout (row-major, contiguous): q, k, v, gq, gk, gv (B, L, D) as the projections give them,
// model channel h P + i; o, go (B, S, P H), output channel j H + h (the reference's order, which
// the output projection reads); taps (L, H), or (B, L, H) one per row (stacked copies folded into
// rows); gtaps (B, L, H), each row's share; keep (B, S), positions in [0, L). Each row's k, v and
// taps are laid out again in buffers of the thread's as (L, P, Hp) and (L, Hp), heads innermost
// and padded with zeros to Hp, a whole number of vectors of W heads, so that every step runs on
// whole vectors (at width 16, 8 heads, partial vectors made the step slower than PyTorch's; as
// copies of whole tensors in PyTorch, forward and backward, these layouts took longer than the
// loops). A row is computed by one thread alone, so the results do not depend on the threads.
//
// Built with the other kernels into one library by cpu_kernels.py and called through ctypes;
// tested against the PyTorch path in tests/models/test_h3_reference.py.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu_threads.h"
#include "cpu_vectors.h"

namespace {

using namespace cpu_vectors;

template <typename T>
inline Vec<T> get(const T* src) {
    return load<T, true>(src, W);
}

template <typename T>
inline void put(T* dst, Vec<T> v) {
    store<T, true>(dst, v, W);
}

// The sizes and the tensors of one call.
template <typename T>
struct Heads {
    const T *q, *k, *v, *taps;
    const int64_t* keep;
    int64_t L, S, P, H;
    bool taps_per_row;

    int64_t D() const { return P * H; }
    int64_t Hp() const { return (H + W - 1) / W * W; }         // heads padded to whole vectors
    const T* taps_of(int64_t b) const { return taps + (taps_per_row ? b * L * H : 0); }
    int64_t last_kept(int64_t b) const {                       // -1 where a row keeps no position
        return S ? *std::max_element(keep + b * S, keep + (b + 1) * S) : -1;
    }
};

// One row's k and v as (positions, P, Hp), its taps as (L, Hp), and q at one kept position as
// (P, Hp), the padding heads 0; with the gradients' buffers of the same layouts.
template <typename T>
struct RowBuffers {
    int64_t P, H, Hp;
    std::vector<T> k, v, taps, q;

    explicit RowBuffers(const Heads<T>& a)
        : P(a.P), H(a.H), Hp(a.Hp()), k(a.L * a.P * Hp, T(0)), v(k.size(), T(0)), taps(a.L * Hp, T(0)),
          q(a.P * Hp, T(0)) {}

    // (positions, D) with channel h P + i -> (positions, P, Hp) indexed [i, h], and back
    void by_index_and_head(const T* src, T* dst, int64_t positions) const {
        for (int64_t t = 0; t < positions; ++t)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t i = 0; i < P; ++i) dst[(t * P + i) * Hp + h] = src[(t * H + h) * P + i];
    }
    void by_head_and_index(const T* src, T* dst, int64_t positions) const {
        for (int64_t t = 0; t < positions; ++t)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t i = 0; i < P; ++i) dst[(t * H + h) * P + i] = src[(t * P + i) * Hp + h];
    }
    // (rows, H) -> (rows, Hp) and back
    void padded(const T* src, T* dst, int64_t rows) const {
        for (int64_t r = 0; r < rows; ++r) std::copy(src + r * H, src + (r + 1) * H, dst + r * Hp);
    }
    void unpadded(const T* src, T* dst, int64_t rows) const {
        for (int64_t r = 0; r < rows; ++r) std::copy(src + r * Hp, src + r * Hp + H, dst + r * H);
    }

    void load_row(const Heads<T>& a, int64_t b, int64_t positions) {
        by_index_and_head(a.k + b * a.L * a.D(), k.data(), positions);
        by_index_and_head(a.v + b * a.L * a.D(), v.data(), positions);
        padded(a.taps_of(b), taps.data(), positions);
    }
    void load_query(const Heads<T>& a, int64_t b, int64_t p) {
        by_index_and_head(a.q + (b * a.L + p) * a.D(), q.data(), 1);
    }
};

// s[i, j] for one kept position p and the heads [h, h + W), from a row's buffers: into s (P P vectors).
template <typename T>
void outer_products_convolved(const RowBuffers<T>& row, int64_t p, int64_t h, Vec<T>* s) {
    const int64_t P = row.P, Hp = row.Hp, PH = P * Hp;
    for (int64_t ij = 0; ij < P * P; ++ij) s[ij] = splat(T(0));
    for (int64_t l = 0; l <= p; ++l) {
        const int64_t t = (p - l) * PH + h;
        const Vec<T> tap = get(row.taps.data() + l * Hp + h);
        for (int64_t i = 0; i < P; ++i) {
            const Vec<T> tk = tap * get(row.k.data() + t + i * Hp);
            for (int64_t j = 0; j < P; ++j) s[i * P + j] += tk * get(row.v.data() + t + j * Hp);
        }
    }
}

template <typename T>
void forward_rows(const Heads<T>& a, T* o, int64_t r0, int64_t r1) {
    const int64_t P = a.P, Hp = a.Hp();
    RowBuffers<T> row(a);
    std::vector<T> o_slot(P * Hp);
    std::vector<Vec<T>> s(P * P);
    for (int64_t b = r0; b < r1; ++b) {
        row.load_row(a, b, a.last_kept(b) + 1);
        for (int64_t slot = 0; slot < a.S; ++slot) {
            const int64_t p = a.keep[b * a.S + slot];
            row.load_query(a, b, p);
            for (int64_t h = 0; h < Hp; h += W) {
                outer_products_convolved(row, p, h, s.data());
                for (int64_t j = 0; j < P; ++j) {
                    Vec<T> out = splat(T(0));
                    for (int64_t i = 0; i < P; ++i) out += get(row.q.data() + i * Hp + h) * s[i * P + j];
                    put(o_slot.data() + j * Hp + h, out);
                }
            }
            row.unpadded(o_slot.data(), o + (b * a.S + slot) * a.D(), P);
        }
    }
}

template <typename T>
void backward_rows(const Heads<T>& a, const T* go, T* gq, T* gk, T* gv, T* gtaps, int64_t r0, int64_t r1) {
    const int64_t P = a.P, Hp = a.Hp(), PH = P * Hp, D = a.D();
    RowBuffers<T> row(a);
    std::vector<T> gk_row(a.L * PH), gv_row(a.L * PH), gtaps_row(a.L * Hp), go_slot(PH, T(0)), gq_slot(PH);
    std::vector<T> gq_p(D);
    std::vector<Vec<T>> s(P * P), gs(P * P);
    for (int64_t b = r0; b < r1; ++b) {
        const int64_t positions = a.last_kept(b) + 1;
        row.load_row(a, b, positions);
        std::fill(gk_row.begin(), gk_row.begin() + positions * PH, T(0));
        std::fill(gv_row.begin(), gv_row.begin() + positions * PH, T(0));
        std::fill(gtaps_row.begin(), gtaps_row.begin() + positions * Hp, T(0));
        T* gq_b = gq + b * a.L * D;
        std::fill(gq_b, gq_b + a.L * D, T(0));
        for (int64_t slot = 0; slot < a.S; ++slot) {
            const int64_t p = a.keep[b * a.S + slot];
            row.load_query(a, b, p);
            row.padded(go + (b * a.S + slot) * D, go_slot.data(), P);
            for (int64_t h = 0; h < Hp; h += W) {
                outer_products_convolved(row, p, h, s.data());
                for (int64_t i = 0; i < P; ++i) {
                    const Vec<T> q_i = get(row.q.data() + i * Hp + h);
                    Vec<T> g = splat(T(0));
                    for (int64_t j = 0; j < P; ++j) {
                        const Vec<T> go_j = get(go_slot.data() + j * Hp + h);
                        g += go_j * s[i * P + j];
                        gs[i * P + j] = q_i * go_j;
                    }
                    put(gq_slot.data() + i * Hp + h, g);
                }
                for (int64_t l = 0; l <= p; ++l) {
                    const int64_t t = (p - l) * PH + h;
                    const Vec<T> tap = get(row.taps.data() + l * Hp + h);
                    Vec<T> gtap = splat(T(0));
                    for (int64_t i = 0; i < P; ++i) {         // sum_j gs[i, j] v[j], then gk and gtaps
                        Vec<T> sum = splat(T(0));
                        for (int64_t j = 0; j < P; ++j) sum += gs[i * P + j] * get(row.v.data() + t + j * Hp);
                        gtap += get(row.k.data() + t + i * Hp) * sum;
                        put(gk_row.data() + t + i * Hp, get(gk_row.data() + t + i * Hp) + tap * sum);
                    }
                    for (int64_t j = 0; j < P; ++j) {         // sum_i gs[i, j] k[i], then gv
                        Vec<T> sum = splat(T(0));
                        for (int64_t i = 0; i < P; ++i) sum += gs[i * P + j] * get(row.k.data() + t + i * Hp);
                        put(gv_row.data() + t + j * Hp, get(gv_row.data() + t + j * Hp) + tap * sum);
                    }
                    put(gtaps_row.data() + l * Hp + h, get(gtaps_row.data() + l * Hp + h) + gtap);
                }
            }
            row.by_head_and_index(gq_slot.data(), gq_p.data(), 1);  // two slots may keep the same position
            for (int64_t c = 0; c < D; ++c) gq_b[p * D + c] += gq_p[c];
        }
        T *gk_b = gk + b * a.L * D, *gv_b = gv + b * a.L * D, *gtaps_b = gtaps + b * a.L * a.H;
        row.by_head_and_index(gk_row.data(), gk_b, positions);
        row.by_head_and_index(gv_row.data(), gv_b, positions);
        row.unpadded(gtaps_row.data(), gtaps_b, positions);
        std::fill(gk_b + positions * D, gk_b + a.L * D, T(0));   // after the last kept position: no effect
        std::fill(gv_b + positions * D, gv_b + a.L * D, T(0));
        std::fill(gtaps_b + positions * a.H, gtaps_b + a.L * a.H, T(0));
    }
}

}  // namespace

// The calling convention (cpu_kernels.py): pointers, then rows B, length L, kept positions S,
// head_dim P, heads H, taps per row (0 / 1), threads.
#define HEADS_ENTRY_POINTS(T, suffix)                                                                     \
    void h3_kept_forward_##suffix(const T* q, const T* k, const T* v, const T* taps, const int64_t* keep, \
                                  T* o, int64_t B, int64_t L, int64_t S, int64_t P, int64_t H,             \
                                  int64_t taps_per_row, int64_t threads) {                                \
        const Heads<T> a{q, k, v, taps, keep, L, S, P, H, taps_per_row != 0};                             \
        cpu_threads::split_rows(B, threads, [=](int64_t r0, int64_t r1) { forward_rows(a, o, r0, r1); }); \
    }                                                                                                     \
    void h3_kept_backward_##suffix(const T* q, const T* k, const T* v, const T* taps, const int64_t* keep,\
                                   const T* go, T* gq, T* gk, T* gv, T* gtaps, int64_t B, int64_t L,       \
                                   int64_t S, int64_t P, int64_t H, int64_t taps_per_row,                 \
                                   int64_t threads) {                                                     \
        const Heads<T> a{q, k, v, taps, keep, L, S, P, H, taps_per_row != 0};                             \
        cpu_threads::split_rows(B, threads, [=](int64_t r0, int64_t r1) {                                 \
            backward_rows(a, go, gq, gk, gv, gtaps, r0, r1);                                             \
        });                                                                                               \
    }

extern "C" {
HEADS_ENTRY_POINTS(float, f32)
HEADS_ENTRY_POINTS(double, f64)
}
