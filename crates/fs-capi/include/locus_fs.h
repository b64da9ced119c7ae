/*
 * locus_fs.h - the C API of the locus file system.
 *
 * locus runs in the calling process: there is no system call on the data path. Every write
 * is atomic and durable when it returns (its data and a checksummed log record are in
 * persistent memory); a background checkpoint later moves logged data into the files.
 *
 * Link with -llocus_fs (target/release/liblocus_fs.so or liblocus_fs.a, built by
 * `cargo build --release -p fs-capi`).
 *
 * Conventions
 *   - Functions returning int return 0 on success and a negative errno value on failure
 *     (-ENOENT, -EEXIST, -ENOTDIR, -EISDIR, -ENOTEMPTY, -ENAMETOOLONG, -EINVAL, -EBADF,
 *     -ENOSPC, -EIO, ...). Functions returning ssize_t return a byte count or a negative
 *     errno. Functions returning a pointer return NULL on failure and set errno.
 *   - After any failure, locus_last_error() describes it in words (what, and which path,
 *     structure or limit); the text belongs to the calling thread.
 *   - Paths are absolute within the file system ("/dir/file"), UTF-8, at most 4096 bytes,
 *     each name at most 255 bytes.
 *   - Every handle may be used from several threads at once, except that one handle must
 *     not be used after (or while) it is closed or freed.
 *   - One process opens a volume at a time (the volume is locked while open).
 */
#ifndef LOCUS_FS_H
#define LOCUS_FS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this interface; locus_fs_api_version() returns the library's. Version 2
 * added the owners and the access and change times to struct locus_stat (so the struct is
 * larger: a program built for version 1 must be built again), and locus_fallocate,
 * locus_chown and the extended-attribute calls. Version 3 added O_TMPFILE to locus_open,
 * and locus_link and locus_flink. */
#define LOCUS_FS_API_VERSION 3

/* The owner of a file made before the volume kept owners; in locus_chown, "unchanged". */
#define LOCUS_NO_OWNER UINT32_MAX

/* An open file system; from locus_fs_open or locus_fs_format, ended by locus_fs_unmount. */
typedef struct locus_fs locus_fs;
/* An open file; from locus_open, ended by locus_close. */
typedef struct locus_file locus_file;
/* A persistent buffer; from locus_buffer_new, ended by locus_write_buffer or locus_buffer_free. */
typedef struct locus_buffer locus_buffer;
/* A directory listing; from locus_opendir, ended by locus_closedir. */
typedef struct locus_dir locus_dir;

/* What an inode is. */
#define LOCUS_KIND_FILE 1
#define LOCUS_KIND_DIR 2
/* A symbolic link: listed by locus_readdir; a path call that meets one fails with ELOOP
   (the C API does not follow links). */
#define LOCUS_KIND_SYMLINK 3
/* A FIFO, a socket's name or a device node (made through locus mount): a name and
   attributes; locus_open refuses it with EOPNOTSUPP. */
#define LOCUS_KIND_SPECIAL 4

struct locus_stat {
    uint64_t ino;
    uint32_t kind;      /* LOCUS_KIND_* */
    uint32_t mode;      /* permission bits, as given at creation or by locus_chmod */
    uint64_t size;      /* bytes */
    uint64_t allocated; /* bytes of volume memory the file's blocks hold */
    uint64_t mtime_ns;  /* last change of the contents, nanoseconds since the Unix epoch */
    uint64_t nlink;
    uint64_t atime_ns;  /* last read (relatime: moved when older than mtime or ctime) */
    uint64_t ctime_ns;  /* last change of the contents or the attributes */
    uint32_t uid;       /* owner: the effective ids of the process that made it, or */
    uint32_t gid;       /* as locus_chown set them; LOCUS_NO_OWNER on older volumes */
};

struct locus_dirent {
    uint64_t ino;
    uint32_t kind;      /* LOCUS_KIND_* */
    char name[256];     /* NUL-terminated */
};

struct locus_fs_stats {
    uint64_t caller_bytes;         /* bytes callers wrote */
    uint64_t media_bytes;          /* bytes stored to persistent memory for them */
    double write_amplification;    /* media_bytes / caller_bytes */
    uint64_t writes;               /* write calls */
    uint64_t records_pending;      /* logged writes not yet checkpointed */
    uint64_t checkpoint_lag;       /* writes logged since the oldest one not checkpointed */
    uint64_t checkpoint_batches;
    uint64_t checkpointed_records;
    uint64_t remapped_blocks;      /* whole blocks moved into files without a copy */
    uint64_t copied_bytes;         /* bytes of partial blocks the checkpoint copied */
    uint64_t snapshots;
    uint64_t backpressure_waits;   /* times a writer waited for log or buffer space */
    uint64_t inodes;
};

