// Tests of <hone/xtensor/adapt.hpp>: xtensor views of spans, buffers, arenas, parameters and replay
// batches have the right shapes and values, and alias hone's memory (no copy).
#define BOOST_TEST_MODULE hone_xtensor_adapt
#include <boost/test/unit_test.hpp>

#include <array>
#include <cstdint>
#include <hone/core/arena.hpp>
#include <hone/core/buffer.hpp>
#include <hone/core/error.hpp>
#include <hone/core/model.hpp>
#include <hone/rl/batch.hpp>
#include <hone/rl/transition.hpp>
#include <hone/xtensor/adapt.hpp>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>
#include <xtensor/xmath.hpp>
#include <xtensor/xoperation.hpp>
#include <xtensor/xview.hpp>

namespace hx = hone::xtensor;

namespace {

template <class E>
std::vector<std::size_t> shape_of(const E& e) {
  return {e.shape().begin(), e.shape().end()};
}

// A config_error whose message contains `part`.
auto message_has(std::string part) {
  return [part = std::move(part)](const hone::config_error& e) {
    const bool ok = std::string(e.what()).find(part) != std::string::npos;
    if (!ok) BOOST_TEST_MESSAGE("message: " << e.what());
    return ok;
  };
}

using vec = std::vector<std::size_t>;

}  // namespace

BOOST_AUTO_TEST_CASE(span_views_have_the_shape_and_alias_the_memory) {
  std::vector<float> v(6);
  std::iota(v.begin(), v.end(), 0.0f);
  const std::span<float> s(v);

  auto flat = hx::adapt(s);
  static_assert(std::is_same_v<decltype(flat), hx::tensor_view<float, 1>>);
  BOOST_TEST(shape_of(flat) == vec{6});
  BOOST_TEST(flat.data() == v.data());

  auto m = hx::adapt(s, {2, 3});
  static_assert(std::is_same_v<decltype(m), hx::tensor_view<float, 2>>);
  BOOST_TEST(shape_of(m) == (vec{2, 3}));
  for (std::size_t i = 0; i < 2; ++i) {
    for (std::size_t j = 0; j < 3; ++j) BOOST_TEST(m(i, j) == v[i * 3 + j]);  // row-major
  }
  m(1, 2) = 42.0f;
  BOOST_TEST(v[5] == 42.0f);
  m = 2.0f * m;  // an xtensor expression assigned into hone's memory
  BOOST_TEST(v[1] == 2.0f);
  BOOST_TEST(v[5] == 84.0f);

  auto d = hx::adapt(s, vec{1, 2, 3});  // rank known at run time
  static_assert(std::is_same_v<decltype(d), hx::array_view<float>>);
  BOOST_TEST(d.dimension() == 3u);
  BOOST_TEST(d(0, 1, 0) == v[3]);
  BOOST_TEST(d.data() == v.data());

  const std::vector<float>& cv = v;  // const memory: a read-only view
  auto c = hx::adapt(cv, std::array<std::size_t, 2>{3, 2});
  static_assert(std::is_const_v<std::remove_pointer_t<decltype(c.data())>>);
  BOOST_TEST(c(2, 1) == 84.0f);
  BOOST_TEST(xt::sum(c)() == 2.0f * (0 + 1 + 2 + 3 + 4) + 84.0f);
}

BOOST_AUTO_TEST_CASE(buffer_views_alias_the_buffer) {
  hone::buffer<double> b(12);
  std::iota(b.begin(), b.end(), 0.0);
  auto m = hx::adapt(b, {3, 4});
  BOOST_TEST(m.data() == b.data());
  BOOST_TEST(m(2, 3) == 11.0);
  xt::view(m, 1, xt::all()) = 0.5;  // row 1
  for (std::size_t j = 4; j < 8; ++j) BOOST_TEST(b[j] == 0.5);
  BOOST_TEST(b[3] == 3.0);
}

