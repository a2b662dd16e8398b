// train_mlp: hone's flagship example. A hand-written MLP (mlp.hpp) learns a 5-armed spiral
// (dataset.hpp) with every technique of hone's trainer composed at compile time:
//
//   hone::trainer t(model,
//                   hone::bf16_mixed{},              // or fp32 / fp16_mixed<> (--precision)
//                   hone::accumulate::by_count{},    // --accumulate micro-batches per step
//                   hone::adamw{.weight_decay = 0.01f},
//                   hone::clip_grad_norm{.max_norm = 1.0f},
//                   hone::one_cycle{.max_lr = lr, .total_steps = steps});
//
// plus parameter groups (no weight decay on biases) and early stopping on the validation loss
// with the best weights restored at the end. The training set is read from a CSV file (the
// spiral's training split written to OUT/spiral_train.csv, or --train-csv) through
// hone::data::loader: a lazy line_dataset, a shuffled order per epoch, batches assembled ahead of
// the step on a oneTBB thread. The precision is a runtime flag, the model's element
// type a template parameter: main() dispatches to one of three instantiations of train<>().
//
// --device picks where: the CPU model above (xtensor, mlp.hpp), or, in a build with CUDA
// (HONE_ENABLE_CUDA), the same MLP on the GPU (mlp_cuda.cuh: cuBLAS GEMMs and small CUDA kernels,
// same initial weights from the same seed) trained by hone::trainer's CUDA implementation with
// the same policies (train_cuda() below; train_cuda.cu instantiates it, cuda_trainer.hpp is its
// plain C++ face, so this file stays a host file). auto picks the GPU when one is visible.
//
// With --checkpoint-dir (CPU path only, for now) it saves checkpoints (hone::checkpoint: atomic
// step-N directories, sync or --checkpoint-async, --keep N) holding the weights, the AdamW moments,
// the step, the loss scaler, the early-stopping state with its best weights, and the loader's
// state (seed, epoch, position), so --resume continues bit for bit where the newest valid
// checkpoint left off.
//
// With --ddp or --zero 1|2 (CPU path, a build with MPI) it trains data-parallel under mpirun:
// hone::data_parallel or hone::zero<1|2> over hone::dist::mpi_comm, each rank on its share of every
// step's samples, rank 0 writing the outputs (distributed.hpp says how).
//
// Writes DIR/metrics.csv (one row per step) and DIR/curves.png (loss and accuracy curves), and
// prints "final test accuracy: XX.XX%". Exit status: 0 done, 1 runtime error, 2 bad flags,
// 3 final accuracy below --min-accuracy, 77 --device cuda without a visible CUDA device (CTest's
// "skipped").
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <hone/checkpoint/directory.hpp>
#include <hone/checkpoint/trainer_checkpoint.hpp>
#include <hone/checkpoint/writer.hpp>
#include <hone/core/error.hpp>
#include <hone/data/line_dataset.hpp>
#include <hone/data/loader.hpp>
#include <hone/dist/data_parallel.hpp>
#include <hone/dist/local_comm.hpp>
#include <hone/io/file_io.hpp>
#include <hone/io/hash.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/optim/param_group.hpp>
#include <hone/precision/policies.hpp>
#include <hone/profile/phase_timer.hpp>
#include <hone/profile/trace.hpp>
#include <hone/profile/zone.hpp>
#include <hone/schedule/one_cycle.hpp>
#include <hone/train/accumulate.hpp>
#include <hone/train/early_stopping.hpp>
#include <hone/train/trainer.hpp>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "common/chart.hpp"
#include "common/png.hpp"
#include "common/progress.hpp"
#include "dataset.hpp"
#include "distributed.hpp"
#include "mlp.hpp"
#if TRAIN_MLP_WITH_CUDA
#include "cuda_trainer.hpp"  // the CUDA path (train_cuda.cu), built with HONE_ENABLE_CUDA
#endif

namespace {

enum class precision_kind { fp32, bf16, fp16 };
enum class device_kind { cpu, cuda, automatic };

struct options {
  precision_kind precision = precision_kind::bf16;
  std::size_t accumulate = 3;
  std::size_t batch = 128;
  std::uint64_t steps = 600;
  double lr = 0.05;
  std::uint64_t eval_every = 25;
  std::uint64_t patience = 8;
  std::size_t hidden = 64;
  std::uint64_t seed = 1;
  device_kind device = device_kind::automatic;
  std::string device_reason;  // why --device auto chose the CPU (set by main)
  std::filesystem::path out = "train_mlp_out";
  std::optional<double> min_accuracy;  // percent
  std::optional<std::filesystem::path> checkpoint_dir;
  std::uint64_t checkpoint_every = 100;
  std::size_t keep = 0;  // 0: keep every checkpoint
  bool checkpoint_async = false;
  bool resume = false;
  std::optional<std::uint64_t> stop_after;         // testing --resume: stop as if interrupted
  std::optional<std::filesystem::path> trace;      // a Perfetto trace of the run (CPU path)
  std::optional<std::filesystem::path> train_csv;  // the training set (default: written to out)
  bool ddp = false;                                // --ddp
  int zero_stage = 0;                              // --zero 1|2 (0: not given)
  train_mlp::parallel_mode parallel = train_mlp::parallel_mode::none;
};

constexpr const char* usage_text =
    "usage: train_mlp [flags]\n"
    "  --precision fp32|bf16|fp16  working precision of weights and gradients (default bf16)\n"
    "  --accumulate N              micro-batches per optimizer step, 1..batch (default 3)\n"
    "  --batch N                   samples per optimizer step, 1..4000 (default 128)\n"
    "  --steps N                   training steps = OneCycle length (default 600)\n"
    "  --lr X                      peak learning rate of the OneCycle schedule (default 0.05)\n"
    "  --eval-every N              validate every N updates (default 25)\n"
    "  --patience N                early stopping: validations without improvement (default 8)\n"
    "  --hidden N                  width of the two hidden layers (default 64)\n"
    "  --seed N                    seed of the initial weights and the batch order (default 1)\n"
    "  --device cpu|cuda|auto      where to train (default auto: cuda if this build has it and\n"
    "                              a GPU is visible, and no checkpoints are asked for)\n"
    "  --out DIR                   where metrics.csv and curves.png go (default train_mlp_out)\n"
    "  --min-accuracy X            exit with status 3 if the final test accuracy (%) is below X\n"
    "  --checkpoint-dir DIR        save checkpoints under DIR (DIR/step-000000100, ...)\n"
    "  --checkpoint-every N        steps between checkpoints (default 100; the last step too)\n"
    "  --keep N                    keep the newest N checkpoints (default 0: all)\n"
    "  --checkpoint-async          write checkpoints in the background while training goes on\n"
    "  --resume                    continue from the newest valid checkpoint in --checkpoint-dir\n"
    "  --stop-after N              stop after step N without a final checkpoint, as if killed\n"
    "                              (to test --resume)\n"
    "  --train-csv FILE            read the training set from this CSV file (x0,x1,label per\n"
    "                              line; default: the spiral's training split, written to\n"
    "                              OUT/spiral_train.csv)\n"
    "  --trace FILE                write a Perfetto trace of the run (CPU path: the trainer's\n"
    "                              phases, the batches, validations and checkpoint saves; open\n"
    "                              it in ui.perfetto.dev)\n"
    "  --ddp                       data parallel under mpirun (hone::data_parallel): each rank\n"
    "                              trains on its share of every step's --batch samples\n"
    "  --zero 1|2                  the same with ZeRO stage 1 (AdamW moments sharded over the\n"
    "                              ranks) or 2 (also the master gradients); CPU path, no\n"
    "                              checkpoints; e.g. mpirun -np 2 train_mlp --zero 2\n"
    "  --help                      print this text\n";

[[noreturn]] void bad_flag(const std::string& why) {
  std::fprintf(stderr, "train_mlp: %s\nrun 'train_mlp --help' for the list of flags\n",
               why.c_str());
  std::exit(2);
}

std::uint64_t parse_integer(std::string_view flag, std::string_view text, std::uint64_t lo,
                            std::uint64_t hi) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size() || v < lo || v > hi) {
    bad_flag(std::string(flag) + " needs an integer in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "], got '" + std::string(text) + "'");
  }
  return v;
}

