// hone/checkpoint/json.hpp: the JSON values of checkpoint files (training_state::data, a tensor
// file's metadata). They are hone::io's (hone/io/json.hpp): hone::checkpoint::json is an alias of
// hone::io::json.
#pragma once

#include "hone/core/config.hpp"
#include "hone/io/json.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {
namespace json = io::json;
}  // namespace checkpoint
HONE_NAMESPACE_END
