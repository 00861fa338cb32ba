"""The route page's "Archive route" button: admin only, same origin, a confirmation step, then the
archive (audited with the token's name); the archived page offers "Restore route".

Every test runs on SQLite and PostgreSQL (the ``database_url`` fixture).
"""

from __future__ import annotations

from html import unescape

from hedgerow.api.auth import TOKEN_COOKIE
from tests.api.conftest import MakeApi

M = {"model": "m1"}
TOKENS = "ops=adm1n-token:admin,r3ad-token:read"


async def test_archive_button_confirms_then_archives_and_restore_undoes_it(make_api: MakeApi) -> None:
    async with make_api(tokens=TOKENS) as (_app, api):
        admin = {"Authorization": "Bearer adm1n-token"}
        assert (await api.put("/v1/routes/junk", params=M, json={}, headers=admin)).status_code == 201
        api.cookies.set(TOKEN_COOKIE, "adm1n-token", path="/ui")
        page = await api.get("/ui/routes/junk", params=M)
        assert page.status_code == 200 and 'name="action" value="archive"' in page.text
        assert "Archive route" in unescape(page.text)

        # the button asks first: nothing is archived yet
        asked = await api.post("/ui/routes/junk", params=M, data={"action": "archive"})
        assert asked.status_code == 200 and 'id="archive-confirm"' in asked.text
        assert 'name="confirm" value="yes"' in asked.text
        assert (await api.get("/v1/routes/junk", params=M, headers=admin)).json()["archived_at"] is None

        done = await api.post("/ui/routes/junk", params=M, data={"action": "archive", "confirm": "yes"})
        assert done.status_code == 303 and "changed=archived" in done.headers["location"]
        route = (await api.get("/v1/routes/junk", params=M, headers=admin)).json()
        assert route["archived_at"] is not None and route["archived_by"] == "ops"
        history = (await api.get("/v1/routes/junk/history", params=M, headers=admin)).json()["history"]
        assert history[0]["reason"] == "archived" and history[0]["actor"] == "ops"
        overview = await api.get("/ui/routes")
        assert "/ui/routes/junk" not in overview.text  # gone from the console's list

        archived_page = await api.get("/ui/routes/junk", params=M | {"changed": "archived"})
        assert archived_page.status_code == 200 and 'id="archived-note"' in archived_page.text
        assert 'name="action" value="restore"' in archived_page.text
        assert 'name="action" value="archive"' not in archived_page.text
        restored = await api.post("/ui/routes/junk", params=M, data={"action": "restore"})
        assert restored.status_code == 303 and "changed=restored" in restored.headers["location"]
        assert (await api.get("/v1/routes/junk", params=M, headers=admin)).json()["archived_at"] is None
        assert "/ui/routes/junk" in (await api.get("/ui/routes")).text


async def test_archive_needs_admin_and_the_same_origin(make_api: MakeApi) -> None:
    async with make_api(tokens=TOKENS) as (_app, api):
        admin = {"Authorization": "Bearer adm1n-token"}
        assert (await api.put("/v1/routes/junk", params=M, json={}, headers=admin)).status_code == 201
        api.cookies.set(TOKEN_COOKIE, "r3ad-token", path="/ui")
        page = await api.get("/ui/routes/junk", params=M)
        assert page.status_code == 200 and 'value="archive"' not in page.text
        assert "Archiving the route needs a token with the admin scope" in page.text
        refused = await api.post("/ui/routes/junk", params=M, data={"action": "archive", "confirm": "yes"})
        assert refused.status_code == 403

        api.cookies.set(TOKEN_COOKIE, "adm1n-token", path="/ui")
        foreign = await api.post(
            "/ui/routes/junk",
            params=M,
            data={"action": "archive", "confirm": "yes"},
            headers={"Origin": "https://elsewhere.example"},
        )
        assert foreign.status_code == 403
        assert (await api.get("/v1/routes/junk", params=M, headers=admin)).json()["archived_at"] is None
        unknown = await api.post("/ui/routes/nope", params=M, data={"action": "archive"})
        assert unknown.status_code == 404 and "'nope'" in unescape(unknown.text)