/* Options for locus_fs_open / locus_fs_format; zero means "the default". Initialise with
 * LOCUS_FS_OPTIONS_INIT. */
struct locus_fs_options {
    uint32_t prelim_buffers;       /* preliminary buffers per thread, 1..=16 (default 16) */
    uint64_t prelim_buffer_bytes;  /* bytes of each (default 2 MiB) */
    uint32_t on_demand_checkpoint; /* 1: checkpoint only when needed, not in the background */
};
#define LOCUS_FS_OPTIONS_INIT { 0, 0, 0 }

/* The interface version the library implements (LOCUS_FS_API_VERSION when they match). */
uint32_t locus_fs_api_version(void);

/* The calling thread's description of its last failure ("" if none). */
const char *locus_last_error(void);

/* Opens the file system on the volume in directory volume_dir (NULL: $LOCUS_VOLUME, else
 * /dev/shm/locus), recovering from any crash. options may be NULL. NULL on failure:
 * errno ENODEV when the volume holds no file system yet. The file system's threads
 * (checkpoint, defragmentation, the volume's monitor) start here with every signal
 * blocked: a signal sent to the process reaches one of the program's threads. */
locus_fs *locus_fs_open(const char *volume_dir, const struct locus_fs_options *options);

/* Creates an empty file system on the volume in volume_dir (NULL as above), replacing any
 * file system there, and opens it. */
locus_fs *locus_fs_format(const char *volume_dir, const struct locus_fs_options *options);

/* Checkpoints everything, writes a final snapshot and closes the volume. Files still open
 * keep it open until they are closed. fs is freed even on failure. */
int locus_fs_unmount(locus_fs *fs);

/* Waits until every write logged so far is checkpointed into its file. */
int locus_fs_checkpoint(locus_fs *fs);

/* Fills *stats. */
int locus_fs_stats(locus_fs *fs, struct locus_fs_stats *stats);

/* Opens path. flags: O_RDONLY, O_WRONLY or O_RDWR, plus O_CREAT (mode gives the permission
 * bits), O_EXCL, O_TRUNC. O_TMPFILE | O_WRONLY or O_RDWR (path a directory) makes a file
 * with no name there, which locus_flink names — the way to make a file appear whole or not
 * at all, whatever crashes: write it, then name it; unnamed at locus_close (or after a
 * crash) it is gone; with O_EXCL it can never be named. O_SYNC, O_DSYNC, O_DIRECT, O_CLOEXEC, O_LARGEFILE, O_NOATIME and
 * O_NOFOLLOW are accepted and change nothing (every write is durable on return, nothing
 * is cached, there are no links). Others, O_APPEND among them (writes are positional:
 * append at locus_fstat's size), are refused with -EINVAL. NULL on failure. */
locus_file *locus_open(locus_fs *fs, const char *path, int flags, uint32_t mode);

/* Checkpoints what the file logged and frees the handle (even on failure). */
int locus_close(locus_file *file);

/* Writes len bytes at offset: all or nothing, durable on return. Returns len. */
ssize_t locus_pwrite(locus_file *file, const void *data, size_t len, uint64_t offset);

/* Reads up to len bytes at offset; fewer at the end of the file, 0 past it. */
ssize_t locus_pread(locus_file *file, void *data, size_t len, uint64_t offset);

/* Sets the size: grows with zeros or shrinks. */
int locus_ftruncate(locus_file *file, uint64_t size);

/* A barrier: every write that returned is durable already (at its return). */
int locus_fsync(locus_file *file);

/* fallocate(2)'s modes (FALLOC_FL_* from <fcntl.h> with _GNU_SOURCE, or <linux/falloc.h>):
 *   0                                    allocate the range's blocks (zeroed, paid from the
 *                                        volume's free space at once, so writes into the
 *                                        range cannot run out of space) and grow the size
 *                                        to cover it; -ENOSPC, with nothing allocated, when
 *                                        the volume lacks the room
 *   FALLOC_FL_KEEP_SIZE                  the same, the size kept
 *   FALLOC_FL_PUNCH_HOLE | KEEP_SIZE     a hole: zeros, whole blocks given back
 *   FALLOC_FL_ZERO_RANGE [| KEEP_SIZE]   zeros with every block allocated
 * Others: -EOPNOTSUPP. len 0: -EINVAL. */
