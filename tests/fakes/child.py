import subprocess, sys
code = "import os, time; os.setsid(); time.sleep(600)"
escaped = subprocess.Popen([sys.executable, "-c", code])
stayed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open("pids.txt", "w").write(f"{escaped.pid} {stayed.pid}\n")
print("---\nval_bpb: 1.5")
