// Our hand-vectorised CPU loops are compiled more than once: a baseline clone,
// one for AVX2+FMA and (the fused elementwise loops) one for AVX-512 (GCC/Clang
// function targets), chosen at run time so that one binary runs on any x86-64
// and still uses the wide units where they exist. SHEAF_CPU_ISA=avx2 or
// =baseline caps the choice (to compare the clones on one machine).
#pragma once

#include <cstdlib>
#include <string_view>

#if defined(__x86_64__) && defined(__GNUC__)
#define SHEAF_HAVE_AVX2_CLONES 1
#define SHEAF_AVX2_TARGET __attribute__((target("avx2,fma")))
// 512-bit vectors asked for explicitly where the compiler takes it in a target
// attribute (GCC; Clang ignores the whole attribute if it sees it).
#if defined(__clang__)
#define SHEAF_AVX512_TARGET __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma")))
#else
#define SHEAF_AVX512_TARGET \
  __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma,prefer-vector-width=512")))
#endif
#endif

namespace sheaf {

namespace cpu_detail {
// 0: baseline, 1: AVX2+FMA, 2: AVX-512 (F, DQ, VL, BW): what the CPU has, capped by SHEAF_CPU_ISA.
inline int isa_level() {
  static const int level = [] {
    int l = 0;
#ifdef SHEAF_HAVE_AVX2_CLONES
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) l = 1;
    if (l == 1 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
      l = 2;
#endif
    if (const char* cap = std::getenv("SHEAF_CPU_ISA")) {
      const std::string_view c(cap);
      if (c == "baseline") l = 0;
      else if (c == "avx2" && l > 1) l = 1;
    }
    return l;
  }();
  return level;
}
}  // namespace cpu_detail

// Whether the AVX2+FMA clones may run on this CPU (asked once).
inline bool use_avx2() { return cpu_detail::isa_level() >= 1; }
// Whether the AVX-512 clones may.
inline bool use_avx512() { return cpu_detail::isa_level() >= 2; }

// The clone of a loop compiled three times (NAME##_base, NAME##_avx2,
// NAME##_avx512, the last two with SHEAF_AVX2_TARGET / SHEAF_AVX512_TARGET)
// that this CPU runs: its address, to keep once.
#ifdef SHEAF_HAVE_AVX2_CLONES
#define SHEAF_PICK_CLONE(NAME) \
  (::sheaf::use_avx512() ? &NAME##_avx512 : ::sheaf::use_avx2() ? &NAME##_avx2 : &NAME##_base)
#else
#define SHEAF_PICK_CLONE(NAME) (&NAME##_base)
#endif

}  // namespace sheaf
