"""``/v1/prices`` and ``/v1/reports/weekly``: scopes, audit, errors, formats, and the CLI's figures."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hedgerow.api.auth import parse_tokens, token_actor
from hedgerow.controller.report.report_render import CSV_COLUMNS
from tests.api.conftest import MakeApi
from tests.controller.report_store_helpers import fill_store

ADMIN = {"Authorization": "Bearer s3cret-admin"}
READ = {"Authorization": "Bearer r3ad"}
TOKENS = "s3cret-admin:admin,r3ad:read"
PRICE = {"input_usd_per_mtok": 1, "output_usd_per_mtok": 1}


async def test_put_price_is_admin_only_audited_and_validated(make_api: MakeApi) -> None:
    async with make_api(tokens=TOKENS) as (_app, api):
        body = {"input_usd_per_mtok": 3, "output_usd_per_mtok": 15, "effective_from": "2026-11-23", "actor": "alice"}
        assert (await api.put("/v1/prices/meta-llama/L-70b", json=body, headers=READ)).status_code == 403
        assert (await api.put("/v1/prices/meta-llama/L-70b", json=body)).status_code == 401
        created = await api.put("/v1/prices/meta-llama/L-70b", json=body, headers=ADMIN)
        assert created.status_code == 201, created.text
        price = created.json()["price"]
        fingerprint = token_actor(parse_tokens(TOKENS), {}, "s3cret-admin")  # an unnamed token
        assert price["model"] == "meta-llama/L-70b" and price["upstream"] is None
        assert fingerprint in price["actor"] and "alice" in price["actor"] and price["created_at"]
        assert price["effective_from"].startswith("2026-11-23T00:00:00")
        again = await api.put("/v1/prices/meta-llama/L-70b", json=body, headers=ADMIN)
        assert again.status_code == 200 and again.json()["added"] is False
        listed = await api.get("/v1/prices", headers=READ)
        assert [p["input_usd_per_mtok"] for p in listed.json()["prices"]] == [3.0]
        one = await api.get("/v1/prices/meta-llama/L-70b", headers=READ)
        assert one.json()["model"] == "meta-llama/L-70b" and len(one.json()["prices"]) == 1
        assert (await api.get("/v1/prices/unknown", headers=READ)).json()["prices"] == []
        for bad, field in (
            ({"output_usd_per_mtok": 1}, "input_usd_per_mtok"),
            ({"input_usd_per_mtok": -1, "output_usd_per_mtok": 1}, "input_usd_per_mtok"),
            ({"input_usd_per_mtok": 1, "output_usd_per_mtok": "1"}, "output_usd_per_mtok"),
            ({**PRICE, "effective_from": "2026-11-23T10:30:00Z"}, "effective_from"),  # not a whole hour
            ({**PRICE, "effective_from": "2026-11-23T10:00:00"}, "effective_from"),  # no zone
            ({"input_usd_per_mtok": 1, "output_usd_per_mtok": 1, "colour": "red"}, "colour"),
            ({"input_usd_per_mtok": 1, "output_usd_per_mtok": 1, "model": "other"}, "model"),
        ):  # fmt: skip
            answer = await api.put("/v1/prices/m", json=bad, headers=ADMIN)
            assert answer.status_code == 422, (bad, answer.text)
            assert answer.json()["detail"]["field"] == field, answer.json()
        broken = await api.put("/v1/prices/m", content=b"{", headers={**ADMIN, "content-type": "application/json"})
        assert broken.status_code == 422 and broken.json()["detail"]["field"] == "body"


async def test_weekly_report_formats_scopes_and_errors(make_api: MakeApi) -> None:
    async with make_api(tokens=TOKENS) as (app, api):
        await fill_store(app.state.sessionmaker, per_route=120)
        assert (await api.get("/v1/reports/weekly")).status_code == 401
        as_json = await api.get("/v1/reports/weekly", params={"week": "2026-W48"}, headers=READ)
        assert as_json.status_code == 200
        report = as_json.json()
        assert report["schema"] == "hedgerow.weekly_report/1" and report["week"] == "2026-W48"
        assert report["total"]["calls"] == 242
        as_csv = await api.get("/v1/reports/weekly", params={"week": "2026-W48", "format": "csv"}, headers=READ)
        assert as_csv.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(as_csv.text)))
        assert tuple(rows[0]) == CSV_COLUMNS
        client_rows = [r for r in rows if r["scope"] == "client"]  # last (report_clients): every call's is "t"
        assert [r["client"] for r in client_rows] == ["t"] and rows[-1:] == client_rows
        assert int(client_rows[0]["calls"]) == 242
        rows = rows[:-1]
        upstream_rows = [r for r in rows if r["scope"] == "upstream"]  # after the total (report_upstreams)
        assert upstream_rows and rows[-len(upstream_rows) :] == upstream_rows
        rows = rows[: -len(upstream_rows)]
        assert [(r["scope"], r["route"], r["model"]) for r in rows] == [
            ("route", "batch", "m-free"), ("route", "chat", "m-priced"), ("total", "", "")
        ]  # fmt: skip
        assert sum(int(r["calls"]) for r in rows[:-1]) == int(rows[-1]["calls"]) == 242
        assert rows[0]["price_status"] == "no price" and rows[0]["spend_usd"] == ""
        assert float(rows[1]["spend_usd"]) == pytest.approx(report["routes"][1]["cost"]["spend_usd"], rel=1e-5)
        md = await api.get("/v1/reports/weekly", params={"week": "2026-W48", "format": "md"}, headers=READ)
        assert md.text.startswith("# hedgerow weekly report 2026-W48") and "| chat | m-priced |" in md.text
        html = await api.get("/v1/reports/weekly", params={"week": "2026-W48", "format": "html"}, headers=READ)
        assert html.text.count("<svg") == 7
        # self-contained: every reference is to the page itself (#glyph ids), nothing to load
        assert re.findall(r'(?:src|href)\s*=\s*"(?!#)[^"]*"', html.text) == []
        assert "<script" not in html.text and "<link" not in html.text
        assert re.findall(r"url\((?!#)", html.text) == []  # clip paths refer to ids on the page
        current = await api.get("/v1/reports/weekly", headers=READ)
        assert current.status_code == 200 and current.json()["partial"] is True
        for params, field in (
            ({"week": "2026-48"}, "week"),
            ({"week": "2026-W54"}, "week"),
            ({"format": "pdf"}, "format"),
        ):
            bad = await api.get("/v1/reports/weekly", params=params, headers=READ)
            assert bad.status_code == 422 and bad.json()["detail"]["field"] == field, bad.text


@pytest.mark.slow
async def test_cli_and_api_give_the_same_figures(make_api: MakeApi, database_url: str, tmp_path: Path) -> None:
    async with make_api() as (app, api):
        await fill_store(app.state.sessionmaker, per_route=120)
        from_api = (await api.get("/v1/reports/weekly", params={"week": "2026-W48"})).json()
    out = tmp_path / "week.json"
    done = subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", "report", "weekly", "--week", "2026-W48", "--db", database_url,
         "--format", "json", "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    from_cli = json.loads(out.read_text())
    for report in (from_api, from_cli):
        report.pop("generated_at")
    assert from_cli == from_api
    html = tmp_path / "week.html"
    done = subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", "report", "weekly", "--week", "2026-W48", "--db", database_url,
         "--format", "html", "-o", str(html)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and html.read_text().count("<svg") == 7
    bad = subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", "report", "weekly", "--week", "W48", "--db", database_url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "--week" in bad.stderr


@pytest.mark.slow
def test_weeks_at_the_ends_of_the_calendar_are_refused_not_a_500(tmp_path: Path) -> None:
    """``2026-W49``-shaped weeks whose report cannot be dated (0001-W01 has no previous week,
    9999-W52 no end) answered 500 from the api and the console and made ``hedgerow report
    weekly`` say it could not read the store (exit 1); now they are a 422 naming ``week`` and
    exit 2. The first week that can be reported is named with its four-digit year."""

    from tests.serve_process import ServeProcess

    db = f"sqlite:///{tmp_path / 'w.db'}"
    served = ServeProcess(db, tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    try:
        for week in ("0001-W01", "9999-W52"):
            api = httpx.get(f"{served.url}/v1/reports/weekly", params={"week": week}, timeout=60)
            assert api.status_code == 422 and api.json()["detail"]["field"] == "week", api.text
            assert "out of range" in api.json()["detail"]["message"]
            page = httpx.get(f"{served.url}/ui/reports/{week}/report.html", timeout=60)
            assert page.status_code == 422 and "out of range" in page.text
        first = httpx.get(f"{served.url}/v1/reports/weekly", params={"week": "0001-W02"}, timeout=60)
        assert first.status_code == 200 and first.json()["week"] == "0001-W02"
    finally:
        served.stop()
    done = subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", "report", "weekly", "--db", db, "--week", "0001-W01"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("hedgerow: --week:"), done.stderr


async def test_a_week_that_has_not_started_is_refused_naming_it(make_api: MakeApi) -> None:
    """``2030-W01`` answered 200 with ``partial: true`` and 0 calls, which reads like an outage
    rather than a typo; now the api and both console pages answer 422 naming the week. The next
    week is refused too; the current week is still reported as partial. The console's error page
    leads back to the weekly reports (it offered only "Back to the routes")."""
    from hedgerow.controller.report.report import IsoWeek
    from hedgerow.controller.store.models import utc_now

    current = IsoWeek.of(utc_now())
    following = IsoWeek.of(current.until)
    async with make_api() as (_app, api):
        for week in ("2030-W01", str(following)):
            answer = await api.get("/v1/reports/weekly", params={"week": week})
            assert answer.status_code == 422, answer.text
            detail = answer.json()["detail"]
            assert detail["field"] == "week" and f"week {week} has not started" in detail["message"], detail
            assert str(current) in detail["message"]
            for path in (f"/ui/reports/{week}", f"/ui/reports/{week}/report.html"):
                page = await api.get(path)
                assert page.status_code == 422 and f"week {week} has not started" in page.text, path
                assert '<a href="/ui/reports">Back to the weekly reports</a>' in page.text, path
        now = await api.get("/v1/reports/weekly", params={"week": str(current)})
        assert now.status_code == 200 and now.json()["partial"] is True
        assert (await api.get(f"/ui/reports/{current}")).status_code == 200


def test_report_cli_refuses_a_week_that_has_not_started(tmp_path: Path) -> None:
    """``hedgerow report weekly --week 2030-W01`` printed an all-zero partial report (exit 0);
    it now exits 2 naming the flag and the week, before it opens the store."""
    missing = tmp_path / "absent.db"
    done = subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", "report", "weekly", "--week", "2030-W01", "--db", f"sqlite:///{missing}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("hedgerow: --week: week 2030-W01 has not started yet"), done.stderr
    assert done.stdout == "" and not missing.exists()


async def test_a_started_week_without_calls_says_so_in_the_api_and_the_cli(make_api: MakeApi, tmp_path: Path) -> None:
    """The previous week of an empty store answered ``price_status: "priced"`` with a spend of
    $0.0000 in every format, as if a priced week had cost nothing. Now the api's JSON says
    ``no_calls`` with a "no calls" cost and null sums, its Markdown says no calls were recorded,
    and ``hedgerow report weekly`` says so on stderr too (exit 0: the week is a valid one)."""
    from hedgerow.controller.report.report import IsoWeek
    from hedgerow.controller.store.models import utc_now

    week = str(IsoWeek.of(utc_now()).previous())
    async with make_api() as (_app, api):
        report = (await api.get("/v1/reports/weekly", params={"week": week})).json()
        md = (await api.get("/v1/reports/weekly", params={"week": week, "format": "md"})).text
    assert report["no_calls"] is True and report["total"]["cost"]["price_status"] == "no calls"
    assert report["total"]["cost"]["spend_usd"] is None
    assert "no calls were recorded in this week" in md and "$0" not in md and "priced" not in md
    db = f"sqlite:///{tmp_path / 'empty.db'}"
    subprocess.run([sys.executable, "-m", "hedgerow.cli", "db", "upgrade", "--db", db], check=True, timeout=120,
                   capture_output=True)  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", "report", "weekly", "--db", db, "--week", week, "--format", "csv"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(f"hedgerow: no calls in {week}"), done.stderr
    assert ",no calls," in done.stdout and ",priced," not in done.stdout


async def test_a_week_typed_in_lower_case_is_taken_and_errors_name_the_week_once(make_api: MakeApi) -> None:
    """``2026-w48`` (as ``date +%G-w%V`` or a hurried hand types it) was refused as "not an ISO
    week such as 2026-W48"; the week is now read in either case, by the api, the console and the
    CLI (one parser). The console's error for a bad week said the week twice ("week 'latest':
    week 'latest' is not ...")."""
    async with make_api() as (_app, api):
        lower = await api.get("/v1/reports/weekly", params={"week": "2026-w48"})
        assert lower.status_code == 200 and lower.json()["week"] == "2026-W48", lower.text
        assert (await api.get("/ui/reports/2026-w48")).status_code == 200
        for week in ("latest", "2026-W99"):
            page = await api.get(f"/ui/reports/{week}")
            assert page.status_code == 422, page.text
            assert page.text.count(f"week &#39;{week}&#39;") == 1, page.text
