import sys
line = "x" * 1023 + "\n"
for _ in range(100 * 1024):  # 100 MB
    sys.stdout.write(line)
print("no metric after the flood")