BOOST_AUTO_TEST_CASE(a_shape_that_does_not_cover_the_memory_is_a_config_error) {
  std::vector<float> v(6);
  BOOST_CHECK_EXCEPTION((void)hx::adapt(std::span<float>(v), {4, 4}), hone::config_error,
                        message_has("the shape {4, 4} has 16 elements, but the memory holds 6"));
  BOOST_CHECK_EXCEPTION((void)hx::adapt(std::span<float>(v), vec{5}), hone::config_error,
                        message_has("the shape {5} has 5 elements"));
}

BOOST_AUTO_TEST_CASE(arena_slots_are_views_of_the_arena) {
  hone::arena_layout layout(sizeof(float));
  layout.add("fc.weight", 6);
  layout.add("fc.bias", 3);
  hone::arena<float> a(layout);

  auto w = hx::adapt(a, "fc.weight", {2, 3});
  BOOST_TEST(shape_of(w) == (vec{2, 3}));
  BOOST_TEST(w.data() == a.view("fc.weight").data());
  w(1, 0) = 5.0f;
  BOOST_TEST(a.view("fc.weight")[3] == 5.0f);

  auto b = hx::adapt(a, 1);  // by index, rank 1
  BOOST_TEST(shape_of(b) == vec{3});
  BOOST_TEST(b.data() == a.view(1).data());
  b += 1.5f;
  for (const float x : a.view("fc.bias")) BOOST_TEST(x == 1.5f);

  const std::string name = "fc.bias";
  auto b2 = hx::adapt(a, name, std::array<std::size_t, 2>{3, 1});
  BOOST_TEST(b2(2, 0) == 1.5f);

  auto all = hx::adapt(a);  // padding included
  BOOST_TEST(shape_of(all) == vec{layout.total()});
  BOOST_TEST(all.data() == a.all().data());
  BOOST_TEST(xt::sum(all)() == 5.0f + 3 * 1.5f);

  const hone::arena<float>& ca = a;
  auto cw = hx::adapt(ca, "fc.weight", {3, 2});
  static_assert(std::is_const_v<std::remove_pointer_t<decltype(cw.data())>>);
  BOOST_TEST(cw(1, 1) == 5.0f);

  BOOST_CHECK_EXCEPTION((void)hx::adapt(a, "fc.bias", {2, 2}), hone::config_error,
                        message_has("has 4 elements, but the memory holds 3"));
  BOOST_CHECK_EXCEPTION((void)hx::adapt(a, "fc.gain"), hone::config_error,
                        message_has("no slot named 'fc.gain'"));
}

namespace {
// A model that keeps its parameters in arenas and hands out hone::parameter records.
struct tiny_model {
  hone::arena_layout layout = [] {
    hone::arena_layout l(sizeof(float));
    l.add("w", 6);
    l.add("b", 2);
    return l;
  }();
  hone::arena<float> values{layout}, grads{layout};
  std::vector<hone::parameter<float>> parameters() {
    return {{"w", {3, 2}, values.view(0), grads.view(0)},
            {"b", {2}, values.view(1), grads.view(1)}};
  }
};
static_assert(hone::model<tiny_model>);

// A user's own parameter record (not hone::parameter): any parameter_like type works.
struct my_param {
  std::string name;
  std::array<int, 2> shape;
  std::span<double> value;
  std::span<double> grad;
};
}  // namespace

