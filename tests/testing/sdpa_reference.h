#ifndef BIGMAC_TESTS_TESTING_SDPA_REFERENCE_H_
#define BIGMAC_TESTS_TESTING_SDPA_REFERENCE_H_

// A CPU causal attention that reads and writes its tensors ONLY through the dims, strides and
// offsets of an SdpaLayout (stages/cuda/sdpa_layout.h), the way cuDNN's fused SDPA does. Compared
// with the CPU backend's attention (which indexes qkv (B,T,3C) directly), it proves the layout
// numbers: a wrong stride or offset reads the wrong elements and the comparison fails.
//
// Scale 1/sqrt(D); softmax subtracts the row maximum; stats is the natural log-sum-exp of the
// scaled scores (max + log(sum exp(s - max))), as cuDNN's Stats output. K and V may have fewer
// heads than Q (grouped-query attention, dividing them): query head h reads kv head
// h / (Hq / Hkv), as cuDNN does. T is float or double; arithmetic is in T.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "stages/cuda/sdpa_layout.h"

namespace bigmac::testutil {

using stages::cuda::SdpaLayout;
using stages::cuda::SdpaTensor;

// The element of x at logical index (i0, i1, i2, i3).
inline int64_t ElementAt(const SdpaTensor& x, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return x.offset + i0 * x.strides[0] + i1 * x.strides[1] + i2 * x.strides[2] + i3 * x.strides[3];
}

// Throws std::out_of_range unless every element of x lies in [0, size) of its buffer (so a wrong
// layout fails a comparison instead of reading past a buffer).
inline void CheckInside(const SdpaTensor& x, int64_t size, const char* name) {
  int64_t lo = x.offset, hi = x.offset;
  for (int i = 0; i < 4; ++i) {
    if (x.dims[i] <= 0) throw std::out_of_range(std::string(name) + ": empty dimension");
    const int64_t span = (x.dims[i] - 1) * x.strides[i];
    (span < 0 ? lo : hi) += span;
  }
  if (lo < 0 || hi >= size) {
    throw std::out_of_range(std::string(name) + " reaches elements [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "] of a buffer of " + std::to_string(size));
  }
}

namespace sdpa_detail {

// The kv head of query head h.
inline int64_t KvHead(const SdpaLayout& l, int64_t h) { return h / (l.q.dims[1] / l.k.dims[1]); }

// Scaled causal scores of one (batch, query head): s[i*T + j] for j <= i (the rest unused).
template <typename T>
std::vector<T> Scores(const T* qkv, const SdpaLayout& l, int64_t b, int64_t h) {
  const int64_t t = l.q.dims[2], d = l.q.dims[3], kv = KvHead(l, h);
  const T scale = T(1) / std::sqrt(T(d));
  std::vector<T> s(t * t, T(0));
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      T dot = 0;
      for (int64_t e = 0; e < d; ++e) {
        dot += qkv[ElementAt(l.q, b, h, i, e)] * qkv[ElementAt(l.k, b, kv, j, e)];
      }
      s[i * t + j] = dot * scale;
    }
  }
  return s;
}

inline void CheckShapes(const SdpaLayout& l, int64_t qkv_size, int64_t out_size,
                        int64_t stats_size) {
  if (l.o.dims != l.q.dims) throw std::invalid_argument("q and o dims differ");
  for (const SdpaTensor* x : {&l.k, &l.v}) {
    if (x->dims[0] != l.q.dims[0] || x->dims[2] != l.q.dims[2] || x->dims[3] != l.q.dims[3] ||
        x->dims[1] != l.k.dims[1] || l.q.dims[1] % x->dims[1] != 0) {
      throw std::invalid_argument("k and v must match q but for heads dividing q's");
    }
  }
  CheckInside(l.q, qkv_size, "q");
  CheckInside(l.k, qkv_size, "k");
  CheckInside(l.v, qkv_size, "v");
  CheckInside(l.o, out_size, "o");
  CheckInside(l.stats, stats_size, "stats");
}

}  // namespace sdpa_detail

