# Everyday programs on a file system filled to ENOSPC, as the mount's and the preload
# library's tests run it on locus (and on a size-limited tmpfs, to show that the transcript
# is what a kernel file system gives): every program fails cleanly while it is full, what was
# there before stays whole, `df` shows nothing available, and once the filler is removed the
# space is back and every program works again. The directory is $1; the transcript holds no
# sizes, so a file system of any size gives the same one. Every command names its files by
# path and no pipeline has two stages on the directory: through the preload library each
# process holds the volume in turn.
set -u
D=$1
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 GIT_OPTIONAL_LOCKS=0
export GIT_CONFIG_COUNT=2 GIT_CONFIG_KEY_0=gc.auto GIT_CONFIG_VALUE_0=0
export GIT_CONFIG_KEY_1=maintenance.auto GIT_CONFIG_VALUE_1=false
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@t
export GIT_AUTHOR_DATE='2000-01-01 00:00 +0000' GIT_COMMITTER_DATE='2000-01-01 00:00 +0000'
available_kib() { df -k --output=avail "$D" | tail -n 1 | tr -d ' '; }
nospace() { grep -q 'No space left on device' && echo "$1: no space" || echo "$1: ?"; }
database() {
    echo "rows $(sqlite3 "$D/db" 'select count(*) from t'), integrity $(sqlite3 "$D/db" 'pragma integrity_check')"
}
files() {
    echo "commits $(git -C "$D/repo" rev-list --count HEAD), fsck $(git -C "$D/repo" fsck --no-progress 2>&1 | wc -l) lines, status $(git -C "$D/repo" status --porcelain | wc -l) lines"
    echo "text $(md5sum < "$D/text" | cut -c1-8), first line $(head -n 1 "$D/text")"
}

# Before: a database in WAL mode, a repository with one commit and a new file not added yet,
# a text file.
sqlite3 "$D/db" "pragma journal_mode=wal; create table t(k integer primary key, v blob);
    insert into t(v) select randomblob(1000) from generate_series(1, 300);" > /dev/null
git init -q "$D/repo" && seq 1 1000 > "$D/repo/numbers" && git -C "$D/repo" add numbers &&
    git -C "$D/repo" commit -qm one
seq 1 200000 > "$D/repo/more"
seq 1 5000 > "$D/text"
database
files
before=$(available_kib)
# The database's shared-memory index (32 KiB) stays when the last connection closes.
sqlite3 "$D/db" ".filectrl persist_wal 1" "select count(*) from t" > /dev/null

# Full: 1 MiB blocks, then 4 KiB ones, then single bytes, each until the file system says no.
dd if=/dev/urandom of="$D/fill1" bs=1M status=none 2>&1 | nospace "dd 1M"
dd if=/dev/urandom of="$D/fill2" bs=4k status=none 2>&1 | nospace "dd 4K"
dd if=/dev/urandom of="$D/fill3" bs=1 count=65536 status=none 2>&1 | nospace "dd 1"
echo "available while full: $(( $(available_kib) < 64 ))"
# A database whose index is there opens and reads while full: SQLite cuts the index to 3
# bytes as the first connection opens it, then grows it back into the room that freed.
echo "while full: $(sqlite3 "$D/db" ".filectrl persist_wal 1" "select count(*) from t" \
    "pragma integrity_check" 2>&1 | tr '\n' ' ')"

# While full: each program fails, and leaves what it worked on as it was. (SQLite may say
# "disk is full" or, as on tmpfs, "disk I/O error" when it cannot grow its shared-memory
# index; either way nothing is committed.)
sqlite3 "$D/db" "insert into t(v) select randomblob(1000) from generate_series(1, 3000);" 2> /dev/null
echo "sqlite3 insert: status $(( $? != 0 ))"
head -c 1048576 /dev/urandom 2>&1 > "$D/blob" | nospace "head -c"
rm -f "$D/blob"
git -C "$D/repo" add more > /dev/null 2>&1 && git -C "$D/repo" commit -qm two > /dev/null 2>&1
echo "git add and commit: status $(( $? != 0 ))"
sed -i 's/^1$/one/' "$D/text" 2>&1 | nospace "sed -i"
tar -C /usr/include -cf - linux 2> /dev/null | tar -C "$D" -xf - 2>&1 | head -n 1 | nospace "tar -x"
rm -rf "$D/linux"
ls -A "$D" | sort | tr '\n' ' '; echo
files

# Freed: the space comes back, and every program works again. Within moments: a FUSE
# server learns of the last close after `close` returns, and frees an unlinked file's
# blocks then; the file system frees the blocks under not yet checkpointed writes when the
# checkpoint retires them. And within 2 MiB: locus keeps a reserve for its next metadata
# snapshot that counts what the metadata grew by since the last one, freed files included,
# until that snapshot is taken.
rm -f "$D/fill1" "$D/fill2" "$D/fill3"
for _ in $(seq 100); do
    [ $(( $(available_kib) + 2048 >= before )) = 1 ] && break
    sleep 0.1
done
now=$(available_kib)
if [ $(( now + 2048 >= before )) = 1 ]; then
    echo "space back: 1"
else
    echo "space back: 0 ($now KiB available, $before KiB before the filler)"
fi
sqlite3 "$D/db" "insert into t(v) select randomblob(1000) from generate_series(1, 3000);"
git -C "$D/repo" add more && git -C "$D/repo" commit -qm two
sed -i 's/^1$/one/' "$D/text"
tar -C /usr/include -cf - linux 2> /dev/null | tar -C "$D" -xf - &&
    echo "tar -x: $(find "$D/linux" -type f | wc -l | sed 's/[0-9]/n/g')"
database
files
