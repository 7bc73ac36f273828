print("---\nval_bpb: nan\ntraining_seconds: 1.0")