// out through l.o, stats through l.stats, from q, k, v through l.q, l.k, l.v in qkv. Sizes are
// the buffers' element counts.
template <typename T>
void StridedAttentionForward(T* out, int64_t out_size, T* stats, int64_t stats_size, const T* qkv,
                             int64_t qkv_size, const SdpaLayout& l) {
  sdpa_detail::CheckShapes(l, qkv_size, out_size, stats_size);
  const int64_t nb = l.q.dims[0], nh = l.q.dims[1], t = l.q.dims[2], d = l.q.dims[3];
  std::vector<T> p(t), acc(d);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t h = 0; h < nh; ++h) {
      const std::vector<T> s = sdpa_detail::Scores(qkv, l, b, h);
      for (int64_t i = 0; i < t; ++i) {
        T max = s[i * t];
        for (int64_t j = 1; j <= i; ++j) max = std::max(max, s[i * t + j]);
        T sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = std::exp(s[i * t + j] - max);
          sum += p[j];
        }
        std::fill(acc.begin(), acc.end(), T(0));
        const int64_t kv = sdpa_detail::KvHead(l, h);
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < d; ++e) acc[e] += p[j] * qkv[ElementAt(l.v, b, kv, j, e)];
        }
        for (int64_t e = 0; e < d; ++e) out[ElementAt(l.o, b, h, i, e)] = acc[e] / sum;
        stats[ElementAt(l.stats, b, h, i, 0)] = max + std::log(sum);
      }
    }
  }
}

// dq, dk, dv through l.q, l.k, l.v inside dqkv (overwritten; a kv head's gradient sums its
// query heads'), from dout through l.o (dO has o's layout), q, k, v in qkv and stats; the
// probabilities are rebuilt as exp(s - stats).
template <typename T>
void StridedAttentionBackward(T* dqkv, const T* dout, int64_t out_size, const T* qkv,
                              int64_t qkv_size, const T* stats, int64_t stats_size,
                              const SdpaLayout& l) {
  sdpa_detail::CheckShapes(l, qkv_size, out_size, stats_size);
  const int64_t nb = l.q.dims[0], nh = l.q.dims[1], t = l.q.dims[2], d = l.q.dims[3];
  const T scale = T(1) / std::sqrt(T(d));
  const int64_t nkv = l.k.dims[1];
  std::vector<T> p(t * t), ds(t * t), dq(t * d);
  std::vector<T> dk(nkv * t * d), dv(nkv * t * d);  // per kv head, summed over its query heads
  for (int64_t b = 0; b < nb; ++b) {
    std::fill(dk.begin(), dk.end(), T(0));
    std::fill(dv.begin(), dv.end(), T(0));
    for (int64_t h = 0; h < nh; ++h) {
      const std::vector<T> s = sdpa_detail::Scores(qkv, l, b, h);
      const int64_t kv = sdpa_detail::KvHead(l, h);
      std::fill(dq.begin(), dq.end(), T(0));
      for (int64_t i = 0; i < t; ++i) {
        const T lse = stats[ElementAt(l.stats, b, h, i, 0)];
        // P = exp(s - lse); dP = dO V^T; D = rowsum(P * dP); dS = P (dP - D) * scale.
        T rowdot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          p[i * t + j] = std::exp(s[i * t + j] - lse);
          T dp = 0;
          for (int64_t e = 0; e < d; ++e) {
            dp += dout[ElementAt(l.o, b, h, i, e)] * qkv[ElementAt(l.v, b, kv, j, e)];
          }
          ds[i * t + j] = dp;
          rowdot += p[i * t + j] * dp;
        }
        for (int64_t j = 0; j <= i; ++j) {
          ds[i * t + j] = p[i * t + j] * (ds[i * t + j] - rowdot) * scale;
        }
      }
      T* dkh = dk.data() + kv * t * d;
      T* dvh = dv.data() + kv * t * d;
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < d; ++e) {
            dvh[j * d + e] += p[i * t + j] * dout[ElementAt(l.o, b, h, i, e)];
            dq[i * d + e] += ds[i * t + j] * qkv[ElementAt(l.k, b, kv, j, e)];
            dkh[j * d + e] += ds[i * t + j] * qkv[ElementAt(l.q, b, h, i, e)];
          }
        }
      }
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t e = 0; e < d; ++e) dqkv[ElementAt(l.q, b, h, i, e)] = dq[i * d + e];
      }
    }
    for (int64_t kv = 0; kv < nkv; ++kv) {
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t e = 0; e < d; ++e) {
          dqkv[ElementAt(l.k, b, kv, i, e)] = dk[(kv * t + i) * d + e];
          dqkv[ElementAt(l.v, b, kv, i, e)] = dv[(kv * t + i) * d + e];
        }
      }
    }
  }
}

}  // namespace bigmac::testutil

#endif  // BIGMAC_TESTS_TESTING_SDPA_REFERENCE_H_
