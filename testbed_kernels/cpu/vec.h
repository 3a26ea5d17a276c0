// 8-float vectors for the CPU kernels: GCC/Clang vector extension, which becomes AVX2 (+FMA with
// -ffp-contract=fast) under -march=native on x86 and two 128-bit ops elsewhere. aligned(4): rows start
// anywhere (cache rows, weight rows), so loads through it are unaligned loads. Where AVX2 is missing the
// helpers below fall back to scalar code with the same results up to rounding.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#endif

typedef float v8f __attribute__((vector_size(32), aligned(4)));

// For an inner loop's helpers whose state (accumulators, a prefetch cursor) must stay in registers: GCC left
// paged_decode's weighted_block a call of its own, its prefetch cursor in memory.
#define FORCE_INLINE inline __attribute__((always_inline))

inline v8f load8(const float* p) { return *reinterpret_cast<const v8f*>(p); }

// x in every lane, one broadcast instruction (`v8f{} + x` is an add to +0 that the compiler must keep, since
// it turns -0 into +0: in an inner loop it cost an add and its latency per broadcast).
inline v8f splat8(float x) {
#if defined(__AVX__) && defined(__FMA__)
    return (v8f)_mm256_set1_ps(x);
#else
    return v8f{x, x, x, x, x, x, x, x};
#endif
}

// acc + a * b, always one fused multiply-add per lane. Written out because the compiler's own contraction
// is a tuning choice (on AMD Zen, GCC keeps a lone accumulation chain as separate mul + add), which would
// make a row's result depend on how many rows share its tile.
inline v8f fma8(v8f a, v8f b, v8f acc) {
#if defined(__AVX__) && defined(__FMA__)
    return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
#else
    v8f r;
    for (int i = 0; i < 8; ++i) r[i] = std::fma(a[i], b[i], acc[i]);
    return r;
#endif
}

// The same pairwise order for every row, so a row's result never depends on what else is in the batch.
inline float hsum(v8f v) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

inline float to_float(float x) { return x; }
inline float to_float(c10::Half x) { return static_cast<float>(x); }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }

// Eight sums at once: lane i of the result is the sum of a[i]'s lanes (a fixed order, so a dot product's
// result never depends on which other dot products share its call). One shuffle tree for eight vectors
// instead of eight scalar reductions.
inline v8f hsum8x8(const v8f* a) {
#if defined(__AVX__)
    const __m256 t0 =
        _mm256_hadd_ps(_mm256_hadd_ps((__m256)a[0], (__m256)a[1]), _mm256_hadd_ps((__m256)a[2], (__m256)a[3]));
    const __m256 t1 =
        _mm256_hadd_ps(_mm256_hadd_ps((__m256)a[4], (__m256)a[5]), _mm256_hadd_ps((__m256)a[6], (__m256)a[7]));
    return (v8f)_mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
#else
    v8f r;
    for (int i = 0; i < 8; ++i) r[i] = hsum(a[i]);
    return r;
#endif
}

// e^x per lane of any GCC float vector V (VI: the int32 vector of its width): Cephes' expf (range reduction
// by ln 2 in two parts, degree-5 polynomial, scale by 2^n); within 2 ulp of std::exp for x in [-87, 88],
// inputs below are clamped (e^-87 ~ 1e-38, softmax's zero). Written with vector arithmetic, which
// -ffp-contract=fast turns into fused multiply-adds, so every width shares one polynomial.
template <typename V, typename VI>
inline V exp_lanes(V x) {
    x = x < -87.0f ? V{} - 87.0f : x;
    x = x > 88.3f ? V{} + 88.3f : x;
    const V magic = V{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
    const V n = (x * 1.44269504088896341f + magic) - magic;
    V v = x - n * 0.693359375f;
    v = v - n * -2.12194440e-4f;
    V p = V{} + 1.9875691500e-4f;
    p = p * v + 1.3981999507e-3f;
    p = p * v + 8.3334519073e-3f;
    p = p * v + 4.1665795894e-2f;
    p = p * v + 1.6666665459e-1f;
    p = p * v + 5.0000001201e-1f;
    p = p * (v * v) + (v + 1.0f);
    const VI e = (__builtin_convertvector(n, VI) + 127) << 23;
    return p * (V)e;
}

typedef int32_t v8i __attribute__((vector_size(32), aligned(4)));
inline v8f exp8(v8f x) { return exp_lanes<v8f, v8i>(x); }

#if defined(__AVX512F__)
typedef float v16f __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64), aligned(4)));
inline v16f load16(const float* p) { return *reinterpret_cast<const v16f*>(p); }
#endif

// 8 consecutive cache elements as fp32 (bf16: the top half of a float; fp16: F16C's conversion).
inline v8f load8_as_float(const float* p) { return load8(p); }
inline v8f load8_as_float(const c10::BFloat16* p) {
#if defined(__AVX2__)
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return (v8f)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
    v8f r;
    for (int i = 0; i < 8; ++i) r[i] = static_cast<float>(p[i]);
    return r;
#endif
}
inline v8f load8_as_float(const c10::Half* p) {
#if defined(__F16C__)
    return (v8f)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    v8f r;
    for (int i = 0; i < 8; ++i) r[i] = static_cast<float>(p[i]);
    return r;
#endif
}
