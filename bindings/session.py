"""The Spark session every scan shares: its environment (this interpreter for the Python workers, loopback for a
local master, Java 17, this checkout importable), its private directory (log4j2 configuration, Spark's local
files), the Java check that makes a missing or old Java one line, and Ctrl-C while Spark runs.

The readers (``analyses`` for recordings, ``brokerlog``, ``pcap``) and ``scan_engine.run_scan`` take their session
from here; this module imports no other module of ``engine.bindings`` and pyspark only when a session starts.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG4J2 = """\
# The Python gateway counts as a shell: Spark resets the root level to its org.apache.spark logger's (and says
# so) unless they are equal.
rootLogger.level = error
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.spark.name = org.apache.spark
logger.spark.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""

_private: dict = {}


def private_dir() -> str:
    """This process's private directory (tempfile.mkdtemp: mode 0700, random name), removed at exit: the JVM's
    log4j2 configuration and, for local masters, Spark's local files. A fixed name in the shared temp directory could
    be planted by another user (a symbolic link, a configuration of theirs) or swapped after a check."""
    if _private.get("pid") != os.getpid():
        _private.update(pid=os.getpid(), dir=tempfile.mkdtemp(prefix="rmqhb-spark-"))
        atexit.register(_remove_private_dir, os.getpid(), _private["dir"])
    return _private["dir"]


def _remove_private_dir(pid: int, path: str) -> None:
    if os.getpid() == pid:  # not from a forked child
        shutil.rmtree(path, ignore_errors=True)


def _log4j2_file() -> str:
    path = os.path.join(private_dir(), "log4j2.properties")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(_LOG4J2)
    return path


