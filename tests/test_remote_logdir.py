"""Remote logdirs against a real S3-compatible server on 127.0.0.1 (moto's server mode).

moto runs in this process, on a real socket; the reader talks to it through s3fs/botocore
exactly as it would talk to AWS, configured the ordinary way (``AWS_ENDPOINT_URL`` and
friends in the environment). Every verdict is checked against the same files read locally.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import plugin_fixtures as fx

from tb_parity_plugin import api, cli
from tb_parity_plugin.logdir.reader import LogdirReader

moto_server = pytest.importorskip("moto.server")
s3fs = pytest.importorskip("s3fs")

BUCKET = "tbp-logs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3:
    """A moto server on a fixed loopback port that a test can stop and start again."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.server: Any = None
        self.env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing-secret",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_MAX_ATTEMPTS": "2",
        }

    def start(self) -> None:
        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def fs(self) -> Any:
        return s3fs.S3FileSystem(skip_instance_cache=True)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    server = S3()
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    server.start()
    server.fs().mkdir(BUCKET)
    try:
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def upload(s3: S3, local: str, prefix: str) -> str:
    """Copy a local logdir to ``s3://BUCKET/prefix``; returns the URL."""
    fs = s3.fs()
    for dirpath, _, files in os.walk(local):
        for name in files:
            path = os.path.join(dirpath, name)
            key = f"{BUCKET}/{prefix}/{os.path.relpath(path, local)}"
            fs.pipe(key, open(path, "rb").read())
    return f"s3://{BUCKET}/{prefix}"


def same_report(local: str, url: str, **kwargs: Any) -> dict[str, Any]:
    a = api.compare(local, **kwargs).to_dict()
    b = api.compare(url, **kwargs).to_dict()
    assert a == b
    return a


def test_a_pair_in_s3_gives_the_local_verdict(s3: S3, tmp_path: Any) -> None:
    fx.write_pair(str(tmp_path), "pair", 12, diverge_at=5)
    url = upload(s3, str(tmp_path / "pair"), "verdict")
    report = same_report(str(tmp_path / "pair"), url)
    assert report["first_divergence"]["step"] == 5 and report["first_divergence"]["kind"] == "lr"


