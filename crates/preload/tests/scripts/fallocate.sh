# fallocate's modes, as the mount's and the preload library's tests run them on tmpfs and
# on locus: the directory is $1 (else $R); every line of output must match.
set -e
D=${1:-$R}
show() { stat -c "$1: %s bytes, %b blocks" "$D/f"; }
fallocate -l 1M "$D/f"
show "mode 0"
printf 'data%.0s' $(seq 1000) | dd of="$D/f" conv=notrunc status=none
printf 'more' | dd of="$D/f" bs=1 seek=300000 conv=notrunc status=none
show "written"
fallocate -n -o 2M -l 64K "$D/f"
show "past the end, size kept"
fallocate -o 512K -l 1M "$D/f"
show "over data and past the end"
fallocate -p -o 16K -l 32K "$D/f"
show "hole punched"
truncate -s 3M "$D/f"
show "grown"
truncate -s 1M "$D/f"
show "cut"
md5sum < "$D/f"
fallocate -l 100T "$D/big" 2>&1 | sed "s|$D|D|" || true
stat -c 'big: %s bytes, %b blocks' "$D/big"
