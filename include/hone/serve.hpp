// hone/serve.hpp: serving the user's model inside the user's process: the dynamic batcher
// (docs/serve.md).
#pragma once

#include "hone/serve/batcher.hpp"
