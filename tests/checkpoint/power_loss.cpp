// The power-loss harness's recorder and crash-state enumerator (see power_loss.hpp).
#include "power_loss.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <hone/io/hash.hpp>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>

namespace fs = std::filesystem;

extern "C" {
extern int pl_recording;
int pl_real_openat(int dirfd, const char* path, int flags, mode_t mode);
int pl_real_close(int fd);
ssize_t pl_real_write(int fd, const void* buf, size_t n, off_t offset, int positional);
int pl_real_ftruncate(int fd, off_t length);
int pl_real_fallocate(int fd, int mode, off_t offset, off_t len, int posix);
int pl_real_fsync(int fd, int data_only);
int pl_real_renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                      unsigned flags);
int pl_real_mkdirat(int dirfd, const char* path, mode_t mode);
int pl_real_unlinkat(int dirfd, const char* path, int flags);
int pl_real_remove(const char* path);
void* pl_real_mmap(void* addr, size_t len, int prot, int flags, int fd, off_t offset);
int pl_real_msync(void* addr, size_t len, int flags);
int pl_real_munmap(void* addr, size_t len);
}

namespace power_loss {
namespace {

constexpr std::size_t sector = 512;

struct node {
  bool dir = false;
  std::string data;                 // a file's bytes
  std::map<std::string, int> kids;  // a directory's entries
};

struct entry_set {
  int dir;
  std::string name;
  int ino;  // -1: the entry is removed
};

enum class kind { ns, write, truncate, sync, sync_range, mark };

struct op {
  kind k = kind::mark;
  int ino = -1;
  std::uint64_t off = 0, len = 0;  // write: offset, length; truncate: new size (off)
  std::string bytes;
  std::vector<entry_set> sets;
  std::string label;  // ns: what it was (for messages); mark: the label
};

struct mapping {
  std::byte* base = nullptr;
  std::size_t len = 0;
  int ino = -1;
  std::uint64_t off = 0;
  std::string shadow;  // the contents last recorded
};

struct recorder {
  std::mutex m;
  fs::path root;
  std::vector<node> base;  // the durable tree at the start (ids 0 .. base.size())
  std::vector<node> live;  // the model of the tree now (ids never reused)
  std::vector<op> ops;
  std::map<int, int> fds;  // descriptor -> inode id
  std::vector<mapping> maps;
  std::vector<std::string> problems;
};

recorder* g = nullptr;

// errno survives the recorder's own work.
struct errno_keeper {
  int saved;
  errno_keeper() : saved(errno) {}
  ~errno_keeper() { errno = saved; }
};

std::optional<fs::path> absolute_of(int dirfd, const char* path) {
  if (path == nullptr) return std::nullopt;
  fs::path p(path);
  if (p.is_absolute()) return p.lexically_normal();
  fs::path base;
  if (dirfd == AT_FDCWD) {
    std::error_code ec;
    base = fs::current_path(ec);
    if (ec) return std::nullopt;
  } else {
    std::error_code ec;
    base = fs::read_symlink("/proc/self/fd/" + std::to_string(dirfd), ec);
    if (ec) return std::nullopt;
  }
  return (base / p).lexically_normal();
}

// The path inside the sandbox ("" for the sandbox itself), or nothing when outside.
std::optional<fs::path> inside(const std::optional<fs::path>& abs) {
  if (!abs) return std::nullopt;
  fs::path a = *abs;
  if (!a.has_filename()) a = a.parent_path();
  const fs::path rel = a.lexically_relative(g->root);
  if (rel.empty()) return std::nullopt;
  if (rel == ".") return fs::path();
  if (*rel.begin() == "..") return std::nullopt;
  return rel;
}

int lookup(const fs::path& rel) {
  int id = 0;
  for (const auto& c : rel) {
    if (c.empty() || c == ".") continue;
    const node& n = g->live[static_cast<std::size_t>(id)];
    if (!n.dir) return -1;
    const auto it = n.kids.find(c.string());
    if (it == n.kids.end()) return -1;
    id = it->second;
  }
  return id;
}

std::pair<int, std::string> parent_of(const fs::path& rel) {
  return {lookup(rel.parent_path()), rel.filename().string()};
}

int new_node(bool dir) {
  g->live.push_back(node{dir, {}, {}});
  return static_cast<int>(g->live.size() - 1);
}

void problem(std::string what) {
  g->problems.push_back(std::move(what));
}

void log_ns(std::vector<entry_set> sets, std::string label) {
  op o;
  o.k = kind::ns;
  o.sets = std::move(sets);
  o.label = std::move(label);
  g->ops.push_back(std::move(o));
}

void apply_write(node& n, std::uint64_t off, std::string_view bytes) {
  if (n.data.size() < off + bytes.size()) n.data.resize(off + bytes.size(), '\0');
  std::memcpy(n.data.data() + off, bytes.data(), bytes.size());
}

void log_write(int ino, std::uint64_t off, std::string bytes) {
  apply_write(g->live[static_cast<std::size_t>(ino)], off, bytes);
  op o;
  o.k = kind::write;
  o.ino = ino;
  o.off = off;
  o.len = bytes.size();
  o.bytes = std::move(bytes);
  g->ops.push_back(std::move(o));
}

void log_truncate(int ino, std::uint64_t size) {
  g->live[static_cast<std::size_t>(ino)].data.resize(size, '\0');
  op o;
  o.k = kind::truncate;
  o.ino = ino;
  o.off = size;
  g->ops.push_back(std::move(o));
}

// Records the sectors of a mapping that changed since it was last recorded.
void diff_mapping(mapping& mp) {
  const std::size_t n = mp.shadow.size();
  for (std::size_t s = 0; s < n; s += sector) {
    const std::size_t len = std::min(sector, n - s);
    if (std::memcmp(mp.base + s, mp.shadow.data() + s, len) == 0) continue;
    std::string bytes(reinterpret_cast<const char*>(mp.base + s), len);
    std::memcpy(mp.shadow.data() + s, bytes.data(), len);
    log_write(mp.ino, mp.off + s, std::move(bytes));
  }
}

void diff_mappings_of(int ino) {
  for (auto& mp : g->maps) {
    if (mp.ino == ino) diff_mapping(mp);
  }
}

int tracked(int fd) {
  const auto it = g->fds.find(fd);
  return it == g->fds.end() ? -1 : it->second;
}

void load_tree(const fs::path& dir, int id) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory()) {
      const int kid = new_node(true);
      g->live[static_cast<std::size_t>(id)].kids[name] = kid;
      load_tree(e.path(), kid);
    } else if (e.is_regular_file()) {
      const int kid = new_node(false);
      g->live[static_cast<std::size_t>(id)].kids[name] = kid;
      std::string data(static_cast<std::size_t>(e.file_size()), '\0');
      FILE* f = std::fopen(e.path().c_str(), "rb");
      if (f != nullptr) {
        if (std::fread(data.data(), 1, data.size(), f) != data.size()) {
          problem("could not read '" + e.path().string() + "'");
        }
        std::fclose(f);
      }
      g->live[static_cast<std::size_t>(kid)].data = std::move(data);
    } else {
      problem("'" + e.path().string() + "' is neither a file nor a directory");
    }
  }
}

