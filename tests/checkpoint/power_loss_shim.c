/* The power-loss harness's interposition layer (test-only). The test executable defines the libc
 * functions that change a file system (open with O_CREAT/O_TRUNC, write, pwrite, ftruncate,
 * fallocate, fsync, fdatasync, rename, renameat2, mkdir, unlink, rmdir, remove, mmap, msync,
 * munmap, close). Being defined in the executable (exported with ENABLE_EXPORTS), they take
 * precedence over libc's for every caller: hone's inline code and libstdc++'s std::filesystem
 * alike. While a recording is active each call goes to the recorder (power_loss.cpp), which runs
 * the real function (reached with dlsym(RTLD_NEXT)) and logs what it changed; otherwise the call
 * goes straight to libc. Calls the recorder does not model (writev, copy_file_range, link, dup,
 * ...) are reported to it, so a save that starts using them fails the test instead of escaping
 * the model.
 *
 * C rather than C++: these definitions must match glibc's declarations exactly (C++ would also
 * compare exception specifications). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- the recorder (power_loss.cpp) ---- */
extern int pl_hook_openat(int dirfd, const char* path, int flags, mode_t mode);
extern int pl_hook_close(int fd);
extern ssize_t pl_hook_write(int fd, const void* buf, size_t n, off_t offset, int positional);
extern int pl_hook_ftruncate(int fd, off_t length);
extern int pl_hook_fallocate(int fd, int mode, off_t offset, off_t len, int posix);
extern int pl_hook_fsync(int fd, int data_only);
extern int pl_hook_renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                             unsigned flags);
extern int pl_hook_mkdirat(int dirfd, const char* path, mode_t mode);
extern int pl_hook_unlinkat(int dirfd, const char* path, int flags);
extern int pl_hook_remove(const char* path);
extern void* pl_hook_mmap(void* addr, size_t len, int prot, int flags, int fd, off_t offset);
extern int pl_hook_msync(void* addr, size_t len, int flags);
extern int pl_hook_munmap(void* addr, size_t len);
extern void pl_hook_unmodeled(const char* call, int fd, int dirfd, const char* path);

/* Set by the recorder while a recording runs. */
int pl_recording = 0;
/* Set while this thread is inside the recorder: its own calls go straight to libc. */
static __thread int pl_inside = 0;

static int pl_on(void) {
  return __atomic_load_n(&pl_recording, __ATOMIC_ACQUIRE) && !pl_inside;
}

static void* pl_next(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == NULL) {
    fprintf(stderr, "power-loss shim: libc has no '%s'\n", name);
    abort();
  }
  return f;
}

