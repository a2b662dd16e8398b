// hone/checkpoint/dtype.hpp: the element types of checkpoint tensors, part of hone::checkpoint's
// API (tensor_writer::add, tensor_view::type). They are hone::io's (hone/io/dtype.hpp), re-exported
// here: hone::checkpoint::dtype is hone::io::dtype.
#pragma once

#include "hone/core/config.hpp"
#include "hone/io/dtype.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {
using io::all_dtypes;
using io::can_convert;
using io::convert;
using io::dtype;
using io::dtype_from_name;
using io::dtype_name;
using io::dtype_of;
using io::dtype_size;
using io::is_convertible_float;
using io::is_sub_byte_dtype_name;
}  // namespace checkpoint
HONE_NAMESPACE_END
