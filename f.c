int f(int x) { return x < 2 ? x : f(x - 1) + f(x - 2); }