double parse_number(std::string_view flag, const char* text, double lo, double hi,
                    bool lo_inclusive) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  const bool above_lo = lo_inclusive ? v >= lo : v > lo;
  if (end == text || *end != '\0' || !std::isfinite(v) || !above_lo || v > hi) {
    char range[96];
    std::snprintf(range, sizeof(range), "%s%g, %g]", lo_inclusive ? "[" : "(", lo, hi);
    bad_flag(std::string(flag) + " needs a number in " + range + ", got '" + text + "'");
  }
  return v;
}

/// --ddp and --zero: one of them, on the CPU path, without checkpoints, in a build with MPI.
void check_parallel_flags(options& o) {
  if (o.ddp && o.zero_stage != 0) {
    bad_flag("--ddp and --zero " + std::to_string(o.zero_stage) +
             " cannot be combined: --ddp keeps the whole optimizer state on every rank, --zero "
             "shards it over the ranks; give one of them");
  }
  o.parallel = o.ddp               ? train_mlp::parallel_mode::ddp
               : o.zero_stage == 1 ? train_mlp::parallel_mode::zero1
                                   : train_mlp::parallel_mode::zero2;
  const std::string flag = train_mlp::parallel_flag(o.parallel);
#if !TRAIN_MLP_WITH_MPI
  bad_flag(flag +
           " is not available: this build of train_mlp has no MPI (install an MPI implementation, "
           "e.g. Open MPI's libopenmpi-dev, and configure hone again with -DHONE_ENABLE_MPI=ON)");
#endif
  if (o.device == device_kind::cuda) {
    bad_flag(flag +
             " works only with --device cpu: hone::data_parallel and hone::zero train the host "
             "model here, over MPI; use --device cpu (or auto, which picks the CPU with " +
             flag + ")");
  }
  if (o.checkpoint_dir) {
    bad_flag("--checkpoint-dir cannot be combined with " + flag +
             " in this example yet: its checkpoints are written and resumed by one process; "
             "train without --checkpoint-dir, or in one process");
  }
}

