// hone/optim/param_group.hpp: parameter groups. A group is a set of arena slots (tensors) that
// share a learning-rate scale and a weight decay, as PyTorch's param_groups. Slots that belong to
// no group form the default group (lr scale 1, the optimizer's own weight decay).
//
// The usual split, no weight decay for biases and normalization weights:
//   auto groups = hone::no_decay_groups(layout);                 // names ending in "bias" or
//                                                                // containing "norm"
//   auto groups = hone::make_param_groups(layout, {
//       {.match = hone::is_no_decay_name, .weight_decay = 0.0f},
//       {.match = [](std::string_view n) { return n.starts_with("head."); }, .lr_scale = 10.0f}});
#pragma once

#include <cctype>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN

/// Slots of one arena_layout sharing hyperparameters. `lr_scale` multiplies the step's learning
/// rate; `weight_decay`, when set, replaces the optimizer policy's.
struct param_group {
  std::vector<std::size_t> slots = {};
  float lr_scale = 1.0f;
  std::optional<float> weight_decay = std::nullopt;
};

/// A rule of make_param_groups: the slots whose name satisfies `match` form one group.
struct param_group_rule {
  std::function<bool(std::string_view)> match = nullptr;
  float lr_scale = 1.0f;
  std::optional<float> weight_decay = std::nullopt;
};

/// Whether a slot name is a bias or a normalization parameter, which by convention get no weight
/// decay: the name ends in "bias" or contains "norm" (ASCII case-insensitive, so "ln.bias",
/// "LayerNorm.weight", "rmsnorm.scale", "blocks.0.norm1.weight" all match). Models that name their
/// norms otherwise ("ln_f.weight") pass their own predicate.
inline bool is_no_decay_name(std::string_view name) noexcept {
  auto lower = [](char c) {
    return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  };
  auto ends_with_ci = [&](std::string_view s, std::string_view suffix) {
    if (s.size() < suffix.size()) return false;
    for (std::size_t i = 0; i < suffix.size(); ++i) {
      if (lower(s[s.size() - suffix.size() + i]) != suffix[i]) return false;
    }
    return true;
  };
  if (ends_with_ci(name, "bias")) return true;
  constexpr std::string_view norm = "norm";
  for (std::size_t i = 0; i + norm.size() <= name.size(); ++i) {
    bool match = true;
    for (std::size_t k = 0; k < norm.size() && match; ++k) match = lower(name[i + k]) == norm[k];
    if (match) return true;
  }
  return false;
}

/// Builds one group per rule from the slot names of `layout`: each slot goes to the first rule
/// that matches it; slots no rule matches stay in the default group (they are not listed).
/// A rule that matches no slot gives an empty group (harmless). Throws config_error for a rule
/// without a predicate.
inline std::vector<param_group> make_param_groups(const arena_layout& layout,
                                                  const std::vector<param_group_rule>& rules) {
  std::vector<param_group> groups(rules.size());
  for (std::size_t r = 0; r < rules.size(); ++r) {
    HONE_REQUIRE(static_cast<bool>(rules[r].match),
                 "hone::make_param_groups: rule " + std::to_string(r) +
                     " has no `match` predicate; give it a callable taking the slot name");
    groups[r].lr_scale = rules[r].lr_scale;
    groups[r].weight_decay = rules[r].weight_decay;
  }
  for (std::size_t i = 0; i < layout.size(); ++i) {
    for (std::size_t r = 0; r < rules.size(); ++r) {
      if (rules[r].match(layout[i].name)) {
        groups[r].slots.push_back(i);
        break;
      }
    }
  }
  return groups;
}

/// One group with weight decay 0 holding the slots `no_decay` accepts (by default biases and
/// normalization parameters, see is_no_decay_name); all other slots stay in the default group.
inline std::vector<param_group> no_decay_groups(
    const arena_layout& layout,
    const std::function<bool(std::string_view)>& no_decay = is_no_decay_name) {
  return make_param_groups(layout, {param_group_rule{no_decay, 1.0f, 0.0f}});
}

HONE_NAMESPACE_END
