// quickstart: a user's own model plugged into hone, trained with a fused update.
//
// The model is a linear regressor y = X w + b written by hand (the forward and backward pass are
// the user's). hone checks it against the model concept at compile time, keeps its parameters and
// gradients in flat arenas, and runs SGD with momentum as one fused element-wise pass over all of
// them (hone::for_each over tensor_lists, on oneTBB workers). The data come from a fixed random
// teacher, so the learned weights can be checked against it.
//
//   quickstart [--steps N] [--features N] [--lr X]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <hone/core.hpp>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {
struct batch {
  std::size_t rows = 0, cols = 0;
  std::vector<float> x;  // rows * cols, row-major
  std::vector<float> y;  // rows
};

// The user's model: all parameters and gradients live in two arenas (weights then bias).
class linear_regressor {
 public:
  explicit linear_regressor(std::size_t features) : layout_(sizeof(float)) {
    layout_.add("weight", features);
    layout_.add("bias", 1);
    values_ = hone::arena<float>(layout_);
    grads_ = hone::arena<float>(layout_);
  }

  std::vector<hone::parameter<float>> parameters() {
    const std::size_t n = values_.view("weight").size();
    return {{"weight", {n}, values_.view("weight"), grads_.view("weight")},
            {"bias", {1}, values_.view("bias"), grads_.view("bias")}};
  }

  // Mean squared error; writes d(loss * loss_scale)/d(params) into the grad views.
  float forward_backward(const batch& b, float loss_scale) {
    auto w = values_.view("weight");
    auto gw = grads_.view("weight");
    const float bias = values_.view("bias")[0];
    float gb = 0.0f;
    double loss = 0.0;
    std::fill(gw.begin(), gw.end(), 0.0f);
    const float inv_n = 1.0f / static_cast<float>(b.rows);
    for (std::size_t r = 0; r < b.rows; ++r) {
      const float* xr = b.x.data() + r * b.cols;
      float pred = bias;
      for (std::size_t c = 0; c < b.cols; ++c) pred += w[c] * xr[c];
      const float err = pred - b.y[r];
      loss += static_cast<double>(err) * err;
      const float g = 2.0f * err * inv_n * loss_scale;
      for (std::size_t c = 0; c < b.cols; ++c) gw[c] += g * xr[c];
      gb += g;
    }
    grads_.view("bias")[0] = gb;
    return static_cast<float>(loss / static_cast<double>(b.rows));
  }

 private:
  hone::arena_layout layout_;
  hone::arena<float> values_, grads_;
};

static_assert(hone::trainable<linear_regressor, batch>);

// SGD with momentum as one element functor: the same code would run on a GPU through
// hone::for_each(hone::cuda_exec{}, ...).
struct sgd_momentum {
  float lr, momentum;
  HONE_HOST_DEVICE void operator()(float& p, float& buf, const float& g) const {
    buf = momentum * buf + g;
    p -= lr * buf;
  }
};

batch make_data(std::size_t rows, std::size_t cols, std::vector<float>& teacher, float& bias,
                unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  teacher.resize(cols);
  for (auto& t : teacher) t = normal(rng);
  bias = 0.5f;
  batch b{rows, cols, std::vector<float>(rows * cols), std::vector<float>(rows)};
  for (std::size_t r = 0; r < rows; ++r) {
    float y = bias;
    for (std::size_t c = 0; c < cols; ++c) {
      const float v = normal(rng);
      b.x[r * cols + c] = v;
      y += teacher[c] * v;
    }
    b.y[r] = y + 0.01f * normal(rng);
  }
  return b;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "quickstart: %s\nusage: quickstart [--steps N] [--features N] [--lr X]\n",
               why.c_str());
  std::exit(2);
}

long parse_positive(std::string_view flag, const char* text) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v <= 0) {
    usage(std::string(flag) + " needs a positive integer, got '" + text + "'");
  }
  return v;
}
}  // namespace

int main(int argc, char** argv) {
  long steps = 200, features = 32;
  float lr = 0.05f;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (i + 1 >= argc) usage("missing value after " + std::string(a));
    if (a == "--steps") {
      steps = parse_positive(a, argv[++i]);
    } else if (a == "--features") {
      features = parse_positive(a, argv[++i]);
    } else if (a == "--lr") {
      char* end = nullptr;
      lr = std::strtof(argv[++i], &end);
      if (*end != '\0' || !(lr > 0.0f) || !std::isfinite(lr)) usage("--lr needs a positive number");
    } else {
      usage("unknown flag " + std::string(a));
    }
  }

  std::vector<float> teacher;
  float teacher_bias = 0;
  const auto cols = static_cast<std::size_t>(features);
  const batch data = make_data(1024, cols, teacher, teacher_bias, 7);
  linear_regressor model(cols);

  // Momentum buffers in their own arena, matched parameter by parameter.
  auto params = model.parameters();
  hone::arena_layout state_layout(sizeof(float));
  for (const auto& p : params) state_layout.add(p.name, p.value.size());
  hone::arena<float> momentum(state_layout);
  hone::tensor_lists<float, float, const float> lists;
  for (std::size_t i = 0; i < params.size(); ++i) {
    lists.add(params[i].value.size(), params[i].value.data(), momentum.view(i).data(),
              params[i].grad.data());
  }

  float loss = 0;
  for (long s = 1; s <= steps; ++s) {
    loss = model.forward_backward(data, 1.0f);
    hone::for_each(lists, sgd_momentum{lr, 0.9f});
    if (s == 1 || s % 50 == 0 || s == steps) std::printf("step %4ld  loss %.6f\n", s, loss);
  }

  double err = 0;
  const auto w = params[0].value;
  for (std::size_t c = 0; c < cols; ++c) err = std::max(err, double(std::abs(w[c] - teacher[c])));
  err = std::max(err, double(std::abs(params[1].value[0] - teacher_bias)));
  std::printf("final loss %.6f, max |w - w_teacher| = %.4f\n", loss, err);
  return (std::isfinite(loss) && err < 0.05) ? 0 : 1;
}
