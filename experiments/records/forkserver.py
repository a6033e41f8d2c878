"""The workflow's ``python -m`` jobs as forks of one process that has imported torch and the
experiments once.

Every job of the pipeline is ``python -m experiments.<module> ...``, and each such process
first spends about 7 s of CPU importing torch, ``torch._dynamo`` (imported by the first optimizer
or meta-tensor operation, and by torchvision), numba and the experiment: more than many smoke
points' own work (each job's wall time is in its ``benchmark:`` file; docs/pipeline.md, "The fork
server"). With the fork server, one process imports them once and every job is a fork of it:

    python -m experiments.records.forkserver serve --socket PATH [--preload MODULE ...]
    python -m experiments.records.forkserver run MODULE [ARG ...]

``run`` (a small client that imports neither torch nor the experiment) hands its command line,
working directory, environment and standard streams to the server named by the environment
variable :data:`SOCKET_ENV`; the server forks a child that takes them over and runs the module's
``main(argv)`` as ``python -m MODULE ARG ...`` would
(:func:`experiments.train.launch.run_rank`), and the client exits with the child's status.
Without a server (:data:`SOCKET_ENV` unset, as on a cluster node or in a shell) ``run`` execs
``python -m MODULE ARG ...`` itself, so a command means the same everywhere; a server that is
set but cannot be reached, that serves another directory, or whose imports read a variable
(:data:`IMPORT_TIME_PREFIXES`) that the job sets otherwise, gives the same fallback with a
warning on standard error. A server that ends while it runs a job fails the job (which may have
started: it is never run twice).

A child starts from the state a fresh process has after its imports: the server only imports
(no parallel work, no CUDA: a server whose imports initialised CUDA stops), and the child gets
the client's streams, directory and environment, fresh random seeds (Python's, numpy's and
torch's, as a new process draws them), and its own process group. A job that ends early (its
client killed: Snakemake cancelling it) has its child's process group terminated. The server
stops when told to (SIGTERM), or when the process that started it (Snakemake) has gone.

What differs from a fresh process: a child counts the server's file mappings in its resident
set only as it touches them (peak-RSS figures read lower, see :mod:`experiments.train.engine`),
and Snakemake's ``benchmark:`` files measure the client, so only their wall time (``s``) is the
job's.

The Snakefile starts a server for a local run when the profile's ``forkserver`` is true
(:func:`start`), and its jobs' commands begin with :func:`command_prefix`.
"""
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback

#: The environment variable naming the server's socket for ``run``.
SOCKET_ENV = "EXPERIMENTS_FORKSERVER"
#: The environment variables read when the preloaded modules are imported (numba's
#: configuration, Python's, torch's): a job whose value differs runs in a fresh process. The
#: thread counts Snakemake sets per job (``OMP_NUM_THREADS``, ...) are not among them: torch
#: reads ``OMP_NUM_THREADS`` at import, which the child applies
#: (:func:`experiments.train.launch.run_rank`), and the experiments set their threads.
IMPORT_TIME_PREFIXES = ("NUMBA_", "PYTHON", "TORCH_")
#: How long a cancelled job's child has to end after SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 10.0
#: How long :func:`start` waits for the server's socket.
START_TIMEOUT_S = 60.0
_HEADER = struct.Struct("!I")
_STREAMS = (0, 1, 2)


#: The words that run a module in a fresh process.
PYTHON_M = ("python", "-m")


def command_prefix(enabled):
    """The words of a job's command before ``MODULE ARG ...``: the fork server's client when
    ``enabled``, else :data:`PYTHON_M`."""
    return (*PYTHON_M, __name__, "run") if enabled else PYTHON_M


# --------------------------------------------------------------------------- the child
def exit_status(stop):
    """The exit status of a process that ended by ``SystemExit`` ``stop``, as Python's (a
    message is printed to standard error and gives 1)."""
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=sys.stderr)
    return 1


def run_command(module, argv):
    """In a forked child: ``module``'s ``main(argv)`` as ``python -m module argv`` would run it;
    returns the process's exit status (an uncaught exception's traceback is printed, as
    Python's, and gives 1)."""
    import importlib

    from ..train.launch import run_rank

    try:
        importlib.import_module(module)
        run_rank(module, *argv)
        return 0
    except SystemExit as stop:
        return exit_status(stop)
    except BaseException:  # report everything, as an uncaught exception would
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _fresh_seeds():
    """New random seeds for torch and numpy, as a new process draws them (Python's ``random``
    reseeds itself in a forked child)."""
    import numpy
    import torch

    torch.seed()
    numpy.random.seed()