#define PL_REAL(ret, name, params)                            \
  typedef ret(*pl_##name##_fn) params;                        \
  static pl_##name##_fn pl_real_ptr_##name(void) {            \
    static pl_##name##_fn f = NULL;                           \
    pl_##name##_fn g = __atomic_load_n(&f, __ATOMIC_ACQUIRE); \
    if (g == NULL) {                                          \
      g = (pl_##name##_fn)pl_next(#name);                     \
      __atomic_store_n(&f, g, __ATOMIC_RELEASE);              \
    }                                                         \
    return g;                                                 \
  }

PL_REAL(int, openat, (int, const char*, int, ...))
PL_REAL(int, close, (int))
PL_REAL(ssize_t, write, (int, const void*, size_t))
PL_REAL(ssize_t, pwrite, (int, const void*, size_t, off_t))
PL_REAL(int, ftruncate, (int, off_t))
PL_REAL(int, fallocate, (int, int, off_t, off_t))
PL_REAL(int, posix_fallocate, (int, off_t, off_t))
PL_REAL(int, fsync, (int))
PL_REAL(int, fdatasync, (int))
PL_REAL(int, renameat2, (int, const char*, int, const char*, unsigned))
PL_REAL(int, mkdirat, (int, const char*, mode_t))
PL_REAL(int, unlinkat, (int, const char*, int))
PL_REAL(int, remove, (const char*))
PL_REAL(void*, mmap, (void*, size_t, int, int, int, off_t))
PL_REAL(int, msync, (void*, size_t, int))
PL_REAL(int, munmap, (void*, size_t))
PL_REAL(ssize_t, writev, (int, const struct iovec*, int))
PL_REAL(ssize_t, pwritev, (int, const struct iovec*, int, off_t))
PL_REAL(ssize_t, copy_file_range, (int, off_t*, int, off_t*, size_t, unsigned))
PL_REAL(ssize_t, sendfile, (int, int, off_t*, size_t))
PL_REAL(int, truncate, (const char*, off_t))
PL_REAL(int, linkat, (int, const char*, int, const char*, int))
PL_REAL(int, symlinkat, (const char*, int, const char*))
PL_REAL(int, dup, (int))
PL_REAL(int, dup2, (int, int))
PL_REAL(int, dup3, (int, int, int))

/* ---- the real functions, for the recorder ---- */
int pl_real_openat(int dirfd, const char* path, int flags, mode_t mode) {
  return pl_real_ptr_openat()(dirfd, path, flags, mode);
}
int pl_real_close(int fd) {
  return pl_real_ptr_close()(fd);
}
ssize_t pl_real_write(int fd, const void* buf, size_t n, off_t offset, int positional) {
  return positional ? pl_real_ptr_pwrite()(fd, buf, n, offset) : pl_real_ptr_write()(fd, buf, n);
}
int pl_real_ftruncate(int fd, off_t length) {
  return pl_real_ptr_ftruncate()(fd, length);
}
int pl_real_fallocate(int fd, int mode, off_t offset, off_t len, int posix) {
  return posix ? pl_real_ptr_posix_fallocate()(fd, offset, len)
               : pl_real_ptr_fallocate()(fd, mode, offset, len);
}
int pl_real_fsync(int fd, int data_only) {
  return data_only ? pl_real_ptr_fdatasync()(fd) : pl_real_ptr_fsync()(fd);
}
int pl_real_renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                      unsigned flags) {
  return pl_real_ptr_renameat2()(olddirfd, oldpath, newdirfd, newpath, flags);
}
int pl_real_mkdirat(int dirfd, const char* path, mode_t mode) {
  return pl_real_ptr_mkdirat()(dirfd, path, mode);
}
int pl_real_unlinkat(int dirfd, const char* path, int flags) {
  return pl_real_ptr_unlinkat()(dirfd, path, flags);
}
int pl_real_remove(const char* path) {
  return pl_real_ptr_remove()(path);
}
void* pl_real_mmap(void* addr, size_t len, int prot, int flags, int fd, off_t offset) {
  return pl_real_ptr_mmap()(addr, len, prot, flags, fd, offset);
}
int pl_real_msync(void* addr, size_t len, int flags) {
  return pl_real_ptr_msync()(addr, len, flags);
}
int pl_real_munmap(void* addr, size_t len) {
  return pl_real_ptr_munmap()(addr, len);
}

/* ---- the interposed functions ---- */
#define PL_ENTER() pl_inside = 1
#define PL_LEAVE() pl_inside = 0

