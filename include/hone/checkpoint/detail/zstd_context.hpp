// hone/checkpoint/detail/zstd_context.hpp: owning handles of zstd's compression and
// decompression contexts. Internal.
#pragma once

#include <zstd.h>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

namespace detail {
struct zstd_cctx_deleter {
  void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
};
struct zstd_dctx_deleter {
  void operator()(ZSTD_DCtx* c) const noexcept { ZSTD_freeDCtx(c); }
};
}  // namespace detail

}  // namespace checkpoint
HONE_NAMESPACE_END
