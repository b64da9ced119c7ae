int g6(int x) { return x * 6; }