static mode_t pl_mode(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

static int pl_open_common(int dirfd, const char* path, int flags, mode_t mode) {
  if (!pl_on()) return pl_real_openat(dirfd, path, flags, mode);
  PL_ENTER();
  const int r = pl_hook_openat(dirfd, path, flags, mode);
  PL_LEAVE();
  return r;
}

int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = pl_mode(flags, ap);
  va_end(ap);
  return pl_open_common(AT_FDCWD, path, flags, mode);
}
int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = pl_mode(flags, ap);
  va_end(ap);
  return pl_open_common(AT_FDCWD, path, flags, mode);
}
int openat(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = pl_mode(flags, ap);
  va_end(ap);
  return pl_open_common(dirfd, path, flags, mode);
}
int openat64(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = pl_mode(flags, ap);
  va_end(ap);
  return pl_open_common(dirfd, path, flags, mode);
}
int __open_2(const char* path, int flags);
int __open_2(const char* path, int flags) {
  return pl_open_common(AT_FDCWD, path, flags, 0);
}
int __open64_2(const char* path, int flags);
int __open64_2(const char* path, int flags) {
  return pl_open_common(AT_FDCWD, path, flags, 0);
}
int __openat_2(int dirfd, const char* path, int flags);
int __openat_2(int dirfd, const char* path, int flags) {
  return pl_open_common(dirfd, path, flags, 0);
}
int creat(const char* path, mode_t mode) {
  return pl_open_common(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

int close(int fd) {
  if (!pl_on()) return pl_real_close(fd);
  PL_ENTER();
  const int r = pl_hook_close(fd);
  PL_LEAVE();
  return r;
}

ssize_t write(int fd, const void* buf, size_t n) {
  if (!pl_on()) return pl_real_write(fd, buf, n, 0, 0);
  PL_ENTER();
  const ssize_t r = pl_hook_write(fd, buf, n, 0, 0);
  PL_LEAVE();
  return r;
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t offset) {
  if (!pl_on()) return pl_real_write(fd, buf, n, offset, 1);
  PL_ENTER();
  const ssize_t r = pl_hook_write(fd, buf, n, offset, 1);
  PL_LEAVE();
  return r;
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t offset) {
  return pwrite(fd, buf, n, offset);
}

int ftruncate(int fd, off_t length) {
  if (!pl_on()) return pl_real_ftruncate(fd, length);
  PL_ENTER();
  const int r = pl_hook_ftruncate(fd, length);
  PL_LEAVE();
  return r;
}
int ftruncate64(int fd, off_t length) {
  return ftruncate(fd, length);
}

int fallocate(int fd, int mode, off_t offset, off_t len) {
  if (!pl_on()) return pl_real_fallocate(fd, mode, offset, len, 0);
  PL_ENTER();
  const int r = pl_hook_fallocate(fd, mode, offset, len, 0);
  PL_LEAVE();
  return r;
}
int fallocate64(int fd, int mode, off_t offset, off_t len) {
  return fallocate(fd, mode, offset, len);
}
int posix_fallocate(int fd, off_t offset, off_t len) {
  if (!pl_on()) return pl_real_fallocate(fd, 0, offset, len, 1);
  PL_ENTER();
  const int r = pl_hook_fallocate(fd, 0, offset, len, 1);
  PL_LEAVE();
  return r;
}
int posix_fallocate64(int fd, off_t offset, off_t len) {
  return posix_fallocate(fd, offset, len);
}

int fsync(int fd) {
  if (!pl_on()) return pl_real_fsync(fd, 0);
  PL_ENTER();
  const int r = pl_hook_fsync(fd, 0);
  PL_LEAVE();
  return r;
}
int fdatasync(int fd) {
  if (!pl_on()) return pl_real_fsync(fd, 1);
  PL_ENTER();
  const int r = pl_hook_fsync(fd, 1);
  PL_LEAVE();
  return r;
}

int renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
              unsigned flags) {
  if (!pl_on()) return pl_real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
  PL_ENTER();
  const int r = pl_hook_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
  PL_LEAVE();
  return r;
}
int renameat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath) {
  return renameat2(olddirfd, oldpath, newdirfd, newpath, 0);
}
int rename(const char* oldpath, const char* newpath) {
  return renameat2(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0);
}

int mkdirat(int dirfd, const char* path, mode_t mode) {
  if (!pl_on()) return pl_real_mkdirat(dirfd, path, mode);
  PL_ENTER();
  const int r = pl_hook_mkdirat(dirfd, path, mode);
  PL_LEAVE();
  return r;
}
int mkdir(const char* path, mode_t mode) {
  return mkdirat(AT_FDCWD, path, mode);
}

