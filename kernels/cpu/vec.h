// 8-float vectors for the CPU kernels: GCC/Clang vector extension, which becomes AVX2 (+FMA with
// -ffp-contract=fast) under -march=native on x86 and two 128-bit ops elsewhere. aligned(4): rows start
// anywhere (cache rows, weight rows), so loads through it are unaligned loads.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#endif

typedef float v8f __attribute__((vector_size(32), aligned(4)));

inline v8f load8(const float* p) { return *reinterpret_cast<const v8f*>(p); }

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
