// hone/profile.hpp: the profile module: scoped zones, counters, flows and thread names recorded
// per thread with bounded memory (hone/profile/zone.hpp), traces streamed to Perfetto protobuf
// and Chrome JSON files (hone/profile/trace.hpp), duration statistics and summary tables, and the
// trainer's step observer that times each phase (hone/profile/phase_timer.hpp), and scalars per
// step written in the background to CSV and TensorBoard event files (hone/profile/metrics.hpp).
#pragma once

#include "hone/profile/chrome_json.hpp"
#include "hone/profile/clock.hpp"
#include "hone/profile/collector.hpp"
#include "hone/profile/csv_writer.hpp"
#include "hone/profile/merge.hpp"
#include "hone/profile/metric_writer.hpp"
#include "hone/profile/metrics.hpp"
#include "hone/profile/perfetto.hpp"
#include "hone/profile/phase_timer.hpp"
#include "hone/profile/stats.hpp"
#include "hone/profile/tensorboard.hpp"
#include "hone/profile/trace.hpp"
#include "hone/profile/zone.hpp"
