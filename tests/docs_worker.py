"""The process in which the documentation's Python blocks run (started by ``tests/docs_examples.py``).

Run as ``python tests/docs_worker.py LOG``. It reads one JSON request a line from stdin and answers each with one
JSON line on its original stdout; what the blocks print (and whatever Lightning writes to the file descriptors) goes
to ``LOG`` instead, and each answer carries the part written while its block ran. Requests:

* ``{"op": "page", "path": P, "cwd": D}``: start page ``P``: a fresh ``__main__`` module as the namespace (as in a
  script a reader runs), the working directory ``D``, the random generators seeded with 0.
* ``{"op": "run", "path": P, "line": N, "source": S}``: run block ``S`` of the current page, compiled as lines
  ``N + 1, ...`` of file ``P`` so that a traceback shows the page's own lines. The answer is
  ``{"ok": bool, "error": traceback or null, "output": str}``.

Only the standard library is imported here before a page asks for more; nothing of the test suite is importable
(the script's own directory is taken off ``sys.path``), so a block sees what a reader's program sees.
"""

from __future__ import annotations

import json
import os
import random
import sys
import traceback
import types
import warnings


def _start_page(cwd: str) -> dict:
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    os.chdir(cwd)
    random.seed(0)
    for name, seed in (("numpy", "random.seed"), ("torch", "manual_seed")):
        if name in sys.modules:
            obj = sys.modules[name]
            for part in seed.split("."):
                obj = getattr(obj, part)
            obj(0)
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.set_default_dtype(torch.float32)
        torch.set_grad_enabled(True)
    return module.__dict__


def _run(source: str, path: str, line: int, namespace: dict) -> str | None:
    try:
        code = compile("\n" * line + source, path, "exec", dont_inherit=True)
        with warnings.catch_warnings():
            # an example must not use what the library (or torch, Lightning) has deprecated
            warnings.filterwarnings("error", category=FutureWarning, module="__main__")
            warnings.filterwarnings("error", category=DeprecationWarning, module="__main__")
            exec(code, namespace)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # noqa: B036 - SystemExit from a block is a failure of the block too
        frames = traceback.extract_tb(error.__traceback__)[1:]  # drop this function's frame
        lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
        return "".join(lines + traceback.format_exception_only(type(error), error))
    return None


def main() -> None:
    log_path = sys.argv[1]
    sys.path[0] = ""  # this script's directory (tests/): a block imports what a script in its working directory does
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    namespace: dict = {}
    for request_line in sys.stdin:
        request = json.loads(request_line)
        if request["op"] == "page":
            namespace = _start_page(request["cwd"])
            answers.write(json.dumps({"ok": True, "error": None, "output": ""}) + "\n")
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        start = os.path.getsize(log_path)
        error = _run(request["source"], request["path"], request["line"], namespace)
        sys.stdout.flush()
        sys.stderr.flush()
        with open(log_path, "rb") as written:
            written.seek(start)
            output = written.read().decode("utf-8", errors="replace")
        answers.write(json.dumps({"ok": error is None, "error": error, "output": output}) + "\n")


if __name__ == "__main__":
    main()
