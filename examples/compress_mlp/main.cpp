// compress_mlp: train_mlp's flagship MLP trained, then compressed every way hone offers, each
// variant measured against the fp32 model:
//
//   fp32          train_mlp's model and recipe on hone::trainer (the reference)
//   structured    hone::compress::prune_neurons: the hidden layers lose --prune-fraction of their
//                 neurons (the matrices shrink), then fine-tuning on the smaller model
//   2:4           hone::compress::sparse24_matrix: 2 of every 4 weights of a row kept by
//                 magnitude, fine-tuned with the masks held by hone::compress::magnitude_pruning,
//                 packed and run by sparse24_matmul
//   int8 static   hone::compress::post_training_quantize: per-row int8 weights, activation ranges
//                 from a calibration pass over the training split, hone::compress::int8_gemm
//   int8 dynamic  the same routine in dynamic mode: hone::compress::dynamic_int8_linear per layer
//                 (activation ranges per row at run time)
//   student       a narrower MLP trained on the teacher's logits with hone::compress::distill_loss,
//                 and the same student trained on the labels alone
//   LoRA          hone::compress::lora_model adapters on every layer, trained on a shifted task
//                 (the spiral rotated by --shift-degrees), then merged into the weights
//
// It prints one table row per variant (test accuracy, bytes of what the variant stores to run,
// inference samples per second, each against the fp32 model) and checks what must hold: the
// structured layers shrank, the 2:4 layers hold 2 zeros in every group of 4, the 2:4 and merged
// LoRA outputs match their dense twins within a stated tolerance, unmerge restores the base
// weights bit for bit, LoRA raised the shifted task's accuracy, and (goals, with flags) the fp32
// accuracy and the int8 variants' drop. Exit status: 0 all checks passed, 1 runtime error, 2 bad
// flags, 3 a check failed.
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <hone/compress/prune.hpp>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "net.hpp"
#include "train.hpp"
#include "train_mlp/dataset.hpp"

namespace {

using namespace compress_mlp;
using train_mlp::split;

enum class observer_kind { minmax, percentile, mse };

struct options {
  std::size_t hidden = 128;
  std::size_t batch = 128;
  std::uint64_t steps = 600;
  double lr = 0.05;
  std::uint64_t seed = 1;
  double prune_fraction = 0.5;
  std::uint64_t finetune_steps = 200;
  double finetune_lr = 0.01;
  observer_kind observer = observer_kind::minmax;
  std::size_t student_hidden = 16;
  std::uint64_t student_steps = 600;
  float temperature = 2.0f;
  float alpha = 0.5f;
  std::size_t lora_rank = 4;
  float lora_alpha = 8.0f;
  std::uint64_t lora_steps = 300;
  double lora_lr = 0.02;
  double shift_degrees = 36.0;
  std::size_t infer_batch = 256;
  std::size_t threads = 1;
  std::size_t repeats = 20;
  std::optional<double> min_accuracy;  // percent
  double max_int8_drop = 0.5;          // points
};

constexpr const char* usage_text =
    "usage: compress_mlp [flags]\n"
    "  --hidden N           width of the two hidden layers of the fp32 model (default 128)\n"
    "  --batch N            samples per training step (default 128)\n"
    "  --steps N            training steps of the fp32 model (default 600)\n"
    "  --lr X               peak learning rate of its OneCycle schedule (default 0.05)\n"
    "  --seed N             seed of initial weights, batch order, adapters (default 1)\n"
    "  --prune-fraction X   share of each hidden layer's neurons removed, in [0, 1) (default 0.5)\n"
    "  --finetune-steps N   fine-tuning steps after structured and 2:4 pruning (default 200)\n"
    "  --finetune-lr X      their peak learning rate (default 0.01)\n"
    "  --observer KIND      int8 static calibration: minmax, percentile or mse (default minmax)\n"
    "  --student-hidden N   width of the distilled student's hidden layers (default 16)\n"
    "  --student-steps N    training steps of each student (default 600)\n"
    "  --temperature X      distillation temperature (default 2)\n"
    "  --alpha X            weight of the distillation term, in [0, 1] (default 0.5)\n"
    "  --lora-rank N        LoRA rank (default 4)\n"
    "  --lora-alpha X       LoRA alpha; scaling = alpha / rank (default 8)\n"
    "  --lora-steps N       LoRA training steps on the shifted task (default 300)\n"
    "  --lora-lr X          their peak learning rate (default 0.02)\n"
    "  --shift-degrees X    the shifted task: the spiral rotated by X degrees (default 36)\n"
    "  --infer-batch N      rows per inference call when measuring (default 256)\n"
    "  --threads N          oneTBB threads for the whole run (default 1)\n"
    "  --repeats N          timed passes over the test set per variant; the median counts\n"
    "                       (default 20)\n"
    "  --min-accuracy X     check: the fp32 model reaches X% test accuracy\n"
    "  --max-int8-drop X    check: each int8 variant is within X points of fp32 (default 0.5)\n"
    "  --help               print this text\n";

[[noreturn]] void bad_flag(const std::string& why) {
  std::fprintf(stderr, "compress_mlp: %s\nrun 'compress_mlp --help' for the list of flags\n",
               why.c_str());
  std::exit(2);
}

std::uint64_t integer_flag(std::string_view flag, const char* text, std::uint64_t lo,
                           std::uint64_t hi) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || text[0] == '-' || v < lo || v > hi) {
    bad_flag(std::string(flag) + " needs an integer in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "], got '" + text + "'");
  }
  return v;
}

