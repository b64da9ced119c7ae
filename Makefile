prog: main.o f.o g1.o g2.o g3.o g4.o g5.o g6.o
\t$(CC) -o $@ $^\n%.o: %.c
\t$(CC) -O2 -c -o $@ $<\n