/*
 * Exercises locus_fs.h from C, the way a C program uses it. Run as
 *   api_test VOLUME_DIR write    format, build a tree, check every call and error; unmount
 *   api_test VOLUME_DIR crash    open, write more, then _exit without closing anything
 *   api_test VOLUME_DIR verify   open (recovering), check everything the other runs wrote
 *   api_test VOLUME_DIR signals  open; a signal the program blocks and sends itself stays
 *                                pending for it (no thread of the library's takes it)
 * Prints "ok <phase>" and exits 0 when every check holds; otherwise names the failed check
 * and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "locus_fs.h"

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "check failed at line %d: %s: ", __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, " (last error: %s)\n", locus_last_error());       \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

#define MIB (1024 * 1024)

static unsigned char pattern(uint64_t i, unsigned seed) { return (unsigned char)(i * 7 + seed); }

static void fill(unsigned char *buf, size_t len, uint64_t base, unsigned seed) {
    for (size_t i = 0; i < len; i++) buf[i] = pattern(base + i, seed);
}

static void expect_bytes(locus_file *f, uint64_t off, size_t len, uint64_t base, unsigned seed) {
    unsigned char *got = malloc(len);
    ssize_t n = locus_pread(f, got, len, off);
    CHECK(n == (ssize_t)len, "read %zd of %zu bytes at %llu", n, len, (unsigned long long)off);
    for (size_t i = 0; i < len; i++)
        CHECK(got[i] == pattern(base + i, seed), "byte %llu is %u, wanted %u",
              (unsigned long long)(off + i), got[i], pattern(base + i, seed));
    free(got);
}

static void write_phase(const char *dir) {
    CHECK(locus_fs_api_version() == LOCUS_FS_API_VERSION, "version %u", locus_fs_api_version());
    struct locus_fs_options opts = LOCUS_FS_OPTIONS_INIT;
    opts.prelim_buffers = 2;
    locus_fs *fs = locus_fs_format(dir, &opts);
    CHECK(fs != NULL, "format %s: errno %d", dir, errno);

    CHECK(locus_mkdir(fs, "/d", 0755) == 0, "mkdir");
    CHECK(locus_mkdir(fs, "/d", 0755) == -EEXIST, "second mkdir");
    locus_file *f = locus_open(fs, "/d/f", O_CREAT | O_EXCL | O_RDWR, 0644);
    CHECK(f != NULL, "create /d/f");

    /* 1 MiB in 64 KiB pieces, then 1000 bytes at an unaligned offset over it. */
    unsigned char *buf = malloc(MIB);
    fill(buf, MIB, 0, 1);
    for (uint64_t off = 0; off < MIB; off += 65536)
        CHECK(locus_pwrite(f, buf + off, 65536, off) == 65536, "pwrite at %llu",
              (unsigned long long)off);
    fill(buf, 1000, 0, 2);
    CHECK(locus_pwrite(f, buf, 1000, 5000) == 1000, "unaligned pwrite");
    expect_bytes(f, 0, 5000, 0, 1);
    expect_bytes(f, 5000, 1000, 0, 2);
    expect_bytes(f, 6000, MIB - 6000, 6000, 1);

    /* A zero-copy write from a persistent buffer, appended at 1 MiB. */
    locus_buffer *b = locus_buffer_new(fs, 8192);
    CHECK(b != NULL && locus_buffer_len(b) == 8192, "buffer");
    fill(buf, 8192, 0, 3);
    CHECK(locus_buffer_write(b, 0, buf, 8192) == 0, "buffer write");
    unsigned char back[16];
    CHECK(locus_buffer_read(b, 100, back, 16) == 0 && back[0] == pattern(100, 3), "buffer read");
    CHECK(locus_buffer_write(b, 8190, buf, 16) == -EINVAL, "buffer write past its end");
    CHECK(locus_write_buffer(f, b, MIB) == 0, "write_buffer");
    struct locus_stat st;
    CHECK(locus_fstat(f, &st) == 0 && st.size == MIB + 8192 && st.kind == LOCUS_KIND_FILE &&
              st.mode == 0644,
          "fstat size %llu kind %u mode %o", (unsigned long long)st.size, st.kind, st.mode);
    CHECK(locus_pread(f, buf, 100, MIB + 8192) == 0, "read past the end");
    CHECK(locus_fsync(f) == 0, "fsync");

    /* Errors: errno values and a message naming the problem. */
    CHECK(locus_open(fs, "/d/f", O_CREAT | O_EXCL | O_RDWR, 0644) == NULL && errno == EEXIST,
          "exclusive create of an existing file: errno %d", errno);
    CHECK(strstr(locus_last_error(), "/d/f") != NULL, "message names the path: %s",
          locus_last_error());
    CHECK(locus_open(fs, "/d/missing", O_RDONLY, 0) == NULL && errno == ENOENT, "missing");
    CHECK(locus_open(fs, "/d/f", O_RDWR | O_APPEND, 0) == NULL && errno == EINVAL, "O_APPEND");
    CHECK(locus_open(fs, "/d/f/x", O_RDONLY, 0) == NULL && errno == ENOTDIR, "file as dir");
    char long_name[300] = "/";
    memset(long_name + 1, 'n', 256);
    CHECK(locus_open(fs, long_name, O_CREAT | O_RDWR, 0644) == NULL && errno == ENAMETOOLONG,
          "256-byte name: errno %d", errno);
    CHECK(locus_pwrite(NULL, buf, 1, 0) == -EBADF, "NULL file");
    CHECK(locus_stat(fs, NULL, &st) == -EINVAL, "NULL path");
    locus_file *ro = locus_open(fs, "/d/f", O_RDONLY, 0);
    CHECK(ro != NULL, "open read-only");
    CHECK(locus_pwrite(ro, buf, 1, 0) == -EBADF, "write to a read-only handle");
    CHECK(locus_close(ro) == 0, "close read-only");

    /* A file made whole before it has a name (O_TMPFILE), then named; one never named;
     * one that may not be; hard links. */
    locus_file *t = locus_open(fs, "/d", O_TMPFILE | O_RDWR, 0640);
    CHECK(t != NULL, "O_TMPFILE: %s", locus_last_error());
    CHECK(locus_fstat(t, &st) == 0 && st.nlink == 0 && st.mode == 0640, "unnamed: nlink %u",
          (unsigned)st.nlink);
    fill(buf, 70000, 0, 4);
    CHECK(locus_pwrite(t, buf, 70000, 0) == 70000, "write the unnamed file");
    CHECK(locus_stat(fs, "/d/whole", &st) == -ENOENT, "not there before its name");
    CHECK(locus_flink(t, "/d/whole") == 0, "flink: %s", locus_last_error());
    CHECK(locus_flink(t, "/d/whole") == -EEXIST, "flink onto a name");
    CHECK(locus_close(t) == 0, "close the named file");
    CHECK(locus_stat(fs, "/d/whole", &st) == 0 && st.size == 70000 && st.nlink == 1,
          "named: size %llu", (unsigned long long)st.size);
    CHECK(locus_link(fs, "/d/whole", "/whole2") == 0, "link");
    CHECK(locus_stat(fs, "/d/whole", &st) == 0 && st.nlink == 2, "two names");
    CHECK(locus_link(fs, "/d", "/d2") == -EPERM, "link of a directory");
    CHECK(locus_unlink(fs, "/whole2") == 0, "unlink one name");
    t = locus_open(fs, "/d", O_TMPFILE | O_WRONLY | O_EXCL, 0600);
    CHECK(t != NULL && locus_pwrite(t, buf, 100, 0) == 100, "exclusive O_TMPFILE");
    CHECK(locus_flink(t, "/d/never") == -ENOENT, "an exclusive one is never named");
    CHECK(locus_close(t) == 0, "close the unnamed file");
    CHECK(locus_stat(fs, "/d/never", &st) == -ENOENT, "gone");
    CHECK(locus_open(fs, "/d", O_TMPFILE | O_RDONLY, 0600) == NULL && errno == EINVAL,
          "read-only O_TMPFILE");
    CHECK(locus_open(fs, "/d/whole", O_TMPFILE | O_RDWR, 0600) == NULL && errno == ENOTDIR,
          "O_TMPFILE in a file");
    CHECK(locus_unlink(fs, "/d/whole") == 0, "unlink the named file");

    /* Namespace: rename, readdir, unlink, rmdir, truncate, chmod. */
    CHECK(locus_rename(fs, "/d/f", "/d/g") == 0, "rename");
    CHECK(locus_stat(fs, "/d/f", &st) == -ENOENT, "old name gone");
    locus_file *h = locus_open(fs, "/d/h", O_CREAT | O_WRONLY, 0600);
    CHECK(h != NULL && locus_close(h) == 0, "create /d/h");
    CHECK(locus_rmdir(fs, "/d") == -ENOTEMPTY, "rmdir of a full directory");
    locus_dir *dir_list = locus_opendir(fs, "/d");
    CHECK(dir_list != NULL, "opendir");
    struct locus_dirent ent;
    int seen_g = 0, seen_h = 0, count = 0;
    while (locus_readdir(dir_list, &ent) == 1) {
        count++;
        seen_g |= strcmp(ent.name, "g") == 0 && ent.kind == LOCUS_KIND_FILE;
        seen_h |= strcmp(ent.name, "h") == 0;
    }
    locus_closedir(dir_list);
    CHECK(count == 2 && seen_g && seen_h, "readdir saw %d entries", count);
    CHECK(locus_unlink(fs, "/d/h") == 0, "unlink");
    CHECK(locus_unlink(fs, "/d/h") == -ENOENT, "second unlink");
    CHECK(locus_truncate(fs, "/d/g", MIB + 4096) == 0, "truncate");
    CHECK(locus_chmod(fs, "/d/g", 0640) == 0, "chmod");
    CHECK(locus_stat(fs, "/d/g", &st) == 0 && st.size == MIB + 4096 && st.mode == 0640,
          "stat after truncate: %llu %o", (unsigned long long)st.size, st.mode);
    CHECK(locus_ftruncate(f, MIB + 4096) == 0, "ftruncate on the renamed open file");

    /* Owners and times: made as this process's effective ids; chown with LOCUS_NO_OWNER
     * keeping one id; a set-user-ID bit cleared by it. */
    CHECK(locus_stat(fs, "/d/g", &st) == 0 && st.uid == geteuid() && st.gid == getegid(),
          "owner %u:%u", st.uid, st.gid);
    CHECK(st.ctime_ns >= st.mtime_ns && st.atime_ns > 0, "times %llu %llu %llu",
          (unsigned long long)st.atime_ns, (unsigned long long)st.mtime_ns,
          (unsigned long long)st.ctime_ns);
    CHECK(locus_chmod(fs, "/d/g", 04750) == 0, "chmod u+s");
    CHECK(locus_chown(fs, "/d/g", 1234, LOCUS_NO_OWNER) == 0, "chown");
    CHECK(locus_stat(fs, "/d/g", &st) == 0 && st.uid == 1234 && st.gid == getegid() &&
              st.mode == 0750,
          "after chown: %u:%u %o", st.uid, st.gid, st.mode);
    CHECK(locus_chown(fs, "/d/missing", 1, 1) == -ENOENT, "chown of a missing name");

    /* Extended attributes: flags, the size probe, ERANGE, listing, removal. */
    CHECK(locus_setxattr(fs, "/d/g", "user.colour", "blue", 4, XATTR_CREATE) == 0, "setxattr");
    CHECK(locus_setxattr(fs, "/d/g", "user.colour", "red", 3, XATTR_CREATE) == -EEXIST,
          "XATTR_CREATE of an existing name");
    CHECK(locus_setxattr(fs, "/d/g", "user.none", "x", 1, XATTR_REPLACE) == -ENODATA,
          "XATTR_REPLACE of a missing name");
    CHECK(locus_setxattr(fs, "/d/g", "system.nfs4_acl", "x", 1, 0) == -EOPNOTSUPP,
          "system namespace");
    CHECK(locus_setxattr(fs, "/d/g", "system.posix_acl_access", "x", 1, 0) == -EINVAL,
          "an ACL that is not one");
    CHECK(locus_setxattr(fs, "/d", "user.dir", "", 0, 0) == 0, "empty value on a directory");
    char value[16];
    CHECK(locus_getxattr(fs, "/d/g", "user.colour", NULL, 0) == 4, "size probe");
    CHECK(locus_getxattr(fs, "/d/g", "user.colour", value, 2) == -ERANGE, "small buffer");
    CHECK(locus_getxattr(fs, "/d/g", "user.colour", value, sizeof value) == 4 &&
              memcmp(value, "blue", 4) == 0,
          "getxattr");
    CHECK(locus_setxattr(fs, "/d/g", "user.a", "1", 1, 0) == 0, "second attribute");
    char names[64];
    ssize_t listed = locus_listxattr(fs, "/d/g", names, sizeof names);
    CHECK(listed == 19 && memcmp(names, "user.a\0user.colour\0", 19) == 0, "listxattr %zd",
          listed);
    CHECK(locus_listxattr(fs, "/d/g", NULL, 0) == 19, "list size probe");
    CHECK(locus_removexattr(fs, "/d/g", "user.a") == 0, "removexattr");
    CHECK(locus_removexattr(fs, "/d/g", "user.a") == -ENODATA, "second removexattr");

    /* fallocate: blocks allocated and counted, the size grown or kept; a hole; zeros;
     * more than the volume has refused with nothing allocated; unknown modes refused. */
    locus_file *a = locus_open(fs, "/alloc", O_CREAT | O_RDWR, 0644);
    CHECK(a != NULL, "create /alloc");
    CHECK(locus_fallocate(a, 0, 0, 256 * 1024) == 0, "fallocate");
    CHECK(locus_fstat(a, &st) == 0 && st.size == 256 * 1024 && st.allocated == 256 * 1024,
          "allocated %llu of %llu", (unsigned long long)st.allocated,
          (unsigned long long)st.size);
    CHECK(locus_fallocate(a, FALLOC_FL_KEEP_SIZE, 256 * 1024, 64 * 1024) == 0, "keep size");
    CHECK(locus_fstat(a, &st) == 0 && st.size == 256 * 1024 && st.allocated == 320 * 1024,
          "keep size: %llu of %llu", (unsigned long long)st.allocated,
          (unsigned long long)st.size);
    fill(buf, 65536, 0, 5);
    CHECK(locus_pwrite(a, buf, 65536, 0) == 65536, "write into the allocation");
    CHECK(locus_fallocate(a, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 8192, 8192) == 0,
          "punch");
    CHECK(locus_fallocate(a, FALLOC_FL_ZERO_RANGE, 32768, 4096) == 0, "zero range");
    unsigned char got[65536];
    CHECK(locus_pread(a, got, sizeof got, 0) == 65536, "read back");
    for (size_t i = 0; i < sizeof got; i++) {
        int zero = (i >= 8192 && i < 16384) || (i >= 32768 && i < 36864);
        CHECK(got[i] == (zero ? 0 : pattern(i, 5)), "byte %zu is %u", i, got[i]);
    }
    CHECK(locus_fallocate(a, 0, 0, 1ULL << 40) == -ENOSPC, "1 TiB");
    CHECK(locus_fstat(a, &st) == 0 && st.size == 256 * 1024, "nothing changed");
    CHECK(locus_fallocate(a, FALLOC_FL_PUNCH_HOLE, 0, 4096) == -EOPNOTSUPP, "punch without keep");
    CHECK(locus_fallocate(a, 0, 0, 0) == -EINVAL, "zero length");
    CHECK(locus_close(a) == 0, "close /alloc");

    struct locus_fs_stats stats;
    CHECK(locus_fs_stats(fs, &stats) == 0, "stats");
    CHECK(stats.caller_bytes >= MIB + 1000 + 8192 && stats.writes >= 18 &&
              stats.write_amplification >= 1.0,
          "stats: %llu bytes, %llu writes, wa %f", (unsigned long long)stats.caller_bytes,
          (unsigned long long)stats.writes, stats.write_amplification);
    CHECK(locus_fs_checkpoint(fs) == 0, "checkpoint");
    CHECK(locus_fs_stats(fs, &stats) == 0 && stats.records_pending == 0, "drained: %llu",
          (unsigned long long)stats.records_pending);
    CHECK(locus_close(f) == 0, "close");
    CHECK(locus_fs_unmount(fs) == 0, "unmount");
    free(buf);
}

