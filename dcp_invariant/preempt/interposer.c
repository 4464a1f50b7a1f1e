/* dcp-invariant preempt: the file operations a training job makes under its run directory,
 * each reported to the tool before it happens, which answers when the job may go on.
 *
 * Loaded with LD_PRELOAD into every process of the job (the launcher, torchrun's ranks, a
 * DataLoader's workers): Python (CPython's os and io modules call these libc functions), C++
 * (torch.save to a path writes through libstdc++'s filebuf, which calls fopen64 and write) and
 * Rust (safetensors: std::fs calls open64 and write) all reach the disk through them. A write
 * the tool never hears of is one it cannot crash before, so each entry point that can change a
 * file under the run directory is here; reads are not.
 *
 * Protocol: one line per operation, "OP\tRANK\tPATH\tPATH2\n", on a Unix socket named by
 * DCP_INVARIANT_PREEMPT_SOCKET; the tool answers one byte, and the operation runs. Paths are
 * relative to DCP_INVARIANT_PREEMPT_ROOT (the run directory); anything outside it is not
 * reported. Without those variables the library does nothing.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_FDS 65536

static char root[PATH_MAX];
static size_t root_len;
static char sock_path[108];
static char rank[32] = "main";
static int sock = -1;
static int active;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int inside;
/* The relative path each write-open descriptor was opened on; NULL when not under the root. */
static char *tracked[MAX_FDS];

static void forget_after_fork(void) {
    /* The child must not share the parent's connection: its lines would interleave. */
    if (sock >= 0) syscall(SYS_close, sock);
    sock = -1;
    pthread_mutex_init(&lock, NULL);
}

/* Start reporting, as the environment says: at load, and again in a process forked from one
 * that loaded the library inactive (preempt's relaunch server), once its environment names
 * the socket. Returns whether it reports. */
int dcp_invariant_preempt_activate(void) {
    static int registered;
    const char *r = getenv("DCP_INVARIANT_PREEMPT_ROOT");
    const char *s = getenv("DCP_INVARIANT_PREEMPT_SOCKET");
    const char *k = getenv("RANK");
    if (active) return 1;
    if (!r || !s || strlen(s) >= sizeof(sock_path) || !realpath(r, root)) return 0;
    root_len = strlen(root);
    strcpy(sock_path, s);
    /* torchrun's ranks carry RANK; a plain `python train.py` is the job's one process. */
    if (k && *k && strlen(k) < sizeof(rank)) strcpy(rank, k);
    if (!registered) pthread_atfork(NULL, NULL, forget_after_fork);
    registered = 1;
    active = 1;
    return 1;
}

__attribute__((constructor)) static void init(void) { dcp_invariant_preempt_activate(); }

