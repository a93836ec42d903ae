"""deploy/container/seccomp.json: a runtime's default profile with what bubblewrap needs allowed
outright, and nothing else opened (tests/container/test_image.py runs the image under it)."""

from __future__ import annotations

import importlib.util
import json
from types import ModuleType
from typing import Any

from tests.container.podman import REPO, SECCOMP


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_seccomp", REPO / "deploy" / "container" / "make_seccomp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rules_naming(profile: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [rule for rule in profile["syscalls"] if name in rule["names"]]


def test_shipped_profile_allows_the_sandbox_calls_and_refuses_by_default() -> None:
    profile = json.loads(SECCOMP.read_text())
    make = generator()
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    for name in make.SANDBOX_CALLS:
        (rule,) = rules_naming(profile, name)  # one rule, no condition left beside it
        assert rule["action"] == "SCMP_ACT_ALLOW"
        assert not rule.get("args") and not rule.get("includes") and not rule.get("excludes")
    # Still refused as the default profile refuses them (no capability in the container).
    for name in ("kexec_load", "init_module", "delete_module", "acct", "open_by_handle_at"):
        assert all(
            rule["action"] != "SCMP_ACT_ALLOW" or rule.get("includes") for rule in rules_naming(profile, name)
        ), name
    # Regenerating it changes nothing: no hand edit went past the generator.
    assert make.with_sandbox_calls(profile) == profile


def test_generator_lifts_conditions_on_the_sandbox_calls_only() -> None:
    base = {
        "defaultAction": "SCMP_ACT_ERRNO",
        "syscalls": [
            {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["mount", "unshare", "bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": 2114060288, "op": "SCMP_CMP_MASKED_EQ"}],
            },
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38, "excludes": {"caps": ["CAP_SYS_ADMIN"]}},
        ],
    }
    made = generator().with_sandbox_calls(base)
    assert made["syscalls"][:2] == [
        {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
    ]
    assert len(made["syscalls"]) == 3
    for name in ("mount", "unshare", "clone", "clone3", "pivot_root", "sethostname", "setns"):
        (rule,) = rules_naming(made, name)
        assert rule["action"] == "SCMP_ACT_ALLOW" and "includes" not in rule and "args" not in rule