# --------------------------------------------------------------------------- the server
class Server:
    """The fork server on the Unix socket ``path`` (see the module docstring); :meth:`serve`
    until SIGTERM or until the parent process is gone."""

    def __init__(self, path, preload=()):
        self.path = path
        self.root = os.getcwd()
        self.parent = os.getppid()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)  # clients may connect (and wait) while the imports run
        self.listener.listen(64)
        self.preload = tuple(preload)
        self.running = {}  # pid -> (client connection, SIGKILL deadline or None)
        self.stopping = False

    def import_modules(self):
        """Import torch, ``torch._dynamo`` and the ``preload`` modules; a module that fails to
        import is left out (its job imports it again and reports the error)."""
        import importlib

        import torch
        import torch._dynamo  # noqa: F401  the first optimizer step imports it in every job

        for module in self.preload:
            try:
                importlib.import_module(module)
            except Exception as error:  # the job itself will report it
                print(f"forkserver: not preloaded: {module}: {error!r}", file=sys.stderr)
        if torch.cuda.is_initialized():
            raise RuntimeError("importing the preloaded modules initialised CUDA, which forked "
                               "jobs cannot use")

    def serve(self):
        """Accept jobs until stopped; end every running job's process group when stopping."""
        self._wakeup = os.pipe()
        os.set_blocking(self._wakeup[1], False)
        signal.set_wakeup_fd(self._wakeup[1])
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._stop)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wakeup[0], selectors.EVENT_READ, "signal")
        try:
            while not self.stopping and os.getppid() == self.parent:
                for key, _ in self._selector.select(timeout=1.0):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "signal":
                        os.read(self._wakeup[0], 4096)
                    else:
                        self._client_event(key.data)
                self._reap()
                self._escalate()
        finally:
            for pid in list(self.running):
                _kill_group(pid, signal.SIGKILL)
            self.listener.close()
            if os.path.exists(self.path):
                os.unlink(self.path)

    def _stop(self, *_):
        self.stopping = True

    def _accept(self):
        connection, _ = self.listener.accept()
        try:
            request, fds = _receive_request(connection)
        except (OSError, ValueError) as error:
            print(f"forkserver: bad request: {error!r}", file=sys.stderr, flush=True)
            connection.close()
            return
        try:
            refusal = self._refusal(request)
            if refusal:
                try:
                    _send(connection, {"refused": refusal})
                except OSError:  # the client left: it is no one else's concern
                    pass
                connection.close()
                return
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                self._child(request, fds, connection)
            try:  # as the child does: whichever runs first, the group exists before a kill
                os.setpgid(pid, pid)
            except (PermissionError, ProcessLookupError):
                pass
        finally:
            for fd in fds:
                os.close(fd)
        self.running[pid] = (connection, None)
        self._selector.register(connection, selectors.EVENT_READ, pid)

    def _refusal(self, request):
        """Why this server cannot run ``request`` as a fresh process would (``None`` if it can):
        another directory, or a variable that the imports read with another value."""
        if os.path.realpath(request["cwd"]) != os.path.realpath(self.root):
            return f"runs jobs in {self.root}"
        env = request["env"]
        for name in sorted(set(env) | set(os.environ)):
            if name.startswith(IMPORT_TIME_PREFIXES) and env.get(name) != os.environ.get(name):
                return (f"was started with {name}={os.environ.get(name)!r}, read at import, "
                        f"and the job has {name}={env.get(name)!r}")
        return None

    def _child(self, request, fds, connection):
        """In the forked child: take over the client's streams, directory and environment, run
        the command, exit with its status; never returns. The server's sockets are closed, the
        client's ``connection`` too: only the server holds it, so that the client sees the
        server end."""
        status = 1
        try:
            os.setpgid(0, 0)
            signal.set_wakeup_fd(-1)
            for number in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(number, signal.SIG_DFL)
            self._selector.close()
            for fd in self._wakeup:
                os.close(fd)
            self.listener.close()
            connection.close()
            for other, _ in self.running.values():
                other.close()
            for fd, stream in zip(fds, _STREAMS):
                os.dup2(fd, stream)
            _reopen_standard_streams()
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            _fresh_seeds()
            status = run_command(request["module"], request["argv"])
        finally:
            os._exit(status)

    def _client_event(self, pid):
        """The client of ``pid`` sent something or left: it only ever leaves early (it waits
        for the status otherwise), so the job is cancelled."""
        connection, deadline = self.running[pid]
        if deadline is None:
            _kill_group(pid, signal.SIGTERM)
            self.running[pid] = (connection, time.monotonic() + TERMINATE_GRACE_S)
        self._selector.unregister(connection)

    def _reap(self):
        while self.running:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            connection, deadline = self.running.pop(pid)
            if deadline is None:  # the client still waits
                self._selector.unregister(connection)
                try:
                    _send(connection, {"status": os.waitstatus_to_exitcode(wait_status)})
                except OSError:
                    pass
            connection.close()

    def _escalate(self):
        now = time.monotonic()
        for pid, (_, deadline) in self.running.items():
            if deadline is not None and now > deadline:
                _kill_group(pid, signal.SIGKILL)


