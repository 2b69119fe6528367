"""Pure discovery cores: values and keys, the version planner, the registration machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from ballast_asgi.discovery.core.model import (
    ConfigVersion,
    DiscoveryError,
    Instance,
    Keys,
    Registration,
    check_url,
    parse_endpoint,
)
from ballast_asgi.discovery.core.registration import RegistrationCore, Step
from ballast_asgi.discovery.core.versions import VersionPlanner, differs

ROOT = Path(__file__).resolve().parents[2]
A = Instance("http://127.0.0.1:9101", "v1")
B = Instance("http://127.0.0.1:9102", "v1")
KEYS = Keys("api")
KA, KB = KEYS.instance(A.url), KEYS.instance(B.url)


# -- values and keys -------------------------------------------------------------
def test_registration_round_trips_and_marks_leaving() -> None:
    """An instance value encodes to compact JSON and decodes back, leaving flag included."""
    assert Registration.decode(Registration(A).encode()) == Registration(A)
    leaving = Registration(A, leaving=True)
    assert Registration.decode(leaving.encode()) == leaving
    assert Registration(A).encode() == b'{"url":"http://127.0.0.1:9101","version":"v1"}'


def test_config_version_round_trips() -> None:
    """A config version keeps its number, instances, time and revision through JSON."""
    v = ConfigVersion(7, (A, B), 1700000000.5, 42)
    assert ConfigVersion.decode(v.encode()) == v


@pytest.mark.parametrize(
    "raw",
    [b"", b"[1]", b"{", b'{"number":0,"instances":[]}', b'{"number":1,"instances":[3]}',
     b'{"number":1,"instances":[{"url":"ftp://x"}]}', b'{"number":"1","instances":[]}'],
)  # fmt: skip
def test_bad_config_versions_are_refused(raw: bytes) -> None:
    """Malformed stored versions raise DiscoveryError, never something else."""
    with pytest.raises(DiscoveryError):
        ConfigVersion.decode(raw)


@pytest.mark.parametrize(
    "url", ["ftp://h:1", "http://", "http://u:p@h:1", "http://h:1/?q=1", "http://h:99999", "x"]
)
def test_bad_instance_urls_are_refused(url: str) -> None:
    """Instance URLs must be http(s) with a host and no userinfo, query or bad port."""
    with pytest.raises(DiscoveryError, match="url"):
        check_url(url)


def test_instance_key_is_the_same_for_the_same_url() -> None:
    """A re-registration writes the very same key (trailing slash ignored)."""
    assert KEYS.instance("http://127.0.0.1:9101/") == KA
    assert KA.startswith(KEYS.instances) and KA != KB
    assert KEYS.history(3).endswith(b"/config/v/000000000003")


def test_bad_service_prefix_and_endpoint_are_named() -> None:
    """Service names, key prefixes and etcd endpoints are validated with the field named."""
    with pytest.raises(DiscoveryError, match="service"):
        Keys("a/b")
    with pytest.raises(DiscoveryError, match="prefix"):
        Keys("a", prefix="x/")
    with pytest.raises(DiscoveryError, match="endpoint"):
        parse_endpoint("https://h:2379")
    assert parse_endpoint("127.0.0.1:2379") == ("127.0.0.1", 2379)


# -- the version planner ---------------------------------------------------------
def test_a_registration_is_written_after_the_debounce() -> None:
    """A new instance is due debounce_s after the change, not before."""
    p = VersionPlanner(debounce_s=0.05)
    p.put(KA, Registration(A), now=10.0)
    assert p.take(10.04) is None
    assert p.wake_at() == pytest.approx(10.05)
    assert p.take(10.05) == (A,)
    assert p.take(10.06) is None


def test_changes_push_the_write_back_but_not_past_max_wait() -> None:
    """Steady churn still writes within max_wait_s of the first change."""
    p = VersionPlanner(debounce_s=0.05, max_wait_s=0.2)
    for i in range(10):
        p.put(
            KEYS.instance(f"http://h:{1000 + i}"),
            Registration(Instance(f"http://h:{1000 + i}")),
            1.0 + i * 0.04,
        )
    assert p.wake_at() == pytest.approx(1.2)
    assert p.take(1.2) is not None


def test_putting_the_same_value_again_changes_nothing() -> None:
    """A re-put of an unchanged registration schedules no write."""
    p = VersionPlanner()
    p.put(KA, Registration(A), 0.0)
    p.take(1.0)
    p.put(KA, Registration(A), 2.0)
    assert p.wake_at() is None and p.take(5.0) is None


def test_a_lost_lease_that_comes_back_within_the_grace_writes_nothing() -> None:
    """Key expired, same key and value re-put inside the grace: no version is due."""
    p = VersionPlanner(debounce_s=0.05, removal_grace_s=2.0)
    p.put(KA, Registration(A), 0.0)
    assert p.take(1.0) == (A,)
    p.delete(KA, 5.0)
    assert p.desired() == (A,)
    p.put(KA, Registration(A), 6.5)
    assert p.wake_at() is None and p.take(10.0) is None


def test_a_crashed_instance_leaves_after_the_grace() -> None:
    """A key that expires and does not return leaves the list after removal_grace_s."""
    p = VersionPlanner(debounce_s=0.05, removal_grace_s=2.0)
    p.put(KA, Registration(A), 0.0)
    p.put(KB, Registration(B), 0.0)
    p.take(1.0)
    p.delete(KA, 5.0)
    assert p.take(6.9) is None
    assert p.wake_at() == pytest.approx(7.0)
    p.take(7.0)
    assert p.take(7.05) == (B,)


def test_leaving_on_purpose_removes_at_once() -> None:
    """A registrar that marks itself leaving is removed after the debounce only."""
    p = VersionPlanner(debounce_s=0.05, removal_grace_s=2.0)
    p.put(KA, Registration(A), 0.0)
    p.put(KB, Registration(B), 0.0)
    p.take(1.0)
    p.put(KA, Registration(A, leaving=True), 3.0)
    p.delete(KA, 3.001)
    assert p.take(3.05) == (B,)


def test_a_new_version_label_is_a_change() -> None:
    """The same URL with another version is a different list (canary needs it)."""
    p = VersionPlanner()
    p.put(KA, Registration(A), 0.0)
    p.take(1.0)
    p.put(KA, Registration(Instance(A.url, "v2")), 2.0)
    assert p.take(3.0) == (Instance(A.url, "v2"),)


def test_relist_treats_missing_keys_as_vanished() -> None:
    """After a lost watch, a listing without a key starts its grace, new keys are added."""
    p = VersionPlanner(removal_grace_s=1.0)
    p.put(KA, Registration(A), 0.0)
    p.take(1.0)
    p.relist({KB: Registration(B)}, 2.0)
    assert p.take(2.5) == (A, B)
    p.take(3.0)
    assert p.take(3.1) == (B,)


def test_seed_keeps_listed_instances_for_the_grace() -> None:
    """A new controller keeps what version N lists for the grace, then follows etcd."""
    p = VersionPlanner(debounce_s=0.05, removal_grace_s=1.0)
    p.seed({KA: A}, 0.0)
    p.put(KB, Registration(B), 0.0)
    assert p.take(0.05) == (A, B)
    p.take(1.0)
    assert p.take(1.05) == (B,)


def test_differs_compares_lists_not_order() -> None:
    """Only a different set of instances is worth a version."""
    assert differs(None, (A,)) and not differs(None, ())
    assert not differs((B, A), (A, B))
    assert differs((A,), (A, B))


def test_planner_rejects_inconsistent_settings() -> None:
    """max_wait_s below debounce_s, or negative times, are refused."""
    with pytest.raises(ValueError):
        VersionPlanner(debounce_s=1.0, max_wait_s=0.5)
    with pytest.raises(ValueError):
        VersionPlanner(removal_grace_s=-1)


# -- the registration state machine ----------------------------------------------
def test_registration_grants_then_keeps_alive_every_third_of_the_ttl() -> None:
    """Granted at t=0 with TTL 6: next keep-alive at t=2."""
    r = RegistrationCore(6)
    assert r.next_step() == (Step.GRANT, 0.0)
    r.granted(11, 0.0)
    assert r.next_step() == (Step.KEEPALIVE, 2.0)
    r.kept(6, 2.0)
    assert r.next_step() == (Step.KEEPALIVE, 4.0)


def test_a_lost_lease_registers_again_at_once() -> None:
    """Keep-alive answering TTL 0 means lost: grant again now, count the loss."""
    r = RegistrationCore(5)
    r.granted(1, 0.0)
    r.kept(0, 1.7)
    assert r.next_step() == (Step.GRANT, 1.7) and r.lost == 1 and r.lease_id is None
    r.granted(2, 1.71)
    assert r.grants == 2 and r.state == "registered"


def test_failures_back_off_and_success_resets() -> None:
    """Unreachable etcd: retries at 0.1, 0.2, 0.4 s... capped; a success resets."""
    r = RegistrationCore(5, retry_s=0.1, max_retry_s=0.3)
    r.granted(1, 0.0)
    r.failed(2.0)
    assert r.next_step() == (Step.KEEPALIVE, pytest.approx(2.1))
    r.failed(2.1)
    r.failed(2.3)
    assert r.next_step()[1] == pytest.approx(2.6)
    assert r.state == "registered"
    r.kept(5, 2.6)
    r.failed(3.0)
    assert r.next_step()[1] == pytest.approx(3.1)


def test_stop_leaves_when_registered_and_finishes_otherwise() -> None:
    """Stopping a registered instance deregisters it; an unregistered one is done."""
    r = RegistrationCore(5)
    r.granted(1, 0.0)
    r.stop(1.0)
    assert r.next_step() == (Step.LEAVE, 1.0)
    r.left()
    assert r.next_step()[0] is Step.DONE
    idle = RegistrationCore(5)
    idle.stop(0.0)
    assert idle.next_step()[0] is Step.DONE


def test_late_answers_after_a_state_change_are_ignored() -> None:
    """A grant or keep-alive answer arriving in the wrong state changes nothing."""
    r = RegistrationCore(5)
    r.kept(5, 0.0)
    assert r.state == "unregistered"
    r.granted(1, 0.0)
    r.granted(2, 0.1)
    assert r.lease_id == 1
    with pytest.raises(ValueError):
        RegistrationCore(0)
