// hone::compiled: the one oneTBB deterministic reduction behind every hone::transform_reduce of a
// program built with separate compilation (core/parallel.hpp, detail::parallel_reduce_any). The
// value type is erased behind reduce_ops; the reduction tree and the order of the leaf and join
// calls are those of the header-only route (oneTBB's parallel_deterministic_reduce with the
// simple partitioner over [0, n) in tasks of `grain`), so the results are the same bits.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_reduce.h>
#include <oneapi/tbb/partitioner.h>

#include <cstddef>
#include <new>

#include "hone/core/parallel.hpp"

HONE_NAMESPACE_BEGIN
namespace detail {
namespace {

/// A value of the erased type: in place up to 64 bytes, else on the heap.
class erased_value {
 public:
  erased_value(const reduce_ops& ops, const void* src) : ops_(&ops) {
    allocate();
    ops_->copy(p_, src);
  }
  erased_value(const erased_value& o) : ops_(o.ops_) {
    allocate();
    ops_->copy(p_, o.p_);
  }
  erased_value& operator=(const erased_value& o) {
    if (this != &o) ops_->assign(p_, o.p_);
    return *this;
  }
  ~erased_value() {
    ops_->destroy(p_);
    if (p_ != static_cast<void*>(buf_)) {
      ::operator delete(p_, std::align_val_t(ops_->align));
    }
  }
  [[nodiscard]] void* get() noexcept { return p_; }
  [[nodiscard]] const void* get() const noexcept { return p_; }

 private:
  void allocate() {
    if (ops_->size <= sizeof(buf_) && ops_->align <= alignof(std::max_align_t)) {
      p_ = buf_;
    } else {
      p_ = ::operator new(ops_->size, std::align_val_t(ops_->align));
    }
  }

  const reduce_ops* ops_;
  void* p_ = nullptr;
  alignas(std::max_align_t) unsigned char buf_[64];
};

}  // namespace

void parallel_reduce_any(std::size_t n, std::size_t grain, const void* init, void* result,
                         const reduce_ops& ops) {
  const erased_value identity(ops, init);
  const erased_value r = tbb::parallel_deterministic_reduce(
      tbb::blocked_range<std::size_t>(0, n, grain), identity,
      [&ops](const tbb::blocked_range<std::size_t>& range, erased_value acc) {
        ops.leaf(ops.leaf_ctx, range.begin(), range.end(), acc.get());
        return acc;
      },
      [&ops](erased_value x, const erased_value& y) {
        ops.join(ops.join_ctx, x.get(), y.get());
        return x;
      },
      tbb::simple_partitioner{});
  ops.assign(result, r.get());
}

}  // namespace detail
HONE_NAMESPACE_END