/* PATH (relative to DIRFD) as a path under the root, normalised lexically; NULL if outside. */
static char *relative(int dirfd, const char *path) {
    char joined[PATH_MAX * 2], out[PATH_MAX];
    if (!path) return NULL;
    if (path[0] == '/') {
        snprintf(joined, sizeof(joined), "%s", path);
    } else {
        char base[PATH_MAX];
        if (dirfd == AT_FDCWD) {
            if (!getcwd(base, sizeof(base))) return NULL;
        } else {
            char link[64];
            snprintf(link, sizeof(link), "/proc/self/fd/%d", dirfd);
            ssize_t n = readlink(link, base, sizeof(base) - 1);
            if (n < 0) return NULL;
            base[n] = 0;
        }
        snprintf(joined, sizeof(joined), "%s/%s", base, path);
    }
    /* Lexical normalisation: drop "." and empty parts, undo ".." */
    size_t len = 0;
    char *save = NULL;
    for (char *part = strtok_r(joined, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        if (!strcmp(part, ".")) continue;
        if (!strcmp(part, "..")) {
            while (len > 0 && out[len - 1] != '/') len--;
            if (len > 0) len--;
            continue;
        }
        size_t plen = strlen(part);
        if (len + plen + 2 >= sizeof(out)) return NULL;
        out[len++] = '/';
        memcpy(out + len, part, plen);
        len += plen;
    }
    out[len] = 0;
    if (len <= root_len || strncmp(out, root, root_len) || out[root_len] != '/') return NULL;
    return strdup(out + root_len + 1);
}

static void say(const char *op, const char *a, const char *b) {
    char line[PATH_MAX * 2 + 96];
    int n = snprintf(line, sizeof(line), "%s\t%s\t%s\t%s\n", op, rank, a ? a : "", b ? b : "");
    if (n <= 0 || (size_t)n >= sizeof(line)) return;
    pthread_mutex_lock(&lock);
    if (sock < 0) {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        strcpy(addr.sun_path, sock_path);
        sock = (int)syscall(SYS_socket, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (sock >= 0 && syscall(SYS_connect, sock, &addr, sizeof(addr)) != 0) {
            syscall(SYS_close, sock);
            sock = -1;
        }
    }
    if (sock >= 0) {
        ssize_t off = 0;
        while (off < n) {
            ssize_t w = syscall(SYS_write, sock, line + off, (size_t)(n - off));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break;
            off += w;
        }
        char ack;
        ssize_t r;
        do r = syscall(SYS_read, sock, &ack, 1); while (r < 0 && errno == EINTR);
    }
    pthread_mutex_unlock(&lock);
}

#define REAL(name) static __typeof__(name) *real_##name; \
    if (!real_##name) real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

static int writes(int flags) { return (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND)) != 0; }

static void track(int fd, char *rel) {
    if (fd >= 0 && fd < MAX_FDS) { free(tracked[fd]); tracked[fd] = rel; } else free(rel);
}

/* An open for writing under the root: said before it happens (it may create or truncate). */
static char *opening(int dirfd, const char *path, int flags) {
    if (!active || inside || !writes(flags)) return NULL;
    char *rel = relative(dirfd, path);
    if (rel) { inside = 1; say((flags & O_TRUNC) ? "truncate-open" : "open", rel, NULL); inside = 0; }
    return rel;
}

static void on_fd(const char *op, int fd) {
    if (!active || inside || fd < 0 || fd >= MAX_FDS || !tracked[fd]) return;
    inside = 1; say(op, tracked[fd], NULL); inside = 0;
}

static void on_path(const char *op, int dirfd, const char *path, int dirfd2, const char *path2) {
    if (!active || inside) return;
    char *a = relative(dirfd, path);
    char *b = path2 ? relative(dirfd2, path2) : NULL;
    if (a || b) { inside = 1; say(op, a ? a : "-", b); inside = 0; }
    free(a); free(b);
}

#define OPEN_BODY(realname, dirfd, path, flags) \
    mode_t mode = 0; \
    if (flags & (O_CREAT | __O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); } \
    char *rel = opening(dirfd, path, flags); \
    int fd = realname; \
    if (rel) track(fd, rel); \
    return fd;

int open(const char *path, int flags, ...) { REAL(open); OPEN_BODY(real_open(path, flags, mode), AT_FDCWD, path, flags) }
int open64(const char *path, int flags, ...) { REAL(open64); OPEN_BODY(real_open64(path, flags, mode), AT_FDCWD, path, flags) }
int openat(int d, const char *path, int flags, ...) { REAL(openat); OPEN_BODY(real_openat(d, path, flags, mode), d, path, flags) }
int openat64(int d, const char *path, int flags, ...) { REAL(openat64); OPEN_BODY(real_openat64(d, path, flags, mode), d, path, flags) }
int creat(const char *path, mode_t mode) { return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode); }
int creat64(const char *path, mode_t mode) { return open64(path, O_CREAT | O_WRONLY | O_TRUNC, mode); }

static int mode_writes(const char *m) { return m && (strchr(m, 'w') || strchr(m, 'a') || strchr(m, '+')); }

#define FOPEN_BODY(call) \
    char *rel = (active && !inside && mode_writes(mode)) ? relative(AT_FDCWD, path) : NULL; \
    if (rel) { inside = 1; say(strchr(mode, 'w') ? "truncate-open" : "open", rel, NULL); inside = 0; } \
    FILE *f = call; \
    if (rel) track(f ? fileno(f) : -1, rel); \
    return f;

FILE *fopen(const char *path, const char *mode) { REAL(fopen); FOPEN_BODY(real_fopen(path, mode)) }
FILE *fopen64(const char *path, const char *mode) { REAL(fopen64); FOPEN_BODY(real_fopen64(path, mode)) }

ssize_t write(int fd, const void *buf, size_t n) { REAL(write); on_fd("write", fd); return real_write(fd, buf, n); }
ssize_t pwrite(int fd, const void *buf, size_t n, off_t o) { REAL(pwrite); on_fd("write", fd); return real_pwrite(fd, buf, n, o); }
ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t o) { REAL(pwrite64); on_fd("write", fd); return real_pwrite64(fd, buf, n, o); }
ssize_t writev(int fd, const struct iovec *v, int c) { REAL(writev); on_fd("write", fd); return real_writev(fd, v, c); }
ssize_t pwritev(int fd, const struct iovec *v, int c, off_t o) { REAL(pwritev); on_fd("write", fd); return real_pwritev(fd, v, c, o); }
size_t fwrite(const void *p, size_t s, size_t n, FILE *f) { REAL(fwrite); on_fd("write", fileno(f)); return real_fwrite(p, s, n, f); }
ssize_t sendfile(int out, int in, off_t *o, size_t n) { REAL(sendfile); on_fd("write", out); return real_sendfile(out, in, o, n); }
ssize_t copy_file_range(int i, off64_t *oi, int out, off64_t *oo, size_t n, unsigned int fl) { REAL(copy_file_range); on_fd("write", out); return real_copy_file_range(i, oi, out, oo, n, fl); }
int ftruncate(int fd, off_t len) { REAL(ftruncate); on_fd("truncate", fd); return real_ftruncate(fd, len); }
int ftruncate64(int fd, off64_t len) { REAL(ftruncate64); on_fd("truncate", fd); return real_ftruncate64(fd, len); }
int fsync(int fd) { REAL(fsync); int r = real_fsync(fd); on_fd("fsync", fd); return r; }
int fdatasync(int fd) { REAL(fdatasync); int r = real_fdatasync(fd); on_fd("fsync", fd); return r; }

