# Diagnostic only (session 17): log every garbage collection over 2 ms of any Python process started with this
# directory on PYTHONPATH, to /tmp/gcpauses/<pid>.log: "<monotonic> <ms> <generation> <argv>".
import gc, os, sys, time
_os_dir = "/tmp/gcpauses"
os.makedirs(_os_dir, exist_ok=True)
_began = [0.0]
_path = os.path.join(_os_dir, f"{os.getpid()}.log")
def _cb(phase, info):
    now = time.perf_counter()
    if phase == "start":
        _began[0] = now
        return
    ms = (now - _began[0]) * 1000.0
    if ms >= 2.0:
        with open(_path, "a") as f:
            f.write(f"{time.monotonic():.3f} {ms:.1f} {info.get('generation')} {' '.join(sys.argv[:3])[:80]}\n")
gc.callbacks.append(_cb)
# Experiment: no automatic full collections in the service (gen 2 collected only by hand, i.e. never here).
if len(sys.argv) > 1 and sys.argv[1] == "serve":
    gc.set_threshold(700, 10, 1_000_000)