static void crash_phase(const char *dir) {
    locus_fs *fs = locus_fs_open(dir, NULL);
    CHECK(fs != NULL, "open: errno %d", errno);
    locus_file *f = locus_open(fs, "/crash", O_CREAT | O_RDWR | O_TRUNC, 0644);
    CHECK(f != NULL, "create /crash");
    unsigned char buf[4096];
    for (uint64_t i = 0; i < 64; i++) {
        fill(buf, sizeof buf, i * 4096, 4);
        CHECK(locus_pwrite(f, buf, sizeof buf, i * 4096) == 4096, "crash write %llu",
              (unsigned long long)i);
    }
    /* Acknowledged: gone without a close, a checkpoint or an unmount. */
    printf("ok crash\n");
    fflush(stdout);
    _exit(0);
}

static void verify_phase(const char *dir) {
    locus_fs *fs = locus_fs_open(dir, NULL);
    CHECK(fs != NULL, "open after the crash: errno %d", errno);
    locus_file *g = locus_open(fs, "/d/g", O_RDONLY, 0);
    CHECK(g != NULL, "open /d/g");
    expect_bytes(g, 0, 5000, 0, 1);
    expect_bytes(g, 5000, 1000, 0, 2);
    expect_bytes(g, 6000, MIB - 6000, 6000, 1);
    expect_bytes(g, MIB, 4096, 0, 3);
    struct locus_stat st;
    CHECK(locus_fstat(g, &st) == 0 && st.size == MIB + 4096, "size %llu",
          (unsigned long long)st.size);
    CHECK(locus_close(g) == 0, "close /d/g");
    locus_file *c = locus_open(fs, "/crash", O_RDONLY, 0);
    CHECK(c != NULL, "open /crash");
    expect_bytes(c, 0, 64 * 4096, 0, 4);
    CHECK(locus_close(c) == 0, "close /crash");
    CHECK(locus_stat(fs, "/d/h", &st) == -ENOENT, "unlinked file stays gone");
    CHECK(locus_stat(fs, "/d/g", &st) == 0 && st.uid == 1234 && st.mode == 0750, "owner kept");
    char value[16];
    CHECK(locus_getxattr(fs, "/d/g", "user.colour", value, sizeof value) == 4 &&
              memcmp(value, "blue", 4) == 0,
          "attribute kept");
    CHECK(locus_stat(fs, "/alloc", &st) == 0 && st.allocated == 320 * 1024 - 8192,
          "allocation kept: %llu", (unsigned long long)st.allocated);
    CHECK(locus_fs_unmount(fs) == 0, "unmount");
}

