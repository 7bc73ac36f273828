import time
blocks = []
for _ in range(40):
    blocks.append(b"x" * (50 * 2 ** 20))  # 50 MB each, written so it is resident
    time.sleep(0.05)
print("---\nval_bpb: 1.0")
