int g5(int x) { return x * 5; }