int unlinkat(int dirfd, const char* path, int flags) {
  if (!pl_on()) return pl_real_unlinkat(dirfd, path, flags);
  PL_ENTER();
  const int r = pl_hook_unlinkat(dirfd, path, flags);
  PL_LEAVE();
  return r;
}
int unlink(const char* path) {
  return unlinkat(AT_FDCWD, path, 0);
}
int rmdir(const char* path) {
  return unlinkat(AT_FDCWD, path, AT_REMOVEDIR);
}
int remove(const char* path) {
  if (!pl_on()) return pl_real_remove(path);
  PL_ENTER();
  const int r = pl_hook_remove(path);
  PL_LEAVE();
  return r;
}

void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t offset) {
  if (!pl_on()) return pl_real_mmap(addr, len, prot, flags, fd, offset);
  PL_ENTER();
  void* r = pl_hook_mmap(addr, len, prot, flags, fd, offset);
  PL_LEAVE();
  return r;
}
void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t offset) {
  return mmap(addr, len, prot, flags, fd, offset);
}
int msync(void* addr, size_t len, int flags) {
  if (!pl_on()) return pl_real_msync(addr, len, flags);
  PL_ENTER();
  const int r = pl_hook_msync(addr, len, flags);
  PL_LEAVE();
  return r;
}
int munmap(void* addr, size_t len) {
  if (!pl_on()) return pl_real_munmap(addr, len);
  PL_ENTER();
  const int r = pl_hook_munmap(addr, len);
  PL_LEAVE();
  return r;
}

/* ---- calls the model does not cover: reported when they touch the recorded tree ---- */
static void pl_unmodeled(const char* call, int fd, int dirfd, const char* path) {
  if (!pl_on()) return;
  PL_ENTER();
  pl_hook_unmodeled(call, fd, dirfd, path);
  PL_LEAVE();
}
ssize_t writev(int fd, const struct iovec* iov, int n) {
  pl_unmodeled("writev", fd, AT_FDCWD, NULL);
  return pl_real_ptr_writev()(fd, iov, n);
}
ssize_t pwritev(int fd, const struct iovec* iov, int n, off_t offset) {
  pl_unmodeled("pwritev", fd, AT_FDCWD, NULL);
  return pl_real_ptr_pwritev()(fd, iov, n, offset);
}
ssize_t copy_file_range(int in, off_t* in_off, int out, off_t* out_off, size_t n, unsigned flags) {
  pl_unmodeled("copy_file_range", out, AT_FDCWD, NULL);
  return pl_real_ptr_copy_file_range()(in, in_off, out, out_off, n, flags);
}
ssize_t sendfile(int out, int in, off_t* offset, size_t n) {
  pl_unmodeled("sendfile", out, AT_FDCWD, NULL);
  return pl_real_ptr_sendfile()(out, in, offset, n);
}
int truncate(const char* path, off_t length) {
  pl_unmodeled("truncate", -1, AT_FDCWD, path);
  return pl_real_ptr_truncate()(path, length);
}
int linkat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, int flags) {
  pl_unmodeled("link", -1, newdirfd, newpath);
  return pl_real_ptr_linkat()(olddirfd, oldpath, newdirfd, newpath, flags);
}
int link(const char* oldpath, const char* newpath) {
  return linkat(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0);
}
int symlinkat(const char* target, int newdirfd, const char* linkpath) {
  pl_unmodeled("symlink", -1, newdirfd, linkpath);
  return pl_real_ptr_symlinkat()(target, newdirfd, linkpath);
}
int symlink(const char* target, const char* linkpath) {
  return symlinkat(target, AT_FDCWD, linkpath);
}
int dup(int fd) {
  pl_unmodeled("dup", fd, AT_FDCWD, NULL);
  return pl_real_ptr_dup()(fd);
}
int dup2(int fd, int fd2) {
  pl_unmodeled("dup2", fd, AT_FDCWD, NULL);
  return pl_real_ptr_dup2()(fd, fd2);
}
int dup3(int fd, int fd2, int flags) {
  pl_unmodeled("dup3", fd, AT_FDCWD, NULL);
  return pl_real_ptr_dup3()(fd, fd2, flags);
}
