# Sourced by scripts/sanitize-test.sh and scripts/torch2-test.sh (SHEAF_SANITIZE=1):
# the AddressSanitizer + UndefinedBehaviorSanitizer build flags and run options.
# Any report fails the run: ASan aborts on the first error; UBSan is made fatal.
#
# -g1: line tables only, enough for a report's file:line stack, and less for
# the compiler to write than -g.
sanitize_flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g1 -O1"
sanitize_cmake_args=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=$sanitize_flags"
                     "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined")
# LibTorch's own allocations at exit are not ours to report; everything else is.
# detect_stack_use_after_return: a frame's locals stay poisoned after it
# returns, so a reference kept past its frame (a callback's captured local, a
# temporary bound to a member reference) is reported, not read by luck.
# suppressions: a dependency's own bugs, each named and explained in the file.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:suppressions=$PWD/scripts/asan-suppressions.txt}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Random programs: a tenth of the Release run's count (everything is ~10x slower here).
export SHEAF_RANDOM_PROGRAMS=${SHEAF_RANDOM_PROGRAMS:-10}