// Compares the model under `id` with the real tree at `dir`.
void compare_tree(const fs::path& dir, int id, const std::vector<node>& t,
                  std::vector<std::string>& out) {
  const node& n = t[static_cast<std::size_t>(id)];
  std::set<std::string> seen;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    seen.insert(name);
    const auto it = n.kids.find(name);
    if (it == n.kids.end()) {
      out.push_back("the model lacks '" + e.path().string() + "'");
      continue;
    }
    const node& k = t[static_cast<std::size_t>(it->second)];
    if (e.is_directory() != k.dir) {
      out.push_back("the model has the wrong kind of entry at '" + e.path().string() + "'");
    } else if (k.dir) {
      compare_tree(e.path(), it->second, t, out);
    } else {
      std::string data(static_cast<std::size_t>(e.file_size()), '\0');
      FILE* f = std::fopen(e.path().c_str(), "rb");
      bool ok = f != nullptr && std::fread(data.data(), 1, data.size(), f) == data.size();
      if (f != nullptr) std::fclose(f);
      if (!ok || data != k.data) {
        out.push_back("the model's bytes of '" + e.path().string() + "' differ from the file's (" +
                      std::to_string(k.data.size()) + " vs " + std::to_string(data.size()) +
                      " bytes)");
      }
    }
  }
  for (const auto& [name, kid] : n.kids) {
    (void)kid;
    if (!seen.contains(name)) out.push_back("the model has '" + (dir / name).string() + "' extra");
  }
}

