"""TLS, passwords and the least-privilege ACL users of deploy/redis/acl.conf, on real servers.

- ``rediss://`` with a CA, a server and a client certificate made by the recipe of
  docs/security.md (``openssl`` CLI), checked against strict (Python 3.13) verification;
- the password from the URL or ``TASKQ_REDIS_PASSWORD``, never printed (errors, the CLI);
- each ACL role can do its job and nothing more, and a refusal is one readable taskq error.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from support import LOOPBACK, RedisServer, free_port

import taskq
from taskq.engine.connection import mask_url
from taskq.ops.exporter import TaskqCollector
from taskq.ops.reaper import Reaper

ROOT = Path(__file__).resolve().parents[2]
ACL_FILE = ROOT / "deploy" / "redis" / "acl.conf"
SECURITY_DOC = ROOT / "docs" / "security.md"
TASKQ_CLI = os.path.join(os.path.dirname(sys.executable), "taskq")
ROLES = ("trainer", "reaper", "exporter", "admin")


def password(role: str) -> str:
    return f"pw-{role}-s3cr3t"


def pings(**kwargs: Any) -> bool:
    try:
        return bool(redis.Redis(host="127.0.0.1", socket_timeout=0.5, **kwargs).ping())
    except redis.exceptions.RedisError:
        return False


# --- TLS -----------------------------------------------------------------------------


def doc_block(lang: str) -> str:
    """The first fenced ``lang`` block of docs/security.md's TLS section."""
    text = SECURITY_DOC.read_text()
    section = text[text.index("## TLS\n") :]
    section = section[: section.index("\n## ", 1)]
    fence = f"```{lang}\n"
    assert fence in section, f"docs/security.md, TLS: no {lang} block"
    block = section[section.index(fence) + len(fence) :]
    return block[: block.index("```")]


def make_certs(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate: the documented
    recipe of docs/security.md, run as written (with 2-day certificates)."""
    (d / "certs.cnf").write_text(doc_block("ini"))
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", doc_block("sh")],
        cwd=d,
        check=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "DAYS": "2"},
    )


def strict_context(d: Path) -> ssl.SSLContext:
    """A client context that verifies as Python 3.13's default does (VERIFY_X509_STRICT)."""
    ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    ctx.load_cert_chain(str(d / "client.crt"), str(d / "client.key"))
    return ctx


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[int, Path]]:
    d = Path(tempfile.mkdtemp(prefix="taskq-tlsca-"))
    make_certs(d)
    port = free_port()
    tls = dict(
        ssl=True,
        ssl_ca_certs=str(d / "ca.crt"),
        ssl_certfile=str(d / "client.crt"),
        ssl_keyfile=str(d / "client.key"),
        password="tls-pw",
    )
    server = RedisServer(
        extra=[
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--tls-cert-file",
            str(d / "server.crt"),
            "--tls-key-file",
            str(d / "server.key"),
            "--tls-ca-cert-file",
            str(d / "ca.crt"),
            "--tls-auth-clients",
            "yes",
            "--requirepass",
            "tls-pw",
        ],
        ready=lambda: pings(port=port, **tls),
    )
    yield port, d
    server.cleanup()
    shutil.rmtree(d, ignore_errors=True)