double number_flag(std::string_view flag, const char* text, double lo, double hi, bool lo_open) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(v) || (lo_open ? v <= lo : v < lo) || v > hi) {
    char range[96];
    std::snprintf(range, sizeof(range), "%s%g, %g]", lo_open ? "(" : "[", lo, hi);
    bad_flag(std::string(flag) + " needs a number in " + range + ", got '" + text + "'");
  }
  return v;
}

observer_kind parse_observer(std::string_view k) {
  if (k == "minmax") return observer_kind::minmax;
  if (k == "percentile") return observer_kind::percentile;
  if (k == "mse") return observer_kind::mse;
  bad_flag("--observer must be minmax, percentile or mse, got '" + std::string(k) + "'");
}

options parse_flags(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view f = argv[i];
    if (f == "--help" || f == "-h") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    }
    if (!f.starts_with("--")) bad_flag("unexpected argument '" + std::string(f) + "'");
    const char* v = nullptr;  // the flag's value, read once the flag is known
    constexpr std::uint64_t big = 10'000'000;
    const auto integer = [&](std::uint64_t lo, std::uint64_t hi) {
      return integer_flag(f, v, lo, hi);
    };
    const auto number = [&](double lo, double hi, bool lo_open = false) {
      return number_flag(f, v, lo, hi, lo_open);
    };
    const auto real = [&](double lo, double hi, bool lo_open = false) {
      return static_cast<float>(number(lo, hi, lo_open));
    };
    const std::pair<std::string_view, std::function<void()>> table[] = {
        {"--hidden", [&] { o.hidden = integer(2, 4096); }},
        {"--batch", [&] { o.batch = integer(1, 4000); }},
        {"--steps", [&] { o.steps = integer(1, big); }},
        {"--lr", [&] { o.lr = number(0.0, 10.0, true); }},
        {"--seed", [&] { o.seed = integer(0, ~std::uint64_t{0}); }},
        {"--prune-fraction", [&] { o.prune_fraction = number(0.0, 0.99); }},
        {"--finetune-steps", [&] { o.finetune_steps = integer(1, big); }},
        {"--finetune-lr", [&] { o.finetune_lr = number(0.0, 10.0, true); }},
        {"--observer", [&] { o.observer = parse_observer(v); }},
        {"--student-hidden", [&] { o.student_hidden = integer(1, 4096); }},
        {"--student-steps", [&] { o.student_steps = integer(1, big); }},
        {"--temperature", [&] { o.temperature = real(0.0, 100.0, true); }},
        {"--alpha", [&] { o.alpha = real(0.0, 1.0); }},
        {"--lora-rank", [&] { o.lora_rank = integer(1, 4096); }},
        {"--lora-alpha", [&] { o.lora_alpha = real(0.0, 1e4, true); }},
        {"--lora-steps", [&] { o.lora_steps = integer(1, big); }},
        {"--lora-lr", [&] { o.lora_lr = number(0.0, 10.0, true); }},
        {"--shift-degrees", [&] { o.shift_degrees = number(-360.0, 360.0); }},
        {"--infer-batch", [&] { o.infer_batch = integer(1, 100'000); }},
        {"--threads", [&] { o.threads = integer(1, 1024); }},
        {"--repeats", [&] { o.repeats = integer(1, 100'000); }},
        {"--min-accuracy", [&] { o.min_accuracy = number(0.0, 100.0); }},
        {"--max-int8-drop", [&] { o.max_int8_drop = number(0.0, 100.0); }},
    };
    const auto* hit = std::find_if(std::begin(table), std::end(table),
                                   [&](const auto& e) { return e.first == f; });
    if (hit == std::end(table)) bad_flag("unknown flag '" + std::string(f) + "'");
    if (i + 1 >= argc) bad_flag("missing value after " + std::string(f));
    v = argv[++i];
    hit->second();
  }
  return o;
}

// ---- measuring ----

/// Logits of every sample of a split, `chunk` rows per call of net.forward.
template <class Net>
std::vector<float> logits_of(Net& net, const split& s, std::size_t features, std::size_t classes,
                             std::size_t chunk) {
  std::vector<float> logits(s.size() * classes);
  for (std::size_t start = 0; start < s.size(); start += chunk) {
    const std::size_t n = std::min(chunk, s.size() - start);
    net.forward(std::span<const float>(s.x).subspan(start * features, n * features), n,
                std::span<float>(logits).subspan(start * classes, n * classes));
  }
  return logits;
}

/// Share of the samples whose largest logit is their label's (ties: the lower class), in %.
double accuracy_of(std::span<const float> logits, const split& s, std::size_t classes) {
  std::size_t correct = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const float* z = logits.data() + i * classes;
    std::size_t best = 0;
    for (std::size_t c = 1; c < classes; ++c) best = z[c] > z[best] ? c : best;
    correct += best == static_cast<std::size_t>(s.y[i]) ? 1 : 0;
  }
  return 100.0 * static_cast<double>(correct) / static_cast<double>(s.size());
}

struct row {
  std::string variant, task;
  double accuracy = 0.0;       // %
  double reference = 0.0;      // the fp32 model's accuracy on the same task, %
  std::size_t bytes = 0;       // what the variant stores to run
  double samples_per_s = 0.0;  // inference
  std::string notes;
};

struct context {
  const options& o;
  std::size_t features, classes;
};

/// The variants' rows, and what times them: each variant's accuracy is measured when it is added;
/// the inference times at the end, interleaved (one pass of every variant, --repeats times), so
/// that a change in the machine's load reaches every variant alike; the median pass counts.
class variants {
 public:
  using forward_fn = std::function<void(std::span<const float>, std::size_t, std::span<float>)>;

  /// Keeps an inference network alive until the timing.
  engine_net& keep(engine_net net) {
    nets_.push_back(std::make_unique<engine_net>(std::move(net)));
    return *nets_.back();
  }
  /// Builds a T that lives as long as the table (what a timed variant refers to).
  template <class T, class... Args>
  T& own(Args&&... args) {
    auto p = std::make_shared<T>(std::forward<Args>(args)...);
    T& ref = *p;
    owned_.push_back(std::move(p));
    return ref;
  }
  /// Adds a variant (net must live until time_all); returns its row.
  template <class Net>
  row& add(const context& c, Net& net, const split& s, row r) {
    r.accuracy =
        accuracy_of(logits_of(net, s, c.features, c.classes, c.o.infer_batch), s, c.classes);
    rows_.push_back(std::move(r));
    runs_.push_back({[&net](std::span<const float> x, std::size_t m, std::span<float> y) {
                       net.forward(x, m, y);
                     },
                     &s});
    return rows_.back();
  }
  [[nodiscard]] const std::deque<row>& rows() const noexcept { return rows_; }

  /// samples_per_s of every row: the median over --repeats interleaved passes over its test set,
  /// after one untimed pass of each.
  void time_all(const context& c) {
    std::vector<std::vector<double>> t(runs_.size());
    for (std::size_t rep = 0; rep <= c.o.repeats; ++rep) {
      for (std::size_t i = 0; i < runs_.size(); ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        fn_net net{runs_[i].forward};
        (void)logits_of(net, *runs_[i].data, c.features, c.classes, c.o.infer_batch);
        const double sec =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rep > 0) t[i].push_back(sec);
      }
    }
    for (std::size_t i = 0; i < runs_.size(); ++i) {
      auto& v = t[i];
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
      rows_[i].samples_per_s = static_cast<double>(runs_[i].data->size()) / v[v.size() / 2];
    }
  }

 private:
  struct fn_net {
    forward_fn& forward_;
    void forward(std::span<const float> x, std::size_t m, std::span<float> y) { forward_(x, m, y); }
  };
  struct run {
    forward_fn forward;
    const split* data;
  };
  std::vector<std::unique_ptr<engine_net>> nets_;
  std::vector<std::shared_ptr<void>> owned_;
  std::deque<row> rows_;  // a deque: the references add() returns stay valid
  std::vector<run> runs_;
};

std::string format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

/// The table; speeds against the fp32 row (the first) and, when the build has OpenBLAS, against
/// the fp32 weights through cblas_sgemm too.
void print_table(const std::deque<row>& rows) {
  const row& fp32 = rows.front();
  const auto blas = std::find_if(rows.begin(), rows.end(),
                                 [](const row& r) { return r.variant == "fp32, OpenBLAS"; });
  const bool with_blas = blas != rows.end();
  std::printf(
      "\n| variant | test set | accuracy | vs fp32 | size | vs fp32 | samples/s | vs fp32 |%s "
      "notes |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |%s --- |\n",
      with_blas ? " vs OpenBLAS |" : "", with_blas ? " ---: |" : "");
  for (const row& r : rows) {
    const std::string vs_blas =
        with_blas ? format(" %.2fx |", r.samples_per_s / blas->samples_per_s) : std::string();
    std::printf("| %s | %s | %.1f%% | %+.1f | %.1f KiB | %.2fx | %.0f | %.2fx |%s %s |\n",
                r.variant.c_str(), r.task.c_str(), r.accuracy, r.accuracy - r.reference,
                static_cast<double>(r.bytes) / 1024.0,
                static_cast<double>(r.bytes) / static_cast<double>(fp32.bytes), r.samples_per_s,
                r.samples_per_s / fp32.samples_per_s, vs_blas.c_str(), r.notes.c_str());
  }
  // Said in words too: which variants ran slower than the references.
  const auto slower = [&](const row& ref, const char* what) {
    std::string list;
    for (const row& r : rows) {
      if (&r != &ref && r.samples_per_s < ref.samples_per_s) {
        list += format("%s%s (%s, %.2fx)", list.empty() ? "" : ", ", r.variant.c_str(),
                       r.task.c_str(), r.samples_per_s / ref.samples_per_s);
      }
    }
    std::printf("slower than %s: %s\n", what, list.empty() ? "none" : list.c_str());
  };
  std::printf("\n");
  slower(fp32, "the fp32 model's loops");
  if (with_blas) slower(*blas, "the fp32 weights through OpenBLAS");
}

// ---- checks ----

struct checks {
  int passed = 0, failed = 0;
  void expect(bool ok, const std::string& what) {
    std::printf("check %s: %s\n", ok ? "passed" : "FAILED", what.c_str());
    (ok ? passed : failed) += 1;
  }
};

/// The largest |a - b| (NaN when any difference is NaN, so that a tolerance check fails) and the
/// largest |b|.
std::pair<double, double> max_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0.0, m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(e) || std::isnan(d)) {
      d = std::numeric_limits<double>::quiet_NaN();
    } else {
      d = std::max(d, e);
    }
    m = std::max(m, std::fabs(static_cast<double>(b[i])));
  }
  return {d, m};
}

