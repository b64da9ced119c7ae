int g1(int x) { return x * 1; }