std::string describe(const op& o) {
  std::ostringstream s;
  switch (o.k) {
    case kind::ns:
      s << "dir  " << o.label;
      break;
    case kind::write:
      s << "write  ino " << o.ino << " [" << o.off << ", " << o.off + o.len << ")";
      break;
    case kind::truncate:
      s << "size  ino " << o.ino << " -> " << o.off;
      break;
    case kind::sync:
      s << "fsync  ino " << o.ino;
      break;
    case kind::sync_range:
      s << "msync  ino " << o.ino << " [" << o.off << ", " << o.off + o.len << ")";
      break;
    case kind::mark:
      s << "mark  " << o.label;
      break;
  }
  return s.str();
}

// ---- crash states ----

struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

// How the un-forced data operations of one file persist.
struct data_choice {
  enum mode_t { subset, torn_last, zeroed } mode = subset;
  std::vector<char> keep;  // per un-forced operation of the file (subset)
};

// Choice lists over n items: all subsets when small, else the corner cases and random ones.
std::vector<std::vector<char>> subsets(std::size_t n, std::size_t all_up_to, std::size_t randoms,
                                       rng& r) {
  std::vector<std::vector<char>> out;
  if (n <= all_up_to) {
    for (std::uint64_t m = 0; m < (std::uint64_t{1} << n); ++m) {
      std::vector<char> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<char>((m >> i) & 1);
      out.push_back(std::move(v));
    }
    return out;
  }
  for (std::size_t p = 0; p <= n; ++p) {  // prefixes (none .. all)
    std::vector<char> v(n, 0);
    std::fill(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(p), 1);
    out.push_back(std::move(v));
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<char> drop(n, 1), only(n, 0);
    drop[i] = 0;
    only[i] = 1;
    out.push_back(std::move(drop));
    out.push_back(std::move(only));
  }
  for (std::size_t k = 0; k < randoms; ++k) {
    std::vector<char> v(n);
    for (auto& c : v) c = static_cast<char>(r.next() & 1);
    out.push_back(std::move(v));
  }
  return out;
}

struct tree_state {
  std::vector<node> nodes;
};

void serialize(const std::vector<node>& t, int id, const std::string& path, std::string& out,
               int depth) {
  const node& n = t[static_cast<std::size_t>(id)];
  if (depth > 32) return;  // a directory linked into itself by reordered renames
  for (const auto& [name, kid] : n.kids) {
    const node& k = t[static_cast<std::size_t>(kid)];
    const std::string p = path + "/" + name;
    if (k.dir) {
      out += "D " + p + "\n";
      serialize(t, kid, p, out, depth + 1);
    } else {
      out += "F " + p + " " + std::to_string(k.data.size()) + " ";
      out += hone::io::hash128(std::as_bytes(std::span(k.data.data(), k.data.size()))).hex();
      out += "\n";
    }
  }
}

void materialize(const std::vector<node>& t, int id, const fs::path& dir, int depth) {
  if (depth > 32) return;
  for (const auto& [name, kid] : t[static_cast<std::size_t>(id)].kids) {
    const node& k = t[static_cast<std::size_t>(kid)];
    if (k.dir) {
      fs::create_directory(dir / name);
      materialize(t, kid, dir / name, depth + 1);
    } else {
      FILE* f = std::fopen((dir / name).c_str(), "wb");
      if (f == nullptr) throw std::runtime_error("cannot create " + (dir / name).string());
      const bool ok = std::fwrite(k.data.data(), 1, k.data.size(), f) == k.data.size();
      if (std::fclose(f) != 0 || !ok)
        throw std::runtime_error("cannot write " + (dir / name).string());
    }
  }
}

}  // namespace

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

// ---- the hooks the shim calls while recording ----
using power_loss::g;
namespace pl = power_loss;