// ---- the variants ----

/// The trained model as hone's post-training quantization hook (hone/compress/ptq.hpp): its linear
/// layers (fc1, fc2, ...) and the fp32 inference network's forward pass, which reports every
/// layer's input (layer 0 reads x; the others' inputs stay in the network after a call).
struct ptq_hook {
  const dense_mlp& net;
  engine_net& fp32;
  std::vector<float> logits;

  [[nodiscard]] std::vector<hc::quantizable_layer> quantizable_layers() const {
    std::vector<hc::quantizable_layer> v;
    for (std::size_t l = 0; l < net.layers.size(); ++l) {
      const linear_layer& p = net.layers[l];
      v.push_back({"fc" + std::to_string(l + 1), p.w, p.b, p.out, p.in});
    }
    return v;
  }
  void calibration_forward(std::span<const float> x, std::size_t rows,
                           const hc::layer_input_hook& hook) {
    logits.resize(rows * fp32.classes());
    fp32.forward(x, rows, logits);
    hook(0, x, rows);
    for (std::size_t l = 1; l < fp32.size(); ++l) hook(l, fp32.input_of(l), rows);
  }
};
static_assert(hc::check_ptq_model<ptq_hook>());

/// The calibration split in batches of --infer-batch rows (the calls the fp32 network serves).
std::vector<std::span<const float>> calibration_batches(const context& c, const split& s) {
  std::vector<std::span<const float>> batches;
  for (std::size_t start = 0; start < s.size(); start += c.o.infer_batch) {
    const std::size_t n = std::min(c.o.infer_batch, s.size() - start);
    batches.push_back(std::span<const float>(s.x).subspan(start * c.features, n * c.features));
  }
  return batches;
}

