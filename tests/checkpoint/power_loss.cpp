// The power-loss harness's recorder and crash-state enumerator (see power_loss.hpp); the model
// they share with the libc hooks is power_loss_model.hpp, the hooks power_loss_hooks.cpp.
#include "power_loss_model.hpp"

namespace fs = std::filesystem;

namespace power_loss {
using namespace detail;

std::string check_report::summary() const {
  std::ostringstream s;
  s << ops << " operations, " << crash_points << " crash points, " << states << " crash states, "
    << distinct << " distinct trees checked, " << failed << " refused";
  return s.str();
}

recording::recording(const fs::path& sandbox) {
  if (g != nullptr) throw std::logic_error("power_loss::recording: one recording at a time");
  auto* r = new recorder;
  r->root = fs::absolute(sandbox).lexically_normal();
  if (!r->root.has_filename()) r->root = r->root.parent_path();
  g = r;
  new_node(true);
  load_tree(r->root, 0);
  r->base = r->live;  // taken as durable: the model never crashes the real file system
  __atomic_store_n(&pl_recording, 1, __ATOMIC_RELEASE);
}

recording::~recording() {
  __atomic_store_n(&pl_recording, 0, __ATOMIC_RELEASE);
  delete g;
  g = nullptr;
}

void recording::mark(const std::string& label) {
  std::lock_guard lock(g->m);
  op o;
  o.k = kind::mark;
  o.label = label;
  g->ops.push_back(std::move(o));
}

void recording::stop() {
  {
    std::lock_guard lock(g->m);
    for (auto& mp : g->maps) diff_mapping(mp);
  }
  __atomic_store_n(&pl_recording, 0, __ATOMIC_RELEASE);
  std::vector<std::string> diffs;
  compare_tree(g->root, 0, g->live, diffs);
  for (auto& d : diffs) problem("after the recording, " + d);
}

std::vector<std::string> recording::problems() const {
  return g->problems;
}

std::string recording::log_text() const {
  std::string out;
  for (std::size_t i = 0; i < g->ops.size(); ++i) {
    out += std::to_string(i) + "  " + describe(g->ops[i]) + "\n";
  }
  return out;
}

check_report recording::check(const fs::path& scratch, const oracle& oracle_fn,
                              const check_options& options) const {
  const std::vector<op>& ops = g->ops;
  const std::size_t n = ops.size();
  // force_at[i]: the first operation that makes operation i durable (n: none).
  std::vector<std::size_t> force_at(n, n);
  for (std::size_t i = 0; i < n; ++i) {
    const op& o = ops[i];
    if (o.k == kind::write || o.k == kind::truncate) {
      for (std::size_t j = i + 1; j < n; ++j) {
        const op& s = ops[j];
        if (s.ino != o.ino) continue;
        if (s.k == kind::sync || (s.k == kind::sync_range && o.k == kind::write && o.off >= s.off &&
                                  o.off + o.len <= s.off + s.len)) {
          force_at[i] = j;
          break;
        }
      }
    } else if (o.k == kind::ns) {
      std::size_t worst = 0;
      for (const auto& es : o.sets) {
        std::size_t at = n;
        for (std::size_t j = i + 1; j < n; ++j) {
          if (ops[j].k == kind::sync && ops[j].ino == es.dir) {
            at = j;
            break;
          }
        }
        worst = std::max(worst, at);
      }
      force_at[i] = worst;
    } else {
      force_at[i] = i;  // syncs and marks change nothing
    }
  }
  // Every inode of the log exists from the start: empty until written (an inode no entry names
  // is invisible).
  std::vector<node> start = g->base;
  for (std::size_t id = start.size(); id < g->live.size(); ++id) {
    start.push_back(node{g->live[id].dir, {}, {}});
  }

  check_report rep;
  rep.ops = n;
  rep.crash_points = n + 1;
  rng r{options.seed};
  std::map<std::pair<std::string, std::size_t>, std::optional<std::string>> cache;
  std::error_code ec;
  fs::remove_all(scratch, ec);
  fs::create_directories(scratch);

  std::vector<std::string> marks;
  for (std::size_t k = 0; k <= n; ++k) {
    if (k > 0 && ops[k - 1].k == kind::mark) marks.push_back(ops[k - 1].label);
    // The un-forced operations of the prefix.
    std::vector<std::size_t> free_ns;
    std::map<int, std::vector<std::size_t>> free_data;
    for (std::size_t i = 0; i < k; ++i) {
      if (force_at[i] < k) continue;
      if (ops[i].k == kind::ns) free_ns.push_back(i);
      if (ops[i].k == kind::write || ops[i].k == kind::truncate) free_data[ops[i].ino].push_back(i);
    }
    const auto ns_choices = subsets(free_ns.size(), 8, 24, r);
    // Data variants: every file all / none / zeroed, then each file's alternatives with the
    // other files all or none.
    using variant = std::map<int, data_choice>;
    std::vector<variant> data_variants;
    auto uniform = [&](data_choice::mode_t mode, char keep) {
      variant v;
      for (const auto& [ino, list] : free_data)
        v[ino] = {mode, std::vector<char>(list.size(), keep)};
      return v;
    };
    data_variants.push_back(uniform(data_choice::subset, 1));
    if (!free_data.empty()) {
      data_variants.push_back(uniform(data_choice::subset, 0));
      data_variants.push_back(uniform(data_choice::zeroed, 1));
      for (const auto& [ino, list] : free_data) {
        std::vector<data_choice> alts;
        for (auto& s : subsets(list.size(), 4, 8, r)) alts.push_back({data_choice::subset, s});
        alts.push_back({data_choice::torn_last, std::vector<char>(list.size(), 1)});
        for (const auto& a : alts) {
          for (const char others : {char{1}, char{0}}) {
            variant v = uniform(data_choice::subset, others);
            v[ino] = a;
            data_variants.push_back(std::move(v));
          }
        }
      }
    }
    // The combinations: all when few, else the corner ones and seeded random ones.
    std::vector<std::pair<std::size_t, std::size_t>> combos;
    const std::size_t total = ns_choices.size() * data_variants.size();
    if (total <= options.max_states_per_point) {
      for (std::size_t a = 0; a < ns_choices.size(); ++a)
        for (std::size_t b = 0; b < data_variants.size(); ++b) combos.emplace_back(a, b);
    } else {
      // The corner cases first: every directory choice with every file's data all or none, and
      // every data variant with all or none of the directory operations; then random pairs.
      std::set<std::pair<std::size_t, std::size_t>> picked;
      std::size_t ns_all_index = 0;
      for (std::size_t a = 0; a < ns_choices.size(); ++a) {
        if (std::all_of(ns_choices[a].begin(), ns_choices[a].end(),
                        [](char c) { return c != 0; })) {
          ns_all_index = a;
        }
      }
      for (std::size_t a = 0; a < ns_choices.size(); ++a) {
        picked.emplace(a, 0);
        if (data_variants.size() > 1) picked.emplace(a, 1);
      }
      for (std::size_t b = 0; b < data_variants.size(); ++b) {
        picked.emplace(ns_all_index, b);
        picked.emplace(0, b);
      }
      while (picked.size() < options.max_states_per_point) {
        picked.emplace(static_cast<std::size_t>(r.next() % ns_choices.size()),
                       static_cast<std::size_t>(r.next() % data_variants.size()));
      }
      combos.assign(picked.begin(), picked.end());
    }

    for (const auto& [a, b] : combos) {
      ++rep.states;
      const std::vector<char>& ns_keep = ns_choices[a];
      const variant& dv = data_variants[b];
      std::set<std::size_t> ns_on;
      for (std::size_t i = 0; i < free_ns.size(); ++i) {
        if (ns_keep[i]) ns_on.insert(free_ns[i]);
      }
      // Which data operations apply, and how.
      std::map<std::size_t, data_choice::mode_t> data_on;  // op index -> how
      for (const auto& [ino, list] : free_data) {
        const data_choice& c = dv.at(ino);
        for (std::size_t i = 0; i < list.size(); ++i) {
          if (c.mode == data_choice::subset && !c.keep[i]) continue;
          data_choice::mode_t how = c.mode;
          if (c.mode == data_choice::torn_last && i + 1 != list.size()) how = data_choice::subset;
          data_on[list[i]] = how;
        }
      }
      std::vector<node> t = start;
      for (std::size_t i = 0; i < k; ++i) {
        const op& o = ops[i];
        const bool forced = force_at[i] < k;
        if (o.k == kind::ns) {
          if (!forced && !ns_on.contains(i)) continue;
          for (const auto& es : o.sets) {
            auto& kids = t[static_cast<std::size_t>(es.dir)].kids;
            if (es.ino < 0) {
              kids.erase(es.name);
            } else {
              kids[es.name] = es.ino;
            }
          }
        } else if (o.k == kind::write || o.k == kind::truncate) {
          data_choice::mode_t how = data_choice::subset;
          if (!forced) {
            const auto it = data_on.find(i);
            if (it == data_on.end()) continue;
            how = it->second;
          }
          node& f = t[static_cast<std::size_t>(o.ino)];
          if (o.k == kind::truncate) {
            f.data.resize(o.off, '\0');
          } else if (how == data_choice::zeroed) {
            // The size persisted, the data did not: bytes past the old end read as zeros, bytes
            // inside it keep their old contents.
            if (f.data.size() < o.off + o.bytes.size()) f.data.resize(o.off + o.bytes.size(), '\0');
          } else if (how == data_choice::torn_last) {
            const std::size_t half =
                o.bytes.size() > sector ? o.bytes.size() / 2 / sector * sector : o.bytes.size() / 2;
            apply_write(f, o.off, std::string_view(o.bytes).substr(0, half));
          } else {
            apply_write(f, o.off, o.bytes);
          }
        }
      }
      std::string text;
      serialize(t, 0, "", text, 0);
      const auto key = std::make_pair(
          std::to_string(hone::io::hash64(std::as_bytes(std::span(text.data(), text.size())))) +
              ":" + std::to_string(text.size()),
          marks.size());
      auto it = cache.find(key);
      if (it == cache.end()) {
        ++rep.distinct;
        const fs::path root = scratch / "state";
        fs::remove_all(root, ec);
        fs::create_directories(root);
        materialize(t, 0, root, 0);
        crash_point cp;
        cp.ops_done = k;
        cp.ops_total = n;
        cp.marks = marks;
        std::optional<std::string> verdict;
        try {
          verdict = oracle_fn(root, cp);
        } catch (const std::exception& e) {
          verdict = std::string("the oracle threw: ") + e.what();
        }
        it = cache.emplace(key, std::move(verdict)).first;
      }
      if (it->second) {
        ++rep.failed;
        if (rep.failures.size() < options.failures_kept) {
          std::ostringstream s;
          s << "crash after " << k << "/" << n
            << " operations (last: " << (k > 0 ? describe(ops[k - 1]) : std::string("none"))
            << "), persisted of the " << free_ns.size() << " un-forced directory operations:";
          for (std::size_t i = 0; i < free_ns.size(); ++i) {
            s << " " << free_ns[i] << (ns_keep[i] ? "+" : "-");
          }
          s << "; data variant " << b << ": " << *it->second << "\n  tree:\n" << text;
          rep.failures.push_back(s.str());
        }
      }
    }
  }
  fs::remove_all(scratch, ec);
  return rep;
}

}  // namespace power_loss