options parse_flags(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    }
    if (!flag.starts_with("--")) bad_flag("unexpected argument '" + std::string(flag) + "'");
    if (flag == "--checkpoint-async") {
      o.checkpoint_async = true;
      continue;
    }
    if (flag == "--resume") {
      o.resume = true;
      continue;
    }
    if (flag == "--ddp") {
      o.ddp = true;
      continue;
    }
    static constexpr std::string_view known[] = {"--precision",
                                                 "--accumulate",
                                                 "--batch",
                                                 "--steps",
                                                 "--lr",
                                                 "--eval-every",
                                                 "--patience",
                                                 "--hidden",
                                                 "--seed",
                                                 "--device",
                                                 "--out",
                                                 "--min-accuracy",
                                                 "--checkpoint-dir",
                                                 "--checkpoint-every",
                                                 "--keep",
                                                 "--stop-after",
                                                 "--trace",
                                                 "--train-csv",
                                                 "--zero"};
    if (std::find(std::begin(known), std::end(known), flag) == std::end(known)) {
      bad_flag("unknown flag '" + std::string(flag) + "'");
    }
    if (i + 1 >= argc) bad_flag("missing value after " + std::string(flag));
    const char* value = argv[++i];
    const std::string_view v = value;
    if (flag == "--precision") {
      if (v == "fp32") {
        o.precision = precision_kind::fp32;
      } else if (v == "bf16") {
        o.precision = precision_kind::bf16;
      } else if (v == "fp16") {
        o.precision = precision_kind::fp16;
      } else {
        bad_flag("--precision must be fp32, bf16 or fp16, got '" + std::string(v) + "'");
      }
    } else if (flag == "--accumulate") {
      o.accumulate = parse_integer(flag, v, 1, 4096);
    } else if (flag == "--batch") {
      const train_mlp::spiral_options data;  // the training split's size bounds the batch
      o.batch = parse_integer(flag, v, 1, data.samples - data.validation - data.test);
    } else if (flag == "--steps") {
      o.steps = parse_integer(flag, v, 1, 10'000'000);
    } else if (flag == "--lr") {
      o.lr = parse_number(flag, value, 0.0, 10.0, false);
    } else if (flag == "--eval-every") {
      o.eval_every = parse_integer(flag, v, 1, 10'000'000);
    } else if (flag == "--patience") {
      o.patience = parse_integer(flag, v, 0, 1'000'000);
    } else if (flag == "--hidden") {
      o.hidden = parse_integer(flag, v, 1, 4096);
    } else if (flag == "--seed") {
      o.seed = parse_integer(flag, v, 0, std::numeric_limits<std::uint64_t>::max());
    } else if (flag == "--device") {
      if (v == "cpu") {
        o.device = device_kind::cpu;
      } else if (v == "cuda") {
        o.device = device_kind::cuda;
      } else if (v == "auto") {
        o.device = device_kind::automatic;
      } else {
        bad_flag("--device must be cpu, cuda or auto, got '" + std::string(v) + "'");
      }
    } else if (flag == "--out") {
      if (v.empty()) bad_flag("--out needs a directory name, got ''");
      o.out = value;
    } else if (flag == "--min-accuracy") {
      o.min_accuracy = parse_number(flag, value, 0.0, 100.0, true);
    } else if (flag == "--checkpoint-dir") {
      if (v.empty()) bad_flag("--checkpoint-dir needs a directory name, got ''");
      o.checkpoint_dir = value;
    } else if (flag == "--checkpoint-every") {
      o.checkpoint_every = parse_integer(flag, v, 1, 10'000'000);
    } else if (flag == "--keep") {
      o.keep = parse_integer(flag, v, 0, 1'000'000);
    } else if (flag == "--stop-after") {
      o.stop_after = parse_integer(flag, v, 1, 10'000'000);
    } else if (flag == "--train-csv") {
      if (v.empty()) bad_flag("--train-csv needs a file name, got ''");
      o.train_csv = value;
    } else if (flag == "--zero") {
      if (v != "1" && v != "2") {
        bad_flag("--zero must be 1 or 2 (the ZeRO stage), got '" + std::string(v) + "'");
      }
      o.zero_stage = v == "1" ? 1 : 2;
    } else if (flag == "--trace") {
      if (v.empty()) bad_flag("--trace needs a file name, got ''");
      o.trace = value;
    }
  }
  if (!o.checkpoint_dir && (o.resume || o.checkpoint_async)) {
    bad_flag(std::string(o.resume ? "--resume" : "--checkpoint-async") +
             " needs --checkpoint-dir DIR");
  }
  if (o.accumulate > o.batch) {
    bad_flag("--accumulate " + std::to_string(o.accumulate) + " is more than --batch " +
             std::to_string(o.batch) + ": every micro-batch needs at least one sample");
  }
  if (o.ddp || o.zero_stage != 0) check_parallel_flags(o);
#if TRAIN_MLP_WITH_CUDA
  if (o.device == device_kind::cuda && o.checkpoint_dir) {
    // hone's checkpoint helpers read the trainer's state from host memory; the CUDA path keeps
    // it on the device. Say so rather than train without the checkpoints asked for.
    bad_flag(
        "--checkpoint-dir works only with --device cpu for now: hone's checkpoint helpers read "
        "host memory, and the CUDA path keeps its weights and optimizer state on the GPU. Use "
        "--device cpu (or auto, which picks the CPU when checkpointing).");
  }
#else
  if (o.device == device_kind::cuda) {
    // Say so rather than fall back to the CPU silently.
    bad_flag(
        "--device cuda is not available: this build of train_mlp has no CUDA (configure hone "
        "with -DHONE_ENABLE_CUDA=ON, which needs the CUDA toolkit). Use --device cpu (or auto).");
  }
#endif
  return o;
}

const char* precision_name(precision_kind p) {
  switch (p) {
    case precision_kind::fp32:
      return "fp32";
    case precision_kind::bf16:
      return "bf16";
    case precision_kind::fp16:
      return "fp16";
  }
  return "?";
}

/// One CSV row: one call of trainer::step.
struct metrics_row {
  std::uint64_t step = 0;  // 1-based; a step skipped for an inf/NaN gradient has its row too
  hone::step_report report;
  std::optional<train_mlp::evaluation> validation;
};

/// printf-style formatting into a std::string.
std::string format(const char* fmt, auto... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  if (n <= 0) return {};
  std::string text(static_cast<std::size_t>(n) + 1, '\0');
  std::snprintf(text.data(), text.size(), fmt, args...);
  text.pop_back();
  return text;
}

void write_csv(const std::filesystem::path& path, const std::vector<metrics_row>& rows) {
  std::string csv = "step,loss,grad_norm,lr,loss_scale,skipped,val_loss,val_accuracy\n";
  for (const metrics_row& r : rows) {
    csv += format("%llu,%.6g,%.6g,%.6g,%g,%d,", static_cast<unsigned long long>(r.step),
                  static_cast<double>(r.report.loss), r.report.grad_norm,
                  static_cast<double>(r.report.lr), static_cast<double>(r.report.loss_scale),
                  r.report.skipped ? 1 : 0);
    if (r.validation) {
      csv += format("%.6g,%.6g", r.validation->loss, r.validation->accuracy);
    } else {
      csv += ',';  // neither val_loss nor val_accuracy: two empty fields
    }
    csv += '\n';
  }
  hone_examples::write_file_atomically(
      path, std::span(reinterpret_cast<const std::uint8_t*>(csv.data()), csv.size()));
}

void write_plot(const std::filesystem::path& path, const std::vector<metrics_row>& rows,
                const std::string& heading) {
  namespace ex = hone_examples;
  ex::series train{.label = "train", .colour = ex::light_blue, .thickness = 1};
  ex::series val_loss{.label = "validation", .colour = ex::orange, .markers = true};
  ex::series val_acc{.label = "validation", .colour = ex::orange, .markers = true};
  const double last_step = rows.empty() ? 1.0 : static_cast<double>(rows.back().step);
  ex::chart loss{.title = "loss (cross-entropy)",
                 .x_label = "step",
                 .x_min = 0.0,
                 .x_max = last_step,
                 .y_min = 0.0,
                 .marks_label = "skipped"};
  double lowest_acc = 100.0;
  for (const metrics_row& r : rows) {
    const auto x = static_cast<double>(r.step);
    if (r.report.skipped) {
      loss.marks.push_back(x);
    } else {
      train.x.push_back(x);
      train.y.push_back(static_cast<double>(r.report.loss));
    }
    if (r.validation) {
      val_loss.x.push_back(x);
      val_loss.y.push_back(r.validation->loss);
      val_acc.x.push_back(x);
      val_acc.y.push_back(100.0 * r.validation->accuracy);
      lowest_acc = std::min(lowest_acc, 100.0 * r.validation->accuracy);
    }
  }
  loss.lines = {train, val_loss};
  ex::chart acc{.title = "accuracy (%)",
                .x_label = "step",
                .lines = {val_acc},
                .x_min = 0.0,
                .x_max = last_step,
                .y_min = std::floor(lowest_acc / 10.0) * 10.0,
                .y_max = 100.0};
  if (*acc.y_min >= 100.0) acc.y_min = 90.0;

  ex::image img(1200, 470, ex::chart_palette());
  ex::draw_text(img, 14, 12, heading, ex::black, 2);
  ex::draw_chart(img, {.left = 0, .top = 34, .width = 600, .height = 436}, loss);
  ex::draw_chart(img, {.left = 600, .top = 34, .width = 600, .height = 436}, acc);
  ex::write_png(path, img);
}

