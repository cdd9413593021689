// AmctSummary: min, max, element count and histogram of a float32 tensor in one op; AmctMinMax:
// min, max and count alone.
//
// Why: calibrating with a histogram algorithm (ifmr, hfmg) summarises every observed activation
// of every step. With stock TF ops that is reduce_min, reduce_max, a dozen small ops choosing
// the histogram range and tf.histogram_fixed_width, whose CPU kernel spends most of its time in
// a single-threaded count loop that stalls when consecutive values hit the same bin (ReLU zeros
// all land in bin 0). Here one pass per chunk finds min/max and bins onto the host's grid, the
// bin computation is vectorised (a float32 multiplication where its error bound holds, float64
// otherwise, either checked against TF's division) and the counts are spread so that repeated
// bins do not serialise on one counter.
//
// Same results as amct_bridge.keras.instrument's TF-op path, bit for bit:
//   lo, hi  = min(x), max(x); both NaN if any value is NaN (reduce_min/max propagate NaN)
//   inside  = lo >= grid[0] and hi <= grid[1]
//   range   = grid if inside, else [lo, hi] ([lo, lo + 1] when lo == hi, or [lo, next float
//             above lo] when lo + 1 rounds back to lo: |lo| >= 2^24)
//   hist    = tf.histogram_fixed_width(x, range, nbins) (TF 2.21 CPU formula:
//             step = hi / nbins - lo / nbins in float64,
//             idx = int32(min((float64(clamp(x, lo, hi)) - lo) / step, nbins - 1)))
//             or all zeros when lo or hi is not finite (the host reports NaN/Inf by layer).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace amct_bridge {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

constexpr int kCopies = 4;        // interleaved sub-histograms
constexpr int64_t kChunk = 2048;  // values per vectorised pass (an 8 KiB index buffer)

constexpr int kSpread = 16;       // extra counters for each edge bin, see Slot

// The top of a constant tensor's range: lo + 1, or the next float when lo + 1 rounds back to lo
// (|lo| >= 2^24): an empty range would make the bin step zero.
float Above(float lo) {
  const float up = lo + 1.0f;
  return up > lo ? up : std::nextafter(lo, std::numeric_limits<float>::infinity());
}

// A histogram range [lo, hi] over nbins bins, in TF's float64 terms; finv and delta for the
// float32 path (IndexFloat) where it is exact (fast), see MakeRange.
struct Range {
  double lo, step, inv, top;
  float flo, fhi;
  int32_t nbins;
  float finv, delta;
  bool fast;
};

constexpr int32_t kFloatMaxBins = 1 << 20;  // IndexFloat's delta stays <= 1/4 of a bin

Range MakeRange(float lo, float hi, int nbins) {
  const double step = static_cast<double>(hi) / nbins - static_cast<double>(lo) / nbins;
  Range r{lo, step, 1.0 / step, static_cast<double>(nbins - 1), lo, hi, nbins, 0.0f, 0.0f, false};
  // IndexFloat's error bound (see there) needs normal, finite float32 factors: a step of at
  // least FLT_MIN (then a difference c - lo that float32 flushes to zero is below one step),
  // 1 / step a normal float and hi - lo finite in float32. Other ranges take the float64 path.
  const float finv = static_cast<float>(r.inv);
  const float width = hi - lo;
  if (nbins <= kFloatMaxBins && step >= std::numeric_limits<float>::min() &&
      std::isfinite(finv) && finv >= std::numeric_limits<float>::min() && std::isfinite(width)) {
    r.finv = finv;
    r.delta = std::ldexp(static_cast<float>(nbins), -22);
    r.fast = true;
  }
  return r;
}

// Where value i's count goes: its bin, except that the two edge bins are spread over kSpread
// counters each (slots nbins + [0, kSpread) for bin 0, nbins + kSpread + [0, kSpread) for the
// last), because they are the hot ones (ReLU zeros, values clamped to the range) and
// increments of one counter in a row wait for each other.
inline int32_t Slot(int32_t bin, int64_t i, int32_t top) {
  const int32_t lane = static_cast<int32_t>(i & (kSpread - 1));
  return bin == 0 ? top + 1 + lane : (bin == top ? top + 1 + kSpread + lane : bin);
}

