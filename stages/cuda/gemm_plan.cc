#include "stages/cuda/gemm_plan.h"

#include <sstream>
#include <stdexcept>

namespace bigmac::stages::cuda {
namespace {

std::string RowMajorText(const RowMajorGemm& g) {
  std::ostringstream text;
  text << "row-major C(" << g.m << "," << g.n << ") = op(A)(" << g.m << "," << g.k << ") op(B)("
       << g.k << "," << g.n << "), trans_a=" << g.trans_a << " trans_b=" << g.trans_b
       << " lda=" << g.lda << " ldb=" << g.ldb << " ldc=" << g.ldc;
  return text.str();
}

// A stored row-major matrix of `rows` x `cols` needs a row stride of at least `cols`.
void CheckLd(const RowMajorGemm& g, const char* name, int64_t ld, int64_t cols) {
  if (ld < cols) {
    throw std::invalid_argument(std::string("GEMM: ") + name + "=" + std::to_string(ld) +
                                " is less than the " + std::to_string(cols) +
                                " columns it strides over, in " + RowMajorText(g));
  }
}

void CheckLayerShape(const char* what, int n, int c, int oc, int64_t ld, const char* ld_name) {
  if (n < 1 || c < 1 || oc < 1 || (ld != 0 && ld < oc)) {
    throw std::invalid_argument(std::string(what) + ": bad shape n=" + std::to_string(n) +
                                " c=" + std::to_string(c) + " oc=" + std::to_string(oc) + " " +
                                ld_name + "=" + std::to_string(ld) + " (need n, c, oc >= 1 and " +
                                ld_name + " = 0 or >= oc)");
  }
}

uint32_t AlignmentOf(uintptr_t pointer) {
  if (pointer == 0) return 256;
  uint32_t alignment = 1;
  while (alignment < 256 && pointer % (alignment * 2) == 0) alignment *= 2;
  return alignment;
}

}  // namespace

ColumnMajorGemm ToColumnMajor(const RowMajorGemm& g) {
  if (g.m < 1 || g.n < 1 || g.k < 1) {
    throw std::invalid_argument("GEMM: m, n and k must be >= 1, in " + RowMajorText(g));
  }
  // Stored row-major shapes: A is (m, k) or (k, m); B is (k, n) or (n, k); C is (m, n).
  CheckLd(g, "lda", g.lda, g.trans_a ? g.m : g.k);
  CheckLd(g, "ldb", g.ldb, g.trans_b ? g.k : g.n);
  CheckLd(g, "ldc", g.ldc, g.n);

  ColumnMajorGemm cm;
  cm.m = g.n;
  cm.n = g.m;
  cm.k = g.k;
  // cuBLAS's A is the row-major B, read column-major: B^T when B was stored (k, n), which is what
  // C^T = op(B)^T op(A)^T needs when trans_b is false; B itself when it was stored (n, k).
  cm.a = Source::kRowB;
  cm.trans_a = g.trans_b;
  cm.lda = g.ldb;
  cm.b = Source::kRowA;
  cm.trans_b = g.trans_a;
  cm.ldb = g.lda;
  cm.ldc = g.ldc;
  cm.a_rows = cm.trans_a ? cm.k : cm.m;
  cm.a_cols = cm.trans_a ? cm.m : cm.k;
  cm.b_rows = cm.trans_b ? cm.n : cm.k;
  cm.b_cols = cm.trans_b ? cm.k : cm.n;
  cm.alpha = g.alpha;
  cm.beta = g.beta;
  return cm;
}

std::string Describe(const ColumnMajorGemm& g) {
  std::ostringstream text;
  text << "m=" << g.m << " n=" << g.n << " k=" << g.k << " transa=" << (g.trans_a ? 'T' : 'N')
       << " transb=" << (g.trans_b ? 'T' : 'N') << " lda=" << g.lda << " ldb=" << g.ldb
       << " ldc=" << g.ldc << " alpha=" << g.alpha << " beta=" << g.beta;
  return text.str();
}

bool HasBias(Epilogue epilogue) {
  return epilogue == Epilogue::kBias || epilogue == Epilogue::kGeluAuxBias;
}

bool HasGelu(Epilogue epilogue) {
  return epilogue == Epilogue::kGeluAux || epilogue == Epilogue::kGeluAuxBias;
}

std::string EpilogueName(Epilogue epilogue) {
  switch (epilogue) {
    case Epilogue::kNone:
      return "none";
    case Epilogue::kBias:
      return "bias";
    case Epilogue::kGeluAux:
      return "gelu_aux";
    case Epilogue::kGeluAuxBias:
      return "gelu_aux_bias";
  }
  return "?";
}

LayerGemm ForwardPlan(int n, int c, int oc, int64_t ld_out, bool bias, bool gelu) {
  CheckLayerShape("MatmulForward", n, c, oc, ld_out, "ld_out");
  RowMajorGemm g;
  g.m = n;
  g.n = oc;
  g.k = c;
  g.trans_a = false;  // inp (N, C)
  g.lda = c;
  g.trans_b = true;  // w (OC, C), used as w^T
  g.ldb = c;
  g.ldc = ld_out == 0 ? oc : ld_out;
  LayerGemm plan;
  plan.gemm = ToColumnMajor(g);
  plan.epilogue = gelu ? (bias ? Epilogue::kGeluAuxBias : Epilogue::kGeluAux)
                       : (bias ? Epilogue::kBias : Epilogue::kNone);
  plan.bias_length = bias ? plan.gemm.m : 0;
  if (gelu) {
    plan.aux_ld = oc;  // gelu_pre is (N, OC) with row stride oc
    plan.gelu_aux_ld_ok = plan.aux_ld % 8 == 0 && plan.aux_ld >= plan.gemm.m;
  }
  return plan;
}

LayerGemm BackwardInputPlan(int n, int c, int oc, int64_t ld_dout) {
  CheckLayerShape("MatmulBackwardInput", n, c, oc, ld_dout, "ld_dout");
  RowMajorGemm g;
  g.m = n;
  g.n = c;
  g.k = oc;
  g.trans_a = false;  // dout (N, OC)
  g.lda = ld_dout == 0 ? oc : ld_dout;
  g.trans_b = false;  // w (OC, C)
  g.ldb = c;
  g.ldc = c;
  LayerGemm plan;
  plan.gemm = ToColumnMajor(g);
  return plan;
}

LayerGemm BackwardWeightPlan(int n, int c, int oc, int64_t ld_dout) {
  CheckLayerShape("MatmulBackwardWeight", n, c, oc, ld_dout, "ld_dout");
  RowMajorGemm g;
  g.m = oc;
  g.n = c;
  g.k = n;
  g.trans_a = true;  // dout (N, OC), used as dout^T
  g.lda = ld_dout == 0 ? oc : ld_dout;
  g.trans_b = false;  // inp (N, C)
  g.ldb = c;
  g.ldc = c;
  g.beta = 1.0f;  // accumulate into the master gradient
  LayerGemm plan;
  plan.gemm = ToColumnMajor(g);
  return plan;
}

Alignments AlignmentsOf(const GemmPointers& p) {
  Alignments alignments;
  alignments.a = AlignmentOf(p.a);
  alignments.b = AlignmentOf(p.b);
  alignments.c = AlignmentOf(p.c);
  alignments.bias = AlignmentOf(p.bias);
  alignments.aux = AlignmentOf(p.aux);
  return alignments;
}

AllowedForms CheckAlignment(const LayerGemm& plan, const GemmPointers& p) {
  AllowedForms forms;
  forms.alignments = AlignmentsOf(p);
  const Alignments& al = forms.alignments;
  const ColumnMajorGemm& g = plan.gemm;
  const bool base = al.a >= 16 && al.b >= 16 && al.c >= 16 && (g.lda * p.ab_size) % 16 == 0 &&
                    (g.ldb * p.ab_size) % 16 == 0 && (g.ldc * p.cd_size) % 16 == 0;
  const bool bias_ok = !HasBias(plan.epilogue) || (p.bias != 0 && al.bias >= 16);
  forms.bias = base && HasBias(plan.epilogue) && bias_ok;
  forms.gelu_aux = base && HasGelu(plan.epilogue) && bias_ok && plan.gelu_aux_ld_ok && p.aux != 0 &&
                   al.aux >= 16 && (plan.aux_ld * p.cd_size) % 16 == 0;
  return forms;
}

}  // namespace bigmac::stages::cuda