int locus_fallocate(locus_file *file, int mode, uint64_t offset, uint64_t len);

int locus_fstat(locus_file *file, struct locus_stat *stat);

int locus_stat(locus_fs *fs, const char *path, struct locus_stat *stat);
int locus_mkdir(locus_fs *fs, const char *path, uint32_t mode);
int locus_rmdir(locus_fs *fs, const char *path);
/* Removes a name; an open file keeps its data until its last close. */
int locus_unlink(locus_fs *fs, const char *path);
/* A further name (a hard link) for the file or symbolic link at from; -EPERM for a
 * directory, -EEXIST when to exists. */
int locus_link(locus_fs *fs, const char *from, const char *to);
/* Names the open file to too, or first (a file opened O_TMPFILE): -ENOENT when its names
 * were all removed or it was opened O_TMPFILE | O_EXCL. */
int locus_flink(locus_file *file, const char *to);
/* Atomic; replaces a file or an empty directory at to. */
int locus_rename(locus_fs *fs, const char *from, const char *to);
int locus_truncate(locus_fs *fs, const char *path, uint64_t size);
int locus_chmod(locus_fs *fs, const char *path, uint32_t mode);
/* Sets the owner (LOCUS_NO_OWNER leaves that id as it is) of what path names, a symbolic
 * link itself included; the set-user-ID bit, and the set-group-ID bit when group execution
 * is on, are cleared on anything but a directory. No permission check: the process holding
 * the volume holds its memory. Files are made as the process's effective ids. */
int locus_chown(locus_fs *fs, const char *path, uint32_t uid, uint32_t gid);

/* Extended attributes of what path names (a symbolic link itself included), as the
 * system calls of <sys/xattr.h>: names "user.*", "trusted.*" or "security.*", and the POSIX
 * ACLs "system.posix_acl_access" and "system.posix_acl_default" in the kernel's layout (the
 * mode follows the access ACL and chmod the ACL; what is made in a directory inherits its
 * default ACL; an ACL that is not one is -EINVAL); other "system.*" names and
 * "security.capability" are -EOPNOTSUPP. Values up to 64 KiB, 256 KiB of names and values
 * per inode (-ENOSPC beyond). flags: 0, XATTR_CREATE (-EEXIST if it exists) or
 * XATTR_REPLACE (-ENODATA if not). getxattr and listxattr with size 0 return the length
 * needed; a buffer too small is -ERANGE. listxattr gives the names, each NUL-terminated. A
 * missing attribute is -ENODATA. Each change is atomic and durable on return. */
int locus_setxattr(locus_fs *fs, const char *path, const char *name, const void *value,
                   size_t size, int flags);
ssize_t locus_getxattr(locus_fs *fs, const char *path, const char *name, void *value,
                       size_t size);
ssize_t locus_listxattr(locus_fs *fs, const char *path, char *list, size_t size);
int locus_removexattr(locus_fs *fs, const char *path, const char *name);

/* Lists a directory (a snapshot taken now, without "." and ".."). */
locus_dir *locus_opendir(locus_fs *fs, const char *path);
/* Fills *entry with the next entry and returns 1; 0 at the end. */
int locus_readdir(locus_dir *dir, struct locus_dirent *entry);
void locus_closedir(locus_dir *dir);

/* A persistent buffer of len bytes on the calling thread's NUMA node: fill it with
 * locus_buffer_write, then commit it with locus_write_buffer - no copy. NULL on failure. */
locus_buffer *locus_buffer_new(locus_fs *fs, size_t len);
size_t locus_buffer_len(const locus_buffer *buffer);
int locus_buffer_write(locus_buffer *buffer, uint64_t offset, const void *data, size_t len);
int locus_buffer_read(const locus_buffer *buffer, uint64_t offset, void *data, size_t len);
/* Commits the whole buffer as the bytes at offset; atomic and durable on return. The buffer
 * is consumed whether or not this succeeds. */
int locus_write_buffer(locus_file *file, locus_buffer *buffer, uint64_t offset);
/* Frees a buffer that was not committed. */
void locus_buffer_free(locus_buffer *buffer);

#ifdef __cplusplus
}
#endif

#endif /* LOCUS_FS_H */