// Slots of x[0, m) in float64 (ranges IndexFloat cannot take): bin = floor((x - lo) *
// (1 / step)). That can differ from TF's
// floor((x - lo) / step) only when the quotient is within rounding error of an integer, so
// such values are counted and the caller redoes the chunk with IndexExact (rare: about one
// value in a million). Branch-free selects and __restrict let GCC vectorise it (a branchy
// clamp mispredicts on ReLU outputs and costs 5x); cloned per ISA to run 4 or 8 wide.
__attribute__((target_clones("avx512f", "avx2", "default"))) int32_t Index(
    const float* __restrict x, int64_t m, Range r, int32_t* __restrict idx) {
  const int32_t top = r.nbins - 1;
  int32_t risky = 0;
  for (int64_t i = 0; i < m; ++i) {
    float c = x[i] > r.flo ? x[i] : r.flo;
    c = c < r.fhi ? c : r.fhi;
    const double d = static_cast<double>(c) - r.lo;
    const double q = d * r.inv;
    int32_t bin = static_cast<int32_t>(q);
    const double frac = q - bin;
    risky += ((frac < 1e-9) & (d != 0.0)) | (frac > 1.0 - 1e-9);
    bin = bin < top ? bin : top;
    idx[i] = Slot(bin, i, top);
  }
  return risky;
}

// Value i's slot with TF's exact division.
inline int32_t SlotExact(float v, int64_t i, const Range& r) {
  float c = v > r.flo ? v : r.flo;
  c = c < r.fhi ? c : r.fhi;
  double q = (static_cast<double>(c) - r.lo) / r.step;
  q = q < r.top ? q : r.top;
  return Slot(static_cast<int32_t>(q), i, r.nbins - 1);
}

// The same slots with TF's exact division.
__attribute__((target_clones("avx512f", "avx2", "default"))) void IndexExact(
    const float* __restrict x, int64_t m, Range r, int32_t* __restrict idx) {
  for (int64_t i = 0; i < m; ++i) idx[i] = SlotExact(x[i], i, r);
}

// Slots of x[0, m) in float32, twice as many lanes as Index's float64 (about half its time):
// q = (c - lo) * (1 / step) with each of the difference, 1 / step and the product rounded to
// float32, so q is within 3 * 2^-24 * q_tf (plus 2^-48 terms) of TF's float64 quotient q_tf,
// and q_tf <= nbins (1 + 2^-28): |q - q_tf| < delta = nbins * 2^-22. Where q is further than
// delta from every integer, floor(q) == floor(q_tf) (and the clamp to the last bin agrees);
// a value within delta of one gets slot -1 and Counter::Add divides for it (SlotExact): about
// 2 * delta of the values (0.8 % at 16384 bins). c == lo (d == 0) is bin 0 in both; a
// difference float32 flushes to zero (FTZ) is below FLT_MIN <= step: bin 0 in both too.
__attribute__((target_clones("avx512f", "avx2", "default"))) void IndexFloat(
    const float* __restrict x, int64_t m, Range r, int32_t* __restrict idx) {
  const int32_t top = r.nbins - 1;
  for (int64_t i = 0; i < m; ++i) {
    float c = x[i] > r.flo ? x[i] : r.flo;
    c = c < r.fhi ? c : r.fhi;
    const float d = c - r.flo;
    const float q = d * r.finv;
    int32_t bin = static_cast<int32_t>(q);
    const float frac = q - static_cast<float>(bin);
    const int32_t near = ((frac < r.delta) & (d != 0.0f)) | (frac > 1.0f - r.delta);
    bin = bin < top ? bin : top;
    idx[i] = near ? -1 : Slot(bin, i, top);
  }
}

void Bin(const float* x, int64_t m, const Range& r, int32_t* idx) {
  if (r.fast) {
    IndexFloat(x, m, r, idx);  // slot -1: Counter::Add divides
  } else if (Index(x, m, r, idx) != 0) {
    IndexExact(x, m, r, idx);
  }
}