hc::ptq_observer ptq_observer_of(observer_kind k) {
  return k == observer_kind::minmax       ? hc::ptq_observer::minmax
         : k == observer_kind::percentile ? hc::ptq_observer::percentile
                                          : hc::ptq_observer::mse;
}

const char* observer_name(observer_kind k) {
  return k == observer_kind::minmax       ? "minmax"
         : k == observer_kind::percentile ? "percentile"
                                          : "mse";
}

/// The spiral with every point rotated by `degrees` about the origin (in standardized
/// coordinates): the shifted task of the LoRA variant. Its own dataset seed, so its samples are
/// new.
train_mlp::dataset rotated_spiral(double degrees) {
  train_mlp::dataset d = train_mlp::make_spiral({.seed = 2025});
  const double a = degrees * std::numbers::pi / 180.0, ca = std::cos(a), sa = std::sin(a);
  for (split* s : {&d.train, &d.validation, &d.test}) {
    for (std::size_t i = 0; i < s->size(); ++i) {
      const double x = s->x[2 * i], y = s->x[2 * i + 1];
      s->x[2 * i] = static_cast<float>(ca * x - sa * y);
      s->x[2 * i + 1] = static_cast<float>(sa * x + ca * y);
    }
  }
  return d;
}

auto no_setup = [](auto&) {};

