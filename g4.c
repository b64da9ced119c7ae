int g4(int x) { return x * 4; }