// Min and max of x[0, m) into *mn / *mx, and the NaN count. finite-math-only (for this function
// alone) lets GCC vectorise the min/max reduction, 7x faster; NaN is then found from the bits,
// which that option cannot assume away, and the caller discards min/max when there is one.
// (Infinities still compare as they should: nothing here rewrites arithmetic on them.)
using AliasedBits = uint32_t __attribute__((may_alias));

__attribute__((target_clones("avx512f", "avx2", "default"),
               optimize("finite-math-only", "no-signed-zeros"))) int64_t
MinMax(const float* __restrict x, int64_t m, float* __restrict mn, float* __restrict mx) {
  const AliasedBits* bits = reinterpret_cast<const AliasedBits*>(x);
  float a = *mn;
  float b = *mx;
  int32_t nans = 0;
  for (int64_t i = 0; i < m; ++i) {
    const float v = x[i];
    nans += (bits[i] & 0x7fffffffu) > 0x7f800000u;
    a = v < a ? v : a;
    b = v > b ? v : b;
  }
  *mn = a;
  *mx = b;
  return nans;
}

// Counts into kCopies interleaved sub-histograms (value i into copy i % kCopies), so that
// repeated bins inside the range do not serialise on one counter either: one copy is a little
// faster when only the edge bins are hot, but 1.5x slower when ReLU zeros fall inside the grid
// (its low end below 0), measured on a 0.5 M-value activation.
class Counter {
 public:
  explicit Counter(int nbins)
      : nbins_(nbins), width_(nbins + 2 * kSpread), sub_(static_cast<size_t>(kCopies) * width_) {}

  // Counts the slots idx[0, m) of the values x[0, m); slot -1 (IndexFloat: near a bin edge)
  // is computed here by TF's division, a rare branch (a second pass over the chunk to find
  // them cost more than IndexFloat saved).
  void Add(const int32_t* idx, const float* x, int64_t m, const Range& r) {
    int32_t* s = sub_.data();
    int64_t i = 0;
    for (; i + kCopies <= m; i += kCopies)
      for (int c = 0; c < kCopies; ++c) {
        int32_t k = idx[i + c];
        if (__builtin_expect(k < 0, 0)) k = SlotExact(x[i + c], i + c, r);
        ++s[c * width_ + k];
      }
    for (; i < m; ++i) ++s[idx[i] < 0 ? SlotExact(x[i], i, r) : idx[i]];
  }

  void Sum(int32_t* out) const {
    std::fill(out, out + nbins_, 0);
    for (int c = 0; c < kCopies; ++c) {
      const int32_t* s = sub_.data() + c * width_;
      for (int b = 0; b < nbins_; ++b) out[b] += s[b];
      for (int k = 0; k < kSpread; ++k) {
        out[0] += s[nbins_ + k];
        out[nbins_ - 1] += s[nbins_ + kSpread + k];
      }
    }
  }

  void Clear() { std::fill(sub_.begin(), sub_.end(), 0); }

 private:
  int nbins_;
  int width_;
  std::vector<int32_t> sub_;
};

// Outputs 0-2 of both ops: min, max and the element count. lo and hi become NaN (in place,
// for the caller too) if a value was NaN, as reduce_min/max give.
::tensorflow::Status SetMinMax(OpKernelContext* ctx, float& lo, float& hi, int64_t nans,
                               int64_t n) {
  if (nans > 0) lo = hi = std::numeric_limits<float>::quiet_NaN();
  Tensor *lo_t, *hi_t, *count_t;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({}), &lo_t));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({}), &hi_t));
  TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({}), &count_t));
  lo_t->scalar<float>()() = lo;
  hi_t->scalar<float>()() = hi;
  count_t->scalar<int64_t>()() = n;
  return absl::OkStatus();
}