def prepare_environment(local: bool = True) -> None:
    """Environment a SparkSession needs before it starts (SPARK.md): worker Python = this interpreter, loopback
    address for local runs, Java 17 if none is set, and this package importable by the Python workers."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    _default_java_home()
    import engine

    root = str(Path(engine.__file__).resolve().parents[1])
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([root] + parts)


_JAVA_17_HOMES = ("/usr/lib/jvm/java-17-openjdk-amd64", "/usr/lib/jvm/java-17-openjdk-arm64", "/usr/lib/jvm/java-17-openjdk")
#: the Java Spark 4 runs on
JAVA_MIN_VERSION = 17


def _default_java_home() -> None:
    """JAVA_HOME = an installed Java 17 when none is set (as Spark's launcher, which uses JAVA_HOME, else PATH)."""
    if "JAVA_HOME" not in os.environ:
        for cand in _JAVA_17_HOMES:
            if Path(cand, "bin", "java").exists():
                os.environ["JAVA_HOME"] = cand
                break


class JavaUnavailable(RuntimeError):
    """Spark's JVM cannot start here: the message is one line saying why and how to point at a Java 17."""


def java_problem() -> Optional[str]:
    """Why Spark's JVM cannot start here (one line: what is wrong and how to point at a Java 17), or None. Checked
    before a session starts: without it a missing or old Java is a py4j traceback after the launcher failed."""
    import re
    import subprocess

    _default_java_home()
    home = os.environ.get("JAVA_HOME")
    fix = (f"Spark needs Java {JAVA_MIN_VERSION} or later: install one (e.g. apt-get install openjdk-17-jre-headless) "
           "and set JAVA_HOME to its directory (e.g. /usr/lib/jvm/java-17-openjdk-amd64)")
    if home:
        java = Path(home, "bin", "java")
        if not os.access(java, os.X_OK):
            return f"JAVA_HOME={home} has no bin/java; {fix}"
        java = str(java)
    else:
        java = shutil.which("java")
        if not java:
            return f"no Java found (JAVA_HOME is not set and no java on PATH); {fix}"
    try:
        run = subprocess.run([java, "-version"], capture_output=True, text=True, errors="replace", timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{java} -version failed ({type(e).__name__}); {fix}"
    m = re.search(r'version "(\d+)(?:\.(\d+))?', run.stderr + run.stdout)
    if run.returncode != 0 or not m:
        return f"{java} -version failed (exit {run.returncode}); {fix}"
    major = int(m.group(2)) if m.group(1) == "1" and m.group(2) else int(m.group(1))  # "1.8.0" is Java 8
    if major < JAVA_MIN_VERSION:
        return f"{java} is Java {major}; {fix}"
    return None


def _local_cores(master: str) -> int:
    inside = master[len("local"):].strip("[]")
    if inside.isdigit():
        return int(inside)
    return os.cpu_count() or 1


def spark_session(master: Optional[str] = None, app_name: str = "rmqhb", *, test: bool = False,
                  driver_memory: str = "2g", conf: Optional[dict] = None) -> SparkSession:
    """The SparkSession for scans and tests: quiet logs, no UI, Arrow on, UTC; ``test=True`` adds the JVM flags
    that start faster (serial GC, C1 only). Reuses a running session. (``analyses.spark_session``: this session with
    the ``rmqhb`` data source of recordings registered.)"""
    master = master or os.environ.get("RMQHB_SPARK_MASTER") or "local[*]"
    local = master.startswith("local")
    prepare_environment(local)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is None:  # a JVM is to start: a missing or old Java is one line, not
        problem = java_problem()                      # a py4j traceback after the launcher failed
        if problem:
            raise JavaUnavailable(problem)
    java_opts = f"-Dlog4j2.configurationFile=file:{_log4j2_file()}"
    if local:  # the JVM's own temporary files (native libraries it unpacks, ...) in the private directory too
        java_opts += f" -Djava.io.tmpdir={private_dir()}"
    if test:
        java_opts += " -XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.memory": driver_memory,
    }
    if local:
        cores = _local_cores(master)
        settings.update({
            "spark.local.dir": private_dir(),  # shuffle and block files, PySpark's temporary files: not world-readable
            "spark.sql.shuffle.partitions": str(cores),
            "spark.default.parallelism": str(cores),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        })
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    if _cli.get("interrupt"):
        spark = _keeping_our_interrupt(builder.getOrCreate)
    else:
        spark = builder.getOrCreate()
    return spark


def _keeping_our_interrupt(fn):
    """fn() while SparkContext's constructor cannot replace our SIGINT handler with its own (cancelAllJobs over
    py4j, then KeyboardInterrupt): a Ctrl-C while the session starts is ours too."""
    import signal

    real = signal.signal

    def keep(sig, handler):
        return signal.getsignal(sig) if sig == signal.SIGINT else real(sig, handler)

    signal.signal = keep
    try:
        return fn()
    finally:
        signal.signal = real


#: {"interrupt": True} while `rmqhb scan` runs from the command line (take_interrupts)
_cli: dict = {}


def take_interrupts(enabled: bool) -> None:
    """`rmqhb scan` from the command line (True): its Ctrl-C ends the process at once with one line, also while
    Spark starts or runs (catch_interrupt, _interrupt); False again when it returns, for a caller in this process
    (rmqhb demo, a test): an embedding program's SIGINT stays its own."""
    _cli["interrupt"] = enabled


def _interrupt(signum, frame) -> None:
    """Ctrl-C in `rmqhb scan`. Before and after the Spark session: KeyboardInterrupt (the report's files are
    removed on the way out, the CLI prints one line; a JVM being launched reads EOF when we exit, and ends). While
    it runs: one line, the local JVM (started ignoring SIGINT) killed, its Python workers end with it, the private
    directory removed, exit 130 at once. Unwinding instead calls into a JVM being torn down: 126-139 lines of py4j
    and Java stacks and seconds of wait."""
    from pyspark import SparkContext

    if SparkContext._gateway is None:  # the JVM being launched (spark-submit, then java): not ours to wait for
        _kill_children()
    if SparkContext._gateway is None or SparkContext._active_spark_context is None:
        raise KeyboardInterrupt
    os.write(2, (b"\n" if os.isatty(2) else b"") + b"rmqhb scan: interrupted\n")
    proc = getattr(SparkContext._gateway, "proc", None)  # ended first: it would write on into the private directory
    if proc is not None:
        try:
            proc.kill()
            proc.wait(2)
        except Exception:
            pass
    if _private.get("pid") == os.getpid():
        shutil.rmtree(_private["dir"], ignore_errors=True)
    os._exit(130)


def _kill_children() -> None:
    """SIGKILL this process's child processes (Linux /proc; elsewhere a launched JVM ends at EOF on its stdin)."""
    me = str(os.getpid())
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
            if stat[stat.rindex(")") + 2:].split()[1] == me:  # field 4, after "pid (comm) state"
                os.kill(int(pid), 9)
        except (OSError, ValueError, IndexError):
            pass


def catch_interrupt() -> None:
    """Our SIGINT handler from here on, when take_interrupts asked for it (and in the main thread)."""
    import signal
    import threading

    if _cli.get("interrupt") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupt)


def restore_interrupt(before) -> None:
    """The SIGINT handler ``before`` back, if ours is still the one installed."""
    import signal

    if before is not None and signal.getsignal(signal.SIGINT) is _interrupt:
        signal.signal(signal.SIGINT, before)
