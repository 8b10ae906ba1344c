#ifndef BIGMAC_STAGES_CPU_BLOCKED_GEMM_H_
#define BIGMAC_STAGES_CPU_BLOCKED_GEMM_H_

// BigMac's own float GEMM for x86 CPUs with AVX2 and FMA, with an opt-in AVX-512 kernel
// (bench/NOTES.md, lever 13 and issue 34's item 5): row-major
// C = alpha op(A) op(B) + beta C, blocked much as BLIS does (6 x 16 micro-tiles over a packed B, k
// in blocks of kGemmKc), with chunks of C's rows shared out to the OpenMP threads: each its own
// share first, then what is left of the others' (chunk_queues.h).
//
// Why not a library's: every element of C is computed by one thread, whichever, as the same chain
// of fused multiply-adds over k, block by block in a fixed order, and edge tiles take the same
// vector path as full ones. So its bits do not depend on the thread count, on how C is split, or on
// whether it is called inside a parallel region: pp/dp layouts that give their ranks different
// thread counts stay bitwise equal at any model size (with OpenBLAS they are not, docs/build.md).
// It also packs less than OpenBLAS on the block's small-k shapes: B is packed once per call and
// thread (a pair of threads packs a copy each, so that neither core reads lines the other wrote;
// a larger team shares one), and A a row tile at a time, into L1, just before its tile runs (a
// transposed A a chunk of rows at a time).
//
// Stateless apart from per-thread packing buffers that live as long as their thread.
#include <cstdint>