/// What every variant starts from.
struct stage {
  const context& c;
  const train_mlp::dataset& data;
  const dense_mlp& base;  // the trained fp32 model
  engine_net& fp32;       // and its inference network
  double fp32_acc;
  variants& table;
  checks& check;
};

/// Structured pruning of --prune-fraction of each hidden layer, then fine-tuning on the smaller
/// model.
void structured_variant(const stage& s) {
  const options& o = s.c.o;
  const train_mlp::dataset& data = s.data;
  const std::size_t features = s.c.features;
  const std::size_t classes = s.c.classes;
  const dense_mlp& base = s.base;
  const double fp32_acc = s.fp32_acc;
  const context& c = s.c;
  variants& table = s.table;
  checks& check = s.check;
  dense_mlp pruned = base;
  hc::prune_neurons(pruned, o.prune_fraction);
  const auto drop =
      static_cast<std::size_t>(std::floor(o.prune_fraction * static_cast<double>(o.hidden)));
  const std::size_t h = std::max<std::size_t>(o.hidden - drop, 1);
  const std::vector<std::size_t> want{features, h, h, classes};
  const std::size_t want_params = features * h + h + h * h + h + h * classes + classes;
  check.expect(
      pruned.widths() == want && pruned.parameter_count() == want_params,
      format("structured: the hidden layers shrank from %zu to %zu neurons (%zu -> %zu "
             "parameters)",
             o.hidden, pruned.layers[0].out, base.parameter_count(), pruned.parameter_count()));
  engine_net before = fp32_net(pruned);
  const double acc_before = accuracy_of(
      logits_of(before, data.test, features, classes, o.infer_batch), data.test, classes);
  train_mlp::mlp<float> small(features, pruned.layers[0].out, classes, o.seed);
  to_trained(pruned, small.parameters());
  shuffled_batches b(data.train, features, o.batch, o.seed + 1);
  const auto next = [&] { return b.next().plain(); };
  train(small, {o.finetune_steps, o.finetune_lr}, next, no_setup);
  engine_net& net = table.keep(fp32_net(from_trained(small.parameters())));
  table.add(c, net, data.test,
            {.variant = format("structured %.0f%%", 100 * o.prune_fraction),
             .task = "spiral",
             .reference = fp32_acc,
             .bytes = net.bytes(),
             .notes = format("hidden %zu -> %zu; %.1f%% before %llu fine-tuning steps", o.hidden, h,
                             acc_before, static_cast<unsigned long long>(o.finetune_steps))});
}

