/* Two things programs do that bypass the usual wrappers, run under liblocus_preload.so by
 * programs.rs:
 *
 *   raw_and_closing raw DIR    file calls made with syscall(2) by number (as fsx makes
 *                              copy_file_range); prints what they return, to be compared
 *                              with the same run on tmpfs.
 *   raw_and_closing empty DIR  calls on an fd with an empty name (AT_EMPTY_PATH and
 *                              without it), a null name, and flags glibc refuses; prints
 *                              what they return, to be compared with tmpfs.
 *   raw_and_closing close HOW DIR
 *                              opens DIR/data, writes, then closes every other fd the way
 *                              daemons do (HOW: closefrom, loop, close_range, raw), writes
 *                              again, prints "ready" and waits for a line on stdin (the test
 *                              checks meanwhile that the volume is still held), then prints
 *                              the file. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static char *join(const char *dir, const char *name) {
    static char paths[4][4096];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 4096, "%s/%s", dir, name);
    return p;
}

static void say(const char *what, long r) {
    if (r < 0)
        printf("%s: -1 %s\n", what, strerror(errno));
    else
        printf("%s: %ld\n", what, r);
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int raw(const char *dir) {
    const char *path = join(dir, "raw"), *moved = join(dir, "moved");
    long fd = syscall(SYS_openat, AT_FDCWD, path, O_CREAT | O_RDWR | O_TRUNC, 0644);
    say("openat", fd >= 0 ? 0 : -1);
    say("write", syscall(SYS_write, fd, "0123456789", 10));
    loff_t from = 2, to = 10;
    say("copy_file_range", syscall(SYS_copy_file_range, fd, &from, fd, &to, 5, 0));
    printf("offsets after: %lld %lld\n", (long long)from, (long long)to);
    char buf[64] = {0};
    say("pread64", syscall(SYS_pread64, fd, buf, sizeof buf - 1, 0));
    printf("bytes: %s\n", buf);
    struct stat st;
    say("fstat", syscall(SYS_fstat, fd, &st));
    printf("size: %lld regular: %d\n", (long long)st.st_size, S_ISREG(st.st_mode));
    struct statx stx;
    say("statx", syscall(SYS_statx, AT_FDCWD, path, 0, STATX_SIZE, &stx));
    printf("statx size: %llu\n", (unsigned long long)stx.stx_size);
    say("lseek end", syscall(SYS_lseek, fd, 0, SEEK_END));
    say("ftruncate", syscall(SYS_ftruncate, fd, 12));
    say("newfstatat", syscall(SYS_newfstatat, AT_FDCWD, path, &st, 0));
    printf("size: %lld\n", (long long)st.st_size);
    say("close", syscall(SYS_close, fd));
    say("renameat2 noreplace", syscall(SYS_renameat2, AT_FDCWD, path, AT_FDCWD, moved, 1));
    say("renameat2 onto existing", syscall(SYS_renameat2, AT_FDCWD, moved, AT_FDCWD, moved, 1));
    say("mkdirat", syscall(SYS_mkdirat, AT_FDCWD, join(dir, "sub"), 0755));
    say("faccessat2", syscall(SYS_faccessat2, AT_FDCWD, moved, R_OK | W_OK, 0));
    long d = syscall(SYS_openat, AT_FDCWD, dir, O_RDONLY | O_DIRECTORY, 0);
    say("openat dir", d >= 0 ? 0 : -1);
    char dents[8192];
    long n = syscall(SYS_getdents64, d, dents, sizeof dents);
    say("getdents64 ok", n > 0 ? 0 : -1);
    char *names[64];
    int count = 0;
    for (long at = 0; at < n && count < 64;) {
        struct dirent64 *e = (struct dirent64 *)(dents + at);
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            names[count++] = strdup(e->d_name);
        at += e->d_reclen;
    }
    qsort(names, count, sizeof *names, by_name);
    printf("entries:");
    for (int i = 0; i < count; i++)
        printf(" %s", names[i]);
    printf("\n");
    say("fchdir", syscall(SYS_fchdir, d));
    char cwd[4096];
    long len = syscall(SYS_getcwd, cwd, sizeof cwd);
    printf("getcwd: length right %d, names the directory %d\n",
           len == (long)strlen(cwd) + 1, strcmp(cwd, dir) == 0);
    say("close dir", syscall(SYS_close, d));
    say("unlinkat", syscall(SYS_unlinkat, AT_FDCWD, moved, 0));
    say("unlinkat dir", syscall(SYS_unlinkat, AT_FDCWD, join(dir, "sub"), AT_REMOVEDIR));
    return 0;
}

static int empty(const char *dir) {
    int fd = open(join(dir, "e"), O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "12345", 5) != 5) {
        perror("open/write");
        return 1;
    }
    struct stat st;
    struct statx sx;
    say("fstatat AT_EMPTY_PATH", fstatat(fd, "", &st, AT_EMPTY_PATH));
    printf("size: %lld\n", (long long)st.st_size);
    say("statx AT_EMPTY_PATH", statx(fd, "", AT_EMPTY_PATH, STATX_SIZE, &sx));
    printf("size: %llu\n", (unsigned long long)sx.stx_size);
    say("fstatat empty name", fstatat(fd, "", &st, 0));
    say("fchownat AT_EMPTY_PATH", fchownat(fd, "", getuid(), getgid(), AT_EMPTY_PATH));
    say("fchownat empty name", fchownat(fd, "", getuid(), getgid(), 0));
    struct timespec times[2] = {{1000, 0}, {2000, 0}};
    say("utimensat by number, null name", syscall(SYS_utimensat, fd, NULL, times, 0));
    fstat(fd, &st);
    printf("mtime: %lld\n", (long long)st.st_mtime);
    say("fchmodat AT_EMPTY_PATH", fchmodat(fd, "", 0600, AT_EMPTY_PATH));
    fstat(fd, &st);
    printf("mode: %o\n", st.st_mode & 0777);
    int d = open(dir, O_RDONLY | O_DIRECTORY);
    say("fstatat directory AT_EMPTY_PATH", fstatat(d, "", &st, AT_EMPTY_PATH));
    printf("directory: %d\n", S_ISDIR(st.st_mode));
    say("openat empty name", openat(d, "", O_RDONLY));
    say("faccessat", faccessat(d, "e", R_OK, 0));
    return close(d) || close(fd);
}

static int closing(const char *how, const char *dir) {
    int fd = open(join(dir, "data"), O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "before\n", 7) != 7) {
        perror("open/write");
        return 1;
    }
    if (!strcmp(how, "closefrom")) {
        closefrom(fd + 1);
    } else if (!strcmp(how, "loop")) {
        long max = sysconf(_SC_OPEN_MAX);
        for (long i = fd + 1; i < max; i++)
            close((int)i);
    } else if (!strcmp(how, "close_range")) {
        if (close_range(fd + 1, ~0U, 0)) {
            perror("close_range");
            return 1;
        }
    } else if (!strcmp(how, "raw")) {
        if (syscall(SYS_close_range, fd + 1, ~0U, 0)) {
            perror("close_range by number");
            return 1;
        }
    } else {
        fprintf(stderr, "unknown way of closing: %s\n", how);
        return 2;
    }
    if (write(fd, "after\n", 6) != 6) {
        perror("write after closing");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    char buf[64] = {0};
    if (pread(fd, buf, sizeof buf - 1, 0) < 0) {
        perror("pread");
        return 1;
    }
    printf("%s", buf);
    return close(fd) ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "raw"))
        return raw(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "empty"))
        return empty(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "close"))
        return closing(argv[2], argv[3]);
    fprintf(stderr, "usage: %s raw DIR | empty DIR | close closefrom|loop|close_range|raw DIR\n",
            argv[0]);
    return 2;
}
