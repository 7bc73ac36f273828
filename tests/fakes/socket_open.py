import os, socket
port = int(os.environ.get("FAKE_PORT", "9"))
s = socket.create_connection(("127.0.0.1", port), timeout=3)
s.sendall(b"exfiltrate")
print("---\nval_bpb: 1.0")