/// 2:4 sparsity on the layers whose inputs come in groups of 4, fine-tuned with the masks held.
void sparse24_variant(const stage& s) {
  const options& o = s.c.o;
  const train_mlp::dataset& data = s.data;
  const std::size_t features = s.c.features;
  const std::size_t classes = s.c.classes;
  const dense_mlp& base = s.base;
  const double fp32_acc = s.fp32_acc;
  const context& c = s.c;
  variants& table = s.table;
  checks& check = s.check;
  std::vector<bool> sparse(base.layers.size());
  for (std::size_t l = 0; l < base.layers.size(); ++l) sparse[l] = base.layers[l].in % 4 == 0;
  const auto prunable = [&](std::string_view name) {
    for (std::size_t l = 0; l < base.layers.size(); ++l) {
      if (sparse[l] && name == "fc" + std::to_string(l + 1) + ".weight") return true;
    }
    return false;
  };
  train_mlp::mlp<float> m24(features, o.hidden, classes, o.seed);
  to_trained(base, m24.parameters());
  // The masks: sparse24_matrix::prune's choice (2 of 4 by magnitude) on the trained weights,
  // written into a mask_arena over the trainer's layout (W [in, out] there) and held by the
  // magnitude_pruning policy, whose schedule never prunes more (target 0).
  const auto hold_masks = [&](auto& t) {
    hc::mask_arena masks(t.layout(), prunable);
    for (std::size_t l = 0; l < base.layers.size(); ++l) {
      if (!sparse[l]) continue;
      const linear_layer& L = base.layers[l];
      const auto w24 = hc::sparse24_matrix::prune(L.w, L.out, L.in);
      const std::span<std::uint8_t> keep =
          masks.tensor(t.layout().find("fc" + std::to_string(l + 1) + ".weight"));
      std::fill(keep.begin(), keep.end(), std::uint8_t{0});
      for (std::size_t r = 0; r < L.out; ++r) {
        for (std::size_t g = 0; g < L.in / 4; ++g) {
          const auto [i0, i1] = w24.group_positions(r, g);
          keep[(4 * g + static_cast<std::size_t>(i0)) * L.out + r] = 1;
          keep[(4 * g + static_cast<std::size_t>(i1)) * L.out + r] = 1;
        }
      }
    }
    t.weight_constraint().restore(std::move(masks), 0.5);
    t.weight_constraint().masks().apply(t.master_weights());  // zero before the first step
  };
  shuffled_batches b(data.train, features, o.batch, o.seed + 2);
  const auto next = [&] { return b.next().plain(); };
  train(m24, {o.finetune_steps, o.finetune_lr}, next, hold_masks,
        hc::magnitude_pruning({.schedule = {.initial = 0.0, .target = 0.0},
                               .scope = hc::prune_scope::per_tensor,
                               .prunable = prunable}));
  const dense_mlp tuned = from_trained(m24.parameters());
  engine_net sparse_net, twin;  // twin: the same weights as dense fp32 layers
  std::string layers;
  bool pattern = true, lossless = true;
  std::size_t groups = 0;
  for (std::size_t l = 0; l < tuned.layers.size(); ++l) {
    const linear_layer& L = tuned.layers[l];
    twin.add(std::make_unique<fp32_linear>(L));
    if (!sparse[l]) {
      sparse_net.add(std::make_unique<fp32_linear>(L));
      continue;
    }
    auto w24 = hc::sparse24_matrix::pack(L.w, L.out, L.in);  // refuses 3 or 4 nonzeros in a group
    const std::vector<float> dense = w24.to_dense();
    lossless = lossless && std::memcmp(dense.data(), L.w.data(), dense.size() * sizeof(float)) == 0;
    for (std::size_t r = 0; r < L.out; ++r) {
      for (std::size_t g = 0; g < L.in / 4; ++g, ++groups) {
        int zeros = 0;
        for (std::size_t k = 0; k < 4; ++k) zeros += dense[r * L.in + 4 * g + k] == 0.0f ? 1 : 0;
        pattern = pattern && zeros >= 2;
      }
    }
    layers += (layers.empty() ? "fc" : ", fc") + std::to_string(l + 1);
    sparse_net.add(std::make_unique<sparse24_linear>(std::move(w24), L.b));
  }
  check.expect(pattern && lossless && groups > 0,
               format("2:4: all %zu groups of 4 weights in %s hold at least 2 zeros after "
                      "fine-tuning, and the packed matrices unpack to the same bits",
                      groups, layers.c_str()));
  engine_net& net = table.keep(std::move(sparse_net));
  const auto y = logits_of(net, data.test, features, classes, o.infer_batch);
  const auto y_dense = logits_of(twin, data.test, features, classes, o.infer_batch);
  const auto [d, m] = max_diff(y, y_dense);
  check.expect(d <= 1e-5 * m,
               format("2:4: sparse24_matmul's logits match dense fp32 layers holding the same "
                      "weights: max |diff| %.3g <= 1e-5 * max |logit| (%.3g)",
                      d, m));
  table.add(c, net, data.test,
            {.variant = "2:4 sparse",
             .task = "spiral",
             .reference = fp32_acc,
             .bytes = net.bytes(),
             .notes = format("%s 2:4, fc1 fp32 (2 inputs); %llu fine-tuning steps with the "
                             "masks held",
                             layers.c_str(), static_cast<unsigned long long>(o.finetune_steps))});
}

/// int8: post-training static quantization, and dynamic.
void int8_variants(const stage& s) {
  const options& o = s.c.o;
  const train_mlp::dataset& data = s.data;
  const dense_mlp& base = s.base;
  engine_net& fp32 = s.fp32;
  const double fp32_acc = s.fp32_acc;
  const context& c = s.c;
  variants& table = s.table;
  checks& check = s.check;
  // hone::compress::post_training_quantize walks the layers through the hook: static int8
  // calibrated on the training split, and dynamic int8 (no calibration).
  ptq_hook model{base, fp32, {}};
  hc::quantized_model qs = hc::post_training_quantize(model, calibration_batches(c, data.train),
                                                      {.observer = ptq_observer_of(o.observer)});
  hc::quantized_model qd = hc::post_training_quantize(model, std::vector<std::span<const float>>{},
                                                      {.mode = hc::ptq_mode::dynamic_int8});
  engine_net st, dyn;
  for (std::size_t l = 0; l < base.layers.size(); ++l) {
    st.add(std::make_unique<ptq_int8>(std::move(qs.layer(l))));
    dyn.add(std::make_unique<ptq_int8>(std::move(qd.layer(l))));
  }
  engine_net& st_net = table.keep(std::move(st));
  engine_net& dyn_net = table.keep(std::move(dyn));
  const row* int8_rows[] = {
      &table.add(c, st_net, data.test,
                 {.variant = "int8 static (PTQ)",
                  .task = "spiral",
                  .reference = fp32_acc,
                  .bytes = st_net.bytes(),
                  .notes = format("int8 weights per row; uint8 activations, %s calibration on "
                                  "the %zu training samples",
                                  observer_name(o.observer), data.train.size())}),
      &table.add(c, dyn_net, data.test,
                 {.variant = "int8 dynamic",
                  .task = "spiral",
                  .reference = fp32_acc,
                  .bytes = dyn_net.bytes(),
                  .notes = "int8 weights per row; uint8 activations, range per row at run time"})};
  for (const row* r : int8_rows) {
    check.expect(r->accuracy >= fp32_acc - o.max_int8_drop,
                 format("%s: accuracy %.1f%% is within %.2f points of fp32 (%.1f%%)",
                        r->variant.c_str(), r->accuracy, o.max_int8_drop, fp32_acc));
  }
}

