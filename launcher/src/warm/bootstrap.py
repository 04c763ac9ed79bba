# drun's warm worker bootstrap (launcher/src/warm/mod.rs): passed in $DRUN_WARM_BOOTSTRAP and
# run by `python -u -c <stub> script.py args..` (launcher/src/warm/handoff.rs; the command line
# shows the worker's script), with the hand-off socket at fd $DRUN_WARM_FD. Imports torch ahead of time, says so, waits
# for the hand-off (the worker's environment, argv, cwd), then becomes `python -u script.py`.
# Stdlib only besides torch; every name lives in one function, so __main__ stays clean.
def _drun_warm():
    import json
    import os
    import signal
    import sys
    import threading
    import time

    fd = int(os.environ["DRUN_WARM_FD"])
    # A cold worker's dispositions at its first line: whatever the interpreter set up.
    saved = {}
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if handler is not None:
            saved[sig] = handler
    started = time.monotonic()
    error = None
    try:
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
    except BaseException as e:  # any failure: the worker runs cold (exec below)
        error = "%s: %s" % (type(e).__name__, e)
    status = {
        "ready": error is None,
        "error": error,
        "import_s": round(time.monotonic() - started, 3),
        "py_threads": threading.active_count(),
        "threads": len(os.listdir("/proc/self/task")),
    }
    try:
        os.write(fd, (json.dumps(status) + "\n").encode())
    except OSError:
        pass  # the agent dropped this interpreter already; the read below ends it
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            os._exit(0)  # dropped without a hand-off
        data += chunk
    os.close(fd)
    msg = json.loads(data)

    def raw(s):
        return s.encode("latin-1")  # bytes sent one char per byte: exact, whatever the encoding

    env = {raw(k): raw(v) for k, v in msg["env"]}
    os.chdir(raw(msg["cwd"]))
    if error is not None:
        os.execve(raw(msg["program"]), msg["orig_argv"], env)
    os.environ.clear()
    os.environb.update(env)
    for sig, handler in saved.items():
        try:
            signal.signal(sig, handler)
        except (OSError, ValueError):
            pass
    # What `python script.py` sets up: argv, sys.path[0] (the script's real directory unless
    # -P/-I), a fresh __main__ with an absolute __file__ and a source loader.
    script = msg["argv"][0]
    sys.argv = msg["argv"]
    sys.orig_argv = msg["orig_argv"]
    if not sys.flags.safe_path:
        sys.path[0] = os.path.dirname(os.path.realpath(script))
    path = os.path.abspath(script)
    import __main__
    from importlib.machinery import SourceFileLoader

    main = __main__.__dict__
    builtins = main["__builtins__"]
    main.clear()
    main.update(
        __name__="__main__",
        __doc__=None,
        __package__=None,
        __loader__=SourceFileLoader("__main__", path),
        __spec__=None,
        __annotations__={},
        __builtins__=builtins,
        __file__=path,
        __cached__=None,
    )
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    del saved, data, msg, env, status, f
    try:
        exec(code, main)
    except SystemExit:
        raise  # the exit status, as the interpreter gives it
    except KeyboardInterrupt:
        # Re-raised, so that the interpreter runs its exit handlers and then dies by SIGINT,
        # as a cold worker does; its traceback is printed without this stub's frames (those
        # before the script's first).
        def hook(kind, value, tb, shown=sys.excepthook, path=path):
            t = tb
            while t is not None and t.tb_frame.f_code.co_filename != path:
                t = t.tb_next
            if t is not None:  # the printer reads the exception's own traceback
                tb = t
                value = value.with_traceback(t)
            shown(kind, value, tb)

        sys.excepthook = hook
        raise
    except BaseException as e:
        # As the interpreter reports an uncaught exception, without this frame.
        tb = e.__traceback__
        e = e.with_traceback(tb.tb_next if tb is not None else None)
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(1)


_drun_warm()
