int g2(int x) { return x * 2; }
