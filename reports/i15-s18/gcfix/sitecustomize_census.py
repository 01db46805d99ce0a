# Diagnostic only (session 18): copy to a directory as sitecustomize.py and put it on PYTHONPATH. In `serve`
# processes keep every collected object (DEBUG_SAVEALL) and every 8 s write a census of that cyclic garbage by type, the
# code locations of garbage frames, functions/classes and exception types to /tmp/gccensus/<pid>.log.
import gc, os, sys, time, threading, collections, types
if "serve" in sys.argv[1:3] :
    d = "/tmp/gccensus"; os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{os.getpid()}.log")
    gc.set_debug(gc.DEBUG_SAVEALL)
    def census():
        while True:
            time.sleep(8)
            gc.collect()
            garbage = list(gc.garbage); gc.garbage.clear()
            c = collections.Counter(); frames = collections.Counter(); excs = collections.Counter()
            for o in garbage:
                t = type(o)
                c[f"{t.__module__}.{t.__qualname__}"] += 1
                if isinstance(o, types.FrameType):
                    frames[f"{o.f_code.co_filename.split('/work/main/')[-1]}:{o.f_code.co_name}:{o.f_lineno}"] += 1
                if isinstance(o, (types.FunctionType, type)):
                    frames[f"fn {getattr(o, '__module__', '?')}.{getattr(o, '__qualname__', '?')}"] += 1
                if isinstance(o, BaseException):
                    excs[f"{type(o).__qualname__}: {str(o)[:60]}"] += 1
            with open(path, "a") as f:
                f.write(f"GARBAGE {time.monotonic():.3f} n={len(garbage)} argv={sys.argv[:4]}\n")
                for k, v in c.most_common(40):
                    f.write(f"  {v:8d} {k}\n")
                f.write(" frames:\n")
                for k, v in frames.most_common(30):
                    f.write(f"  {v:8d} {k}\n")
                f.write(" exceptions:\n")
                for k, v in excs.most_common(15):
                    f.write(f"  {v:8d} {k}\n")
            del garbage
    threading.Thread(target=census, daemon=True).start()
