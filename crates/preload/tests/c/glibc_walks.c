/* glibc's directory walkers and freopen on a tree under argv[1], printing what a program
 * sees, with argv[1] cut from every path. Lines whose order depends on the directory's
 * order are sorted. Run on tmpfs and through liblocus_preload.so; the outputs must match. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *root;
static size_t root_len;
static char *lines[256];
static int nlines;
static int skip_d;
static int stop_at_c;

static void die(const char *what) {
    fprintf(stderr, "%s: %s\n", what, strerror(errno));
    exit(1);
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) die(path);
}

static int by_string(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void flush_sorted(const char *title) {
    qsort(lines, nlines, sizeof lines[0], by_string);
    printf("%s:\n", title);
    for (int i = 0; i < nlines; i++) {
        printf("  %s\n", lines[i]);
        free(lines[i]);
    }
    nlines = 0;
}

static const char *kind(int flag) {
    switch (flag) {
    case FTW_F: return "F";
    case FTW_D: return "D";
    case FTW_DNR: return "DNR";
    case FTW_NS: return "NS";
    case FTW_SL: return "SL";
    case FTW_DP: return "DP";
    case FTW_SLN: return "SLN";
    }
    return "?";
}

static int seen(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    char *line;
    const char *rel = path + root_len;
    long size = (flag == FTW_F || flag == FTW_SL) ? (long)st->st_size : -1;
    if (asprintf(&line, "%s %s level=%d base=%s size=%ld", rel, kind(flag), ftw->level,
                 path + ftw->base, size) < 0)
        die("asprintf");
    lines[nlines++] = line;
    if (skip_d && flag == FTW_D && strcmp(path + ftw->base, "d") == 0) return FTW_SKIP_SUBTREE;
    if (stop_at_c && strcmp(path + ftw->base, "c") == 0) return 42;
    return 0;
}

static int order_ok = 1;
static char last_dp[4096];
static int depth_check(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)ftw;
    /* with FTW_DEPTH every entry below a directory comes before the directory */
    if (last_dp[0] && strncmp(path, last_dp, strlen(last_dp)) == 0 && path[strlen(last_dp)] == '/')
        order_ok = 0;
    if (flag == FTW_DP) snprintf(last_dp, sizeof last_dp, "%s", path);
    return 0;
}

static int plain(const char *path, const struct stat *st, int flag) {
    char *line;
    (void)st;
    if (asprintf(&line, "%s %s", path + root_len, kind(flag)) < 0) die("asprintf");
    lines[nlines++] = line;
    return 0;
}

static int visible(const struct dirent *d) { return d->d_name[0] != '.'; }

static void cat(const char *path) {
    char buf[256];
    FILE *f = fopen(path, "r");
    if (!f) { printf("%s: %s\n", path + root_len, strerror(errno)); return; }
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    printf("%s: \"%s\"\n", path + root_len, buf);
}

int main(int argc, char **argv) {
    char p[4096], q[4096];
    if (argc != 2) return 2;
    root = argv[1];
    root_len = strlen(root);

#define AT(s) (snprintf(p, sizeof p, "%s/%s", root, s), p)
    if (mkdir(AT("t"), 0755) || mkdir(AT("t/d"), 0755) || mkdir(AT("t/d/e"), 0755) ||
        mkdir(AT("u"), 0755))
        die("mkdir");
    put(AT("u/f"), "ffffff");
    put(AT("t/a"), "aaaa");
    put(AT("t/d/b"), "bb");
    put(AT("t/d/e/c"), "c");
    put(AT("t/.hidden"), "h");
    /* l leads out of t (so the walk's order cannot matter), loop back into u */
    if (symlink("../u", AT("t/l")) || symlink("nowhere", AT("t/x")) || symlink(".", AT("u/loop")))
        die("symlink");

    struct dirent **names;
    int n = scandir(AT("t"), &names, visible, alphasort);
    if (n < 0) die("scandir");
    printf("scandir t (visible, alphasort): %d:", n);
    for (int i = 0; i < n; i++) { printf(" %s", names[i]->d_name); free(names[i]); }
    free(names);
    printf("\n");

    int dfd = open(root, O_RDONLY | O_DIRECTORY);
    if (dfd < 0) die("open root");
    n = scandirat(dfd, "t/d", &names, NULL, alphasort);
    if (n < 0) die("scandirat");
    printf("scandirat t/d (all): %d:", n);
    for (int i = 0; i < n; i++) { printf(" %s", names[i]->d_name); free(names[i]); }
    free(names);
    printf("\n");
    close(dfd);
    errno = 0;
    n = scandir(AT("t/missing"), &names, NULL, NULL);
    if (n >= 0) return 3;
    printf("scandir t/missing: %d %s\n", n, strerror(errno));

    if (nftw(AT("t"), seen, 8, FTW_PHYS) != 0) die("nftw phys");
    flush_sorted("nftw FTW_PHYS");
    if (nftw(AT("t"), seen, 8, 0) != 0) die("nftw");
    flush_sorted("nftw following links");
    skip_d = 1;
    if (nftw(AT("t"), seen, 8, FTW_PHYS | FTW_ACTIONRETVAL) != 0) die("nftw actionretval");
    skip_d = 0;
    flush_sorted("nftw FTW_ACTIONRETVAL, d's subtree skipped");
    if (nftw(AT("t"), depth_check, 8, FTW_PHYS | FTW_DEPTH) != 0) die("nftw depth");
    printf("nftw FTW_DEPTH: directories after their contents: %s\n", order_ok ? "yes" : "no");
    stop_at_c = 1;
    printf("nftw stopped by the callback: %d\n", nftw(AT("t"), seen, 8, FTW_PHYS));
    stop_at_c = 0;
    nlines = 0;
    errno = 0;
    n = nftw(AT("t/missing"), seen, 8, 0);
    printf("nftw of a missing path: %d %s\n", n, strerror(errno));
    if (ftw(AT("t/d"), plain, 8) != 0) die("ftw");
    flush_sorted("ftw t/d");

    /* FTW_CHDIR: each callback runs in the directory that holds the entry */
    if (chdir(root)) die("chdir root");
    if (nftw("t", seen, 8, FTW_PHYS | FTW_CHDIR) != 0) die("nftw chdir");
    for (int i = 0; i < nlines; i++) free(lines[i]);
    nlines = 0;
    if (!getcwd(q, sizeof q)) die("getcwd");
    printf("after FTW_CHDIR the working directory is back: %s\n",
           strcmp(q, root) == 0 ? "yes" : q);

    /* freopen: a stream onto another file, stdout onto a file, a relative name */
    FILE *f = fopen(AT("one"), "w");
    if (!f) die("fopen one");
    fputs("first", f);
    f = freopen(AT("two"), "w", f);
    if (!f) die("freopen two");
    fputs("second", f);
    fclose(f);
    cat(AT("one"));
    cat(AT("two"));
    fflush(stdout);
    int saved = dup(1);
    if (!freopen("rel.txt", "w", stdout)) die("freopen stdout");
    printf("through stdout, relative to %s\n", "the working directory");
    fflush(stdout);
    /* fd 1 back to where it was: stdout writes there again */
    dup2(saved, 1);
    close(saved);
    cat(AT("rel.txt"));
    return 0;
}
