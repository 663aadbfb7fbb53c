"""`python -m specchat ARGS` as a process of its own, forked from a warm interpreter instead of started cold.

A cold `specchat` process spends ~6 s (more on a busy machine) importing torch and transformers before it
reads its first option; the CLI tests start dozens of them. Here one helper interpreter per test process
imports those third-party libraries once (and nothing of specchat), then forks a child per command. The
child is the command as `python -m specchat` runs it (`runpy._run_module_as_main`, what `-m` calls): its
own pid (signals and kills reach it alone), stdin, stdout and stderr (files, read back as a pipe would be
read), environment and working directory; it imports specchat itself and leaves as the command does (its
exit handlers run, its output is flushed, then `os._exit`; a traceback, should one escape, through the
interpreter's own exit), and its exit status is its own. What it skips is only the import of torch and
transformers, and a word they would print on import is not lost: the helper refuses to serve if importing them
printed anything.

A command that exits before importing torch is quicker cold (~0.3 s); tests about the process start itself
(`refused_before_loading`: what a fresh interpreter imported) or about a real pipe or device as stdout (a
closed pipe, /dev/full) start cold too.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

# Third-party modules every model-loading command imports; specchat's own modules are left to each child.
WARM = (
    "numpy", "torch", "safetensors.torch", "tokenizers", "huggingface_hub", "gguf", "typer", "transformers",
    "transformers.activations", "transformers.modeling_utils", "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto", "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2", "torch.utils.cpp_extension", "typer._adapters",
)  # fmt: skip
# Variables none of those modules reads on import (torch's extension builder reads its directory when it builds;
# specchat's modules, which read the rest, are imported by each child): one helper serves environments that differ
# in them alone, each child running in its command's own.
READ_WHEN_RUN = ("TORCH_EXTENSIONS_DIR", "OLLAMA_MODELS")

_HELPER = r"""
import importlib, json, os, signal, sys
# Ctrl-C as a terminal delivers it, also when this test run was started with SIGINT ignored (`make test &` in
# a script): an interpreter that starts with it ignored never raises KeyboardInterrupt, nor do its forks.
signal.signal(signal.SIGINT, signal.default_int_handler)
inbox, outbox = os.fdopen(int(sys.argv[1]), "r"), os.fdopen(int(sys.argv[2]), "w", buffering=1)
for name in json.loads(sys.argv[3]):
    importlib.import_module(name)