BOOST_AUTO_TEST_CASE(parameter_views_have_the_parameter_shape) {
  tiny_model net;
  auto ps = net.parameters();
  std::iota(net.values.view(0).begin(), net.values.view(0).end(), 1.0f);

  auto w = hx::value(ps[0]);  // rank from the record's shape
  static_assert(std::is_same_v<decltype(w), hx::array_view<float>>);
  BOOST_TEST(shape_of(w) == (vec{3, 2}));
  BOOST_TEST(w.data() == net.values.view("w").data());
  BOOST_TEST(w(2, 1) == 6.0f);

  auto w2 = hx::value<2>(ps[0]);  // fixed rank
  static_assert(std::is_same_v<decltype(w2), hx::tensor_view<float, 2>>);
  auto g2 = hx::grad<2>(ps[0]);
  BOOST_TEST(g2.data() == net.grads.view("w").data());
  g2 = 2.0f * w2 - 1.0f;  // written into the gradient arena
  BOOST_TEST(net.grads.view("w")[0] == 1.0f);
  BOOST_TEST(net.grads.view("w")[5] == 11.0f);

  auto gb = hx::grad(ps[1]);
  BOOST_TEST(shape_of(gb) == vec{2});
  gb(1) = -3.0f;
  BOOST_TEST(net.grads.view("b")[1] == -3.0f);

  BOOST_CHECK_EXCEPTION((void)hx::value<2>(ps[1]), hone::config_error,
                        message_has("parameter 'b' has rank 1"));
  auto bad = ps[0];
  bad.shape = {2, 2};
  BOOST_CHECK_EXCEPTION((void)hx::grad(bad), hone::config_error,
                        message_has("but the grad of parameter 'w' holds 6"));

  std::vector<double> value(6, 1.0), grad(6, 0.0);
  const my_param mine{"mine", {2, 3}, value, grad};
  auto mv = hx::value<2>(mine);
  BOOST_TEST(shape_of(mv) == (vec{2, 3}));
  hx::grad<2>(mine) = mv * 4.0;
  BOOST_TEST(grad[4] == 4.0);
}

namespace {
using step = hone::transition<hone::field<"obs", float, 2, 3>, hone::field<"action", std::int32_t>,
                              hone::field<"done", bool>>;
struct my_step {
  float frame[2][2];
  std::int32_t action;
};
using my_transition = hone::transition<hone::member<"frame", &my_step::frame>,
                                       hone::member<"action", &my_step::action>>;
}  // namespace

BOOST_AUTO_TEST_CASE(replay_batch_columns_have_rows_first) {
  hone::replay_batch<step> b(5);
  for (std::size_t r = 0; r < b.size(); ++r) {
    step::record rec{};
    for (std::size_t i = 0; i < 6; ++i) hone::get<"obs">(rec)[i] = static_cast<float>(10 * r + i);
    hone::get<"action">(rec) = static_cast<std::int32_t>(r);
    hone::get<"done">(rec) = r == 4;
    b.set_row(r, rec);
    b.weights()[r] = 0.25f * static_cast<float>(r);
    b.keys()[r] = 100 + r;
  }

  auto obs = hx::column<"obs">(b);
  static_assert(std::is_same_v<decltype(obs), hx::tensor_view<float, 3>>);
  BOOST_TEST(shape_of(obs) == (vec{5, 2, 3}));
  BOOST_TEST(obs.data() == b.get<"obs">().data());
  BOOST_TEST(obs(3, 1, 2) == 35.0f);
  obs(4, 0, 1) = -1.0f;
  BOOST_TEST(hone::get<"obs">(b.row(4))[1] == -1.0f);

  auto action = hx::column<"action">(b);
  BOOST_TEST(shape_of(action) == vec{5});
  BOOST_TEST(xt::sum(action)() == 0 + 1 + 2 + 3 + 4);
  auto done = hx::column<"done">(b);
  BOOST_TEST(done(4));
  BOOST_TEST(!done(3));

  auto w = hx::weights(b);
  BOOST_TEST(shape_of(w) == vec{5});
  BOOST_TEST(w.data() == b.weights().data());
  BOOST_TEST(w(2) == 0.5f);
  auto k = hx::keys(b);
  BOOST_TEST(k(3) == 103u);

  const auto& cb = b;
  auto cobs = hx::column<"obs">(cb);
  static_assert(std::is_const_v<std::remove_pointer_t<decltype(cobs.data())>>);
  BOOST_TEST(cobs(0, 1, 0) == 3.0f);

  hone::replay_batch<my_transition> m(2);
  auto frame = hx::column<"frame">(m);  // a member<> array: {rows, elements}
  BOOST_TEST(shape_of(frame) == (vec{2, 4}));
  frame = xt::ones<float>({2, 4});
  BOOST_TEST(m.row(1).frame[1][1] == 1.0f);
}
