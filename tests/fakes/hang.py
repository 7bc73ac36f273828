import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM and sleeping", flush=True)
while True:
    time.sleep(1)
