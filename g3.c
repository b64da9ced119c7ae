int g3(int x) { return x * 3; }