/// Distillation into a narrower student, and the same student without a teacher.
void student_variants(const stage& s) {
  const options& o = s.c.o;
  const train_mlp::dataset& data = s.data;
  const std::size_t features = s.c.features;
  const std::size_t classes = s.c.classes;
  engine_net& fp32 = s.fp32;
  const double fp32_acc = s.fp32_acc;
  const context& c = s.c;
  variants& table = s.table;
  const std::vector<float> teacher = logits_of(fp32, data.train, features, classes, o.infer_batch);
  for (const float alpha : {o.alpha, 0.0f}) {
    student_mlp student(features, o.student_hidden, classes, o.seed,
                        {.temperature = o.temperature, .alpha = alpha});
    shuffled_batches b(data.train, features, o.batch, o.seed + 3, teacher, classes);
    const auto next = [&] { return b.next(); };
    train(student, {o.student_steps, o.lr}, next, no_setup);
    engine_net& net = table.keep(fp32_net(from_trained(student.parameters())));
    const bool distilled = alpha > 0.0f;
    table.add(
        c, net, data.test,
        {.variant = distilled ? "student, distilled" : "student, labels only",
         .task = "spiral",
         .reference = fp32_acc,
         .bytes = net.bytes(),
         .notes = distilled ? format("hidden %zu; T = %g, alpha = %g, %llu steps", o.student_hidden,
                                     static_cast<double>(o.temperature), static_cast<double>(alpha),
                                     static_cast<unsigned long long>(o.student_steps))
                            : format("hidden %zu; cross-entropy only, same steps, no teacher",
                                     o.student_hidden)});
  }
}

/// LoRA adapters trained on the shifted task: base, unmerged and merged rows.
void lora_variants(const stage& s, const train_mlp::dataset& shifted) {
  const options& o = s.c.o;
  const std::size_t features = s.c.features;
  const std::size_t classes = s.c.classes;
  const dense_mlp& base = s.base;
  engine_net& fp32 = s.fp32;
  const context& c = s.c;
  variants& table = s.table;
  checks& check = s.check;
  const std::string task = format("rotated %g deg", o.shift_degrees);
  row& base_row = table.add(c, fp32, shifted.test,
                            {.variant = "fp32, no adapter",
                             .task = task,
                             .bytes = fp32.bytes(),
                             .notes = "the fp32 model as trained on the spiral"});
  const double base_acc = base_row.accuracy;
  base_row.reference = base_acc;
  // The adapters' base weights (merge() writes into them) and the adapted network, owned by the
  // table: the unmerged row is timed at the end.
  dense_mlp& adapted = table.own<dense_mlp>(base);
  lora_mlp& lora_net = table.own<lora_mlp>(adapted, hc::lora_options{.r = o.lora_rank,
                                                                     .alpha = o.lora_alpha,
                                                                     .dropout = 0.0f,
                                                                     .use_rslora = false,
                                                                     .seed = o.seed});
  {
    shuffled_batches b(shifted.train, features, o.batch, o.seed + 4);
    const auto next = [&] { return b.next().plain(); };
    train(lora_net, {o.lora_steps, o.lora_lr}, next, no_setup);
    lora_net.lora().eval();
    std::size_t adapter_bytes = 0;
    for (const auto& p : lora_net.parameters()) adapter_bytes += p.value.size() * sizeof(float);
    const auto notes =
        format("r %zu, alpha %g on fc1-fc3 (%zu adapter parameters), %llu steps", o.lora_rank,
               static_cast<double>(o.lora_alpha), adapter_bytes / sizeof(float),
               static_cast<unsigned long long>(o.lora_steps));
    table.add(c, lora_net, shifted.test,
              {.variant = "LoRA, unmerged",
               .task = task,
               .reference = base_acc,
               .bytes = fp32.bytes() + adapter_bytes,
               .notes = notes + "; base + adapter, lora_model::forward"});
    const std::vector<float> y_adapter =
        logits_of(lora_net, shifted.test, features, classes, o.infer_batch);
    std::vector<std::vector<float>> before;
    for (const linear_layer& L : adapted.layers) before.push_back(L.w);
    lora_net.lora().merge();
    engine_net& merged = table.keep(fp32_net(adapted));
    const row& merged_row = table.add(c, merged, shifted.test,
                                      {.variant = "LoRA, merged",
                                       .task = task,
                                       .reference = base_acc,
                                       .bytes = merged.bytes(),
                                       .notes = notes + "; W += (alpha / r) B A, fp32 engine"});
    const auto y_merged = logits_of(merged, shifted.test, features, classes, o.infer_batch);
    const auto [d, m] = max_diff(y_merged, y_adapter);
    check.expect(d <= 1e-5 * m,
                 format("LoRA: the merged model's logits match base + adapter: max |diff| %.3g <= "
                        "1e-5 * max |logit| (%.3g)",
                        d, m));
    lora_net.lora().unmerge();  // the unmerged row is timed below: base + adapter again
    bool same = true;
    for (std::size_t l = 0; l < adapted.layers.size(); ++l) {
      same = same && std::memcmp(before[l].data(), adapted.layers[l].w.data(),
                                 before[l].size() * sizeof(float)) == 0;
    }
    const std::vector<float> y_again =
        logits_of(lora_net, shifted.test, features, classes, o.infer_batch);
    same =
        same && std::memcmp(y_again.data(), y_adapter.data(), y_again.size() * sizeof(float)) == 0;
    check.expect(same,
                 "LoRA: unmerge() restores every base weight bit for bit, and base + adapter "
                 "gives the same logits bit for bit as before merge()");
    check.expect(merged_row.accuracy > base_acc,
                 format("LoRA: the shifted task's accuracy rose from %.1f%% to %.1f%%", base_acc,
                        merged_row.accuracy));
  }
}

