/* LD_PRELOAD shim for bench/explore/sandbox_cuda_probe.py: print every failing open/ioctl/mmap/connect with its
   errno, to find which call of the CUDA driver a sandbox refuses (gcc -shared -fPIC -o shim.so this.c -ldl). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

static void report(const char *what, const char *detail, unsigned long arg) {
    int e = errno;
    fprintf(stderr, "[shim %d] %s %s 0x%lx -> errno %d (%s)\n", getpid(), what, detail ? detail : "", arg, e, strerror(e));
    errno = e;
}

#define OPEN_LIKE(name, ...)                                                                  \
    int name(const char *p, int flags, ...) {                                                 \
        static int (*real)(const char *, int, ...);                                           \
        if (!real) real = dlsym(RTLD_NEXT, #name);                                            \
        va_list ap; va_start(ap, flags); int mode = va_arg(ap, int); va_end(ap);              \
        int r = real(p, flags, mode);                                                         \
        if (r < 0) report(#name, p, flags);                                                   \
        return r;                                                                             \
    }
OPEN_LIKE(open)
OPEN_LIKE(open64)

int openat(int d, const char *p, int flags, ...) {
    static int (*real)(int, const char *, int, ...);
    if (!real) real = dlsym(RTLD_NEXT, "openat");
    va_list ap; va_start(ap, flags); int mode = va_arg(ap, int); va_end(ap);
    int r = real(d, p, flags, mode);
    if (r < 0) report("openat", p, flags);
    return r;
}

int ioctl(int fd, unsigned long req, ...) {
    static int (*real)(int, unsigned long, ...);
    if (!real) real = dlsym(RTLD_NEXT, "ioctl");
    va_list ap; va_start(ap, req); void *arg = va_arg(ap, void *); va_end(ap);
    int r = real(fd, req, arg);
    if (r < 0) {
        char link[64], target[256] = "";
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n > 0) target[n] = 0;
        report("ioctl", target, req);
    }
    return r;
}

void *mmap(void *a, size_t len, int prot, int flags, int fd, off_t off) {
    static void *(*real)(void *, size_t, int, int, int, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "mmap");
    void *r = real(a, len, prot, flags, fd, off);
    if (r == MAP_FAILED) report("mmap", "", (unsigned long)len);
    return r;
}

int connect(int s, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    if (!real) real = dlsym(RTLD_NEXT, "connect");
    int r = real(s, addr, len);
    if (r < 0) report("connect", addr->sa_family == AF_UNIX ? ((const char *)addr) + 2 : "inet", addr->sa_family);
    return r;
}

long syscall(long n, ...) {
    static long (*real)(long, ...);
    if (!real) real = dlsym(RTLD_NEXT, "syscall");
    va_list ap; va_start(ap, n);
    long a[6]; for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
    va_end(ap);
    long r = real(n, a[0], a[1], a[2], a[3], a[4], a[5]);
    if (r < 0) { char nr[32]; snprintf(nr, sizeof nr, "nr=%ld", n); report("syscall", nr, (unsigned long)a[0]); }
    return r;
}

int access(const char *p, int mode) {
    static int (*real)(const char *, int);
    if (!real) real = dlsym(RTLD_NEXT, "access");
    int r = real(p, mode);
    if (r < 0) report("access", p, mode);
    return r;
}

ssize_t readlink(const char *p, char *buf, size_t n) {
    static ssize_t (*real)(const char *, char *, size_t);
    if (!real) real = dlsym(RTLD_NEXT, "readlink");
    ssize_t r = real(p, buf, n);
    if (r < 0) report("readlink", p, 0);
    return r;
}

int fcntl(int fd, int cmd, ...) {
    static int (*real)(int, int, ...);
    if (!real) real = dlsym(RTLD_NEXT, "fcntl");
    va_list ap; va_start(ap, cmd); long arg = va_arg(ap, long); va_end(ap);
    int r = real(fd, cmd, arg);
    if (r < 0) report("fcntl", "", (unsigned long)cmd);
    return r;
}
