// hone/profile/merge.hpp: the traces of several processes (one per rank, written with
// trace_options::rank and clock_offset_ns) merged into one file that shows every rank on one
// time line.
//
//  - merge_perfetto_traces: a Perfetto trace is a protobuf `Trace`, a repeated field of
//    TracePacket, so the concatenation of several traces is their union. Each input is checked
//    to be a sequence of complete packets first (a file cut short by a killed rank is refused,
//    naming it and the offset), then copied. Inputs written with distinct ranks use distinct
//    packet sequences and track ids, so nothing in them clashes.
//  - merge_chrome_json_traces: the "traceEvents" arrays of Chrome trace-event JSON files joined
//    in one document (each file parsed with hone's strict JSON reader; numbers keep their text,
//    so times are copied digit for digit).
// The output is written under a temporary name and renamed into place: it appears whole or not
// at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/directory.hpp"
#include "hone/io/error.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/json.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

namespace detail {

/// Reads a whole trace file.
inline std::vector<std::byte> read_trace_file(const std::filesystem::path& path) {
  io::input_file in(path);
  std::vector<std::byte> bytes(static_cast<std::size_t>(in.size()));
  in.read_at(0, bytes);
  return bytes;
}

/// Checks that `bytes` is a sequence of complete `Trace.packet` fields (tag 0x0a, a varint
/// length, that many bytes); io::format_error naming the file and offset otherwise.
inline void check_perfetto_framing(std::span<const std::byte> bytes,
                                   const std::filesystem::path& path) {
  auto fail = [&](std::size_t at, const std::string& what) {
    throw io::format_error("hone::profile::merge_perfetto_traces: '" + path.string() +
                           "' is not a complete Perfetto trace: " + what + " at byte " +
                           std::to_string(at) + " of " + std::to_string(bytes.size()) +
                           " (a trace whose writer was killed ends in the middle of a packet)");
  };
  std::size_t i = 0;
  while (i < bytes.size()) {
    const std::size_t start = i;
    if (static_cast<unsigned char>(bytes[i]) != 0x0a) {
      fail(start, "expected a TracePacket (field 1, length-delimited)");
    }
    ++i;
    std::uint64_t len = 0;
    int shift = 0;
    for (;;) {
      if (i >= bytes.size()) fail(start, "a packet's length is cut off");
      const auto b = static_cast<unsigned char>(bytes[i++]);
      if (shift == 63 && (b & 0x7e) != 0) fail(start, "a packet's length overflows 64 bits");
      len |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) break;
      shift += 7;
      if (shift > 63) fail(start, "a packet's length is longer than 10 bytes");
    }
    if (len > bytes.size() - i) {
      fail(start, "a packet of " + std::to_string(len) + " bytes runs past the end");
    }
    i += static_cast<std::size_t>(len);
  }
}

/// Writes `parts` one after the other to a temporary sibling of `output`, fsyncs it and renames
/// it into place; the temporary is removed when anything fails.
template <class Parts>
void write_merged(const std::filesystem::path& output, const Parts& parts) {
  const std::filesystem::path tmp = io::temp_sibling(output);
  try {
    io::output_file out(tmp, io::create_mode::truncate, io::write_hashing::off);
    for (const auto& part : parts) out.write(part);
    out.sync();
    (void)out.close();
    io::rename_path(tmp, output);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
}

}  // namespace detail

/// Writes the union of the Perfetto traces `inputs` (.pftrace files of hone::profile::trace,
/// one per rank) to `output`. io::format_error naming the file when an input is not a sequence
/// of complete packets (nothing is written then); config_error for no input.
inline void merge_perfetto_traces(std::span<const std::filesystem::path> inputs,
                                  const std::filesystem::path& output) {
  HONE_REQUIRE(!inputs.empty(), "hone::profile::merge_perfetto_traces: no input trace given");
  std::vector<std::vector<std::byte>> files;
  files.reserve(inputs.size());
  for (const auto& p : inputs) {
    files.push_back(detail::read_trace_file(p));
    detail::check_perfetto_framing(files.back(), p);
  }
  detail::write_merged(output, files);
}

/// Writes one Chrome trace-event JSON document whose "traceEvents" holds every event of the
/// `inputs` (.json files of hone::profile::trace, one per rank), file by file. io::format_error
/// naming the file when one is not JSON or has no "traceEvents" array.
inline void merge_chrome_json_traces(std::span<const std::filesystem::path> inputs,
                                     const std::filesystem::path& output) {
  HONE_REQUIRE(!inputs.empty(), "hone::profile::merge_chrome_json_traces: no input trace given");
  std::string text = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
  bool first = true;
  for (const auto& p : inputs) {
    const std::vector<std::byte> bytes = detail::read_trace_file(p);
    const std::string context = "hone::profile::merge_chrome_json_traces: '" + p.string() + "'";
    const io::json::value doc = io::json::parse(
        std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), context);
    const io::json::value* events = doc.is_object() ? doc.find("traceEvents") : nullptr;
    if (events == nullptr || !events->is_array()) {
      throw io::format_error(context +
                             " has no \"traceEvents\" array; it is not a Chrome trace-event file");
    }
    for (const io::json::value& e : events->as_array()) {
      text += first ? "\n" : ",\n";
      first = false;
      e.dump_to(text);
    }
  }
  text += "\n]}\n";
  const std::string_view parts[] = {text};
  detail::write_merged(output, parts);
}

}  // namespace profile
HONE_NAMESPACE_END
