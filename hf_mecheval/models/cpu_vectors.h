// Vectors of W = 16 lanes and the math the compiled CPU kernels run on them (exp, softplus,
// sigmoid, lane sums; loads and stores of a partial block), shared by selective_scan_cpu.cpp,
// short_conv_cpu.cpp, ssd_cpu.cpp and ssm_taps_cpu.cpp. Compiled without -ffast-math: nothing here
// is reassociated.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace cpu_vectors {

// A block of W = 16 channels as one vector (GCC / Clang vector extensions): one AVX-512 register
// of floats, two AVX2 ones, four NEON ones; the compiler maps it to what the CPU has.
constexpr int64_t W = 16;
template <typename T> struct Lanes;
template <> struct Lanes<float> { typedef float type __attribute__((vector_size(W * sizeof(float)))); };
template <> struct Lanes<double> { typedef double type __attribute__((vector_size(W * sizeof(double)))); };
template <typename T> using Vec = typename Lanes<T>::type;
typedef int32_t IntLanes __attribute__((vector_size(W * sizeof(int32_t))));
typedef uint32_t UIntLanes __attribute__((vector_size(W * sizeof(uint32_t))));

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
// bits that k times it is exact, so r is exact to a float's precision), exp(r) by a polynomial
// of degree 6 (its interpolant at the Chebyshev points of that interval, coefficients rounded to
// float: within 2.6e-9 of exp(r), a twentieth of float's rounding step), 2^k built in the
// exponent bits. k is rounded by adding 1.5 * 2^23 (a float that large has no fraction bits:
// the sum is rounded to an integer, k sits in its low bits, and subtracting 1.5 * 2^23 again
// gives k exactly), fewer operations than converting to integers and back (the forward scan
// 15 % faster than with that and the Taylor series to r^7 it replaced). The whole exp is within
// 1.6 float32 rounding steps of the float64 value over [-80, 80] (torch's: 1.04). The file is
// compiled without -ffast-math, so nothing reassociates these steps. Double (the tests'
// precision) takes std::exp lane by lane.
inline Vec<float> decay(Vec<float> v) {
    const Vec<float> lowest = splat(-80.0f), highest = splat(80.0f);
    v = v < lowest ? lowest : v;
    v = v > highest ? highest : v;
    const Vec<float> shifted = v * 1.44269504088896341f + 12582912.0f;   // 1.5 * 2^23 + round(v / ln 2)
    const Vec<float> kf = shifted - 12582912.0f;
    Vec<float> r = v - kf * 0.693145751953125f;              // ln 2's leading bits (exact product)
    r = r - kf * 1.42860682030941723e-6f;                    // ln 2's remaining bits
    Vec<float> p = splat(0.0013941108481958508f);
    p = p * r + 0.00837512593716383f;
    p = p * r + 0.04166635125875473f;
    p = p * r + 0.16666415333747864f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    UIntLanes bits;                                          // k in the low bits; shifted past the
    std::memcpy(&bits, &shifted, sizeof bits);               // top, 1.5 * 2^23's bits leave 2^k
    // unsigned lanes: the shift wraps modulo 2^32 (defined), where a signed one would overflow
    return p * (Vec<float>)((bits + 127u) << 23);            // 2^k, k in [-116, 116]: a normal float
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

}  // namespace cpu_vectors
