"""The route table (pure): configured routes, app templates, bounded automatic groups."""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ballast_asgi.core.priority import Priority
from ballast_asgi.core.routes import OTHER, Route, RouteTable, first_segment_group


def _table(*routes: Route, **kw: int | bool) -> RouteTable:
    return RouteTable(routes, **kw)  # type: ignore[arg-type]


def test_configured_route_matches_by_pattern_and_method_first_hit_wins() -> None:
    """Routes match in order, with fnmatch paths (``*`` spans ``/``) and method filters."""
    api_get = Route("api-read", source="config", paths=("/api/*",), methods=("GET",))
    api = Route("api", source="config", paths=("/api/*", "/v2/*"))
    table = _table(api_get, api, learn=False)
    assert table.match("get", "/api/a/b") is api_get
    assert table.match("POST", "/api/a") is api
    assert table.match("GET", "/v2/x") is api
    assert table.match("GET", "/apix").name == "/apix"  # no match: its automatic group


def test_without_configuration_different_first_segments_are_different_routes() -> None:
    """/status/500 and /get fall in different automatic routes; same segment, same route."""
    table = RouteTable(learn=False)
    status = table.match("GET", "/status/500")
    assert status.name == "/status" and status.source == "auto"
    assert table.match("GET", "/get").name == "/get"
    assert table.match("GET", "/status/200") is status
    assert table.match("GET", "/").name == "/"
    assert table.match("GET", "//x").name == "/"


@pytest.mark.parametrize("path", ["/12345/x", "/a%2Fb", "/" + "a" * 41, "/sp ace", "/é"])
def test_ids_and_odd_segments_go_to_other(path: str) -> None:
    """An all-digit id, a long or non-name segment never gets a group of its own."""
    assert first_segment_group(path) is None
    assert RouteTable(learn=False).match("GET", path).name == OTHER


def test_thousands_of_random_paths_never_grow_the_table_past_its_bound() -> None:
    """5,000 invented paths: at most max_groups automatic routes plus ``other``."""
    rng = random.Random(7)
    table = RouteTable(max_groups=8, learn=False)
    for _ in range(5_000):
        seg = "".join(
            rng.choices(string.ascii_letters + string.digits + "%._-~!", k=rng.randint(1, 60))
        )
        table.match(rng.choice(["GET", "POST", "PURGE"]), f"/{seg}/{rng.random()}")
    assert len(table.known()) <= 8 + 1
    assert len(table.counts) <= 8 + 1
    assert sum(table.counts.values()) == 5_000
    assert table.capacity >= len(table.known())


@given(st.lists(st.text(max_size=80), max_size=300))
def test_any_paths_stay_within_capacity(paths: list[str]) -> None:
    """Whatever the paths, the routes returned are bounded by the table's capacity."""
    table = RouteTable(max_groups=4, max_templates=2, learn=False)
    names = {table.match("GET", "/" + p, p if len(p) % 3 == 0 else None).name for p in paths}
    assert len(names) <= table.capacity
    assert len(table.known()) <= table.capacity


def test_app_templates_name_routes_and_are_capped() -> None:
    """An app's route template names its route; past max_templates they share ``other``."""
    table = RouteTable(max_templates=2)
    a = table.match("GET", "/items/1", "/items/{id}")
    assert a.name == "/items/{id}" and a.source == "app"
    assert table.match("GET", "/items/2", "/items/{id}") is a
    table.match("GET", "/users/1", "/users/{id}")
    assert table.match("GET", "/x", "/x").name == OTHER


def test_configured_route_wins_over_the_template() -> None:
    """A configured route matches before the app's template."""
    admin = Route("admin", source="config", paths=("/admin*",), priority=Priority.CRITICAL)
    table = _table(admin)
    assert table.match("GET", "/admin/users", "/admin/users") is admin


def test_auto_off_sends_unmatched_requests_to_other() -> None:
    """auto_routes.enabled false: one shared route for everything unmatched."""
    assert _table(auto=False).match("GET", "/get").name == OTHER


def test_duplicate_names_and_negative_bounds_are_refused() -> None:
    """Two routes of one name, or a negative max_groups, are errors naming the problem."""
    with pytest.raises(ValueError, match="unique"):
        _table(Route("a", paths=("/a",)), Route("a", paths=("/b",)))
    with pytest.raises(ValueError, match="max_groups"):
        RouteTable(max_groups=-1)


def test_route_describes_its_policy_for_the_snapshot() -> None:
    """describe() is JSON-safe and names the route's settings."""
    route = Route("api", source="config", priority=Priority.BULK, deadline_ms=300, paths=("/a",))
    assert route.describe()["priority"] == "bulk"
    assert route.describe()["deadline_ms"] == 300
    assert route.describe()["limiter_partition"] is False


def test_with_learn_a_segment_gets_its_route_after_a_non_404_answer() -> None:
    """learn (default): other until the upstream answers non-404; a 404 never gives a route."""
    table = RouteTable()
    assert table.match("GET", "/get").name == OTHER
    table.learn("/get", 200)
    assert table.match("GET", "/get/x").name == "/get"
    table.learn("/invented", 404)
    assert table.match("GET", "/invented").name == OTHER
    table.learn("/status/500", 500)
    assert table.match("GET", "/status/503").name == "/status"
    table.learn("/12345", 200)  # an id never names a route, known or not
    assert table.match("GET", "/12345").name == OTHER


def test_learning_is_bounded_by_max_groups() -> None:
    """An upstream that knows every path still gives at most max_groups routes."""
    table = RouteTable(max_groups=3)
    for i in range(100):
        table.learn(f"/seg{i}/x", 200)
    assert len(table.known()) == 3 + 1
