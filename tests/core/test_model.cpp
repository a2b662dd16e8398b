// Tests of the model concepts: positive cases, negative cases written as static_assert(!...), and
// the model_traits customization point for a type the user cannot change.
#define BOOST_TEST_MODULE hone_core_model
#include <boost/test/unit_test.hpp>

#include <hone/core/model.hpp>
#include <span>
#include <string>
#include <vector>

namespace user {
struct batch {
  std::vector<float> x, y;
};

// A one-weight linear model y = w * x, written the way a user would.
struct linear {
  std::vector<float> w{0.0f}, gw{0.0f};
  std::vector<hone::parameter<float>> parameters() {
    return {{"w", {1}, std::span<float>(w), std::span<float>(gw)}};
  }
  float forward_backward(const batch& b, float loss_scale) {
    float loss = 0, g = 0;
    const auto n = static_cast<float>(b.x.size());
    for (std::size_t i = 0; i < b.x.size(); ++i) {
      const float r = w[0] * b.x[i] - b.y[i];
      loss += r * r / n;
      g += 2 * r * b.x[i] / n;
    }
    gw[0] = g * loss_scale;
    return loss;
  }
};

struct no_parameters {
  float forward_backward(const batch&, float) { return 0; }
};
struct bad_records {  // parameters() returns something that is not a parameter record
  std::vector<int> parameters() { return {1, 2}; }
};
struct mismatched_views {
  struct rec {
    std::string name;
    std::vector<int> shape;
    std::span<float> value;
    std::span<double> grad;  // grad in another precision than value
  };
  std::vector<rec> parameters() { return {}; }
};
struct no_forward_backward {
  std::vector<hone::parameter<float>> parameters() { return {}; }
};
}  // namespace user

namespace third_party {  // a type the user cannot change: different member names
struct net {
  std::vector<float> weights, grads;
  float train_on(const user::batch&, float) { return 1.0f; }
};
}  // namespace third_party

template <>
struct hone::model_traits<third_party::net> {
  static std::vector<hone::parameter<float>> parameters(third_party::net& n) {
    return {{"weights", {n.weights.size()}, n.weights, n.grads}};
  }
  static float forward_backward(third_party::net& n, const user::batch& b, float s) {
    return n.train_on(b, s);
  }
};

static_assert(hone::model<user::linear>);
static_assert(hone::trainable<user::linear, user::batch>);
static_assert(hone::check_trainable<user::linear, user::batch>());
static_assert(!hone::trainable<user::linear, int>);  // no forward_backward for this batch type
static_assert(!hone::model<user::no_parameters>);
static_assert(!hone::has_parameters<user::no_parameters>);
static_assert(hone::has_parameters<user::bad_records>);
static_assert(!hone::model<user::bad_records>);
static_assert(!hone::model<user::mismatched_views>);
static_assert(hone::model<user::no_forward_backward>);
static_assert(!hone::trainable<user::no_forward_backward, user::batch>);
static_assert(hone::model<third_party::net>);
static_assert(hone::trainable<third_party::net, user::batch>);
static_assert(hone::parameter_like<hone::parameter<double>>);
static_assert(!hone::parameter_like<int>);

BOOST_AUTO_TEST_CASE(model_traits_reach_the_users_members) {
  user::linear m;
  user::batch b{{1, 2, 3}, {2, 4, 6}};
  const float loss = hone::model_traits<user::linear>::forward_backward(m, b, 2.0f);
  BOOST_TEST(loss == (4.0f + 16.0f + 36.0f) / 3.0f, boost::test_tools::tolerance(1e-6f));
  // d/dw mean((w x - y)^2) at w = 0 is -2 mean(x y) = -56/3, scaled by 2.
  BOOST_TEST(m.gw[0] == 2.0f * (-2.0f * 28.0f / 3.0f), boost::test_tools::tolerance(1e-6f));
  auto params = hone::model_traits<user::linear>::parameters(m);
  BOOST_TEST(params.size() == 1u);
  BOOST_TEST(params[0].name == "w");
  BOOST_TEST(params[0].grad.data() == m.gw.data());
}

BOOST_AUTO_TEST_CASE(specialized_traits_adapt_a_foreign_type) {
  third_party::net n{{1, 2, 3}, {0, 0, 0}};
  auto params = hone::model_traits<third_party::net>::parameters(n);
  BOOST_TEST(params[0].shape[0] == 3u);
  BOOST_TEST(params[0].value.data() == n.weights.data());
  BOOST_TEST(hone::model_traits<third_party::net>::forward_backward(n, {}, 1.0f) == 1.0f);
}