class SummaryOp : public OpKernel {
 public:
  explicit SummaryOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("nbins", &nbins_));
  }

  void Compute(OpKernelContext* ctx) override {
    const auto values = ctx->input(0).flat<float>();
    const Tensor& grid_t = ctx->input(1);
    OP_REQUIRES(ctx, grid_t.NumElements() == 2,
                ::tensorflow::errors::InvalidArgument("grid should hold 2 values [lo, hi], got shape ",
                                                      grid_t.shape().DebugString()));
    const float g0 = grid_t.flat<float>()(0);
    const float g1 = grid_t.flat<float>()(1);
    const float* x = values.data();
    const int64_t n = values.size();

    // Pass 1: min/max, and (the usual case once the host has set a grid) the counts on the
    // grid, speculatively: they are kept if the batch turns out to lie inside it.
    const bool has_grid = g0 < g1;
    const Range grid = MakeRange(g0, g1, nbins_);
    float lo = std::numeric_limits<float>::infinity();
    float hi = -std::numeric_limits<float>::infinity();
    Counter counter(nbins_);
    int32_t idx[kChunk];
    int64_t nans = 0;
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t m = std::min(kChunk, n - start);
      nans += MinMax(x + start, m, &lo, &hi);
      if (has_grid && nbins_ > 1) {
        Bin(x + start, m, grid, idx);
        counter.Add(idx, x + start, m, grid);
      }
    }
    OP_REQUIRES_OK(ctx, SetMinMax(ctx, lo, hi, nans, n));
    const bool inside = lo >= g0 && hi <= g1;
    Tensor *inside_t, *hist_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({}), &inside_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({nbins_}), &hist_t));
    inside_t->scalar<bool>()() = inside;
    int32_t* hist = hist_t->flat<int32_t>().data();

    if (!(hi - lo < std::numeric_limits<float>::infinity())) {  // NaN or Inf: no histogram
      std::fill(hist, hist + nbins_, 0);
      return;
    }
    if (nbins_ == 1) {  // as TF: everything in the one bin, no zero-width step
      hist[0] = static_cast<int32_t>(n);
      return;
    }
    if (inside) {
      counter.Sum(hist);
      return;
    }
    // Pass 2: the batch's own range (no grid yet, or the range grew).
    const Range own = MakeRange(lo, hi > lo ? hi : Above(lo), nbins_);
    counter.Clear();
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t m = std::min(kChunk, n - start);
      Bin(x + start, m, own, idx);
      counter.Add(idx, x + start, m, own);
    }
    counter.Sum(hist);
  }

 private:
  int nbins_ = 0;
};

// Min, max and count alone (tensors observed without a histogram): one vectorised pass instead
// of reduce_min and reduce_max, two.
class MinMaxOp : public OpKernel {
 public:
  explicit MinMaxOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const auto values = ctx->input(0).flat<float>();
    float lo = std::numeric_limits<float>::infinity();
    float hi = -std::numeric_limits<float>::infinity();
    const int64_t n = values.size();
    int64_t nans = 0;
    for (int64_t start = 0; start < n; start += kChunk)
      nans += MinMax(values.data() + start, std::min(kChunk, n - start), &lo, &hi);
    OP_REQUIRES_OK(ctx, SetMinMax(ctx, lo, hi, nans, n));
  }
};

}  // namespace
}  // namespace amct_bridge

REGISTER_OP("AmctMinMax")
    .Input("values: float")
    .Output("lo: float")
    .Output("hi: float")
    .Output("count: int64")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("AmctMinMax").Device(::tensorflow::DEVICE_CPU),
                        amct_bridge::MinMaxOp);

REGISTER_OP("AmctSummary")
    .Input("values: float")
    .Input("grid: float")
    .Attr("nbins: int >= 1")
    .Output("lo: float")
    .Output("hi: float")
    .Output("count: int64")
    .Output("inside: bool")
    .Output("hist: int32")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      int nbins = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("nbins", &nbins));
      for (int i = 0; i < 4; ++i) c->set_output(i, c->Scalar());
      c->set_output(4, c->Vector(nbins));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("AmctSummary").Device(::tensorflow::DEVICE_CPU),
                        amct_bridge::SummaryOp);