/// Writes the training split as a CSV file, one sample per record: x0,...,x{f-1},label (floats
/// with 9 significant digits, which read back as the same floats). Written under a temporary
/// name and renamed into place.
void write_training_csv(const std::filesystem::path& path, const train_mlp::split& train,
                        std::size_t features) {
  std::string text;
  text.reserve(train.size() * 40);
  char num[32];
  for (std::size_t i = 0; i < train.size(); ++i) {
    for (std::size_t f = 0; f < features; ++f) {
      std::snprintf(num, sizeof num, "%.9g,", static_cast<double>(train.x[i * features + f]));
      text += num;
    }
    text += std::to_string(train.y[i]);
    text += '\n';
  }
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  const std::filesystem::path tmp = path.string() + ".tmp";
  (void)hone::io::write_file(tmp, std::as_bytes(std::span(text.data(), text.size())));
  hone::io::rename_path(tmp, path);
}

/// One step's samples as the loader assembles them.
struct csv_batch {
  std::vector<float> x;
  std::vector<std::int32_t> y;
};

/// The loader's collate function: parses record "x0,...,x{f-1},label" into row `row`. A record
/// that does not parse throws; the loader reports it with its index and byte offset in the file.
struct parse_sample {
  std::size_t features;
  std::size_t classes;
  void operator()(csv_batch& b, std::size_t row, std::string_view record) const {
    std::size_t at = 0;
    auto field = [&](bool last) {
      const std::size_t comma = record.find(',', at);
      if (last ? comma != std::string_view::npos : comma == std::string_view::npos) {
        throw std::runtime_error("expected " + std::to_string(features + 1) +
                                 " comma-separated fields (features, then the label)");
      }
      const std::string_view f = record.substr(at, last ? std::string_view::npos : comma - at);
      at = comma + 1;
      return f;
    };
    for (std::size_t k = 0; k < features; ++k) {
      const std::string_view f = field(false);
      float v = 0.0f;
      const auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
      if (ec != std::errc() || end != f.data() + f.size() || !std::isfinite(v)) {
        throw std::runtime_error("feature " + std::to_string(k) + " is not a finite number");
      }
      b.x[row * features + k] = v;
    }
    const std::string_view f = field(true);
    long label = -1;
    const auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), label);
    if (ec != std::errc() || end != f.data() + f.size() || label < 0 ||
        static_cast<std::size_t>(label) >= classes) {
      throw std::runtime_error("the label is not an integer in [0, " + std::to_string(classes) +
                               ")");
    }
    b.y[row] = static_cast<std::int32_t>(label);
  }
};

/// Training batches read from a CSV file through hone::data::loader: a lazy line_dataset over the
/// file (8 bytes of index per record, saved next to it), an epoch-wise shuffled order
/// (shuffled_sampler: a pure function of the seed and the epoch), `batch` samples per step
/// assembled on a oneTBB thread ahead of the step (the last partial batch of an epoch dropped),
/// each step cut into `parts` micro-batches of nearly equal size (the first batch % parts of
/// them one sample larger; accumulate::by_count weights them by size). Its state (seed, epoch,
/// position) travels in the checkpoints, so --resume reads the same batches as an
/// uninterrupted run. Data parallel, rank `rank` of `ranks` reads the same batches and cuts
/// its contiguous share of each one into the micro-batches (train_mlp::rank_share).
class file_batches {
 public:
  file_batches(const std::filesystem::path& csv, std::size_t features, std::size_t classes,
               std::size_t batch, std::size_t parts, std::uint64_t seed, int rank = 0,
               int ranks = 1)
      : features_(features),
        rank_(rank),
        ranks_(ranks),
        dataset_(csv, hone::data::line_format::csv),
        loader_(dataset_,
                csv_batch{std::vector<float>(batch * features), std::vector<std::int32_t>(batch)},
                parse_sample{features, classes},
                {.batch_size = batch,
                 .threads = 1,
                 .prefetch = 2,
                 .seed = seed,
                 .last = hone::data::last_batch::drop},
                hone::data::shuffled_sampler{}),
        micro_(parts) {}

  [[nodiscard]] std::size_t samples_in_file() const { return dataset_.size(); }
  [[nodiscard]] hone::data::loader_state state() const { return loader_.state(); }
  void restore(const hone::data::loader_state& s) { loader_.restore(s); }
  /// Seconds the training loop waited in next() (the batch was not ready), and samples read.
  [[nodiscard]] double wait_seconds() const { return wait_seconds_; }
  [[nodiscard]] std::uint64_t samples() const { return samples_; }

  /// The micro-batches of the next step (valid until the next call).
  std::span<const train_mlp::batch> next() {
    const auto t0 = std::chrono::steady_clock::now();
    const auto* b = loader_.next();
    if (b == nullptr) b = loader_.next();  // an epoch ended: the next one starts
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (b == nullptr) {
      throw hone::config_error("the training file holds " + std::to_string(dataset_.size()) +
                               " samples, fewer than one batch");
    }
    const train_mlp::share mine = train_mlp::rank_share(b->info.rows, rank_, ranks_);
    const std::size_t n_rows = mine.count;
    samples_ += n_rows;
    const std::size_t parts = micro_.size(), small = n_rows / parts, extra = n_rows % parts;
    const auto x = std::span<const float>(b->data.x).subspan(mine.first * features_);
    const auto y = std::span<const std::int32_t>(b->data.y).subspan(mine.first);
    for (std::size_t m = 0, first = 0; m < parts; ++m) {
      const std::size_t n = small + (m < extra ? 1 : 0);
      micro_[m] = {x.subspan(first * features_, n * features_), y.subspan(first, n)};
      first += n;
    }
    return micro_;
  }

