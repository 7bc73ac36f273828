print("trained, but forgot to report")
