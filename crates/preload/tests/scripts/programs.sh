# Programs stored in directory $1 (else $R), run as a user runs them; the preload
# library's and the mount's tests compare every line with tmpfs (the directory shown as D).
D=${1:-$R}
printf '#!/bin/sh\necho "sh script: $0 $1"\n' > "$D/s.sh" && chmod +x "$D/s.sh"
"$D/s.sh" one
(cd "$D" && ./s.sh two)
printf '#!/usr/bin/env python3\nimport sys\nprint("python script:", sys.argv[1:])\n' > "$D/p.py"
chmod 755 "$D/p.py" && "$D/p.py" a b
printf '#! /bin/sh -eu \necho "one argument: $-"\n' > "$D/e.sh" && chmod +x "$D/e.sh" && "$D/e.sh"
printf '#!%s/s.sh\n' "$D" > "$D/nested" && chmod +x "$D/nested" && "$D/nested" x
mkdir "$D/bin" && cp /bin/echo "$D/bin/myecho" && "$D/bin/myecho" a program copied in
PATH="$D/bin:$PATH" env myecho found on PATH by env
ln -s /bin/echo "$D/bin/hostecho" && "$D/bin/hostecho" a link out of the directory
python3 -c 'import subprocess, sys; subprocess.run([sys.argv[1], "from", "python"])' "$D/s.sh"
python3 -c 'import os, sys; os.waitpid(os.posix_spawn(sys.argv[1], [sys.argv[1], "spawned"], os.environ), 0)' "$D/s.sh"
printf 'int main(void) { return 3; }\n' > "$D/three.c"
printf 'all: three\n\t./s.sh made\n\t./three || echo "three exited $$?"\nthree: three.c\n\tcc -o three three.c\n' > "$D/Makefile"
(cd "$D" && make -s)
printf '#include <stdio.h>\n#include <stdlib.h>\nint main(void) {\n  char line[64] = "";\n  FILE *p = popen("wc -c < three.c", "r");\n  if (p && fgets(line, sizeof line, p)) printf("popen: %%s", line);\n  if (p) pclose(p);\n  return system("./s.sh by system") ? 1 : 0;\n}\n' > "$D/sys.c"
(cd "$D" && cc -o sys sys.c && ./sys)
chmod 644 "$D/p.py"; "$D/p.py"; echo "not executable: $?"
"$D/nothing"; echo "missing: $?"
printf 'echo no interpreter line: $0\n' > "$D/plain" && chmod +x "$D/plain" && "$D/plain"
true
