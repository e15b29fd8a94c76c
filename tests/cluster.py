"""A real two-"node" cluster on this machine for the multi-node tests: sshd + pdsh, and Slurm + munge.

Everything lives in a temp directory of its own (configs, host keys, client key, spool, state, sockets):
the system's sshd, ~/.ssh and /etc/slurm are never touched. The nodes are 127.0.0.1 and 127.0.0.2 (the
whole 127/8 range is loopback on Linux); ssh reaches them on a port of its own through a client config
that a PATH shim (`ssh` -> `ssh -F <config>`) selects, so DeepSpeed's runner and pdsh run unmodified.
Missing Debian packages are installed once (CI runs as root on a fresh machine); where that or a daemon
start is impossible, `ClusterUnavailable` carries the reason and the tests skip printing it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PACKAGES = {  # binary -> Debian package
    "sshd": "openssh-server",
    "ssh": "openssh-client",
    "pdsh": "pdsh",
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
}
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
NODES = ("127.0.0.1", "127.0.0.2")


class ClusterUnavailable(Exception):
    """Why a real sshd or Slurm cannot be had here (printed as the skip reason)."""


def which(name: str) -> str | None:
    return shutil.which(name) or next(
        (f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None
    )


def ensure_packages(binaries: list[str]) -> None:
    """apt-get install the packages behind any missing binary (update once, non-interactive). Under a lock:
    the sshd and Slurm tests run in two pytest-xdist workers at once, and a second apt-get would fail on
    dpkg's lock."""
    if all(which(b) is not None for b in binaries):
        return
    with open(Path(tempfile.gettempdir()) / "mlstm-ds-tests-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _install_missing(binaries)


def _install_missing(binaries: list[str]) -> None:
    """Checked again under the lock: the other worker may have installed them meanwhile."""
    missing = sorted({PACKAGES[b] for b in binaries if which(b) is None})
    if not missing:
        return
    if os.geteuid() != 0 or which("apt-get") is None:
        raise ClusterUnavailable(f"{', '.join(missing)} not installed and cannot be (needs root and apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            raise ClusterUnavailable(f"{' '.join(cmd[:3])} failed: {p.stderr.strip().splitlines()[-1:]}")
    if any(which(b) is None for b in binaries):
        raise ClusterUnavailable(f"installed {missing} but {binaries} are still not all on PATH")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.2)
    tail = log.read_text()[-800:] if log is not None and log.exists() else ""
    raise ClusterUnavailable(f"{what} did not come up in {timeout:.0f}s {tail!r}")


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


@dataclass
class Daemons:
    procs: list[subprocess.Popen]

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@dataclass
class SshCluster:
    """sshd on NODES at `port`; `env` puts the `ssh` shim first on PATH (pdsh and DeepSpeed use it)."""

    dir: Path
    port: int
    env: dict[str, str]
    daemons: Daemons

    def hostfile(self, path: Path, slots: int = 1) -> Path:
        path.write_text("".join(f"{h} slots={slots}\n" for h in NODES))
        return path


def start_sshd(tmp: Path) -> SshCluster:
    ensure_packages(["sshd", "ssh", "pdsh"])
    tmp.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o700)
    for kind in ("ed25519",):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(tmp / f"host_{kind}")], check=True
        )
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "client_key")], check=True)
    (tmp / "authorized_keys").write_text((tmp / "client_key.pub").read_text())
    os.chmod(tmp / "authorized_keys", 0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    port = free_port()
    (tmp / "sshd_config").write_text(
        f"Port {port}\n"
        + "".join(f"ListenAddress {h}\n" for h in NODES)
        + f"HostKey {tmp / 'host_ed25519'}\nPidFile {tmp / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {tmp / 'authorized_keys'}\nStrictModes no\nUsePAM no\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\nX11Forwarding no\nPrintMotd no\nMaxStartups 50\nMaxSessions 50\n"
    )
    log = tmp / "sshd.log"
    proc = subprocess.Popen(
        [which("sshd"), "-D", "-e", "-f", str(tmp / "sshd_config")],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    daemons = Daemons([proc])
    try:
        wait_for(lambda: all(port_open(h, port) for h in NODES), 20, "sshd", log)
    except ClusterUnavailable:
        daemons.stop()
        raise
    (tmp / "ssh_config").write_text(
        f"Host {' '.join(NODES)}\n  Port {port}\n  IdentityFile {tmp / 'client_key'}\n  IdentitiesOnly yes\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  BatchMode yes\n"
    )
    shim = tmp / "bin"
    shim.mkdir()
    (shim / "ssh").write_text(f'#!/bin/sh\nexec {which("ssh")} -F {tmp / "ssh_config"} "$@"\n')
    os.chmod(shim / "ssh", 0o755)
    env = {"PATH": f"{shim}:{os.environ['PATH']}"}
    probe = subprocess.run(
        ["pdsh", "-S", "-R", "ssh", "-w", ",".join(NODES), "echo ok"],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0 or probe.stdout.count("ok") != len(NODES):
        daemons.stop()
        raise ClusterUnavailable(f"pdsh over the test sshd failed: {probe.stderr.strip()[-400:]}")
    return SshCluster(tmp, port, env, daemons)


@dataclass
class SlurmCluster:
    """slurmctld + slurmd + munged on this host; `env` holds SLURM_CONF for sbatch/srun/squeue."""

    dir: Path
    node: str
    env: dict[str, str]
    daemons: Daemons

    def wait_job(self, job_id: str, timeout: float) -> str:
        """Poll until the job leaves the queue; return its final state (from scontrol while it is kept)."""
        deadline = time.time() + timeout
        state = ""
        while time.time() < deadline:
            p = subprocess.run(
                ["scontrol", "show", "job", job_id],
                env=dict(os.environ, **self.env),
                capture_output=True,
                text=True,
            )
            for tok in p.stdout.split():
                if tok.startswith("JobState="):
                    state = tok.split("=", 1)[1]
            if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return state
            time.sleep(0.5)
        subprocess.run(["scancel", job_id], env=dict(os.environ, **self.env))
        return f"TIMEOUT(last {state})"


def start_slurm(tmp: Path) -> SlurmCluster:
    ensure_packages(["munged", "slurmctld", "slurmd", "sbatch"])
    for sub in ("state", "spool", "munge", "log"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(tmp / "munge", 0o700)
    key = tmp / "munge" / "munge.key"
    subprocess.run([which("mungekey"), "--create", "--keyfile", str(key)], check=True, capture_output=True)
    os.chmod(key, 0o600)
    sock = tmp / "munge" / "munge.socket"
    daemons = Daemons([])
    try:
        daemons.procs.append(
            subprocess.Popen(
                [
                    which("munged"),
                    "-F",
                    "--force",
                    f"--key-file={key}",
                    f"--socket={sock}",
                    f"--pid-file={tmp / 'munge' / 'munged.pid'}",
                    f"--log-file={tmp / 'log' / 'munged.log'}",
                    f"--seed-file={tmp / 'munge' / 'seed'}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=(tmp / "log" / "munged.out").open("w"),
            )
        )
        wait_for(sock.exists, 15, "munged", tmp / "log" / "munged.out")
        node = socket.gethostname().split(".")[0]
        ctl_port, d_port = free_port(), free_port()
        cpus = os.cpu_count() or 1
        conf = tmp / "slurm.conf"
        conf.write_text(
            f"ClusterName=mlstmtest\nSlurmctldHost={node}(127.0.0.1)\nSlurmctldPort={ctl_port}\n"
            f"SlurmdPort={d_port}\nAuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={sock},cred_expire=10\n"
            f"StateSaveLocation={tmp / 'state'}\nSlurmdSpoolDir={tmp / 'spool'}\n"
            f"SlurmctldPidFile={tmp / 'slurmctld.pid'}\nSlurmdPidFile={tmp / 'slurmd.pid'}\n"
            f"SlurmctldLogFile={tmp / 'log' / 'slurmctld.log'}\nSlurmdLogFile={tmp / 'log' / 'slurmd.log'}\n"
            "SlurmUser=root\nSlurmdUser=root\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "MpiDefault=none\nSchedulerType=sched/builtin\nSelectType=select/cons_tres\n"
            # a requeued job becomes eligible once its credential expires, and is started by the next
            # periodic pass (60 s by default): every 2 s here
            "SchedulerParameters=sched_interval=2\n"
            "SelectTypeParameters=CR_Core\nReturnToService=2\nMinJobAge=300\nKillWait=5\n"
            "InactiveLimit=0\nSlurmdTimeout=60\nLaunchParameters=use_interactive_step\n"
            f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN\n"
            f"PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4\n"
        )
        env = {"SLURM_CONF": str(conf)}
        full = dict(os.environ, **env)
        for daemon in ("slurmctld", "slurmd"):
            daemons.procs.append(
                subprocess.Popen(
                    [which(daemon), "-D", "-f", str(conf)] + (["-i"] if daemon == "slurmctld" else []),
                    env=full,
                    stdout=subprocess.DEVNULL,
                    stderr=(tmp / "log" / f"{daemon}.out").open("w"),
                )
            )
            if daemon == "slurmctld":
                wait_for(
                    lambda: port_open("127.0.0.1", ctl_port), 30, "slurmctld", tmp / "log" / "slurmctld.out"
                )

        def node_idle() -> bool:
            p = subprocess.run(["sinfo", "-h", "-o", "%t"], env=full, capture_output=True, text=True)
            return p.stdout.strip() in ("idle", "mix")

        wait_for(node_idle, 60, "slurmd (node idle)", tmp / "log" / "slurmd.log")
    except (ClusterUnavailable, subprocess.CalledProcessError, OSError) as e:
        daemons.stop()
        raise (
            e if isinstance(e, ClusterUnavailable) else ClusterUnavailable(f"slurm start failed: {e}")
        ) from None
    return SlurmCluster(tmp, node, env, daemons)