namespace bigmac::sdk::cpu::internal {

// The micro-tile and the blocking (in floats): k in blocks of kGemmKc, B packed kGemmNc columns
// and as many k blocks as fit kGemmPackedB floats at a time (one with A transposed), chunks of at
// most kGemmMc rows (a transposed A is packed a chunk at a time, any other a row tile at a time).
inline constexpr int kGemmMr = 6;
inline constexpr int kGemmNr = 16;
inline constexpr int kGemmKc = 256;
inline constexpr int kGemmMc = 144;
inline constexpr int kGemmNc = 4096;
// 8 MB of B at a time (each rank's, in an L3 that ranks on one host share; measured with one
// rank on a 32 MB L3): llama_20m's gate_up (k 512 x 3072 columns, 6 MB) then runs
// both its k blocks per row tile (with 4 MB, its C went out to memory between them: 6% more CPU
// time per step, bench/NOTES.md lever 18).
inline constexpr int64_t kGemmPackedB = int64_t{1} << 21;

// The micro-kernels. kAvx2: 6 x 16 tiles with AVX2 and FMA. kAvx512: 6 x 64 tiles with
// AVX-512F (the edges that are not whole 16-column panels, and tiles of fewer than 6 rows, by the
// AVX2 kernel). Both compute each element of C as the same chain of fused multiply-adds and fold
// it the same way, so they give the same bits (tested): the GEMM's results do not depend on the
// kernel.
enum class GemmKernel { kAvx2, kAvx512 };
inline constexpr int kWidePanels = 4;  // kAvx512's tile: kGemmMr x (kWidePanels x kGemmNr)

// True when this CPU runs the kernel (AVX2 and FMA; AVX-512F as well for kAvx512).
bool BlockedSgemmSupported(GemmKernel kernel = GemmKernel::kAvx2);

// "avx2" or "avx512" (BIGMAC_CPU_GEMM and the [rank] line say bigmac-avx2, bigmac-avx512).
const char* GemmKernelName(GemmKernel kernel);

// How many AVX-512 tiles this process has run (all threads; for the tests, which check that the
// kAvx512 kernel really took them).
int64_t WideTilesRun();

// An elementwise step fused into the GEMM (the MLP's GELU, SwiGLU): `apply` runs once on every
// element of C, after its last fold, on the thread that computed it, block by block while the
// block is still in cache. It gets rows x cols of C at `c` (row stride ldc), whose first element
// is C[row0][col0], and `context` as given. An empty one (apply null) does nothing. Column blocks
// are finished in order: every row of the block holding column j is final before any thread
// starts a later block, so an epilogue may read the earlier columns of its rows (SwiGLU's up
// columns read their gate columns, up to a block to the left).
struct GemmEpilogue {
  void (*apply)(void* context, float* c, int64_t ldc, int row0, int col0, int rows,
                int cols) = nullptr;
  void* context = nullptr;  // the caller's; outlives the GEMM call
};

// Row-major C = alpha op(A) op(B) + beta C with op(A) m x k and op(B) k x n (m, n, k >= 0). With
// beta == 0, C is only written (it may hold NaN); with alpha == 0 or k == 0, A and B are not read.
// Then `epilogue` on all of C. Uses the OpenMP threads when called outside a parallel region and
// the product is large enough; one thread inside one. Needs BlockedSgemmSupported(kernel).
void BlockedSgemm(GemmKernel kernel, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                  const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc,
                  const GemmEpilogue& epilogue = {});

// B packed once for several products that read it, or its first columns, or its first rows (the
// attention's keys and values: one pack per head serves all its query blocks, each of which reads
// its causal prefix). op(B) is k x n with 1 <= k <= kGemmKc (aborts otherwise), packed into
// BlockedPackedBFloats(k, n) floats at `out`, 64-byte aligned: panels of kGemmNr columns, the panel
// of columns [j, j + kGemmNr) at out + j * k, zero-padded.
int64_t BlockedPackedBFloats(int k, int n);
void BlockedPackB(bool trans_b, int k, int n, const float* b, int ldb, float* out);

// BlockedSgemm with op(B) given as BlockedPackB packed it, for packed_k rows (0: k) and at least n
// columns; the product reads its first k rows (k <= packed_k <= kGemmKc, aborts otherwise). The
// same bits as BlockedSgemm with the plain B's first k rows.
void BlockedSgemmPackedB(GemmKernel kernel, bool trans_a, int m, int n, int k, float alpha,
                         const float* a, int lda, const float* packed_b, float beta, float* c,
                         int ldc, int packed_k = 0);

// A whole B packed once for several products (a weight, constant while a flush's micro-batches
// pass it): op(B) is k x n with k >= 1 and 1 <= n <= kGemmNc (aborts otherwise), in blocks of
// kGemmKc rows, block pc at out + pc * (n rounded up to kGemmNr) laid out as BlockedPackB lays out
// a B of that block's rows; BlockedPackedBFloats(k, n) floats at `out`, 64-byte aligned. The
// OpenMP team packs it when called outside a parallel region.
void BlockedPackWholeB(bool trans_b, int k, int n, const float* b, int ldb, float* out);

// BlockedSgemm (A untransposed) with op(B) as BlockedPackWholeB packed it for these k and n: the
// same bits as BlockedSgemm on the plain B, and the same epilogue.
void BlockedSgemmPackedWholeB(GemmKernel kernel, int m, int n, int k, float alpha, const float* a,
                              int lda, const float* packed_b, float beta, float* c, int ldc,
                              const GemmEpilogue& epilogue = {});
// How many BlockedSgemmPackedWholeB products and BlockedPackWholeB packs this process has run
// (for the tests).
int64_t WholeBProductsRun();
int64_t WholeBPacksMade();

// The rows of C in one chunk of work (pure; tested): the team packs B, then each thread runs its
// own share of the chunks and takes what is left of the others' (chunk_queues.h). About 64
// chunks per thread, whole micro-tiles, at most kGemmMc.
int BlockedSgemmChunkRows(int m, int threads);

// How many threads a product of this size uses at most `available` (pure): one below about a
// million multiply-adds, where a fork costs more than it saves.
int BlockedSgemmThreads(int m, int n, int k, int available);

}  // namespace bigmac::sdk::cpu::internal

#endif  // BIGMAC_STAGES_CPU_BLOCKED_GEMM_H_