def test_the_cli_reads_a_url(s3: S3, tmp_path: Any, capsys: Any) -> None:
    fx.write_pair(str(tmp_path), "pair", 6, diverge_at=2)
    url = upload(s3, str(tmp_path / "pair"), "cli")
    assert cli.main(["diff", url, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["first_divergence"]["step"] == 2


def test_a_growing_object_is_read_incrementally(s3: S3, tmp_path: Any) -> None:
    """An object store has no append: the writer re-uploads the object longer. Only the new bytes are fetched."""
    fx.write_pair(str(tmp_path), "pair", 10)
    local = tmp_path / "pair"
    fs = s3.fs()
    url = f"s3://{BUCKET}/grow"
    files = {side: next(p for p in (local / side).iterdir() if "tfevents" in p.name) for side in ("tf1", "tf2")}
    full = {side: path.read_bytes() for side, path in files.items()}
    half = {side: len(data) // 2 for side, data in full.items()}
    for side, data in full.items():
        fs.pipe(f"{BUCKET}/grow/{side}/{files[side].name}", data[: half[side]])  # cut mid-record, as a flush might
    reader = LogdirReader(url)
    reader.reload()
    first = reader.bytes_read
    assert 0 < first <= sum(half.values())
    for side, data in full.items():
        fs.pipe(f"{BUCKET}/grow/{side}/{files[side].name}", data)
    assert reader.reload()
    assert reader.bytes_read == sum(len(d) for d in full.values())  # every byte consumed once
    assert not reader.problems
    expected = api.compare(str(local))
    grown = api.compare(url)
    assert grown.to_dict() == expected.to_dict()
    with LogdirReader(str(local)) as local_reader:
        for side in ("tf1", "tf2"):
            assert list(reader.run(side).steps) == list(local_reader.run(side).steps)


def test_a_replaced_object_is_never_read_as_if_appended(s3: S3, tmp_path: Any) -> None:
    fx.write_pair(str(tmp_path), "a", 6)
    fx.write_pair(str(tmp_path), "b", 9, diverge_at=1)
    fs = s3.fs()
    name = "events.out.tfevents.1.host"
    a = next(p for p in (tmp_path / "a" / "tf2").iterdir() if "tfevents" in p.name).read_bytes()
    b = next(p for p in (tmp_path / "b" / "tf2").iterdir() if "tfevents" in p.name).read_bytes()
    fs.pipe(f"{BUCKET}/replaced/tf2/{name}", a)
    reader = LogdirReader(f"s3://{BUCKET}/replaced")
    reader.reload()
    steps = list(reader.run("tf2").steps)
    fs.pipe(f"{BUCKET}/replaced/tf2/{name}", b)  # longer, other content
    reader.reload()
    # never a mix: either the old steps with a problem naming the replacement, or the new file read anew
    run = reader.run("tf2")
    assert list(run.steps) == steps or list(run.steps) == list(range(9))
    if list(run.steps) == steps:
        assert any("replaced" in p.message for p in run.problems)


def test_a_listing_of_many_runs(s3: S3, tmp_path: Any) -> None:
    """More objects than one listing page (1000 keys): every run is found."""
    fx.write_pair(str(tmp_path), "one", 2)
    data = next(p for p in (tmp_path / "one" / "tf1").iterdir() if "tfevents" in p.name).read_bytes()
    fs = s3.fs()
    runs = 1005
    fs.pipe({f"{BUCKET}/many/run{i:04d}/events.out.tfevents.1.h": data for i in range(runs)})
    reader = LogdirReader(f"s3://{BUCKET}/many")
    names = reader.run_names()
    assert len(names) == runs and names[0] == "run0000" and names[-1] == f"run{runs - 1:04d}"
    assert all(list(reader.run(n).steps) == [0, 1] for n in (names[0], names[-1]))


def test_a_network_error_mid_read_is_reported_then_recovered(s3: S3, tmp_path: Any) -> None:
    fx.write_pair(str(tmp_path), "pair", 8, diverge_at=3)
    url = upload(s3, str(tmp_path / "pair"), "flaky")
    reader = LogdirReader(url)
    reader.reload()
    before = reader.bytes_read
    fs = s3.fs()
    extra = tmp_path / "more"
    fx.append_steps(str(extra), "tf2", 8, 12, diverge_at=3)  # a second event file appears for tf2
    new = next(p for p in extra.iterdir() if "tfevents" in p.name)
    fs.pipe(f"{BUCKET}/flaky/tf2/{new.name}", new.read_bytes())
    reader._storage.discover()  # list while the server is up, so the read below fails mid-way
    s3.stop()
    try:
        reader.reload()
    except OSError as exc:  # listing failed: the reload says so, and nothing was dropped
        assert "cannot list" in str(exc)
    else:
        assert any("retried on the next reload" in p.message for p in reader.problems)
    finally:
        s3.start()
    assert reader.bytes_read >= before
    reader.reload()
    assert not reader.problems
    assert list(reader.run("tf2").steps) == list(range(12))


def test_a_missing_bucket_is_a_clear_error(s3: S3, capsys: Any) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LogdirReader("s3://no-such-bucket-here/logs")
    assert cli.main(["diff", "s3://no-such-bucket-here/logs"]) == 2
    err = capsys.readouterr().err
    assert "no-such-bucket-here" in err and "testing-secret" not in err


def test_an_unknown_protocol_is_a_clear_error() -> None:
    with pytest.raises(OSError, match="nosuchfs"):
        LogdirReader("nosuchfs://bucket/logs")


def test_tensorboard_serves_the_tab_from_s3(s3: S3, tmp_path: Any) -> None:
    """A real ``tensorboard --logdir s3://...`` process answers the tab's routes with the local verdict.

    TensorBoard opens an ``s3://`` logdir only through its own boto3 client, which it uses when
    TensorFlow is not importable (with TensorFlow it asks for tensorflow-io, which does not
    support TF 2.21): the server runs as in a serving environment without TensorFlow.
    """
    fx.write_pair(str(tmp_path / "logs"), "pair", 10, diverge_at=4)
    url = upload(s3, str(tmp_path / "logs"), "served")
    notf = tmp_path / "notf" / "tensorflow"
    notf.mkdir(parents=True)
    (notf / "__init__.py").write_text("raise ImportError('this server runs without TensorFlow')\n")
    path = os.pathsep.join(p for p in (str(notf.parent), os.environ.get("PYTHONPATH", "")) if p)
    expected = api.compare(str(tmp_path / "logs" / "pair")).to_dict()
    port = _free_port()
    tensorboard = shutil.which("tensorboard", path=os.path.dirname(sys.executable)) or "tensorboard"
    log = open(tmp_path / "tensorboard.log", "w")
    proc = subprocess.Popen(
        [tensorboard, "--logdir", url, "--host", "127.0.0.1", "--port", str(port), "--load_fast=false"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **s3.env, "S3_ENDPOINT": s3.env["AWS_ENDPOINT_URL"], "PYTHONPATH": path},
    )
    base = f"http://127.0.0.1:{port}/data/plugin/tb_parity/"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                runs = json.loads(urllib.request.urlopen(base + "runs", timeout=30).read())
                if len(runs["runs"]) == 2:
                    break
            except Exception:
                if proc.poll() is not None:
                    raise
            assert time.monotonic() < deadline, open(log.name).read()[-2000:]
            time.sleep(0.5)
        summary = json.loads(urllib.request.urlopen(base + "summary?baseline=pair/tf1&candidate=pair/tf2").read())
        assert summary["first_divergence"] == expected["first_divergence"]
        assert summary["verdict"] == "diverge"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_refused_credentials_are_a_clear_error_without_the_secret(
    s3: S3, tmp_path: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fx.write_pair(str(tmp_path), "pair", 3)
    url = upload(s3, str(tmp_path / "pair"), "locked")
    from moto import settings

    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the server now checks keys: ours are unknown
    with pytest.raises(OSError) as info:
        LogdirReader(url)
    assert "locked" in str(info.value) and "testing-secret" not in str(info.value)
    assert cli.main(["diff", url]) == 2
    err = capsys.readouterr().err
    assert "locked" in err and "testing-secret" not in err and "Traceback" not in err


def test_the_demo_writes_its_pair_to_a_url(s3: S3, tmp_path: Any) -> None:
    url = f"s3://{BUCKET}/demo"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for target in (url, str(tmp_path)):
        subprocess.run(
            [sys.executable, "-m", "demo.write_logs", target, "--pairs", "lr_offbyone"],
            cwd=repo,
            env={**os.environ, **s3.env},
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=600,
        )
    local = api.compare(str(tmp_path / "lr_offbyone"))
    remote = api.compare(f"{url}/lr_offbyone")
    assert remote.first_divergence == local.first_divergence and remote.steps_compared == local.steps_compared


def test_an_object_that_vanishes_between_listing_and_reading_is_named(s3: S3, tmp_path: Any) -> None:
    fx.write_pair(str(tmp_path), "pair", 4)
    url = upload(s3, str(tmp_path / "pair"), "vanish")
    reader = LogdirReader(url)
    listed = reader._storage.discover()
    gone = listed["tf2"][0]
    s3.fs().rm(gone)
    reader._storage.discover = lambda: listed  # type: ignore[method-assign]  # the listing taken before the delete
    reader.reload()
    (problem,) = reader.run("tf2").problems
    assert gone.rpartition("/")[2] in problem.path and "cannot read" in problem.message
    assert list(reader.run("tf1").steps) == [0, 1, 2, 3]  # the other run is read as usual