extern "C" {

int pl_hook_openat(int dirfd, const char* path, int flags, mode_t mode) {
  std::lock_guard lock(g->m);
  const auto rel = pl::inside(pl::absolute_of(dirfd, path));
  const int existed = rel ? pl::lookup(*rel) : -1;
  const int fd = pl_real_openat(dirfd, path, flags, mode);
  if (fd < 0 || !rel) return fd;
  pl::errno_keeper keep;
  int id = existed;
  if (existed < 0) {
    const auto [parent, leaf] = pl::parent_of(*rel);
    if (!(flags & O_CREAT) || parent < 0) {
      pl::problem("opened '" + std::string(path) + "', which the model does not have");
      return fd;
    }
    id = pl::new_node(false);
    g->live[static_cast<std::size_t>(parent)].kids[leaf] = id;
    pl::log_ns({{parent, leaf, id}}, "create " + rel->string());
  } else if ((flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY &&
             !g->live[static_cast<std::size_t>(existed)].dir) {
    pl::log_truncate(existed, 0);
  }
  g->fds[fd] = id;
  return fd;
}

int pl_hook_close(int fd) {
  std::lock_guard lock(g->m);
  const int r = pl_real_close(fd);
  pl::errno_keeper keep;
  g->fds.erase(fd);
  return r;
}

ssize_t pl_hook_write(int fd, const void* buf, size_t n, off_t offset, int positional) {
  std::lock_guard lock(g->m);
  const int ino = pl::tracked(fd);
  if (ino < 0) return pl_real_write(fd, buf, n, offset, positional);
  std::uint64_t at = static_cast<std::uint64_t>(offset);
  if (!positional) {
    if (::fcntl(fd, F_GETFL) & O_APPEND) pl::problem("O_APPEND writes are not modelled");
    at = static_cast<std::uint64_t>(::lseek(fd, 0, SEEK_CUR));
  }
  const ssize_t r = pl_real_write(fd, buf, n, offset, positional);
  pl::errno_keeper keep;
  if (r > 0) {
    pl::log_write(ino, at, std::string(static_cast<const char*>(buf), static_cast<std::size_t>(r)));
  }
  return r;
}

int pl_hook_ftruncate(int fd, off_t length) {
  std::lock_guard lock(g->m);
  const int r = pl_real_ftruncate(fd, length);
  pl::errno_keeper keep;
  const int ino = pl::tracked(fd);
  if (r == 0 && ino >= 0) pl::log_truncate(ino, static_cast<std::uint64_t>(length));
  return r;
}

int pl_hook_fallocate(int fd, int mode, off_t offset, off_t len, int posix) {
  std::lock_guard lock(g->m);
  const int r = pl_real_fallocate(fd, mode, offset, len, posix);
  pl::errno_keeper keep;
  const int ino = pl::tracked(fd);
  if (r != 0 || ino < 0) return r;
  if (mode != 0) {
    pl::problem("fallocate mode " + std::to_string(mode) + " is not modelled");
    return r;
  }
  const auto end = static_cast<std::uint64_t>(offset + len);
  if (end > g->live[static_cast<std::size_t>(ino)].data.size()) pl::log_truncate(ino, end);
  return r;
}

int pl_hook_fsync(int fd, int data_only) {
  std::lock_guard lock(g->m);
  const int ino = pl::tracked(fd);
  if (ino >= 0) pl::diff_mappings_of(ino);  // fsync also writes a file's mapped pages
  const int r = pl_real_fsync(fd, data_only);
  pl::errno_keeper keep;
  if (r == 0 && ino >= 0) {
    pl::op o;
    o.k = pl::kind::sync;
    o.ino = ino;
    g->ops.push_back(std::move(o));
  }
  return r;
}

int pl_hook_renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                      unsigned flags) {
  std::lock_guard lock(g->m);
  const auto a = pl::inside(pl::absolute_of(olddirfd, oldpath));
  const auto b = pl::inside(pl::absolute_of(newdirfd, newpath));
  const int ia = a ? pl::lookup(*a) : -1;
  const int ib = b ? pl::lookup(*b) : -1;
  const int r = pl_real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
  pl::errno_keeper keep;
  if (r != 0 || (!a && !b)) return r;
  if (!a || !b || ia < 0) {
    pl::problem("rename '" + std::string(oldpath) + "' -> '" + std::string(newpath) +
                "' crosses the recorded tree or starts from an unknown entry");
    return r;
  }
  if (*a == *b) return r;
  const auto [pa, la] = pl::parent_of(*a);
  const auto [pb, lb] = pl::parent_of(*b);
  auto& ka = g->live[static_cast<std::size_t>(pa)].kids;
  auto& kb = g->live[static_cast<std::size_t>(pb)].kids;
  if (flags & RENAME_EXCHANGE) {
    ka[la] = ib;
    kb[lb] = ia;
    pl::log_ns({{pa, la, ib}, {pb, lb, ia}}, "exchange " + a->string() + " <-> " + b->string());
  } else {
    ka.erase(la);
    kb[lb] = ia;
    pl::log_ns({{pb, lb, ia}, {pa, la, -1}}, "rename " + a->string() + " -> " + b->string());
  }
  return r;
}

int pl_hook_mkdirat(int dirfd, const char* path, mode_t mode) {
  std::lock_guard lock(g->m);
  const auto rel = pl::inside(pl::absolute_of(dirfd, path));
  const int r = pl_real_mkdirat(dirfd, path, mode);
  pl::errno_keeper keep;
  if (r != 0 || !rel) return r;
  const auto [parent, leaf] = pl::parent_of(*rel);
  if (parent < 0) {
    pl::problem("mkdir '" + std::string(path) + "' in a directory the model does not have");
    return r;
  }
  const int id = pl::new_node(true);
  g->live[static_cast<std::size_t>(parent)].kids[leaf] = id;
  pl::log_ns({{parent, leaf, id}}, "mkdir " + rel->string());
  return r;
}

static void pl_unlinked(const std::optional<fs::path>& rel) {
  const auto [parent, leaf] = pl::parent_of(*rel);
  if (parent < 0) return;
  g->live[static_cast<std::size_t>(parent)].kids.erase(leaf);
  pl::log_ns({{parent, leaf, -1}}, "unlink " + rel->string());
}

int pl_hook_unlinkat(int dirfd, const char* path, int flags) {
  std::lock_guard lock(g->m);
  const auto rel = pl::inside(pl::absolute_of(dirfd, path));
  const int r = pl_real_unlinkat(dirfd, path, flags);
  pl::errno_keeper keep;
  if (r == 0 && rel) pl_unlinked(rel);
  return r;
}

int pl_hook_remove(const char* path) {
  std::lock_guard lock(g->m);
  const auto rel = pl::inside(pl::absolute_of(AT_FDCWD, path));
  const int r = pl_real_remove(path);
  pl::errno_keeper keep;
  if (r == 0 && rel) pl_unlinked(rel);
  return r;
}

void* pl_hook_mmap(void* addr, size_t len, int prot, int flags, int fd, off_t offset) {
  std::lock_guard lock(g->m);
  void* p = pl_real_mmap(addr, len, prot, flags, fd, offset);
  pl::errno_keeper keep;
  const int ino = pl::tracked(fd);
  if (p == MAP_FAILED || ino < 0 || !(flags & MAP_SHARED) || !(prot & PROT_WRITE)) return p;
  pl::mapping mp;
  mp.base = static_cast<std::byte*>(p);
  mp.len = len;
  mp.ino = ino;
  mp.off = static_cast<std::uint64_t>(offset);
  const std::string& data = g->live[static_cast<std::size_t>(ino)].data;
  const std::size_t have =
      data.size() > mp.off ? std::min<std::size_t>(len, data.size() - mp.off) : 0;
  mp.shadow = data.substr(static_cast<std::size_t>(mp.off), have);
  g->maps.push_back(std::move(mp));
  return p;
}

int pl_hook_msync(void* addr, size_t len, int flags) {
  std::lock_guard lock(g->m);
  auto* a = static_cast<std::byte*>(addr);
  pl::mapping* hit = nullptr;
  for (auto& mp : g->maps) {
    if (a >= mp.base && a < mp.base + mp.len) hit = &mp;
  }
  if (hit != nullptr) pl::diff_mapping(*hit);
  const int r = pl_real_msync(addr, len, flags);
  pl::errno_keeper keep;
  if (r == 0 && hit != nullptr && (flags & MS_SYNC)) {
    pl::op o;
    o.k = pl::kind::sync_range;
    o.ino = hit->ino;
    // Linux writes whole pages: the range is widened to the pages it touches.
    const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t from = hit->off + static_cast<std::uint64_t>(a - hit->base);
    o.off = from / page * page;
    o.len = (from + len + page - 1) / page * page - o.off;
    g->ops.push_back(std::move(o));
  }
  return r;
}

int pl_hook_munmap(void* addr, size_t len) {
  std::lock_guard lock(g->m);
  auto* a = static_cast<std::byte*>(addr);
  for (auto it = g->maps.begin(); it != g->maps.end(); ++it) {
    if (it->base == a) {
      if (it->len != len) pl::problem("a partial munmap of a recorded mapping is not modelled");
      pl::diff_mapping(*it);
      g->maps.erase(it);
      break;
    }
  }
  return pl_real_munmap(addr, len);
}

void pl_hook_unmodeled(const char* call, int fd, int dirfd, const char* path) {
  std::lock_guard lock(g->m);
  pl::errno_keeper keep;
  const bool hit = (fd >= 0 && pl::tracked(fd) >= 0) ||
                   (path != nullptr && pl::inside(pl::absolute_of(dirfd, path)).has_value());
  if (hit) pl::problem(std::string(call) + " on the recorded tree is not modelled");
}

}  // extern "C"