int close(int fd) {
    REAL(close);
    if (fd >= 0 && fd < MAX_FDS && tracked[fd]) { on_fd("close", fd); track(fd, NULL); tracked[fd] = NULL; }
    return real_close(fd);
}
int fclose(FILE *f) {
    REAL(fclose);
    int fd = f ? fileno(f) : -1;
    if (fd >= 0 && fd < MAX_FDS && tracked[fd]) {
        /* What fclose flushes is written by glibc inside it, out of reach: said as one write. */
        on_fd("write", fd); on_fd("close", fd); free(tracked[fd]); tracked[fd] = NULL;
    }
    return real_fclose(f);
}

int rename(const char *a, const char *b) { REAL(rename); on_path("rename", AT_FDCWD, a, AT_FDCWD, b); return real_rename(a, b); }
int renameat(int da, const char *a, int db, const char *b) { REAL(renameat); on_path("rename", da, a, db, b); return real_renameat(da, a, db, b); }
int renameat2(int da, const char *a, int db, const char *b, unsigned int fl) { REAL(renameat2); on_path("rename", da, a, db, b); return real_renameat2(da, a, db, b, fl); }
int unlink(const char *p) { REAL(unlink); on_path("unlink", AT_FDCWD, p, 0, NULL); return real_unlink(p); }
int unlinkat(int d, const char *p, int fl) { REAL(unlinkat); on_path((fl & AT_REMOVEDIR) ? "rmdir" : "unlink", d, p, 0, NULL); return real_unlinkat(d, p, fl); }
int mkdir(const char *p, mode_t m) { REAL(mkdir); on_path("mkdir", AT_FDCWD, p, 0, NULL); return real_mkdir(p, m); }
int mkdirat(int d, const char *p, mode_t m) { REAL(mkdirat); on_path("mkdir", d, p, 0, NULL); return real_mkdirat(d, p, m); }
int rmdir(const char *p) { REAL(rmdir); on_path("rmdir", AT_FDCWD, p, 0, NULL); return real_rmdir(p); }
int symlink(const char *t, const char *p) { REAL(symlink); on_path("symlink", AT_FDCWD, p, 0, NULL); return real_symlink(t, p); }
int symlinkat(const char *t, int d, const char *p) { REAL(symlinkat); on_path("symlink", d, p, 0, NULL); return real_symlinkat(t, d, p); }
int link(const char *a, const char *b) { REAL(link); on_path("link", AT_FDCWD, b, 0, NULL); return real_link(a, b); }
int linkat(int da, const char *a, int db, const char *b, int fl) { REAL(linkat); on_path("link", db, b, 0, NULL); return real_linkat(da, a, db, b, fl); }
int truncate(const char *p, off_t len) { REAL(truncate); on_path("truncate", AT_FDCWD, p, 0, NULL); return real_truncate(p, len); }