int run(const options& o) {
  const train_mlp::dataset data = train_mlp::make_spiral({});
  const train_mlp::dataset shifted = rotated_spiral(o.shift_degrees);
  const context c{o, data.features, data.classes};
  const std::size_t classes = data.classes, features = data.features;
  std::printf(
      "compress_mlp: spiral of %zu arms (train %zu, test %zu); %zu oneTBB thread(s); "
      "inference in calls of %zu rows, median of %zu interleaved passes; int8 kernel %s\n",
      classes, data.train.size(), data.test.size(), o.threads, o.infer_batch, o.repeats,
      hc::int8_kernel_name(hc::best_int8_kernel()));
  variants table;
  checks check;
  const auto t_start = std::chrono::steady_clock::now();

  // ---- fp32: train_mlp's model and recipe ----
  train_mlp::mlp<float> model(features, o.hidden, classes, o.seed);
  {
    shuffled_batches b(data.train, features, o.batch, o.seed);
    const auto next = [&] { return b.next().plain(); };
    train(model, {o.steps, o.lr}, next, no_setup);
  }
  const dense_mlp base = from_trained(model.parameters());
  engine_net& fp32 = table.keep(fp32_net(base));
  row& fp32_row = table.add(
      c, fp32, data.test,
      {.variant = "fp32",
       .task = "spiral",
       .bytes = fp32.bytes(),
       .notes = format("%zu-%zu-%zu-%zu, %zu parameters, %llu steps", features, o.hidden, o.hidden,
                       classes, base.parameter_count(), static_cast<unsigned long long>(o.steps))});
  const double fp32_acc = fp32_row.accuracy;
  fp32_row.reference = fp32_acc;
  std::printf("fp32 model trained: %.1f%% test accuracy\n", fp32_acc);
#if COMPRESS_MLP_OPENBLAS
  {  // the same weights through a tuned fp32 GEMM: how much of a speed-up is the kernel alone
    engine_net blas;
    for (const linear_layer& l : base.layers) blas.add(std::make_unique<blas_linear>(l));
    engine_net& net = table.keep(std::move(blas));
    table.add(c, net, data.test,
              {.variant = "fp32, OpenBLAS",
               .task = "spiral",
               .reference = fp32_acc,
               .bytes = net.bytes(),
               .notes = "the fp32 weights through cblas_sgemm"});
  }
#endif

  const stage s{c, data, base, fp32, fp32_acc, table, check};
  structured_variant(s);
  sparse24_variant(s);
  int8_variants(s);
  student_variants(s);
  lora_variants(s, shifted);
  if (o.min_accuracy) {
    check.expect(
        fp32_acc >= *o.min_accuracy,
        format("fp32: test accuracy %.1f%% reaches --min-accuracy %g", fp32_acc, *o.min_accuracy));
  }

  std::printf("trained, compressed and checked in %.1f s; timing inference...\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
  table.time_all(c);
  print_table(table.rows());
  if (check.failed > 0) {
    std::printf("%d of %d checks FAILED\n", check.failed, check.passed + check.failed);
    return 3;
  }
  std::printf("all %d checks passed\n", check.passed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse_flags(argc, argv);
#if COMPRESS_MLP_OPENBLAS
  openblas_set_num_threads(static_cast<int>(o.threads));  // its own threads, not oneTBB's
#endif
  try {
    tbb::task_arena arena(static_cast<int>(o.threads));
    return arena.execute([&] { return run(o); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compress_mlp: %s\n", e.what());
    return 1;
  }
}