/* A program that blocks a signal to take it later (sigwait, a signalfd) after the library
 * started its threads: the signal waits for it. A thread of the library's with the signal
 * unblocked would take it instead, and SIGUSR1's default action would end the process. */
static void signals_phase(const char *dir) {
    locus_fs *fs = locus_fs_open(dir, NULL);
    CHECK(fs != NULL, "open: errno %d", errno);
    sigset_t usr1, pending;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    CHECK(pthread_sigmask(SIG_BLOCK, &usr1, NULL) == 0, "block SIGUSR1");
    CHECK(kill(getpid(), SIGUSR1) == 0, "send SIGUSR1 to the process");
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
    CHECK(sigpending(&pending) == 0 && sigismember(&pending, SIGUSR1) == 1,
          "SIGUSR1 pending for the program");
    int taken = 0;
    CHECK(sigwait(&usr1, &taken) == 0 && taken == SIGUSR1, "sigwait takes it");
    CHECK(locus_fs_unmount(fs) == 0, "unmount");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s VOLUME_DIR write|crash|verify|signals\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[2], "write") == 0)
        write_phase(argv[1]);
    else if (strcmp(argv[2], "crash") == 0)
        crash_phase(argv[1]);
    else if (strcmp(argv[2], "verify") == 0)
        verify_phase(argv[1]);
    else if (strcmp(argv[2], "signals") == 0)
        signals_phase(argv[1]);
    else {
        fprintf(stderr, "unknown phase %s\n", argv[2]);
        return 2;
    }
    printf("ok %s\n", argv[2]);
    return 0;
}
