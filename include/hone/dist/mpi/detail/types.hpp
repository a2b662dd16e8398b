// hone/dist/mpi/detail/types.hpp: the element types of hone::dist::mpi_comm's collectives (their
// MPI datatypes and names) and its own reductions: max with hone's NaN rule on float and double,
// sum and max on the 16-bit floats hone::bfloat16 and hone::half (moved as MPI_UINT16_T, combined
// in float and rounded back). Included by hone/dist/mpi/mpi_comm.hpp; not for direct use.
#pragma once

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/detail/simd.hpp"
#include "hone/core/half.hpp"
#include "hone/dist/communicator.hpp"

HONE_NAMESPACE_BEGIN
namespace dist::detail {

template <class T>
inline constexpr bool mpi_supported_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, bfloat16> || std::is_same_v<T, half>;

/// hone::bfloat16 and hone::half: 2-byte types MPI knows nothing of, moved as MPI_UINT16_T and
/// reduced by mpi_comm's own operations (below).
template <class T>
inline constexpr bool is_float16_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, half>;

template <class T>
MPI_Datatype mpi_type() noexcept {
  static_assert(mpi_supported_v<T>,
                "hone::dist::mpi_comm: the element type of a collective must be float, double, "
                "std::int32_t, std::int64_t, hone::bfloat16 or hone::half; convert the data to "
                "one of them.");
  if constexpr (std::is_same_v<T, float>) {
    return MPI_FLOAT;
  } else if constexpr (std::is_same_v<T, double>) {
    return MPI_DOUBLE;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return MPI_INT32_T;
  } else if constexpr (is_float16_v<T>) {
    static_assert(sizeof(T) == sizeof(std::uint16_t));
    return MPI_UINT16_T;
  } else {
    return MPI_INT64_T;
  }
}

template <class T>
constexpr const char* type_name() noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return "float";
  } else if constexpr (std::is_same_v<T, double>) {
    return "double";
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return "int32";
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return "bfloat16";
  } else if constexpr (std::is_same_v<T, half>) {
    return "half";
  } else {
    return "int64";
  }
}

/// The max of hone's reduce_op::max: NaN when either is NaN (the canonical quiet NaN, so every
/// rank holds the same bits), +0 over -0; commutative and associative.
template <class T>
T nan_max(T a, T b) noexcept {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  if (a < b) return b;
  if (b < a) return a;
  return std::signbit(a) ? b : a;
}

template <class T>
void nan_max_loop(const void* in, void* inout, int count) noexcept {
  const T* x = static_cast<const T*>(in);
  T* y = static_cast<T*>(inout);
  for (int i = 0; i < count; ++i) y[i] = nan_max(x[i], y[i]);
}

/// The MPI user function of reduce_op::max on float and double (MPI_MAX leaves NaN to the order
/// in which the implementation combines the ranks).
inline void mpi_nan_max(void* in, void* inout, int* count, MPI_Datatype* type) {
  if (*type == MPI_FLOAT) {
    nan_max_loop<float>(in, inout, *count);
  } else if (*type == MPI_DOUBLE) {
    nan_max_loop<double>(in, inout, *count);
  }
}

/// The sum of two 16-bit floats as an element functor of hone's vector loop (core/detail/simd.hpp):
/// both widened exactly, added in float, rounded to nearest even on store, so every target gives
/// T(float(a) + float(b)) (of a NaN result only its NaN-ness is fixed: the payload may come from
/// either operand, as with the compiler's scalar add).
struct float16_add_op {
  template <class T>
  void operator()(T& a, const T& b) const noexcept {
    a = T(static_cast<float>(a) + static_cast<float>(b));
  }
  template <class V>
  void apply(V& a, const V& b) const noexcept {
    a = a + b;
  }
};

