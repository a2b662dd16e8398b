// The hooks the libc shim (power_loss_shim.c) calls while the power-loss harness records: each
// updates the model of the tree (power_loss_model.hpp) and logs the operation.
#include "power_loss_model.hpp"

namespace fs = std::filesystem;

using power_loss::detail::g;
namespace pl = power_loss::detail;

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
