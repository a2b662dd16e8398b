// HONE_PROFILE_NVTX: every zone is also an NVTX range in the domain "hone". A fake NVTX tool,
// attached the way NVTX3 attaches a statically linked injection (the symbol
// InitializeInjectionNvtx2_fnptr), records the ranges pushed and popped, so the test sees what
// Nsight Systems would see, without a GPU or Nsight.
#include <cstdint>

// The injection's entry point, declared before NVTX's headers: with NVTX_STATIC_INJECTION_IMPL
// they refer to it instead of defining their weak null default.
extern "C" int (*InitializeInjectionNvtx2_fnptr)(const void* (*)(std::uint32_t));
#define NVTX_STATIC_INJECTION_IMPL

#define BOOST_TEST_MODULE hone_profile_nvtx
#include <boost/test/unit_test.hpp>

#include <hone/profile/collector.hpp>
#include <hone/profile/phase_timer.hpp>
#include <hone/profile/zone.hpp>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "recording_sink.hpp"

static_assert(HONE_PROFILE_WITH_NVTX == 1, "this test is built with HONE_PROFILE_NVTX");

namespace {

struct fake_tool {
  std::mutex mu;
  std::vector<std::string> created;                  // domains created
  std::vector<std::pair<std::thread::id, std::string>> calls;  // "push <name>" / "pop"
  nvtxDomainHandle_t hone_domain = nullptr;
};
fake_tool& tool() {
  static fake_tool t;
  return t;
}

nvtxDomainHandle_t create_domain(const char* name) {
  auto& t = tool();
  const std::lock_guard lock(t.mu);
  t.created.emplace_back(name);
  // Any distinct non-null handle: NVTX passes it back on every call in the domain.
  static int handles[64];
  auto* h = reinterpret_cast<nvtxDomainHandle_t>(&handles[t.created.size() % 64]);
  if (std::string(name) == "hone") t.hone_domain = h;
  return h;
}
int push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  auto& t = tool();
  const std::lock_guard lock(t.mu);
  std::string what = d == t.hone_domain ? "push " : "push(other domain) ";
  if (a != nullptr && a->messageType == NVTX_MESSAGE_TYPE_ASCII) what += a->message.ascii;
  t.calls.emplace_back(std::this_thread::get_id(), what);
  return 0;
}
int pop(nvtxDomainHandle_t d) {
  auto& t = tool();
  const std::lock_guard lock(t.mu);
  t.calls.emplace_back(std::this_thread::get_id(), d == t.hone_domain ? "pop" : "pop(other)");
  return 0;
}

int attach(NvtxGetExportTableFunc_t get) {
  const auto* cb = static_cast<const NvtxExportTableCallbacks*>(get(NVTX_ETID_CALLBACKS));
  if (cb == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) == 0) return 0;
  if (size <= NVTX_CBID_CORE2_DomainCreateA) return 0;
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&create_domain);
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&push);
  *table[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&pop);
  return 1;
}

/// This thread's calls since the last take().
std::vector<std::string> take() {
  auto& t = tool();
  const std::lock_guard lock(t.mu);
  std::vector<std::string> out;
  std::vector<std::pair<std::thread::id, std::string>> rest;
  for (auto& [id, what] : t.calls) {
    if (id == std::this_thread::get_id()) {
      out.push_back(what);
    } else {
      rest.emplace_back(id, what);
    }
  }
  t.calls = std::move(rest);
  return out;
}

using strings = std::vector<std::string>;

}  // namespace

extern "C" {
int (*InitializeInjectionNvtx2_fnptr)(const void* (*)(std::uint32_t)) = &attach;
}

BOOST_AUTO_TEST_CASE(zones_are_nvtx_ranges_in_the_hone_domain_with_recording_off) {
  BOOST_TEST(!hone::profile::enabled());
  (void)take();
  {
    HONE_ZONE("outer");
    HONE_ZONE("inner");
  }
  BOOST_TEST(take() == (strings{"push outer", "push inner", "pop", "pop"}),
             boost::test_tools::per_element());
  const auto& t = tool();
  BOOST_TEST(t.created == strings{"hone"}, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(with_recording_on_hone_records_the_same_zones) {
  hone::profile::collector c;
  c.discard();
  hone::profile::set_enabled(true);
  (void)take();
  { HONE_ZONE("work"); }
  hone::profile::set_enabled(false);
  BOOST_TEST(take() == (strings{"push work", "pop"}), boost::test_tools::per_element());
  const recording_sink s = drain(c);
  BOOST_TEST(s.script(hone::profile::detail::this_thread_buffer()->serial) ==
                 (strings{"B:work", "E:work"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(the_trainer_s_phases_are_nvtx_ranges_and_threads_keep_their_own_stacks) {
  hone::profile::phase_timer pt;
  (void)take();
  pt.phase_begin(hone::step_phase::checkpoint);
  pt.phase_end(hone::step_phase::checkpoint);
  pt.phase_begin(hone::step_phase::forward_backward);
  std::thread other([] { HONE_ZONE("on another thread"); });
  other.join();
  pt.phase_end(hone::step_phase::forward_backward);
  pt.phase_begin(hone::step_phase::checkpoint);
  pt.phase_end(hone::step_phase::checkpoint);  // the after_step checkpoint ends the step
  BOOST_TEST(take() == (strings{"push step", "push checkpoint", "pop", "push forward_backward",
                                "pop", "push checkpoint", "pop", "pop"}),
             boost::test_tools::per_element());
  const auto& t = tool();
  bool seen = false;
  for (const auto& [id, what] : t.calls) seen = seen || what == "push on another thread";
  BOOST_TEST(seen, "the other thread's range was pushed on its own thread");
}
