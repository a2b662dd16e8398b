// hone/data.hpp: the data module: lazy datasets over memory-mapped files (text lines, CSV, JSON
// Lines) with a saved offset index of 8 bytes per record (docs/data.md).
#pragma once

#include "hone/data/line_dataset.hpp"