def _reopen_standard_streams():
    """``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` on the (new) descriptors 0, 1 and 2,
    buffered as a new process's: standard output line-buffered only on a terminal."""
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)


def _kill_group(pid, number):
    try:
        os.killpg(pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def _send(connection, message, fds=()):
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(connection, [payload], list(fds))
    else:
        connection.sendall(payload)


def _receive(connection, max_fds=0):
    """One framed JSON message (and up to ``max_fds`` file descriptors sent with it)."""
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, max_fds)
    if len(data) < _HEADER.size:
        raise ValueError("connection closed before a message")
    size, = _HEADER.unpack_from(data)
    data = data[_HEADER.size:]
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ValueError("connection closed inside a message")
        data += chunk
    return json.loads(data), fds


def _receive_request(connection):
    connection.settimeout(10.0)
    request, fds = _receive(connection, len(_STREAMS))
    connection.settimeout(None)
    if len(fds) != len(_STREAMS) or not isinstance(request.get("argv"), list):
        for fd in fds:
            os.close(fd)
        raise ValueError(f"expected a command and {len(_STREAMS)} streams")
    return request, fds


# --------------------------------------------------------------------------- the client
def _exec(module, argv):
    """Replace this process by ``python -m module argv``."""
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])


def run(module, argv):
    """Run ``python -m module argv`` through the server of :data:`SOCKET_ENV` (or, without
    one, by exec); exits with the command's status."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        _exec(module, argv)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            connection.connect(path)
            _send(connection, {"module": module, "argv": argv, "cwd": os.getcwd(),
                               "env": dict(os.environ)}, _STREAMS)
        except OSError as error:  # the command did not reach a server: nothing runs it
            reply = {"refused": f"is not reachable ({error})"}
        else:
            try:
                reply, _ = _receive(connection)
            except (OSError, ValueError) as error:  # it may have started: never run it twice
                sys.exit(f"experiments.records.forkserver: the server at {path} ended before "
                         f"the job did ({error}); see its log")
    finally:
        connection.close()
    if "refused" in reply:
        print(f"experiments.records.forkserver: the server at {path} {reply['refused']}: "
              "running in a fresh process", file=sys.stderr, flush=True)
        _exec(module, argv)
    status = reply["status"]
    sys.exit(status if status >= 0 else 128 - status)


# --------------------------------------------------------------------------- the workflow's
def start(preload, log_path):
    """Start a server for this process's jobs (the Snakefile's ``onstart``): its socket in a
    new temporary directory, named in :data:`SOCKET_ENV` of this process's environment (which
    the jobs inherit), its output in ``log_path``; it stops when this process exits. Returns
    the server's ``Popen``; if the server does not come up, warns and returns ``None`` (the
    jobs then start fresh processes)."""
    import atexit

    from .ownership import mark, remove

    # Marked, so that stopping removes this folder and nothing else (ownership.remove).
    directory = mark(tempfile.mkdtemp(prefix="experiments-forkserver-"), __name__)
    path = os.path.join(directory, "socket")
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", __name__, "serve", "--socket", path,
             "--preload", *preload], stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def stop():
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=TERMINATE_GRACE_S)
            except subprocess.TimeoutExpired:
                server.kill()
        remove(directory)

    atexit.register(stop)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not os.path.exists(path):
        if server.poll() is not None or time.monotonic() > deadline:
            print(f"experiments.records.forkserver: the server did not start (see {log_path}): "
                  "every job starts a fresh process", file=sys.stderr)
            return None
        time.sleep(0.05)
    os.environ[SOCKET_ENV] = path
    return server


def _serve(argv):
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m {__name__} serve")
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on")
    parser.add_argument("--preload", nargs="*", default=[], help="modules to import once")
    args = parser.parse_args(argv)
    server = Server(args.socket, args.preload)
    try:
        server.import_modules()
    except RuntimeError as error:
        server.listener.close()
        os.unlink(args.socket)
        sys.exit(f"forkserver: {error}")
    print(f"forkserver: serving {server.root} on {args.socket}", file=sys.stderr, flush=True)
    server.serve()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    usage = (f"usage: python -m {__name__} run MODULE [ARG ...]\n"
             f"       python -m {__name__} serve --socket PATH [--preload MODULE ...]")
    if argv[:1] == ["serve"]:
        _serve(argv[1:])
    elif argv[:1] == ["run"] and len(argv) >= 2 and not argv[1].startswith("-"):
        run(argv[1], argv[2:])
    else:
        sys.exit(usage)


if __name__ == "__main__":
    main()