def test_documented_certificates_pass_strict_verification_both_ways(
    tls_server: tuple[int, Path],
) -> None:
    port, d = tls_server
    ctx = strict_context(d)
    # the server verifies our client certificate in the handshake (tls-auth-clients yes)
    with (
        socket.create_connection((LOOPBACK, port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=LOOPBACK) as tls,
    ):
        tls.sendall(b"AUTH tls-pw\r\nPING\r\n")
        reply = b""
        while not reply.endswith(b"+PONG\r\n"):
            chunk = tls.recv(100)
            assert chunk, reply
            reply += chunk
        assert reply == b"+OK\r\n+PONG\r\n"
    # and a CA as `openssl req -x509` makes it is what strict verification refuses
    old = d / "old"
    old.mkdir()
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=old CA",
        ],
        cwd=old,
        check=True,
        capture_output=True,
        timeout=60,
    )
    (old / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    subprocess.run(
        [
            "openssl",
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "s.key",
            "-out",
            "s.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
        cwd=old,
        check=True,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            "s.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "s.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
        cwd=old,
        check=True,
        capture_output=True,
        timeout=60,
    )
    for strict in (False, True):
        flag = ["-x509_strict"] if strict else []
        r = subprocess.run(
            ["openssl", "verify", *flag, "-CAfile", "ca.crt", "s.crt"],
            cwd=old,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (r.returncode == 0) is not strict, (strict, r.stdout, r.stderr)


def tls_url(port: int, d: Path, client_cert: bool = True, password: str = "tls-pw") -> str:
    query = f"ssl_ca_certs={d / 'ca.crt'}"
    if client_cert:
        query += f"&ssl_certfile={d / 'client.crt'}&ssl_keyfile={d / 'client.key'}"
    return f"rediss://:{password}@127.0.0.1:{port}/0?{query}"


def test_rediss_with_ca_and_client_certs_runs_a_job(
    tls_server: tuple[int, Path], job_name: str
) -> None:
    port, d = tls_server
    url = tls_url(port, d)
    client = taskq.connect(url)
    client.create_job(job_name, [{"i": i} for i in range(20)], passes=2)
    ids = []
    with taskq.Trainer(job_name, url=url, prefetch=2) as trainer:
        for task in trainer:
            ids.append((task.pass_no, task.id))
    assert sorted(ids) == [(p, i) for p in range(2) for i in range(20)]
    assert client.status(job_name).state == "completed"
    assert client.audit(job_name)["ok"]


def test_rediss_without_a_client_cert_or_password_is_refused_readably(
    tls_server: tuple[int, Path],
) -> None:
    port, d = tls_server
    with pytest.raises(taskq.ConnectionLost) as no_cert:
        taskq.connect(tls_url(port, d, client_cert=False), retries=0).ping()
    assert "***" in str(no_cert.value) and "tls-pw" not in str(no_cert.value)
    with pytest.raises(taskq.TaskqError, match="refused the credentials") as bad_pw:
        taskq.connect(tls_url(port, d, password="wrong-pw"), retries=0).ping()
    assert "wrong-pw" not in str(bad_pw.value)


# --- passwords are never printed -----------------------------------------------------------


def test_mask_url_hides_every_password_form() -> None:
    cases = {
        "redis://trainer:p%40ss@h:6379/0": "redis://trainer:***@h:6379/0",
        "redis://u:p@ss/w:rd@h:1/0": "redis://u:***@h:1/0",
        "rediss://:pw@h:1/0?ssl_ca_certs=/ca.crt": "rediss://:***@h:1/0?ssl_ca_certs=/ca.crt",
        "redis://h:1/0?password=pw&db=1": "redis://h:1/0?password=***&db=1",
        "redis+sentinel://:pw@a:1,b:2/mymaster/0": "redis+sentinel://:***@a:1,b:2/mymaster/0",
        "redis+cluster://u:pw@a:1,b:2": "redis+cluster://u:***@a:1,b:2",
        "unix://:pw@/run/redis.sock?db=0": "unix://:***@/run/redis.sock?db=0",
        "redis://h:1/0": "redis://h:1/0",
    }
    for url, masked in cases.items():
        assert mask_url(url) == masked


def test_connection_lost_and_the_cli_error_line_mask_the_password() -> None:
    port = free_port()  # nothing listens there
    url = f"redis://admin:hunter2-secret@127.0.0.1:{port}/0"
    with pytest.raises(taskq.ConnectionLost) as e:
        taskq.connect(url, retries=0).ping()
    assert "***" in str(e.value) and "hunter2" not in str(e.value)
    out = subprocess.run(
        [TASKQ_CLI, "--url", url, "job", "list"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0
    assert "hunter2" not in out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("taskq: error:") and "***" in lines[0], lines


# --- ACL roles -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_port() -> Iterator[int]:
    """A redis-server running deploy/redis/acl.conf with test passwords in place."""
    d = Path(tempfile.mkdtemp(prefix="taskq-acl-"))
    text = ACL_FILE.read_text()
    for role in ROLES:
        assert f">CHANGE_ME_{role}" in text, f"acl.conf: no placeholder for {role}"
        text = text.replace(f">CHANGE_ME_{role}", f">{password(role)}")
    # a superuser of the test's own, only to flush the script cache
    (d / "acl.conf").write_text(text + "user tester on >tester-pw ~* &* +@all\n")
    port = free_port()
    server = RedisServer(
        extra=["--aclfile", str(d / "acl.conf")],
        port=port,
        directory=d,
        ready=lambda: pings(port=port),
    )
    yield port
    server.cleanup()
    shutil.rmtree(d, ignore_errors=True)


def role_url(port: int, role: str) -> str:
    return f"redis://{role}:{password(role)}@127.0.0.1:{port}/0"


def assert_refused(exc: BaseException, role: str) -> None:
    """One readable taskq error: says ACL, names the URL masked, never the password."""
    text = str(exc)
    assert isinstance(exc, taskq.TaskqError), type(exc)
    assert "refused by ACL" in text and "***" in text, text
    assert password(role) not in text
    assert "\n" not in text


def test_acl_trainer_runs_passes_but_cannot_delete_or_flush(acl_port: int, job_name: str) -> None:
    admin = taskq.connect(role_url(acl_port, "admin"))
    admin.create_job(job_name, [{"i": i} for i in range(12)], passes=2)
    url = role_url(acl_port, "trainer")
    ids = []
    with taskq.Trainer(job_name, url=url, prefetch=1) as trainer:  # register .. leave
        for task in trainer:
            ids.append((task.pass_no, task.id))
        assert trainer.heartbeat() == []
    assert sorted(ids) == [(p, i) for p in range(2) for i in range(12)]
    assert admin.status(job_name).state == "completed"
    assert admin.audit(job_name)["ok"]

    trainer_client = taskq.connect(url)
    with pytest.raises(taskq.TaskqError) as e:
        trainer_client.delete_job(job_name)
    assert_refused(e.value, "trainer")
    assert admin.status(job_name).tasks == 12  # nothing was deleted
    out = subprocess.run(
        [TASKQ_CLI, "--url", url, "job", "delete", job_name, "--yes"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode != 0 and len(lines) == 1, out.stderr
    assert lines[0].startswith("taskq: error:") and "refused by ACL" in lines[0], lines
    assert password("trainer") not in out.stdout + out.stderr
    assert admin.status(job_name).tasks == 12
    with pytest.raises(redis.exceptions.NoPermissionError):
        trainer_client.redis.flushall()
    with pytest.raises(redis.exceptions.NoPermissionError):
        trainer_client.redis.delete(trainer_client.keys(job_name).meta)


def test_acl_trainer_password_from_taskq_redis_password(
    acl_port: int, job_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    taskq.connect(role_url(acl_port, "admin")).create_job(job_name, [{"i": 0}, {"i": 1}])
    monkeypatch.setenv("TASKQ_REDIS_PASSWORD", password("trainer"))
    url = f"redis://trainer@127.0.0.1:{acl_port}/0"
    with taskq.Trainer(job_name, url=url) as trainer:
        assert sorted(t.id for t in trainer) == [0, 1]
    monkeypatch.setenv("TASKQ_REDIS_PASSWORD", "not-it")
    with pytest.raises(taskq.TaskqError, match="refused the credentials") as e:
        taskq.connect(url, retries=0).ping()
    assert "not-it" not in str(e.value)


def test_acl_exporter_reads_but_cannot_write(acl_port: int, job_name: str) -> None:
    admin = taskq.connect(role_url(acl_port, "admin"))
    admin.create_job(job_name, [{"i": i} for i in range(5)])
    tester = redis.Redis(port=acl_port, username="tester", password="tester-pw")
    tester.function_flush()
    exporter = taskq.connect(role_url(acl_port, "exporter"))
    # only the admin may load the library (whoever may load one may replace one)
    with pytest.raises(taskq.TaskqError, match="not loaded on this Redis") as e:
        exporter.status(job_name)
    assert "taskq job status" in str(e.value)
    admin.status(job_name)  # loads it
    status = exporter.status(job_name)
    assert (status.tasks, status.todo) == (5, 5)
    assert exporter.tasks(job_name, "todo", limit=10)
    assert job_name in exporter.list_jobs()
    families = {f.name: f for f in TaskqCollector(exporter, jobs=[job_name]).collect()}
    assert families["taskq_exporter_scrape_errors"].samples[0].value == 0
    assert any(s.labels.get("job_name") == job_name for s in families["taskq_tasks"].samples)

    with pytest.raises(taskq.TaskqError) as e:
        exporter.create_job(job_name + "-x", [{"i": 0}])
    assert_refused(e.value, "exporter")
    with pytest.raises(taskq.TaskqError) as e:
        exporter.cancel_job(job_name)
    assert_refused(e.value, "exporter")
    assert admin.status(job_name).state == "running"
    assert admin.redis.exists(admin.keys(job_name + "-x").meta) == 0


def test_acl_reaper_reaps_but_cannot_delete(acl_port: int, job_name: str) -> None:
    admin = taskq.connect(role_url(acl_port, "admin"))
    admin.create_job(
        job_name,
        [{"i": i} for i in range(3)],
        manual_clock=True,
        worker_ttl=2.0,
        heartbeat_interval=0.5,
    )
    lost = taskq.Trainer(job_name, url=role_url(acl_port, "trainer"), heartbeat=False)
    assert lost.lease(timeout=0) is not None
    admin.advance_clock(job_name, 3000)
    reaper_client = taskq.connect(role_url(acl_port, "reaper"))
    assert Reaper(reaper_client, jobs=[job_name]).tick() == {job_name: 1}
    assert admin.status(job_name).counters["expired_worker_lost"] == 1
    with pytest.raises(taskq.TaskqError) as e:
        reaper_client.delete_job(job_name)
    assert_refused(e.value, "reaper")


def test_acl_admin_does_everything_under_the_prefix_but_nothing_dangerous(
    acl_port: int, job_name: str
) -> None:
    admin = taskq.connect(role_url(acl_port, "admin"))
    admin.create_job(job_name, [{"i": i} for i in range(3)], auto_advance=False, passes=2)
    with taskq.Trainer(job_name, url=role_url(acl_port, "trainer")) as trainer:
        assert len(list(trainer.passes().__next__())) == 3
    assert admin.next_pass(job_name) == 1
    admin.cancel_job(job_name)
    assert admin.repair_index() == ([], [])
    admin.delete_job(job_name)
    assert job_name not in admin.list_jobs()
    with pytest.raises(taskq.JobNotFound):
        admin.status(job_name)
    for command in (("FLUSHALL",), ("CONFIG", "GET", "maxmemory"), ("KEYS", "*")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            admin.redis.execute_command(*command)
    with pytest.raises(redis.exceptions.NoPermissionError):
        admin.redis.set("not-taskq:key", "1")


def test_acl_default_user_only_pings(acl_port: int) -> None:
    anonymous = taskq.connect(f"redis://127.0.0.1:{acl_port}/0")
    anonymous.ping()
    with pytest.raises(taskq.TaskqError) as e:
        anonymous.list_jobs()
    assert "refused by ACL" in str(e.value)
