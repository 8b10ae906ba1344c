#include "stages/cpu/blocked_gemm.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/util/compute_progress.h"
#include "core/util/host_memory.h"
#include "stages/cpu/chunk_queues.h"

namespace bigmac::sdk::cpu::internal {
namespace {

#define BIGMAC_AVX2_FMA __attribute__((target("avx2,fma")))

// A float buffer that only grows, in huge pages when large (util::AllocateHost); one per thread
// and role, freed with the thread.
class PackBuffer {
 public:
  PackBuffer() = default;
  PackBuffer(const PackBuffer&) = delete;
  PackBuffer& operator=(const PackBuffer&) = delete;
  ~PackBuffer() { std::free(data_); }

  float* Get(int64_t floats) {
    if (floats > capacity_) {
      std::free(data_);
      data_ = static_cast<float*>(::bigmac::util::AllocateHost(floats * int64_t{sizeof(float)}));
      if (!data_) {
        std::fprintf(stderr, "bigmac: out of memory for a %lld-byte GEMM packing buffer\n",
                     static_cast<long long>(floats * int64_t{sizeof(float)}));
        std::abort();
      }
      capacity_ = floats;
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  int64_t capacity_ = 0;
};

// B is packed in pieces of one k block and up to kPackPanels panels (shared out when a large team
// packs one copy): an untransposed B row by row, 512 contiguous bytes at a time (panel by panel,
// its rows ldb apart each cost a TLB entry: packing was 3.4% of the llama_20m step).
constexpr int kPackPanels = 8;

std::atomic<int64_t> wide_tiles{0};     // AVX-512 tiles run, for WideTilesRun()
std::atomic<int64_t> whole_b_runs{0};   // for WholeBProductsRun()
std::atomic<int64_t> whole_b_packs{0};  // for WholeBPacksMade()

thread_local PackBuffer a_buffer;
thread_local PackBuffer b_buffer;      // B packed by one thread, or shared by a large team
thread_local PackBuffer own_b_buffer;  // this thread's own copy of B in a small team's product

// Teams of up to this many threads pack a copy of B each (measured with two; with more, B's
// packing and its place in the L3 would grow with the team, which was not measured).
constexpr int kOwnBMaxThreads = 2;

// How a micro-kernel folds its accumulators into C (all fused, so the rounding is stated here):
// the first k block overwrites (beta == 0) or scales C, later blocks add to it.
enum class Fold { kOverwrite, kScale, kAccumulate };

// One row of 16 of C folded with its accumulators (lo: columns 0-7, hi: 8-15).
template <Fold kFold>
BIGMAC_AVX2_FMA inline void FoldRow(float* row, __m256 lo, __m256 hi, __m256 va, __m256 vb) {
  if constexpr (kFold == Fold::kOverwrite) {
    _mm256_storeu_ps(row, _mm256_mul_ps(va, lo));
    _mm256_storeu_ps(row + 8, _mm256_mul_ps(va, hi));
  } else if constexpr (kFold == Fold::kScale) {
    _mm256_storeu_ps(row, _mm256_fmadd_ps(va, lo, _mm256_mul_ps(vb, _mm256_loadu_ps(row))));
    _mm256_storeu_ps(row + 8, _mm256_fmadd_ps(va, hi, _mm256_mul_ps(vb, _mm256_loadu_ps(row + 8))));
  } else {
    _mm256_storeu_ps(row, _mm256_fmadd_ps(va, lo, _mm256_loadu_ps(row)));
    _mm256_storeu_ps(row + 8, _mm256_fmadd_ps(va, hi, _mm256_loadu_ps(row + 8)));
  }
}

// C[0..6) x [0..16) (leading dimension ldc) folded with the product of a packed A tile (kc steps
// of kGemmMr floats) and a packed B panel (kc rows of 16 floats, 64-byte aligned) over kc steps.
// (Reading an untransposed B in place instead, with its row stride, made the kernel slower than
// the packing it saves: lever 13.)
template <Fold kFold>
BIGMAC_AVX2_FMA void MicroKernel(int kc, const float* ap, const float* bp, float alpha, float beta,
                                 float* c, int64_t ldc) {
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
  __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
  __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
  __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  for (int p = 0; p < kc; ++p, ap += kGemmMr, bp += kGemmNr) {
    const __m256 b0 = _mm256_load_ps(bp);
    const __m256 b1 = _mm256_load_ps(bp + 8);
    __m256 a = _mm256_broadcast_ss(ap);
    c00 = _mm256_fmadd_ps(a, b0, c00);
    c01 = _mm256_fmadd_ps(a, b1, c01);
    a = _mm256_broadcast_ss(ap + 1);
    c10 = _mm256_fmadd_ps(a, b0, c10);
    c11 = _mm256_fmadd_ps(a, b1, c11);
    a = _mm256_broadcast_ss(ap + 2);
    c20 = _mm256_fmadd_ps(a, b0, c20);
    c21 = _mm256_fmadd_ps(a, b1, c21);
    a = _mm256_broadcast_ss(ap + 3);
    c30 = _mm256_fmadd_ps(a, b0, c30);
    c31 = _mm256_fmadd_ps(a, b1, c31);
    a = _mm256_broadcast_ss(ap + 4);
    c40 = _mm256_fmadd_ps(a, b0, c40);
    c41 = _mm256_fmadd_ps(a, b1, c41);
    a = _mm256_broadcast_ss(ap + 5);
    c50 = _mm256_fmadd_ps(a, b0, c50);
    c51 = _mm256_fmadd_ps(a, b1, c51);
  }
  const __m256 va = _mm256_set1_ps(alpha);
  const __m256 vb = _mm256_set1_ps(beta);
  FoldRow<kFold>(c, c00, c01, va, vb);
  FoldRow<kFold>(c + ldc, c10, c11, va, vb);
  FoldRow<kFold>(c + 2 * ldc, c20, c21, va, vb);
  FoldRow<kFold>(c + 3 * ldc, c30, c31, va, vb);
  FoldRow<kFold>(c + 4 * ldc, c40, c41, va, vb);
  FoldRow<kFold>(c + 5 * ldc, c50, c51, va, vb);
}

template <Fold kFold>
void Tile(int kc, const float* ap, const float* bp, float alpha, float beta, float* c, int64_t ldc,
          int rows, int cols) {
  if (rows == kGemmMr && cols == kGemmNr) {
    MicroKernel<kFold>(kc, ap, bp, alpha, beta, c, ldc);
    return;
  }
  // An edge tile runs the same kernel on a full copy, so its elements round as full tiles do.
  alignas(64) float full[kGemmMr * kGemmNr] = {};  // lanes outside the tile are computed, dropped
  if (kFold != Fold::kOverwrite) {
    for (int r = 0; r < rows; ++r) std::copy(c + r * ldc, c + r * ldc + cols, full + r * kGemmNr);
  }
  MicroKernel<kFold>(kc, ap, bp, alpha, beta, full, kGemmNr);
  for (int r = 0; r < rows; ++r)
    std::copy(full + r * kGemmNr, full + r * kGemmNr + cols, c + r * ldc);
}

#define BIGMAC_AVX512 __attribute__((target("avx512f")))

// C[0..6) x [0..16 kPanels) folded with a packed A tile times kPanels packed B panels (panel j at
// bp + j * panel_stride), with AVX-512F: one 16-float vector per row and panel, 6 x kPanels
// accumulators. Every element takes the same chain as in MicroKernel (start at zero, one fused
// multiply-add per k in order, then the same fold), so the bits are the AVX2 kernel's. A CPU
// with two 512-bit FMA units runs twice the multiply-adds per cycle with it; one that splits
// 512-bit operations in two (Zen 4) the same as with AVX2 (bench/NOTES.md).
template <Fold kFold, int kPanels>
BIGMAC_AVX512 void WideMicroKernel(int kc, const float* ap, const float* bp, int64_t panel_stride,
                                   float alpha, float beta, float* c, int64_t ldc) {
  __m512 acc[kGemmMr][kPanels];
  for (int r = 0; r < kGemmMr; ++r) {
    for (int j = 0; j < kPanels; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < kc; ++p, ap += kGemmMr) {
    __m512 b[kPanels];
    for (int j = 0; j < kPanels; ++j) b[j] = _mm512_load_ps(bp + j * panel_stride + p * kGemmNr);
    for (int r = 0; r < kGemmMr; ++r) {
      const __m512 ar = _mm512_set1_ps(ap[r]);
      for (int j = 0; j < kPanels; ++j) acc[r][j] = _mm512_fmadd_ps(ar, b[j], acc[r][j]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
  const __m512 vb = _mm512_set1_ps(beta);
  for (int r = 0; r < kGemmMr; ++r) {
    for (int j = 0; j < kPanels; ++j) {
      float* out = c + r * ldc + j * kGemmNr;
      if constexpr (kFold == Fold::kOverwrite) {
        _mm512_storeu_ps(out, _mm512_mul_ps(va, acc[r][j]));
      } else if constexpr (kFold == Fold::kScale) {
        _mm512_storeu_ps(out,
                         _mm512_fmadd_ps(va, acc[r][j], _mm512_mul_ps(vb, _mm512_loadu_ps(out))));
      } else {
        _mm512_storeu_ps(out, _mm512_fmadd_ps(va, acc[r][j], _mm512_loadu_ps(out)));
      }
    }
  }
}

// The AVX-512 tile over `panels` (1 to kWidePanels) whole panels.
template <Fold kFold>
void WideTile(int panels, int kc, const float* ap, const float* bp, int64_t panel_stride,
              float alpha, float beta, float* c, int64_t ldc) {
  switch (panels) {
    case 1:
      WideMicroKernel<kFold, 1>(kc, ap, bp, panel_stride, alpha, beta, c, ldc);
      break;
    case 2:
      WideMicroKernel<kFold, 2>(kc, ap, bp, panel_stride, alpha, beta, c, ldc);
      break;
    case 3:
      WideMicroKernel<kFold, 3>(kc, ap, bp, panel_stride, alpha, beta, c, ldc);
      break;
    default:
      WideMicroKernel<kFold, 4>(kc, ap, bp, panel_stride, alpha, beta, c, ldc);
      break;
  }
}

// dst[r * ldd + c] = src[c * lds + r] for an 8 x 8 block.
BIGMAC_AVX2_FMA inline void Transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds);
  __m256 r2 = _mm256_loadu_ps(src + 2 * lds), r3 = _mm256_loadu_ps(src + 3 * lds);
  __m256 r4 = _mm256_loadu_ps(src + 4 * lds), r5 = _mm256_loadu_ps(src + 5 * lds);
  __m256 r6 = _mm256_loadu_ps(src + 6 * lds), r7 = _mm256_loadu_ps(src + 7 * lds);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  r0 = _mm256_shuffle_ps(t0, t2, 0x44);
  r1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  r2 = _mm256_shuffle_ps(t1, t3, 0x44);
  r3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  r4 = _mm256_shuffle_ps(t4, t6, 0x44);
  r5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  r6 = _mm256_shuffle_ps(t5, t7, 0x44);
  r7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(dst, _mm256_permute2f128_ps(r0, r4, 0x20));
  _mm256_storeu_ps(dst + ldd, _mm256_permute2f128_ps(r1, r5, 0x20));
  _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(r2, r6, 0x20));
  _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(r3, r7, 0x20));
  _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(r0, r4, 0x31));
  _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(r1, r5, 0x31));
  _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(r2, r6, 0x31));
  _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(r3, r7, 0x31));
}