 private:
  std::size_t features_;
  int rank_;
  int ranks_;
  hone::data::line_dataset dataset_;
  hone::data::loader<hone::data::line_dataset, csv_batch, parse_sample,
                     hone::data::shuffled_sampler>
      loader_;
  std::vector<train_mlp::batch> micro_;
  double wait_seconds_ = 0.0;
  std::uint64_t samples_ = 0;
};

/// The training CSV of a run: --train-csv, or the spiral's training split written to
/// <out>/spiral_train.csv (by rank 0: the others wait for it).
template <class Comm>
std::filesystem::path training_csv(const options& o, const train_mlp::dataset& data, Comm& comm) {
  if (o.train_csv) return *o.train_csv;
  const std::filesystem::path p = o.out / "spiral_train.csv";
  if (comm.rank() == 0) write_training_csv(p, data.train, data.features);
  comm.barrier().wait();
  return p;
}

/// The CPU path. `comm` is the job's communicator (a hone::dist::local_comm in one process) and
/// `reduction` the trainer's gradient reduction role (none: local gradients), see distributed.hpp.
template <class Precision, class Comm, class... Reduction>
int train(const options& o, Precision precision, Comm& comm, Reduction... reduction) {
  static_assert(sizeof...(Reduction) <= 1);
  using working_type = typename Precision::working_type;
  using model_type = train_mlp::mlp<working_type>;
  static_assert(hone::trainable<model_type, train_mlp::batch>);

  const train_mlp::dataset data = train_mlp::make_spiral({});
  const std::size_t features = data.features;
  model_type model(features, o.hidden, data.classes, o.seed);
  // phase_timer (the step observer role) times each phase of every step; the table is printed at
  // the end, and with --trace each step's phases are zones of the trace.
  hone::trainer t(model, precision, hone::accumulate::by_count{},
                  hone::adamw{.weight_decay = 0.01f}, hone::clip_grad_norm{.max_norm = 1.0f},
                  hone::one_cycle{.max_lr = o.lr, .total_steps = o.steps},
                  hone::profile::phase_timer{}, std::move(reduction)...);
  // No weight decay on biases.
  t.set_param_groups(hone::make_param_groups(
      t.layout(), {{.match = hone::is_no_decay_name, .weight_decay = 0.0f}}));
  const bool root = comm.rank() == 0;  // rank 0 validates, tests and writes the outputs
  if constexpr (sizeof...(Reduction) > 0) hone::dist::broadcast_weights(t, comm);

  hone::early_stopping stop(
      {.mode = hone::monitor_mode::min, .patience = o.patience, .min_delta = 1e-4});
  hone::best_weights_keeper best;
  best.track(t.master_weights());

  std::size_t parameters = 0;
  for (const auto& p : model.parameters()) parameters += p.value.size();
  const std::size_t share = train_mlp::rank_share(o.batch, 0, comm.size()).count;
  const std::size_t small = share / o.accumulate, extra = share % o.accumulate;
  const std::string split =
      extra == 0 ? format("%zu x %zu", o.accumulate, small)
                 : format("%zu x %zu + %zu x %zu", extra, small + 1, o.accumulate - extra, small);
  std::printf("train_mlp: %zu-arm spiral, %zu train / %zu validation / %zu test samples\n",
              data.classes, data.train.size(), data.validation.size(), data.test.size());
  std::printf(
      "  model: MLP %zu-%zu-%zu-%zu (%zu parameters), %s weights and gradients%s\n", features,
      o.hidden, o.hidden, data.classes, parameters, precision_name(o.precision),
      t.zero_copy() ? " (the trainer updates them in place: zero copy)" : ", fp32 master weights");
  std::printf(
      "  step: %zu samples in micro-batches of %s%s, AdamW (weight decay 0.01, none on "
      "biases), clip_grad_norm 1.0, OneCycle (peak lr %g, %llu steps)\n",
      o.batch, split.c_str(), comm.size() > 1 ? " on rank 0" : "", o.lr,
      static_cast<unsigned long long>(o.steps));
  std::printf("  early stopping on the validation loss (every %llu steps, patience %llu)\n",
              static_cast<unsigned long long>(o.eval_every),
              static_cast<unsigned long long>(o.patience));
  std::printf("  device: cpu%s\n", o.device_reason.c_str());
  if constexpr (sizeof...(Reduction) > 0) {
    std::printf(
        "  data parallel (%s): %d ranks over MPI, each on its contiguous share of a "
        "step's %zu samples (%zu on rank 0)\n",
        train_mlp::parallel_flag(o.parallel), comm.size(), o.batch, share);
  }

  file_batches batches(training_csv(o, data, comm), features, data.classes, o.batch, o.accumulate,
                       o.seed, comm.rank(), comm.size());
  std::printf("  training data: %zu samples read from %s through hone::data::loader\n",
              batches.samples_in_file(),
              (o.train_csv ? *o.train_csv : o.out / "spiral_train.csv").string().c_str());

  // Checkpoints: DIR/step-N directories that appear atomically (see docs/checkpoint.md).
  namespace ck = hone::checkpoint;
  std::optional<ck::checkpoint_writer> writer;
  const ck::shape_map shapes = ck::parameter_shapes(model);
  std::uint64_t first_step = 1;
  if (o.checkpoint_dir) {
    ck::writer_options wo;
    wo.root = *o.checkpoint_dir;
    wo.async = o.checkpoint_async;
    wo.busy = ck::on_busy::wait;
    if (o.keep > 0) wo.retention = ck::retention_policy{.keep_last = o.keep};
    writer.emplace(std::move(wo));  // creates DIR; removes what killed runs left there
    for (const auto& p : writer->cleaned()) {
      std::printf("  checkpoints: removed the leftover of an interrupted save, %s\n",
                  p.string().c_str());
    }
    std::printf("  checkpoints: every %llu steps into %s (%s%s)\n",
                static_cast<unsigned long long>(o.checkpoint_every),
                o.checkpoint_dir->string().c_str(), o.checkpoint_async ? "async" : "sync",
                o.keep > 0 ? format(", keeping the newest %zu", o.keep).c_str() : "");
    if (o.resume) {
      std::vector<std::string> skipped;
      const auto c = ck::newest_valid(*o.checkpoint_dir, true, &skipped);
      for (const auto& why : skipped) std::printf("  checkpoints: %s\n", why.c_str());
      if (!c) {
        std::printf("  checkpoints: no valid checkpoint in %s yet: starting from scratch\n",
                    o.checkpoint_dir->string().c_str());
      } else {
        const ck::training_state st = ck::restore(t, c->path);
        if (const auto it = st.metadata.find("precision");
            it != st.metadata.end() && it->second != precision_name(o.precision)) {
          throw hone::config_error("the checkpoint " + c->path.string() +
                                   " was trained with --precision " + it->second + ", not " +
                                   precision_name(o.precision));
        }
        batches.restore(hone::data::load_loader_state(st.data));  // seed, epoch, position
        ck::restore_early_stopping(stop, c->path, st, &best);
        first_step = st.data.at("call").as_u64() + 1;
        std::printf("  resumed from %s: step %llu (%llu updates)\n", c->path.string().c_str(),
                    static_cast<unsigned long long>(first_step - 1),
                    static_cast<unsigned long long>(t.steps_done()));
      }
    }
  }
  const auto save_checkpoint = [&](std::uint64_t step,
                                   const std::optional<train_mlp::evaluation>& validation) {
    ck::training_state own;  // what the trainer does not know: the loader's state, metadata
    hone::data::save_loader_state(own.data, batches.state());
    own.data.set("call", step);  // calls of trainer::step, skipped ones included
    own.metadata["precision"] = precision_name(o.precision);
    if (validation) own.metadata["val_loss"] = format("%.9g", validation->loss);
    (void)writer->save(step, [&](ck::snapshot& s) {
      ck::capture(t, s, own, {.shapes = &shapes});
      ck::capture_early_stopping(stop, s, &best);  // patience counters and the best weights
    });
  };
  std::vector<metrics_row> rows;
  rows.reserve(std::min<std::uint64_t>(o.steps, 100'000));
  hone_examples::progress bar(o.steps);
  std::uint64_t skipped = 0, skipped_in_a_row = 0;
  std::optional<train_mlp::evaluation> last_validation;
  std::optional<hone::profile::trace> trace;
  if (o.trace && root) {
    trace.emplace(hone::profile::trace_options{.perfetto = *o.trace, .process_name = "train_mlp"});
    hone::profile::set_thread_name("main");
  }
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t step = first_step; step <= o.steps; ++step) {
    const hone::step_report r = [&] {
      const std::span<const train_mlp::batch> micro = [&] {
        HONE_ZONE("train_mlp.batches");  // the next step's micro-batches, from the shuffled order
        return batches.next();
      }();
      hone::step_report report = t.step(micro);
      // Each rank's loss is the mean over its share: record the mean over the ranks.
      if (comm.size() > 1) {
        report.loss = static_cast<float>(train_mlp::mean_over_ranks(comm, report.loss));
      }
      return report;
    }();
    if (writer) writer->check();  // a failed background save throws here, at the next step
    metrics_row& row = rows.emplace_back(metrics_row{step, r, std::nullopt});
    bool stopping = false;
    if (step % o.eval_every == 0 || step == o.steps) {
      HONE_ZONE("train_mlp.validate");
      // Rank 0's numbers on every rank: every rank's early stopping decides alike.
      row.validation = train_mlp::from_root(
          comm, root ? std::optional(model.evaluate(data.validation, features)) : std::nullopt);
      last_validation = row.validation;
      // Snapshots the (master) weights whenever the validation loss is a new best.
      stopping = stop.update(row.validation->loss, step, best);
    }
    const std::string val_acc =
        last_validation ? format("%.2f%%", 100.0 * last_validation->accuracy) : std::string("-");
    bar.update(step, format("loss %.4f  lr %.2e  val_acc %s", static_cast<double>(r.loss),
                            static_cast<double>(r.lr), val_acc.c_str()));

    if (r.skipped) {  // an inf/NaN gradient: weights, moments and schedule did not move
      ++skipped;
      if (++skipped_in_a_row > 50) {
        throw hone::error("training diverged: " + std::to_string(skipped_in_a_row) +
                          " steps in a row had an inf/NaN gradient");
      }
      bar.note(format("step %5llu: inf/NaN gradient, update skipped (loss scale %g -> %g)",
                      static_cast<unsigned long long>(step), static_cast<double>(r.loss_scale),
                      static_cast<double>(t.scaler().scale())));
    } else {
      skipped_in_a_row = 0;
    }
    if (row.validation) {
      bar.note(
          format("step %5llu/%llu  loss %.4f  grad_norm %.3f  lr %.2e  scale %g  "
                 "val_loss %.4f  val_acc %6.2f%%",
                 static_cast<unsigned long long>(step), static_cast<unsigned long long>(o.steps),
                 static_cast<double>(r.loss), r.grad_norm, static_cast<double>(r.lr),
                 static_cast<double>(r.loss_scale), row.validation->loss,
                 100.0 * row.validation->accuracy));
    }
    if (writer && (step % o.checkpoint_every == 0 || step == o.steps || stopping)) {
      save_checkpoint(step, row.validation);
    }
    if (o.stop_after && step >= *o.stop_after) {
      if (writer) writer->wait();
      bar.finish();
      std::printf("stopped after step %llu (--stop-after), as if interrupted\n",
                  static_cast<unsigned long long>(step));
      return 0;
    }
    if (stopping) {
      bar.note(stop.message());
      break;
    }
  }
  bar.finish();
  if (writer) {
    writer->wait();
    if (trace) trace->close();  // after the last background write, so the trace has it
    std::printf("checkpoints: %zu saved, newest %s\n", writer->saves_committed(),
                writer->last_committed() ? writer->last_committed()->string().c_str() : "-");
  }
  {
    const std::span<const float> w = t.master_weights();
    std::printf("final master weights xxh3-128: %s\n", ck::hash128(std::as_bytes(w)).hex().c_str());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("trained %zu steps (%llu updates, %llu skipped) in %.2f s\n", rows.size(),
              static_cast<unsigned long long>(t.steps_done()),
              static_cast<unsigned long long>(skipped), seconds);
  std::printf("data: %.0f samples/s trained, %.1f%% of the time waiting for the loader\n",
              static_cast<double>(batches.samples()) / seconds,
              100.0 * batches.wait_seconds() / seconds);
  std::printf("time per phase of the trainer's step (hone::profile::phase_timer):\n");
  std::fflush(stdout);
  t.observer().print_summary(std::cout);
  if (trace) {
    trace->close();
    std::printf("wrote the trace %s (%llu events dropped)\n", o.trace->string().c_str(),
                static_cast<unsigned long long>(trace->dropped_events()));
  }

  // Back to the weights with the best validation loss: into the fp32 master weights, then cast
  // into the model's working weights.
  if (best.has_snapshot()) {
    best.restore();
    t.publish_weights();
    std::printf("restored the best weights: validation loss %.4f at step %llu\n", stop.best(),
                static_cast<unsigned long long>(stop.best_step().value_or(0)));
  }
  if (!root) return 0;  // the same weights on every rank: rank 0 tests them and writes the outputs
  const train_mlp::evaluation final_test = model.evaluate(data.test, features);
  const double accuracy = 100.0 * final_test.accuracy;
  std::printf("final test loss: %.4f\nfinal test accuracy: %.2f%%\n", final_test.loss, accuracy);

  const std::filesystem::path csv = o.out / "metrics.csv", png = o.out / "curves.png";
  write_csv(csv, rows);
  write_plot(
      png, rows,
      format("train_mlp  %s  batch %zu = %zu micro-batch%s  %llu steps   final test "
             "accuracy %.2f%%",
             precision_name(o.precision), o.batch, o.accumulate, o.accumulate == 1 ? "" : "es",
             static_cast<unsigned long long>(rows.size()), accuracy));
  std::printf("wrote %s and %s\n", csv.string().c_str(), png.string().c_str());

  if (o.min_accuracy && accuracy < *o.min_accuracy) {
    std::fprintf(stderr, "train_mlp: final test accuracy %.2f%% is below --min-accuracy %g\n",
                 accuracy, *o.min_accuracy);
    return 3;
  }
  return 0;
}

#if TRAIN_MLP_WITH_CUDA
/// The CUDA path: the device MLP of mlp_cuda.cuh (cuBLAS GEMMs and small kernels) trained by
/// hone::trainer's CUDA implementation with the same policies as train() (train_cuda.cu builds
/// both; cuda_trainer.hpp is their plain C++ face). Same dataset, initial weights, batch order,
/// early stopping and outputs as train(); no checkpoints (parse_flags refuses them here).
template <class Precision>
int train_cuda(const options& o, Precision precision) {
  const train_mlp::dataset data = train_mlp::make_spiral({});
  const std::size_t features = data.features;
  const std::unique_ptr<train_mlp::cuda::device_trainer> t = train_mlp::cuda::make_trainer(
      {features, o.hidden, o.hidden, data.classes}, o.seed, precision,
      hone::adamw{.weight_decay = 0.01f}, hone::clip_grad_norm{.max_norm = 1.0f},
      hone::one_cycle{.max_lr = o.lr, .total_steps = o.steps});
  // No weight decay on biases.
  t->set_param_groups(hone::make_param_groups(
      t->layout(), {{.match = hone::is_no_decay_name, .weight_decay = 0.0f}}));

  hone::early_stopping stop(
      {.mode = hone::monitor_mode::min, .patience = o.patience, .min_delta = 1e-4});
  // The keeper snapshots a host copy of the device's master weights (refreshed before each
  // validation's update below).
  hone::best_weights_keeper best;
  best.track(t->host_master_weights());

  std::size_t parameters = 0;
  for (std::size_t i = 0; i < t->layout().size(); ++i) parameters += t->layout()[i].count;
  const std::size_t small = o.batch / o.accumulate, extra = o.batch % o.accumulate;
  const std::string split =
      extra == 0 ? format("%zu x %zu", o.accumulate, small)
                 : format("%zu x %zu + %zu x %zu", extra, small + 1, o.accumulate - extra, small);
  std::printf("train_mlp: %zu-arm spiral, %zu train / %zu validation / %zu test samples\n",
              data.classes, data.train.size(), data.validation.size(), data.test.size());
  std::printf(
      "  model: MLP %zu-%zu-%zu-%zu (%zu parameters), %s weights and gradients%s\n", features,
      o.hidden, o.hidden, data.classes, parameters, precision_name(o.precision),
      t->zero_copy() ? " (the trainer updates them in place: zero copy)" : ", fp32 master weights");
  std::printf(
      "  step: %zu samples in micro-batches of %s, AdamW (weight decay 0.01, none on "
      "biases), clip_grad_norm 1.0, OneCycle (peak lr %g, %llu steps)\n",
      o.batch, split.c_str(), o.lr, static_cast<unsigned long long>(o.steps));
  std::printf("  early stopping on the validation loss (every %llu steps, patience %llu)\n",
              static_cast<unsigned long long>(o.eval_every),
              static_cast<unsigned long long>(o.patience));
  std::printf("  device: %s: cuBLAS GEMMs (fp32 accumulation) and CUDA kernels\n",
              train_mlp::cuda::device_description().c_str());

  hone::dist::local_comm one_process;
  file_batches batches(training_csv(o, data, one_process), features, data.classes, o.batch,
                       o.accumulate, o.seed);
  std::vector<metrics_row> rows;
  rows.reserve(std::min<std::uint64_t>(o.steps, 100'000));
  hone_examples::progress bar(o.steps);
  std::uint64_t skipped = 0, skipped_in_a_row = 0;
  std::optional<train_mlp::evaluation> last_validation;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t step = 1; step <= o.steps; ++step) {
    const hone::step_report r = t->step(batches.next());
    metrics_row& row = rows.emplace_back(metrics_row{step, r, std::nullopt});
    bool stopping = false;
    if (step % o.eval_every == 0 || step == o.steps) {
      row.validation = t->evaluate(data.validation, features);
      last_validation = row.validation;
      t->download_master_weights();  // what `best` snapshots on a new best
      stopping = stop.update(row.validation->loss, step, best);
    }
    const std::string val_acc =
        last_validation ? format("%.2f%%", 100.0 * last_validation->accuracy) : std::string("-");
    bar.update(step, format("loss %.4f  lr %.2e  val_acc %s", static_cast<double>(r.loss),
                            static_cast<double>(r.lr), val_acc.c_str()));
    if (r.skipped) {  // an inf/NaN gradient: weights, moments and schedule did not move
      ++skipped;
      if (++skipped_in_a_row > 50) {
        throw hone::error("training diverged: " + std::to_string(skipped_in_a_row) +
                          " steps in a row had an inf/NaN gradient");
      }
      bar.note(format("step %5llu: inf/NaN gradient, update skipped (loss scale %g -> %g)",
                      static_cast<unsigned long long>(step), static_cast<double>(r.loss_scale),
                      static_cast<double>(t->loss_scale())));
    } else {
      skipped_in_a_row = 0;
    }
    if (row.validation) {
      bar.note(
          format("step %5llu/%llu  loss %.4f  grad_norm %.3f  lr %.2e  scale %g  "
                 "val_loss %.4f  val_acc %6.2f%%",
                 static_cast<unsigned long long>(step), static_cast<unsigned long long>(o.steps),
                 static_cast<double>(r.loss), r.grad_norm, static_cast<double>(r.lr),
                 static_cast<double>(r.loss_scale), row.validation->loss,
                 100.0 * row.validation->accuracy));
    }
    if (o.stop_after && step >= *o.stop_after) {
      bar.finish();
      std::printf("stopped after step %llu (--stop-after), as if interrupted\n",
                  static_cast<unsigned long long>(step));
      return 0;
    }
    if (stopping) {
      bar.note(stop.message());
      break;
    }
  }
  bar.finish();
  t->download_master_weights();
  std::printf("final master weights xxh3-128: %s\n",
              hone::io::hash128(std::as_bytes(t->host_master_weights())).hex().c_str());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("trained %zu steps (%llu updates, %llu skipped) in %.2f s\n", rows.size(),
              static_cast<unsigned long long>(t->steps_done()),
              static_cast<unsigned long long>(skipped), seconds);

  // Back to the weights with the best validation loss: the host copy into the device's master
  // weights, then cast into the model's working weights.
  if (best.has_snapshot()) {
    best.restore();
    t->upload_master_weights();
    std::printf("restored the best weights: validation loss %.4f at step %llu\n", stop.best(),
                static_cast<unsigned long long>(stop.best_step().value_or(0)));
  }
  const train_mlp::evaluation final_test = t->evaluate(data.test, features);
  const double accuracy = 100.0 * final_test.accuracy;
  std::printf("final test loss: %.4f\nfinal test accuracy: %.2f%%\n", final_test.loss, accuracy);

  const std::filesystem::path csv = o.out / "metrics.csv", png = o.out / "curves.png";
  write_csv(csv, rows);
  write_plot(
      png, rows,
      format("train_mlp  %s  cuda  batch %zu = %zu micro-batch%s  %llu steps   final test "
             "accuracy %.2f%%",
             precision_name(o.precision), o.batch, o.accumulate, o.accumulate == 1 ? "" : "es",
             static_cast<unsigned long long>(rows.size()), accuracy));
  std::printf("wrote %s and %s\n", csv.string().c_str(), png.string().c_str());

  if (o.min_accuracy && accuracy < *o.min_accuracy) {
    std::fprintf(stderr, "train_mlp: final test accuracy %.2f%% is below --min-accuracy %g\n",
                 accuracy, *o.min_accuracy);
    return 3;
  }
  return 0;
}
#endif

/// Where to train: --device cpu or cuda as given; auto picks CUDA when this build has it, a device
/// is visible and no checkpoints are asked for (they need the CPU path). Records in
/// o.device_reason why auto chose the CPU.
bool use_cuda(options& o) {
  if (o.device == device_kind::cpu) return false;
#if TRAIN_MLP_WITH_CUDA
  if (o.device == device_kind::cuda) return true;
  if (o.parallel != train_mlp::parallel_mode::none) {
    o.device_reason =
        std::string(" (auto: ") + train_mlp::parallel_flag(o.parallel) + " needs the CPU path)";
    return false;
  }
  if (o.checkpoint_dir) {
    o.device_reason = " (auto: checkpoints need the CPU path)";
    return false;
  }
  if (train_mlp::cuda::device_count() == 0) {
    o.device_reason = " (auto: no CUDA device)";
    return false;
  }
  return true;
#else
  o.device_reason = " (auto: this build of train_mlp has no CUDA)";
  return false;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  options o = parse_flags(argc, argv);
  const bool cuda = use_cuda(o);
#if !TRAIN_MLP_WITH_CUDA
  (void)cuda;  // always false without CUDA
#else
  if (cuda && train_mlp::cuda::device_count() == 0) {
    // 77: the "skipped" status of automake and CTest (SKIP_RETURN_CODE), so the GPU tests of
    // this example are reported as skipped on machines without a GPU.
    std::fprintf(stderr,
                 "train_mlp: --device cuda, but no CUDA device is visible (cudaGetDeviceCount "
                 "found none); use --device cpu or auto (exit status 77: skipped)\n");
    return 77;
  }
#endif
  // The precision is a runtime flag, the model's element type a template parameter.
  const auto run = [&](auto precision) {
#if TRAIN_MLP_WITH_CUDA
    if (cuda) return train_cuda(o, precision);
#endif
#if TRAIN_MLP_WITH_MPI
    if (o.parallel != train_mlp::parallel_mode::none) {
      return train_mlp::run_distributed(o.parallel, o.batch, o.accumulate, argc, argv,
                                        [&](auto& comm, auto reduction) {
                                          return train(o, precision, comm, std::move(reduction));
                                        });
    }
#endif
    hone::dist::local_comm one_process;
    return train(o, precision, one_process);
  };
  try {
    std::error_code ec;
    std::filesystem::create_directories(o.out, ec);
    if (ec || !std::filesystem::is_directory(o.out)) {
      throw hone::error("cannot create the output directory '" + o.out.string() +
                        "': " + (ec ? ec.message() : std::string("a file of that name exists")));
    }
    switch (o.precision) {
      case precision_kind::fp32:
        return run(hone::fp32{});
      case precision_kind::bf16:
        return run(hone::bf16_mixed{});
      case precision_kind::fp16:
        // PyTorch's GradScaler defaults, but growing the scale after 200 good steps instead of
        // 2000 (this run is only a few hundred steps long).
        return run(hone::fp16_mixed<>{.scaler = {.growth_interval = 200}});
    }
  } catch (const hone::error& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
  return 1;
}