/// The sum of 16-bit floats (T = hone::bfloat16 or hone::half), as NCCL's half sums: each pair
/// widened to float, added, and rounded back to T (to nearest even; beyond T's range, inf). It runs
/// through hone's vector loop on hone::active_isa() (F16C converts 8 or 16 halves per instruction,
/// where the portable conversion takes a dozen integer operations per value).
/// float16_sum_range: acc[i] = T(float(acc[i]) + float(other[i])) for i < n, the signature of the
/// point-to-point collectives' reductions (p2p_op.hpp); float16_sum_loop: the same with MPI's
/// argument order and int count, for mpi_comm's MPI operations.
template <class T>
void float16_sum_range(void* acc, const void* other, std::size_t n) noexcept {
  ::hone::detail::simd_apply_range(
      float16_add_op{}, 0, n,
      std::tuple<T*, const T*>(static_cast<T*>(acc), static_cast<const T*>(other)),
      std::make_index_sequence<2>{});
}
template <class T>
void float16_sum_loop(const void* in, void* inout, int count) noexcept {
  float16_sum_range<T>(inout, in, static_cast<std::size_t>(count));
}

/// reduce_op::max on 16-bit floats: nan_max of the widened values (NaN gives T's quiet NaN, +0
/// is larger than -0), rounded back (exactly, since both values are T's).
template <class T>
void float16_max_loop(const void* in, void* inout, int count) noexcept {
  const T* x = static_cast<const T*>(in);
  T* y = static_cast<T*>(inout);
  for (int i = 0; i < count; ++i)
    y[i] = T(nan_max(static_cast<float>(x[i]), static_cast<float>(y[i])));
}

// The MPI user functions of the four 16-bit operations (the datatype, MPI_UINT16_T, does not
// tell bfloat16 from half: one function per type and reduction).
inline void mpi_bf16_sum(void* in, void* inout, int* count, MPI_Datatype*) {
  float16_sum_loop<bfloat16>(in, inout, *count);
}
inline void mpi_half_sum(void* in, void* inout, int* count, MPI_Datatype*) {
  float16_sum_loop<half>(in, inout, *count);
}
inline void mpi_bf16_max(void* in, void* inout, int* count, MPI_Datatype*) {
  float16_max_loop<bfloat16>(in, inout, *count);
}
inline void mpi_half_max(void* in, void* inout, int* count, MPI_Datatype*) {
  float16_max_loop<half>(in, inout, *count);
}

/// mpi_comm's own reductions: max on float and double with the NaN rule, sum and max on the
/// 16-bit floats. Created after MPI_Init (create()), freed before MPI_Finalize (free()).
struct mpi_ops {
  MPI_Op max = MPI_OP_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL;
  MPI_Op half_sum = MPI_OP_NULL;
  MPI_Op bf16_max = MPI_OP_NULL;
  MPI_Op half_max = MPI_OP_NULL;

  /// Creates the operations (all commutative: MPI may combine the ranks in any grouping; for the
  /// 16-bit sums that grouping changes the rounding, but the rank that owns a block computes it
  /// alone, so every rank still receives the same bits).
  void create() {
    const auto make = [](MPI_User_function* f, MPI_Op& op) {
      const int rc = MPI_Op_create(f, 1, &op);
      if (rc != MPI_SUCCESS) {
        throw dist_error("hone::dist::mpi_comm: MPI_Op_create failed with MPI error code " +
                         std::to_string(rc));
      }
    };
    make(&mpi_nan_max, max);
    make(&mpi_bf16_sum, bf16_sum);
    make(&mpi_half_sum, half_sum);
    make(&mpi_bf16_max, bf16_max);
    make(&mpi_half_max, half_max);
  }
  void free() noexcept {
    for (MPI_Op* op : {&max, &bf16_sum, &half_sum, &bf16_max, &half_max})
      if (*op != MPI_OP_NULL) MPI_Op_free(op);
  }

  /// The operation of `op` on T: MPI's own for integers (and float sums), mpi_comm's otherwise.
  template <class T>
  [[nodiscard]] MPI_Op of(reduce_op op) const noexcept {
    if constexpr (std::is_same_v<T, bfloat16>) {
      return op == reduce_op::sum ? bf16_sum : bf16_max;
    } else if constexpr (std::is_same_v<T, half>) {
      return op == reduce_op::sum ? half_sum : half_max;
    } else if constexpr (std::is_floating_point_v<T>) {
      return op == reduce_op::sum ? MPI_SUM : max;
    } else {
      return op == reduce_op::sum ? MPI_SUM : MPI_MAX;
    }
  }
};

}  // namespace dist::detail
HONE_NAMESPACE_END