// dst[p * 6 + r] = src[r * lds + p] for 6 rows and 8 columns. Each step's store writes 8 floats,
// of which the next step's overwrites the last two (the last step's land past dst + 48).
BIGMAC_AVX2_FMA inline void Transpose6x8(const float* src, int64_t lds, float* dst) {
  const __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds);
  const __m256 r2 = _mm256_loadu_ps(src + 2 * lds), r3 = _mm256_loadu_ps(src + 3 * lds);
  const __m256 r4 = _mm256_loadu_ps(src + 4 * lds), r5 = _mm256_loadu_ps(src + 5 * lds);
  const __m256 zero = _mm256_setzero_ps();
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, zero, 0x44), u5 = _mm256_shuffle_ps(t4, zero, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, zero, 0x44), u7 = _mm256_shuffle_ps(t5, zero, 0xEE);
  _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(dst + 6, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(dst + 12, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(dst + 18, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(dst + 24, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(dst + 30, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(dst + 36, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(dst + 42, _mm256_permute2f128_ps(u3, u7, 0x31));
}

// op(B)[p0, p0 + kc) x [col0, col0 + nc) into panels of kGemmNr columns (panel j at out + j * kc,
// kc rows of kGemmNr floats); columns past nc are zero. The fixed-width loops compile to vector
// moves (a std::copy of 16 floats is a memmove call).
BIGMAC_AVX2_FMA void PackB(bool trans, const float* b, int64_t ldb, int p0, int kc, int col0,
                           int nc, float* out) {
  if (!trans) {  // op(B)(p, j) = b[p * ldb + j]: row by row, so that B is read in its order
    const int whole = nc / kGemmNr * kGemmNr;
    for (int p = 0; p < kc; ++p) {
      const float* src = b + (p0 + p) * ldb + col0;
      float* dst = out + p * kGemmNr;
      for (int j = 0; j < whole; j += kGemmNr) {
        _mm256_store_ps(dst + int64_t{j} * kc, _mm256_loadu_ps(src + j));
        _mm256_store_ps(dst + int64_t{j} * kc + 8, _mm256_loadu_ps(src + j + 8));
      }
      if (whole < nc) {
        for (int jj = 0; jj < kGemmNr; ++jj) {
          dst[int64_t{whole} * kc + jj] = whole + jj < nc ? src[whole + jj] : 0.0f;
        }
      }
    }
    return;
  }
  for (int j = 0; j < nc; j += kGemmNr) {
    const int cols = std::min(kGemmNr, nc - j);
    float* panel = out + int64_t{j} * kc;
    if (cols == kGemmNr) {  // op(B)(p, j) = b[j * ldb + p]: 8 x 8 transposes
      const float* src = b + (col0 + j) * ldb + p0;
      int p = 0;
      for (; p + 8 <= kc; p += 8) {
        for (int half = 0; half < kGemmNr; half += 8) {
          Transpose8x8(src + half * ldb + p, ldb, panel + p * kGemmNr + half, kGemmNr);
        }
      }
      for (; p < kc; ++p) {
        for (int jj = 0; jj < kGemmNr; ++jj) panel[p * kGemmNr + jj] = src[jj * ldb + p];
      }
    } else {
      for (int jj = 0; jj < kGemmNr; ++jj) {
        const float* src = b + (col0 + j + jj) * ldb + p0;
        for (int p = 0; p < kc; ++p) panel[p * kGemmNr + jj] = jj < cols ? src[p] : 0.0f;
      }
    }
  }
}

// op(A) rows [row0, row0 + mc) x [p0, p0 + kc) into panels of kGemmMr rows (panel i at
// out + i * kc, kc steps of kGemmMr floats); rows past mc are zero.
BIGMAC_AVX2_FMA void PackA(bool trans, const float* a, int64_t lda, int row0, int mc, int p0,
                           int kc, float* out) {
  for (int i = 0; i < mc; i += kGemmMr) {
    const int rows = std::min(kGemmMr, mc - i);
    float* panel = out + int64_t{i} * kc;
    if (trans) {  // op(A)(r, p) = a[p * lda + r]: kGemmMr contiguous floats per step
      const float* src = a + p0 * lda + row0 + i;
      float* dst = panel;
      if (rows == kGemmMr) {
        // Six floats per step by a masked load (it reads nothing past them) and an eight-float
        // store, whose two extra zeros the next step overwrites (past the last step they land
        // in the next panel's first step, packed after this one, or in the buffer's slack).
        const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
        for (int p = 0; p < kc; ++p, src += lda, dst += kGemmMr) {
          _mm256_storeu_ps(dst, _mm256_maskload_ps(src, six));
        }
      } else {
        for (int p = 0; p < kc; ++p, src += lda, dst += kGemmMr) {
          for (int r = 0; r < kGemmMr; ++r) dst[r] = r < rows ? src[r] : 0.0f;
        }
      }
    } else if (rows == kGemmMr) {  // op(A)(r, p) = a[r * lda + p]: 8 x 8 transposes of 6 rows
      const float* src = a + (row0 + i) * lda + p0;
      int p = 0;
      for (; p + 8 <= kc; p += 8) Transpose6x8(src + p, lda, panel + p * kGemmMr);
      for (; p < kc; ++p) {
        for (int r = 0; r < kGemmMr; ++r) panel[p * kGemmMr + r] = src[r * lda + p];
      }
    } else {  // interleave the rows, zero-padded
      for (int r = 0; r < kGemmMr; ++r) {
        const float* src = a + (row0 + i + r) * lda + p0;
        if (r < rows) {
          for (int p = 0; p < kc; ++p) panel[p * kGemmMr + r] = src[p];
        } else {
          for (int p = 0; p < kc; ++p) panel[p * kGemmMr + r] = 0.0f;
        }
      }
    }
  }
}

struct Problem {
  GemmKernel kernel;
  bool trans_a, trans_b;
  int m, n, k;
  float alpha;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float beta;
  float* c;
  int64_t ldc;
  GemmEpilogue epilogue;
};

void RunTile(Fold fold, int kc, const float* ap, const float* b_panel, const Problem& pr, float* c,
             int rows, int cols) {
  switch (fold) {
    case Fold::kOverwrite:
      Tile<Fold::kOverwrite>(kc, ap, b_panel, pr.alpha, pr.beta, c, pr.ldc, rows, cols);
      break;
    case Fold::kScale:
      Tile<Fold::kScale>(kc, ap, b_panel, pr.alpha, pr.beta, c, pr.ldc, rows, cols);
      break;
    case Fold::kAccumulate:
      Tile<Fold::kAccumulate>(kc, ap, b_panel, pr.alpha, pr.beta, c, pr.ldc, rows, cols);
      break;
  }
}

void RunWideTile(Fold fold, int panels, int kc, const float* ap, const float* b_panel,
                 int64_t stride, const Problem& pr, float* c) {
  wide_tiles.fetch_add(1, std::memory_order_relaxed);
  switch (fold) {
    case Fold::kOverwrite:
      WideTile<Fold::kOverwrite>(panels, kc, ap, b_panel, stride, pr.alpha, pr.beta, c, pr.ldc);
      break;
    case Fold::kScale:
      WideTile<Fold::kScale>(panels, kc, ap, b_panel, stride, pr.alpha, pr.beta, c, pr.ldc);
      break;
    case Fold::kAccumulate:
      WideTile<Fold::kAccumulate>(panels, kc, ap, b_panel, stride, pr.alpha, pr.beta, c, pr.ldc);
      break;
  }
}

// B's k blocks [k_begin, k_end), packed one after another: block pc (kc rows) at
// bp + (pc - k_begin) * padded_nc, its panel j at + j * kc. A B that BlockedPackB packed for more
// rows than the product reads (packed_k > 0: one block) has its panels packed_k rows apart.
struct PackedB {
  const float* bp;
  int k_begin, k_end;
  int64_t padded_nc;
  int packed_k = 0;
  // Rows from one panel to the next in block pc.
  int PanelRows(int pc) const { return packed_k > 0 ? packed_k : std::min(kGemmKc, k_end - pc); }
  int64_t Offset(int pc, int col) const {
    return int64_t{pc - k_begin} * padded_nc + int64_t{col} * PanelRows(pc);
  }
  const float* Block(int pc, int col) const { return bp + Offset(pc, col); }
};

// One row tile of C (`rows` rows from `row`, columns [jc, jc + nc)) folded with the tile of A
// times k block pc of the packed B; after the last k block, the epilogue on the tile.
void RunPanels(const Problem& pr, int pc, const float* ap, int row, int rows, const PackedB& packed,
               int jc, int nc) {
  float* c_row = pr.c + row * pr.ldc + jc;
  const int kc = std::min(kGemmKc, pr.k - pc);
  const Fold fold =
      pc > 0 ? Fold::kAccumulate : (pr.beta == 0.0f ? Fold::kOverwrite : Fold::kScale);
  int jr = 0;
  if (pr.kernel == GemmKernel::kAvx512 && rows == kGemmMr) {
    while (nc - jr >= kGemmNr) {  // whole panels, up to kWidePanels at a time
      const int panels = std::min(kWidePanels, (nc - jr) / kGemmNr);
      RunWideTile(fold, panels, kc, ap, packed.Block(pc, jr),
                  int64_t{kGemmNr} * packed.PanelRows(pc), pr, c_row + jr);
      jr += panels * kGemmNr;
    }
  }
  for (; jr < nc; jr += kGemmNr) {  // the AVX2 tiles: edges, or every tile
    RunTile(fold, kc, ap, packed.Block(pc, jr), pr, c_row + jr, rows, std::min(kGemmNr, nc - jr));
  }
  if (pr.epilogue.apply && pc + kc == pr.k) {
    pr.epilogue.apply(pr.epilogue.context, c_row, pr.ldc, row, jc, rows, nc);
  }
}

// Rows [row_begin, row_end) (at most kGemmMc) of C for one column block, against the k blocks
// packed in `packed`. The packed B streams from L2 or L3 past a packed tile of A in L1.
// - A untransposed: row tiles outside, then the group's k blocks, then column panels, so a tile's
//   rows of C stay in L2 from one k block to the next (with the k blocks outside, C went out to
//   memory between them; a group holds four k blocks at 2048 columns, two at 4096). The
//   tile of A is packed just before it runs: read in place, its six rows lda apart fell into one
//   L1 set when lda was a multiple of 1024 floats (the 20M model's k = 2048 shapes ran 6% slower).
// - A transposed (the weight gradients): one k block at a time (PackedKRows), which stays in L2
//   while the chunks pass it; the chunk's A packed for it, then row tiles. (C's rows staying in
//   L2 instead, with B's blocks streaming from L3, was 3% slower on those shapes.)
// (BLIS's order, column panels outside with A packed into L2, made the 20M step 16% slower on Zen
// 3: bench/NOTES.md, lever 13.)
void RunRows(const Problem& pr, int row_begin, int row_end, int jc, int nc, const PackedB& packed) {
  const int mc = row_end - row_begin;
  float* ap = a_buffer.Get(int64_t{kGemmKc} * (kGemmMc + kGemmMr));
  if (pr.trans_a) {
    for (int pc = packed.k_begin; pc < packed.k_end; pc += kGemmKc) {
      const int kc = std::min(kGemmKc, pr.k - pc);
      PackA(true, pr.a, pr.lda, row_begin, mc, pc, kc, ap);
      for (int ir = 0; ir < mc; ir += kGemmMr) {
        RunPanels(pr, pc, ap + int64_t{ir} * kc, row_begin + ir, std::min(kGemmMr, mc - ir), packed,
                  jc, nc);
      }
    }
    return;
  }
  for (int ir = 0; ir < mc; ir += kGemmMr) {
    // A chunk runs all of a group's k blocks (up to 4096 of k): progress between its row tiles.
    if (ir > 0) ::bigmac::util::ComputeProgress();
    const int rows = std::min(kGemmMr, mc - ir);
    for (int pc = packed.k_begin; pc < packed.k_end; pc += kGemmKc) {
      PackA(false, pr.a, pr.lda, row_begin + ir, rows, pc, std::min(kGemmKc, pr.k - pc), ap);
      RunPanels(pr, pc, ap, row_begin + ir, rows, packed, jc, nc);
    }
  }
}

// f(0) .. f(count - 1), shared by the team of the enclosing parallel region when `team` (an
// OpenMP worksharing loop, which ends in a barrier), or all on this thread.
template <typename F>
void ForEach(bool team, bool dynamic, int count, const F& f) {
  if (!team) {
    for (int i = 0; i < count; ++i) f(i);
  } else if (dynamic) {
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < count; ++i) f(i);
  } else {
#pragma omp for schedule(static)
    for (int i = 0; i < count; ++i) f(i);
  }
}

// nc columns of B in whole panels, as PackB lays them out.
int64_t PaddedColumns(int nc) { return int64_t{(nc + kGemmNr - 1) / kGemmNr} * kGemmNr; }

// How many of k's rows B is packed for at a time with nc columns: whole k blocks, as many as
// fit kGemmPackedB floats, at least one; one with A transposed (RunRows: there the k blocks are
// outside the chunk's rows, and one block of B stays in L2 while all the chunks pass it).
int PackedKRows(bool trans_a, int k, int nc) {
  if (nc <= 0) return 0;
  if (trans_a) return std::min(k, kGemmKc);
  const int64_t blocks = std::max<int64_t>(1, kGemmPackedB / (PaddedColumns(nc) * kGemmKc));
  return static_cast<int>(std::min<int64_t>(k, blocks * kGemmKc));
}

// The floats B's packing takes with nc columns.
int64_t PackedBFloats(bool trans_a, int k, int nc) {
  return PackedKRows(trans_a, k, nc) * PaddedColumns(nc);
}

// A B packed before the product, or none (data null).
struct PrepackedB {
  const float* data = nullptr;
  // BlockedPackB's panels for packed_k >= k rows (one block, packed_k <= kGemmKc), column block
  // jc at data + jc * packed_k; or, with `whole`, BlockedPackWholeB's (one column block), the
  // group from k_begin at data + k_begin * PaddedColumns(n).
  int packed_k = 0;
  bool whole = false;
};

// The whole product, by one thread or by the team that calls it together (`team`). For each
// column block and group of k blocks B's panels are packed, then the threads take chunks of
// rows. With bp null each thread packs all of B into its own buffer (a pair packs twice what one
// shared copy takes, but no packed line that one core wrote is read by the other: on this host's
// far-apart vCPUs that was slower, bench/NOTES.md lever 23); otherwise the team packs B into
// the shared bp together. A team with `queues` shares the chunks out by them, one without takes
// chunks as they come free. A `prepacked` B is not packed.
void Run(const Problem& pr, bool team, int chunk_rows, float* bp, const PrepackedB& prepacked,
         ChunkQueues* queues) {
  const int chunks = (pr.m + chunk_rows - 1) / chunk_rows;
  const bool own_b = !prepacked.data && !bp;
  int loop = 0;
  for (int jc = 0; jc < pr.n; jc += kGemmNc) {
    const int nc = std::min(kGemmNc, pr.n - jc);
    const int panels = static_cast<int>(PaddedColumns(nc) / kGemmNr);
    const int group_rows = PackedKRows(pr.trans_a, pr.k, nc);
    float* pack_to = own_b ? own_b_buffer.Get(PackedBFloats(pr.trans_a, pr.k, nc)) : bp;
    for (int k_begin = 0; k_begin < pr.k; k_begin += group_rows) {
      const float* group_b = !prepacked.data ? pack_to
                             : prepacked.whole
                                 ? prepacked.data + int64_t{k_begin} * PaddedColumns(nc)
                                 : prepacked.data + int64_t{jc} * prepacked.packed_k;
      const PackedB packed{group_b, k_begin, std::min(pr.k, k_begin + group_rows),
                           PaddedColumns(nc), prepacked.whole ? 0 : prepacked.packed_k};
      const int blocks = (packed.k_end - k_begin + kGemmKc - 1) / kGemmKc;
      const int pieces = (panels + kPackPanels - 1) / kPackPanels;  // per k block
      if (!prepacked.data) {
        ForEach(team && !own_b, false, blocks * pieces, [&](int item) {
          const int pc = k_begin + item / pieces * kGemmKc;
          const int j = item % pieces * kPackPanels * kGemmNr;
          PackB(pr.trans_b, pr.b, pr.ldb, pc, std::min(kGemmKc, pr.k - pc), jc + j,
                std::min(kPackPanels * kGemmNr, nc - j), pack_to + packed.Offset(pc, j));
        });
      }
      const auto rows = [&](int chunk) {
        ::bigmac::util::ComputeProgress();  // messages in flight move on while the rows compute
        const int begin = chunk * chunk_rows;
        RunRows(pr, begin, std::min(pr.m, begin + chunk_rows), jc, nc, packed);
      };
      // The closing barrier is what finishes a column block in every row before the next one
      // starts (GemmEpilogue's promise), and a k block in every row before the next adds to it.
      if (team && queues) {
        queues->ForEach(++loop, chunks, rows);
#pragma omp barrier
      } else {
        ForEach(team, true, chunks, rows);  // no nowait: its barrier as above
      }
    }
  }
}

// k == 0 or alpha == 0: C = beta C, as BLAS defines it.
void ScaleOnly(int m, int n, float beta, float* c, int64_t ldc) {
  for (int i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    for (int j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
  }
}

}  // namespace

bool BlockedSgemmSupported(GemmKernel kernel) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  static const bool avx512 = avx2 && __builtin_cpu_supports("avx512f");
  return kernel == GemmKernel::kAvx512 ? avx512 : avx2;
}

int64_t WideTilesRun() { return wide_tiles.load(std::memory_order_relaxed); }

const char* GemmKernelName(GemmKernel kernel) {
  return kernel == GemmKernel::kAvx512 ? "avx512" : "avx2";
}

int BlockedSgemmChunkRows(int m, int threads) {
  // About 64 chunks per thread, so that the last one to finish idles the others little: with 8,
  // the threads spent 3.6% of the llama_20m step waiting in libgomp, with 64 2.1% (bench/NOTES.md,
  // lever 18). A chunk costs an atomic increment; A is packed per row tile (or, transposed, per
  // chunk: the same floats in all).
  // Whole row tiles, at most kGemmMc rows (a transposed A's packed block).
  constexpr int kChunksPerThread = 64;
  const int per = (m + kChunksPerThread * threads - 1) / (kChunksPerThread * threads);
  const int rows = (per + kGemmMr - 1) / kGemmMr * kGemmMr;
  return std::clamp(rows, kGemmMr, kGemmMc);
}

int BlockedSgemmThreads(int m, int n, int k, int available) {
  const int64_t work = int64_t{m} * n * k;
  if (work < (int64_t{1} << 20) || available <= 1) return 1;
  return available;
}

namespace {

// BlockedSgemm, with B given packed (`prepacked`) or not (its data null).
void Sgemm(GemmKernel kernel, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
           const float* a, int lda, const float* b, int ldb, const PrepackedB& prepacked,
           float beta, float* c, int ldc, const GemmEpilogue& epilogue) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f) {  // as BLAS: A and B are not read
    ScaleOnly(m, n, beta, c, ldc);
    if (epilogue.apply) epilogue.apply(epilogue.context, c, ldc, 0, 0, m, n);
    return;
  }
  const Problem problem{kernel, trans_a, trans_b, m,    n, k,   alpha,   a,
                        lda,    b,       ldb,     beta, c, ldc, epilogue};
  const int threads = omp_in_parallel() ? 1 : BlockedSgemmThreads(m, n, k, omp_get_max_threads());
  const int chunk_rows = BlockedSgemmChunkRows(m, threads);
  // B's packed block when one thread packs it, or a team without queues shares it: the calling
  // thread's buffer. (Column blocks are kGemmNc wide but the last, so two sizes at most.)
  const auto callers_b = [&]() -> float* {
    return prepacked.data ? nullptr
                          : b_buffer.Get(std::max(PackedBFloats(trans_a, k, std::min(kGemmNc, n)),
                                                  PackedBFloats(trans_a, k, n % kGemmNc)));
  };
  if (threads == 1) {
    Run(problem, false, chunk_rows, callers_b(), prepacked, nullptr);
    return;
  }
  const int64_t loops = int64_t{(n + kGemmNc - 1) / kGemmNc} * ((k + kGemmKc - 1) / kGemmKc);
  ChunkQueues queues;
  ChunkQueues* use =
      ChunkQueues::Fits(threads, (m + chunk_rows - 1) / chunk_rows, loops) ? &queues : nullptr;
  float* bp = use && threads <= kOwnBMaxThreads ? nullptr : callers_b();  // null: each its own
#pragma omp parallel num_threads(threads)
  Run(problem, omp_get_num_threads() > 1, chunk_rows, bp, prepacked, use);
}

}  // namespace

void BlockedSgemm(GemmKernel kernel, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                  const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc,
                  const GemmEpilogue& epilogue) {
  Sgemm(kernel, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, {}, beta, c, ldc, epilogue);
}

int64_t BlockedPackedBFloats(int k, int n) { return int64_t{k} * PaddedColumns(n); }

namespace {

// op(B) (k x n) in blocks of kGemmKc rows, block pc at out + pc * PaddedColumns(n) laid out as
// PackB lays out its rows; by the OpenMP team when called outside a parallel region and large.
void PackBlocks(bool trans_b, int k, int n, const float* b, int ldb, float* out) {
  const int blocks = (k + kGemmKc - 1) / kGemmKc;
  const int pieces = (n + kPackPanels * kGemmNr - 1) / (kPackPanels * kGemmNr);
  const int64_t padded_n = PaddedColumns(n);
  const bool team = !omp_in_parallel() && int64_t{k} * n >= (int64_t{1} << 16);  // 256 KB
#pragma omp parallel for schedule(static) if (team)
  for (int item = 0; item < blocks * pieces; ++item) {
    const int pc = item / pieces * kGemmKc;
    const int kc = std::min(kGemmKc, k - pc);
    const int j = item % pieces * kPackPanels * kGemmNr;
    PackB(trans_b, b, ldb, pc, kc, j, std::min(kPackPanels * kGemmNr, n - j),
          out + pc * padded_n + int64_t{j} * kc);
  }
}

}  // namespace

void BlockedPackB(bool trans_b, int k, int n, const float* b, int ldb, float* out) {
  if (k <= 0 || k > kGemmKc || reinterpret_cast<std::uintptr_t>(out) % 64 != 0) {
    std::fprintf(stderr, "bigmac: BlockedPackB with k = %d (1 to %d) into %p (64-byte aligned)\n",
                 k, kGemmKc, static_cast<void*>(out));
    std::abort();
  }
  PackBlocks(trans_b, k, n, b, ldb, out);  // one block
}

void BlockedPackWholeB(bool trans_b, int k, int n, const float* b, int ldb, float* out) {
  if (k <= 0 || n <= 0 || n > kGemmNc || reinterpret_cast<std::uintptr_t>(out) % 64 != 0) {
    std::fprintf(stderr,
                 "bigmac: BlockedPackWholeB with k = %d (at least 1), n = %d (1 to %d) into %p "
                 "(64-byte aligned)\n",
                 k, n, kGemmNc, static_cast<void*>(out));
    std::abort();
  }
  whole_b_packs.fetch_add(1, std::memory_order_relaxed);
  PackBlocks(trans_b, k, n, b, ldb, out);
}

void BlockedSgemmPackedWholeB(GemmKernel kernel, int m, int n, int k, float alpha, const float* a,
                              int lda, const float* packed_b, float beta, float* c, int ldc,
                              const GemmEpilogue& epilogue) {
  if (n > kGemmNc) {
    std::fprintf(stderr, "bigmac: BlockedSgemmPackedWholeB with n = %d (at most %d)\n", n, kGemmNc);
    std::abort();
  }
  whole_b_runs.fetch_add(1, std::memory_order_relaxed);
  Sgemm(kernel, false, false, m, n, k, alpha, a, lda, nullptr, 0, {packed_b, 0, true}, beta, c, ldc,
        epilogue);
}

int64_t WholeBProductsRun() { return whole_b_runs.load(std::memory_order_relaxed); }
int64_t WholeBPacksMade() { return whole_b_packs.load(std::memory_order_relaxed); }

void BlockedSgemmPackedB(GemmKernel kernel, bool trans_a, int m, int n, int k, float alpha,
                         const float* a, int lda, const float* packed_b, float beta, float* c,
                         int ldc, int packed_k) {
  if (packed_k == 0) packed_k = k;
  if (k > packed_k || packed_k > kGemmKc) {
    std::fprintf(stderr,
                 "bigmac: BlockedSgemmPackedB with k = %d of a B packed for %d rows (at most %d)\n",
                 k, packed_k, kGemmKc);
    std::abort();
  }
  Sgemm(kernel, trans_a, false, m, n, k, alpha, a, lda, nullptr, 0, {packed_b, packed_k, false},
        beta, c, ldc, {});
}

}  // namespace bigmac::sdk::cpu::internal
