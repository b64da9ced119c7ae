# renameat2(RENAME_EXCHANGE) cases, run in the directory given as argv[1]; what it prints is
# compared between tmpfs and locus (the preload library's and locus mount's tests).
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def exchange(a, b):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), 2) != 0:
        return errno.errorcode[ctypes.get_errno()]
    return "ok"
def tree():
    out = []
    for top, dirs, files in sorted(os.walk(".")):
        for name in sorted(dirs + files):
            path = os.path.join(top, name)
            st = os.lstat(path)
            out.append(f"{path}:{'d' if os.path.isdir(path) else 'f'}{st.st_nlink}")
    return " ".join(sorted(out))
os.chdir(sys.argv[1])
os.makedirs("d1/sub/deep")
os.mkdir("d2")
with open("d1/f", "w") as f:
    f.write("one")
with open("d2/g", "w") as f:
    f.write("two")
print("files", exchange("d1/f", "d2/g"), open("d1/f").read(), open("d2/g").read())
print("dir and file", exchange("d1/sub", "d2/g"), tree())
print("missing", exchange("d1/f", "d1/missing"))
print("into itself", exchange("d2", "d2/g/deep"), exchange("d2/g/deep", "d2"))
os.link("d1/f", "d1/f2")
print("two names of one file", exchange("d1/f", "d1/f2"), os.stat("d1/f").st_nlink)
print("a directory and its parent's sibling", exchange("d2/g", "d1"), tree())
print("flags together", libc.renameat2(-100, b"d1", -100, b"d2", 3), errno.errorcode[ctypes.get_errno()])
