// Our hand-vectorised CPU loops are compiled twice: a baseline clone and one
// for AVX2+FMA (GCC/Clang function targets), chosen at run time so that one
// binary runs on any x86-64 and still uses the wide units where they exist.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define SHEAF_HAVE_AVX2_CLONES 1
#define SHEAF_AVX2_TARGET __attribute__((target("avx2,fma")))
#endif

namespace sheaf {

// Whether the AVX2+FMA clones may run on this CPU (asked once).
inline bool use_avx2() {
#ifdef SHEAF_HAVE_AVX2_CLONES
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

}  // namespace sheaf
