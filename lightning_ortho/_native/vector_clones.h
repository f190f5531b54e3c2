/* VECTOR_CLONES: compile a kernel twice, for AVX2 and for the baseline x86-64 (SSE2), and pick one when the library
 * loads (GCC/clang target_clones, an ifunc resolved by cpuid). The build stays portable: one library runs on every
 * x86-64 CPU, yet the row passes use 256-bit vectors where the CPU has them (about twice the throughput of SSE2 on
 * these memory-resident passes). Both clones are compiled with -ffp-contract=off, so neither fuses a multiply and an
 * add; they may still sum a reduction in another order (lanes of 8 instead of 4), as BLAS does from CPU to CPU.
 * Elsewhere (other architectures, macOS without ifunc, compilers without target_clones) it is empty: one build. */
#ifndef LIGHTNING_ORTHO_VECTOR_CLONES_H
#define LIGHTNING_ORTHO_VECTOR_CLONES_H
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && (!defined(__clang__) || __clang_major__ >= 14)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif
#endif
