with open("frozen.txt", "a") as f:
    f.write("tampered\n")
print("---\nval_bpb: 0.5")