sys.stdout.flush()
sys.stderr.flush()
outbox.write(json.dumps({"ready": True}) + "\n")
for line in inbox:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:  # the command: leaves by os._exit as specchat's main does (or an exception, through the exit)
        inbox.close()
        outbox.close()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in ((0, request["stdin"], os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                                (2, request["stderr"], os.O_WRONLY)):
            if path is not None:
                opened = os.open(path, flags)
                os.dup2(opened, fd)
                os.close(opened)
        sys.argv = ["-m", *request["args"]]
        del importlib, json, signal, inbox, outbox, line, request, pid
        import runpy
        runpy._run_module_as_main("specchat")
        sys.exit(0)
    outbox.write(json.dumps({"pid": pid}) + "\n")
    _, status = os.waitpid(pid, 0)
    outbox.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
"""


class _Helper:
    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self.active: Forked | None = None
        requests_read, self.requests = os.pipe()
        self.replies, replies_write = os.pipe()
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (the helper writes to it while it lives)
        self.process = subprocess.Popen(
            [sys.executable, "-c", _HELPER, str(requests_read), str(replies_write), json.dumps(WARM)],
            pass_fds=(requests_read, replies_write), stdout=self.log, stderr=self.log, env=self.env,
        )  # fmt: skip
        os.close(requests_read)
        os.close(replies_write)
        self.outbox = os.fdopen(self.requests, "w", buffering=1)
        self.pending = b""  # replies read but not yet taken (select() sees only what is still in the pipe)
        self._read(timeout=300)  # ready
        self.log.seek(0)
        printed = self.log.read().decode(errors="replace")
        if printed:  # a cold process would have printed it into the command's stderr
            self.close()
            raise RuntimeError(f"importing {', '.join(WARM)} printed something:\n{printed}")

    def _read(self, timeout: float) -> dict | None:
        """The helper's next reply, or None after `timeout` seconds without one."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            ready, _, _ = select.select([self.replies], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(self.replies, 65536)
            if not chunk:
                self.log.seek(0)
                raise RuntimeError(f"the fork helper died:\n{self.log.read().decode(errors='replace')}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, args, env: dict[str, str], stdin: str | None, timeout: float) -> subprocess.CompletedProcess:
        process = self.start(args, env, stdin)
        stdout, stderr = process.communicate(timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def start(self, args, env: dict[str, str], stdin: str | None) -> Forked:
        if self.active is not None and self.active.returncode is None:  # one left running by a failed test
            self.active.kill()  # the helper waits for each child before it forks the next
            self.active.wait()
        tmp = tempfile.TemporaryDirectory()
        paths = {name: os.path.join(tmp.name, name) for name in ("stdin", "stdout", "stderr")}
        for name in ("stdout", "stderr"):
            open(paths[name], "w").close()
        if stdin is None:
            paths["stdin"] = None  # the helper's own: this process's, as subprocess.run would pass it on
        else:
            with open(paths["stdin"], "w") as file:
                file.write(stdin)
        request = {"args": list(args), "cwd": os.getcwd(), "env": dict(env), **paths}
        self.outbox.write(json.dumps(request) + "\n")
        pid = self._read(timeout=60)["pid"]
        self.active = Forked(self, [sys.executable, "-m", "specchat", *args], pid, tmp, paths)
        return self.active

    def close(self) -> None:
        try:
            self.outbox.close()  # the helper reads the end of its requests and leaves
            os.close(self.replies)
        except OSError:
            pass
        self.process.wait(timeout=30)


class Forked:
    """A command forked by the helper, used as a `subprocess.Popen(..., stdout=PIPE, stderr=PIPE, text=True)`:
    `pid`, `poll`, `wait`, `send_signal`, `kill`, `communicate`, and `stdout.read(n)`, which waits for n
    characters (or the end of the command) as a pipe would. Its stdout and stderr are files, so it never
    blocks on a full pipe."""

    def __init__(self, helper: _Helper, args: list[str], pid: int, tmp, paths: dict):
        self.helper, self.args, self.pid, self.returncode = helper, args, pid, None
        self._tmp, self._paths = tmp, paths
        self.stdout = _Output(paths["stdout"], self)

    def poll(self) -> int | None:
        if self.returncode is None:
            reply = self.helper._read(timeout=0)
            if reply is not None:
                self._reaped(reply["returncode"])
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            reply = self.helper._read(timeout=1e9 if timeout is None else timeout)
            if reply is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._reaped(reply["returncode"])
        return self.returncode

    def _reaped(self, returncode: int) -> None:
        self.returncode = returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()  # as subprocess.run does on a timeout
            self.wait()
            raise
        out = self.stdout.read()
        with open(self._paths["stderr"]) as err:  # text=True's decoding and newlines
            err_text = err.read()
        self.stdout.close()
        self._tmp.cleanup()
        return out, err_text


class _Output:
    """The command's stdout file, read as the pipe it stands for: `read(n)` waits until n characters came or
    the command ended, `read()` until it ended."""

    def __init__(self, path: str, process: Forked):
        self.file, self.process = open(path), process  # noqa: SIM115 (closed by `communicate`)

    def read(self, n: int = -1) -> str:
        text = ""
        while True:
            ended = self.process.poll() is not None  # before reading: all it wrote is in the file then
            text += self.file.read() if n < 0 else self.file.read(n - len(text))
            if ended or 0 <= n <= len(text):
                return text
            time.sleep(0.02)

    def close(self) -> None:
        self.file.close()


_helpers: dict[tuple, _Helper] = {}


def _helper(env: dict[str, str]) -> _Helper:
    key = tuple(sorted((name, value) for name, value in env.items() if name not in READ_WHEN_RUN))
    if key not in _helpers:
        _helpers[key] = _Helper(env)
        atexit.register(_helpers[key].close)
    return _helpers[key]


def run_specchat(args, *, env: dict[str, str], stdin: str | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess:  # fmt: skip
    """What `subprocess.run([sys.executable, "-m", "specchat", *args], input=stdin, capture_output=True,
    text=True, env=env, timeout=timeout)` returns, from a forked child (a cold process where fork is missing)."""
    if not hasattr(os, "fork"):
        return subprocess.run([sys.executable, "-m", "specchat", *args], input=stdin, capture_output=True, check=False,
                              text=True, env=env, timeout=timeout)  # fmt: skip
    return _helper(env).run(args, env, None if stdin is None else str(stdin), timeout)


def start_specchat(args, *, env: dict[str, str]) -> Forked | subprocess.Popen:
    """What `subprocess.Popen([sys.executable, "-m", "specchat", *args], stdout=PIPE, stderr=PIPE, text=True,
    env=env)` starts, forked (a cold process where fork is missing)."""
    if not hasattr(os, "fork"):
        return subprocess.Popen([sys.executable, "-m", "specchat", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    return _helper(env).start(args, env, None)
