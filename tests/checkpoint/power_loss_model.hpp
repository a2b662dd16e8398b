// tests/checkpoint/power_loss_model.hpp: the power-loss harness's model of the file tree and the
// log of what the recorded process did to it, shared by the recorder and crash-state enumerator
// (power_loss.cpp) and the hooks the libc shim calls (power_loss_hooks.cpp). Internal to the
// harness; see power_loss.hpp for what it does.
#pragma once

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
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

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

namespace power_loss::detail {
namespace fs = std::filesystem;

inline constexpr std::size_t sector = 512;

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

inline recorder* g = nullptr;

// errno survives the recorder's own work.
struct errno_keeper {
  int saved;
  errno_keeper() : saved(errno) {}
  ~errno_keeper() { errno = saved; }
};

inline std::optional<fs::path> absolute_of(int dirfd, const char* path) {
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
inline std::optional<fs::path> inside(const std::optional<fs::path>& abs) {
  if (!abs) return std::nullopt;
  fs::path a = *abs;
  if (!a.has_filename()) a = a.parent_path();
  const fs::path rel = a.lexically_relative(g->root);
  if (rel.empty()) return std::nullopt;
  if (rel == ".") return fs::path();
  if (*rel.begin() == "..") return std::nullopt;
  return rel;
}

inline int lookup(const fs::path& rel) {
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

inline std::pair<int, std::string> parent_of(const fs::path& rel) {
  return {lookup(rel.parent_path()), rel.filename().string()};
}

inline int new_node(bool dir) {
  g->live.push_back(node{dir, {}, {}});
  return static_cast<int>(g->live.size() - 1);
}

inline void problem(std::string what) {
  g->problems.push_back(std::move(what));
}

inline void log_ns(std::vector<entry_set> sets, std::string label) {
  op o;
  o.k = kind::ns;
  o.sets = std::move(sets);
  o.label = std::move(label);
  g->ops.push_back(std::move(o));
}

inline void apply_write(node& n, std::uint64_t off, std::string_view bytes) {
  if (n.data.size() < off + bytes.size()) n.data.resize(off + bytes.size(), '\0');
  std::memcpy(n.data.data() + off, bytes.data(), bytes.size());
}

inline void log_write(int ino, std::uint64_t off, std::string bytes) {
  apply_write(g->live[static_cast<std::size_t>(ino)], off, bytes);
  op o;
  o.k = kind::write;
  o.ino = ino;
  o.off = off;
  o.len = bytes.size();
  o.bytes = std::move(bytes);
  g->ops.push_back(std::move(o));
}

inline void log_truncate(int ino, std::uint64_t size) {
  g->live[static_cast<std::size_t>(ino)].data.resize(size, '\0');
  op o;
  o.k = kind::truncate;
  o.ino = ino;
  o.off = size;
  g->ops.push_back(std::move(o));
}

// Records the sectors of a mapping that changed since it was last recorded.
inline void diff_mapping(mapping& mp) {
  const std::size_t n = mp.shadow.size();
  for (std::size_t s = 0; s < n; s += sector) {
    const std::size_t len = std::min(sector, n - s);
    if (std::memcmp(mp.base + s, mp.shadow.data() + s, len) == 0) continue;
    std::string bytes(reinterpret_cast<const char*>(mp.base + s), len);
    std::memcpy(mp.shadow.data() + s, bytes.data(), len);
    log_write(mp.ino, mp.off + s, std::move(bytes));
  }
}

inline void diff_mappings_of(int ino) {
  for (auto& mp : g->maps) {
    if (mp.ino == ino) diff_mapping(mp);
  }
}

inline int tracked(int fd) {
  const auto it = g->fds.find(fd);
  return it == g->fds.end() ? -1 : it->second;
}

inline void load_tree(const fs::path& dir, int id) {
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
inline void compare_tree(const fs::path& dir, int id, const std::vector<node>& t,
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

inline std::string describe(const op& o) {
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
inline std::vector<std::vector<char>> subsets(std::size_t n, std::size_t all_up_to,
                                              std::size_t randoms, rng& r) {
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

inline void serialize(const std::vector<node>& t, int id, const std::string& path, std::string& out,
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

inline void materialize(const std::vector<node>& t, int id, const fs::path& dir, int depth) {
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

}  // namespace power_loss::detail
